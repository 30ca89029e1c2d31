/* test_hf_refusals.c - what api_checkpoint_load refuses, each failure naming the config field,
 * file or tensor that stops it (the daemon then exits 2 at start-up: tests/server/test_models.c):
 * an unknown model_type, a RoPE type attnd lacks, a layer past num_hidden_layers, heads that
 * do not split the hidden size when no head_dim says their size, a missing tensor, a misshapen one,
 * a shard the index names that is missing, a config or index that is not JSON, shards whose tensors
 * overlap or run past their file, a directory with no weights. Each case is a copy of a reference
 * checkpoint (tests/api/hf/cases) in a temporary directory with one thing broken. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/safetensors_writer.h"

static const char *cases_dir;
static char tmp[128];

/* ---- Fixtures ----------------------------------------------------------------------------- */

static bool copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[65536];
    size_t n;
    bool ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out)
        ok = fclose(out) == 0 && ok;
    return ok;
}

/* A fresh copy of case `family` as tmp/<name>; its path into dir[256]. */
static bool fresh_copy(const char *family, const char *name, char dir[256])
{
    static const char *const files[] = {"config.json",
                                        "model.safetensors",
                                        "model.safetensors.index.json",
                                        "model-00001-of-00003.safetensors",
                                        "model-00002-of-00003.safetensors",
                                        "model-00003-of-00003.safetensors"};
    snprintf(dir, 256, "%s/%s", tmp, name);
    if (mkdir(dir, 0755) != 0)
        return false;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[512], to[512];
        struct stat st;
        snprintf(from, sizeof from, "%s/%s/%s", cases_dir, family, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (stat(from, &st) == 0 && !copy_file(from, to))
            return false;
    }
    return true;
}

/* Sets config.json's `key` to the JSON `value` (NULL: removes it). */
static bool edit_config(const char *dir, const char *key, const char *value)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg)
        return false;
    if (value)
        json_object_set_new(cfg, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(cfg, key);
    bool ok = json_dump_file(cfg, path, 0) == 0;
    json_decref(cfg);
    return ok;
}

static bool write_text(const char *dir, const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return stw_write_file(path, text, strlen(text));
}

/* Loading `dir`'s layer `layer` fails, and the message holds `want` and `also` (or NULL). */
static void expect_refused(const char *dir, int64_t layer, const char *want, const char *also)
{
    char err[600] = "";
    eng_layer *l = api_checkpoint_load("m", dir, layer, NULL, err, sizeof err);
    CHECKF(l == NULL, "%s loaded", dir);
    eng_layer_free(l);
    CHECKF(strstr(err, want) && (!also || strstr(err, also)), "%s: \"%s\" lacks \"%s\" / \"%s\"",
           dir, err, want, also ? also : "");
}

/* ---- The config --------------------------------------------------------------------------- */

static void test_config_fields_that_stop_the_load(void)
{
    char dir[256];
    CHECK(fresh_copy("llama", "type", dir) && edit_config(dir, "model_type", "\"bert\""));
    expect_refused(dir, 0, "model_type", "bert");
    CHECK(fresh_copy("llama", "rope", dir) &&
          edit_config(dir, "rope_parameters",
                      "{\"rope_type\":\"mrope\",\"factor\":2.0,\"rope_theta\":10000}"));
    expect_refused(dir, 0, "rope_type", "mrope");
    CHECK(fresh_copy("llama", "rope4", dir) && edit_config(dir, "rope_parameters", NULL) &&
          edit_config(dir, "rope_scaling", "{\"type\":\"longrope\",\"factor\":2.0}"));
    expect_refused(dir, 0, "short_factor", NULL); /* longrope needs its factors */
    CHECK(fresh_copy("llama", "maxpos", dir) &&
          edit_config(dir, "max_position_embeddings", "1e300"));
    expect_refused(dir, 0, "max_position_embeddings", NULL);
    CHECK(fresh_copy("phi3", "longrope", dir) &&
          edit_config(dir, "rope_parameters",
                      "{\"rope_type\":\"longrope\",\"short_factor\":[1,1],\"long_factor\":[1,1]}"));
    expect_refused(dir, 0, "short_factor", "8 numbers");
    CHECK(fresh_copy("llama", "past", dir));
    expect_refused(dir, 2, "num_hidden_layers", "layer 2");
    /* Heads of 32 make q 128 wide: the checkpoint's q_proj is not. */
    CHECK(fresh_copy("qwen3", "headdim", dir) && edit_config(dir, "head_dim", "32"));
    expect_refused(dir, 0, "model.layers.0.self_attn.q_proj.weight", "[128, 64]");
    CHECK(fresh_copy("llama", "heads", dir) && edit_config(dir, "head_dim", NULL) &&
          edit_config(dir, "num_attention_heads", "5") &&
          edit_config(dir, "num_key_value_heads", "5"));
    expect_refused(dir, 0, "num_attention_heads", "multiple of 5 heads");
    CHECK(fresh_copy("llama", "notjson", dir) &&
          write_text(dir, "config.json", "{\"model_type\":"));
    expect_refused(dir, 0, "config.json", "not JSON");
    CHECK(fresh_copy("llama", "kvheads", dir) && edit_config(dir, "num_key_value_heads", "3"));
    expect_refused(dir, 0, "num_key_value_heads", NULL);
    CHECK(fresh_copy("gemma2", "window", dir) && edit_config(dir, "sliding_window", "0"));
    expect_refused(dir, 0, "sliding_window", NULL);
}

/* ---- The tensors -------------------------------------------------------------------------- */

static void test_missing_and_misshapen_tensors_are_named(void)
{
    char dir[256];
    /* The config promises biases the checkpoint does not have. */
    CHECK(fresh_copy("llama31_scaled", "bias", dir) && edit_config(dir, "attention_bias", "true"));
    expect_refused(dir, 1, "model.layers.1.self_attn.q_proj.bias", NULL);
    /* More key/value heads than k_proj has rows. */
    CHECK(fresh_copy("mistral_window", "shape", dir) &&
          edit_config(dir, "num_key_value_heads", "4"));
    expect_refused(dir, 1, "model.layers.1.self_attn.k_proj.weight", "[32, 64]");
    /* Sinks that gpt_oss needs, absent when the family is another's with the same names. */
    CHECK(fresh_copy("llama", "sinks", dir) && edit_config(dir, "model_type", "\"gpt_oss\""));
    expect_refused(dir, 1, "sinks", NULL);
    /* The fused projection of another layout's size. */
    CHECK(fresh_copy("phi3", "fused", dir) && edit_config(dir, "num_key_value_heads", "2"));
    expect_refused(dir, 0, "qkv_proj.weight", "[192, 64]");
}

/* ---- The index and shards ----------------------------------------------------------------- */

static void test_index_and_shard_failures_are_named(void)
{
    char dir[256], path[512];
    CHECK(fresh_copy("qwen3", "noshard", dir));
    snprintf(path, sizeof path, "%s/model-00002-of-00003.safetensors", dir);
    CHECK(unlink(path) == 0);
    expect_refused(dir, 0, "model-00002-of-00003.safetensors", "missing");
    CHECK(fresh_copy("qwen3", "badindex", dir) &&
          write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [1,"));
    expect_refused(dir, 0, "model.safetensors.index.json", "not a JSON object");
    CHECK(fresh_copy("qwen3", "escape", dir) &&
          write_text(dir, "model.safetensors.index.json",
                     "{\"weight_map\":{\"x\":\"../llama/model.safetensors\"}}"));
    expect_refused(dir, 0, "../llama/model.safetensors", "not a file name");
    snprintf(dir, sizeof dir, "%s/empty", tmp);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/llama/config.json", cases_dir);
    char to[512];
    snprintf(to, sizeof to, "%s/config.json", dir);
    CHECK(copy_file(path, to));
    expect_refused(dir, 0, "neither model.safetensors", NULL);
}

/* A single-file checkpoint of llama layer 0 whose header is `header` over `data_len` bytes. */
static void broken_shard(const char *name, const char *header, size_t data_len, char dir[256])
{
    char path[512];
    stw_bytes b;
    unsigned char data[64] = {0};
    CHECK(fresh_copy("llama31_scaled", name, dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(stw_build_raw(strlen(header), header, strlen(header), data, data_len, &b));
    CHECK(stw_write_file(path, b.data, b.len));
    stw_bytes_free(&b);
}

static void test_shards_that_overlap_or_run_past_their_file(void)
{
    char dir[256];
    broken_shard("overlap",
                 "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[4,12]}}",
                 16, dir);
    expect_refused(dir, 0, "overlap", "model.safetensors");
    broken_shard("pastend", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[16],\"data_offsets\":[0,32]}}",
                 16, dir);
    expect_refused(dir, 0, "past the end", "'a'");
    broken_shard("size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8]}}", 16,
                 dir);
    expect_refused(dir, 0, "do not match dtype and shape", NULL);
    broken_shard("header", "{\"a\":", 16, dir);
    expect_refused(dir, 0, "not a JSON object", NULL);
    /* A tensor of the layer in a dtype attnd does not read. */
    broken_shard("dtype",
                 "{\"model.layers.0.self_attn.o_proj.weight\":{\"dtype\":\"I32\",\"shape\":[2,2],"
                 "\"data_offsets\":[0,16]}}",
                 16, dir);
    expect_refused(dir, 0, "model.layers.0.self_attn.o_proj.weight", "I32");
    /* A well-formed shard without the layer's tensors. */
    broken_shard("absent", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8,
                 dir);
    expect_refused(dir, 0, "model.layers.0.self_attn.o_proj.weight", NULL);
}

static void remove_tree(const char *path)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    cases_dir = getenv("ATTND_HF_CASES") ? getenv("ATTND_HF_CASES") : "tests/api/hf/cases";
    snprintf(tmp, sizeof tmp, "/tmp/attnd_hf_XXXXXX");
    if (!mkdtemp(tmp)) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_config_fields_that_stop_the_load);
    RUN(test_missing_and_misshapen_tensors_are_named);
    RUN(test_index_and_shard_failures_are_named);
    RUN(test_shards_that_overlap_or_run_past_their_file);
    remove_tree(tmp);
    return check_report();
}
