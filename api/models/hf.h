/*
 * hf.h - reading the attention layers of a Hugging Face checkpoint directory (config.json plus
 * model.safetensors, or model.safetensors.index.json and its shards): the config reader
 * (hf_config.c), the files (hf_files.c, whose shards safetensors.c reads) and the families'
 * tensor names and the roles they play for the engine (hf_layer.c).
 *
 * Usage (what api_models_load does with a directory):
 *
 *     char err[512];
 *     api_model_about about;                           // family and first layer
 *     int64_t n;
 *     eng_layer **all = api__checkpoint_layers("llama", dir, -1, &n, &about, err, sizeof err);
 *     eng_layer **one = api__checkpoint_layers("l2", dir, 2, &n, &about, err, sizeof err);
 */
#ifndef ATTND_API_MODELS_HF_H
#define ATTND_API_MODELS_HF_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"
#include "engine/engine.h"

/* A failure: the config field, file or tensor that stops the load, and a sentence. */
typedef struct {
    char field[128];
    char message[512];
} hf_error;

/* Fills `e` (the first failure wins) and returns -1. */
int api__hf_fail(hf_error *e, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* How a family stores the q, k and v projections. */
typedef enum {
    HF_QKV_SEPARATE, /* q_proj, k_proj, v_proj */
    HF_QKV_SPLIT,    /* one [q; k; v] matrix (Phi-3's qkv_proj, Falcon's multi-query) */
    HF_QKV_GROUPED,  /* groups of (q heads, one k head, one v head) rows (GPT-NeoX, Falcon) */
    HF_QKV_CONV1D,   /* GPT-2's Conv1D c_attn: [E, q; k; v], transposed */
} hf_qkv;

/* Whether a projection has a bias: never, always, or as a config flag says. */
typedef struct {
    const char *key; /* NULL: `fixed` */
    bool fixed;      /* the value without a key, or the key's default */
} hf_bias_rule;

/* Which layers slide a window when config.json has no layer_types. */
typedef enum {
    HF_WINDOW_NONE,      /* none */
    HF_WINDOW_ALL,       /* every layer, when sliding_window is set (Mistral, Starcoder2, Phi-3) */
    HF_WINDOW_QWEN,      /* use_sliding_window: layers from max_window_layers on */
    HF_WINDOW_ALTERNATE, /* even layers (Gemma 2) */
    HF_WINDOW_PATTERN,   /* all but every sliding_window_pattern-th (Gemma 3) */
} hf_window_rule;

typedef enum {
    HF_SCALE_HEAD,       /* 1/sqrt(D) */
    HF_SCALE_PRE_ATTN,   /* query_pre_attn_scalar^-1/2 (Gemma) */
    HF_SCALE_MULTIPLIER, /* attention_multiplier (Granite) */
    HF_SCALE_GPT2,       /* scale_attn_weights, scale_attn_by_inverse_layer_idx */
} hf_scale_rule;

/* A family: where its tensors are and what its config keys mean. */
typedef struct hf_family {
    const char *model_type;
    const char *prefix[2]; /* printf formats of the layer's attention prefix (%lld: layer) */
    hf_qkv qkv;
    const char *q, *k, *v, *o; /* tensor stems; for fused layouts q is the fused one */
    hf_bias_rule bias_qkv, bias_o;
    bool rope;
    eng_rope_style rope_style;
    eng_qk_norm norm;
    const char *norm_flag; /* the config flag that turns the norm on; NULL: always */
    bool norm_whole, norm_plus_one;
    const char *norm_q, *norm_k; /* stems */
    hf_window_rule window;
    hf_scale_rule scale;
    bool sinks;
} hf_family;

/* Everything read from config.json about one layer, family-neutral. */
typedef struct {
    const hf_family *family;
    hf_qkv qkv;            /* the family's, or Falcon's from its config */
    int64_t layer, layers; /* the layer served, and num_hidden_layers */
    int64_t E, H, Hkv, D;
    int64_t groups; /* HF_QKV_GROUPED: groups of H / groups q heads with one k and one v */
    bool bias_qkv, bias_o;
    bool qk_norm_per_head_tensors; /* StableLM: q_layernorm.norms.{h}.weight */
    bool sinks;
    eng_decoder_spec spec;
    float short_factor[2048]; /* LongRoPE's, which spec.rope.short_factor points to */
} hf_config;

/* Reads `cfg` (the parsed config.json) for layer `layer` (< 0: 0) into `out`. */
int api__hf_config_read(const json_t *cfg, int64_t layer, hf_config *out, hf_error *e);

/* The checkpoint's files: the index's weight map (or the one file), mapped on demand. */
typedef struct hf_files hf_files;

/* Opens DIR's weights: model.safetensors.index.json (whose shards must exist) or
 * model.safetensors. Nothing is read past the index until a tensor is asked for. */
hf_files *api__hf_files_open(const char *dir, hf_error *e);
void api__hf_files_close(hf_files *f);

/* Tensor `name` of the checkpoint, pointing into its mapped shard and labelled with its name
 * (valid until close; `out` NULL only asks whether it is there); 1 when found, 0 when absent,
 * -1 on a bad shard or a tensor no weight can be (safetensors.h, api__st_tensor). */
int api__hf_files_tensor(hf_files *f, const char *name, eng_weight *out, hf_error *e);

/* Bytes of the shards' data that the tensors asked for span. */
size_t api__hf_files_bytes_read(const hf_files *f);

/* The header checks of one shard's bytes (api__st_parse, as api__hf_files_tensor makes them),
 * for the fuzzer: JSON, dtypes, shapes against byte counts, offsets inside the data and not
 * overlapping. */
int api__hf_shard_check(const unsigned char *bytes, size_t size, const char *file, hf_error *e);

/* The checks of an index's text (JSON, a weight_map of file names inside `dir`, each shard
 * present), as api__hf_files_open makes them, for the fuzzer. */
int api__hf_index_check(const char *dir, const char *text, size_t len, hf_error *e);

/* As api_checkpoint_load, layer `layer` of the checkpoint, or every layer in order when `layer`
 * is < 0 (0 to num_hidden_layers - 1), each a decoder layer named `name`: an array of *n
 * layers (the caller frees each and the array), and what describes them (the family's
 * model_type and the index of the first) into `about`. NULL on failure, with `err` naming the
 * config field, file or tensor (of which layer) that stops it; nothing is left allocated. */
eng_layer **api__checkpoint_layers(const char *name, const char *dir, int64_t layer, int64_t *n,
                                   api_model_about *about, char *err, size_t errlen);

#endif
