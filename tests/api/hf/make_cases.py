# Tiny Hugging Face checkpoints (random weights, saved in bf16 as real checkpoints are) of the
# mainstream decoder families, and for each the input and output of one layer's attention module
# captured during the model's own forward pass (its own masks, windows, rotary tables).
# usage: python3 tests/api/hf/make_cases.py OUTDIR SET   (SET: a name for the archive; needs
# transformers and torch, which make test does not: the cases it wrote are in tests/api/hf/cases)
import json, os, shutil, sys, tarfile, traceback
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM

out, which = sys.argv[1], sys.argv[2]
E, I, L = 64, 128, 20
seed = 11
os.makedirs(out, exist_ok=True)
print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)

common = dict(hidden_size=E, intermediate_size=I, num_hidden_layers=2, vocab_size=64,
              max_position_embeddings=256, num_attention_heads=4, tie_word_embeddings=False)
W = 8  # sliding windows shorter than the sequence, so they bite
fams = {
    "llama": ("llama", dict(common, num_key_value_heads=2)),
    "llama31_scaled": ("llama", dict(common, num_key_value_heads=2, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral_window": ("mistral", dict(common, num_key_value_heads=2, sliding_window=W)),
    "qwen2": ("qwen2", dict(common, num_key_value_heads=2)),
    "qwen3": ("qwen3", dict(common, num_key_value_heads=2, head_dim=E // 4)),
    "gemma2": ("gemma2", dict(common, num_key_value_heads=2, head_dim=E // 4, query_pre_attn_scalar=E // 2,
                              attn_logit_softcapping=50.0, sliding_window=W)),
    "gemma3": ("gemma3_text", dict(common, num_key_value_heads=2, head_dim=E // 4, query_pre_attn_scalar=E // 4,
                                   sliding_window=W, rope_local_base_freq=10000.0, rope_theta=1000000.0)),
    "phi3": ("phi3", dict(common, num_key_value_heads=4, pad_token_id=0)),
    "phi": ("phi", dict(common, partial_rotary_factor=0.5)),
    "gpt2": ("gpt2", dict(n_embd=E, n_head=4, n_layer=2, vocab_size=64, n_positions=256)),
    "gpt_neox": ("gpt_neox", dict(common, rotary_pct=0.25)),
    "falcon": ("falcon", dict(hidden_size=E, num_hidden_layers=2, num_attention_heads=4, vocab_size=64,
                              multi_query=True, parallel_attn=True, bias=False, alibi=False)),
    "olmo2": ("olmo2", dict(common, num_key_value_heads=4)),
    "starcoder2": ("starcoder2", dict(common, num_key_value_heads=2, sliding_window=W, use_bias=True)),
    "gptj": ("gptj", dict(n_embd=E, n_head=4, n_layer=2, vocab_size=64, n_positions=256, rotary_dim=8)),
    "gpt_oss": ("gpt_oss", dict(common, num_key_value_heads=2, head_dim=E // 4, sliding_window=W,
                                num_local_experts=2, num_experts_per_tok=1,
                                max_position_embeddings=131072)),
    "granite": ("granite", dict(common, num_key_value_heads=2, attention_multiplier=0.3)),
    "stablelm": ("stablelm", dict(common, num_key_value_heads=4, partial_rotary_factor=0.25,
                                  use_qkv_bias=True, qk_layernorm=True)),
}


def attention_modules(model):
    return [(n, m) for n, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and "Flash" not in type(m).__name__]


for k, (mtype, kw) in fams.items():
    try:
        torch.manual_seed(seed)
        cfg = AutoConfig.for_model(mtype, **kw)
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        with torch.no_grad():  # random weights of a sensible size (default inits are tiny)
            for n, p in model.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
                elif "norm" in n or "ln" in n or "layernorm" in n.lower():
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.copy_(0.3 * torch.randn_like(p))
        model = model.to(torch.bfloat16).to(torch.float32).eval()  # bf16-exact weights
        d = os.path.join(out, k)
        shard = "60KB" if k in ("llama", "qwen3") else "2GB"
        model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True, max_shard_size=shard)
        # the reference runs the checkpoint as a user loads it: fp32, rotary tables made afresh
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        mods = attention_modules(model)
        layer = len(mods) - 1  # the last layer: in alternating families it differs from layer 0
        cap = {}

        def hook(m, args, kwargs, output):
            hs = args[0] if args else kwargs.get("hidden_states")
            cap["in"] = hs.detach().clone()
            cap["out"] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        h = mods[layer][1].register_forward_hook(hook, with_kwargs=True)
        ids = torch.randint(0, 64, (1, L), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            model(input_ids=ids)
        h.remove()
        meta = {"name": k, "model_type": mtype, "layer": layer, "module": mods[layer][0],
                "class": type(mods[layer][1]).__name__, "causal": True,
                "input": cap["in"][0].tolist(), "output": cap["out"][0].tolist()}
        json.dump(meta, open(os.path.join(d, "attnd_case.json"), "w"))
        print("ok", k, mods[layer][0], type(mods[layer][1]).__name__, sorted(os.listdir(d)), flush=True)
    except Exception:
        print("FAILED", k, flush=True)
        traceback.print_exc()
        shutil.rmtree(os.path.join(out, k), ignore_errors=True)

with tarfile.open(f"{out}.tgz", "w:gz") as t:
    t.add(out, arcname=f"hf_{which}")
print("wrote", f"{out}.tgz", os.path.getsize(f"{out}.tgz"), flush=True)
