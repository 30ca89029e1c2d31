/*
 * bench_checkpoint.c - serving one layer of a large checkpoint maps only what it needs:
 * start-up time and resident memory of attnd serving layer 0 of a generated 8-layer Llama-style
 * checkpoint of about 1 GiB in 4 bf16 shards (hidden size 2048, 16 heads, MLP 5632, vocab
 * 32000), against the bytes of that layer's attention weights and against the same daemon
 * without the model. The line says whether RSS stays within those bytes plus 64 MiB.
 *
 * The shards are written sparse: every tensor's place is in the file, but only layer 0's
 * attention tensors are written (with nonzero values); the rest reads as zeros. What is
 * measured is what the daemon maps and touches, which does not depend on the other bytes.
 */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/daemon.h"

#define HIDDEN 2048
#define HEADS  16
#define MLP    5632
#define VOCAB  32000
#define LAYERS 8
#define SHARDS 4

typedef struct {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector */
} tensor;

static size_t tensor_list(tensor *t)
{
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    static const struct {
        const char *name;
        int64_t rows, cols;
    } mlp[] = {{"gate_proj", MLP, HIDDEN}, {"up_proj", MLP, HIDDEN}, {"down_proj", HIDDEN, MLP}};
    size_t n = 0;
    t[n++] = (tensor){"model.embed_tokens.weight", VOCAB, HIDDEN};
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < 4; i++) {
            snprintf(t[n].name, sizeof t[n].name, "model.layers.%d.self_attn.%s.weight", l,
                     attn[i]);
            t[n].rows = HIDDEN;
            t[n++].cols = HIDDEN;
        }
        for (int i = 0; i < 3; i++) {
            snprintf(t[n].name, sizeof t[n].name, "model.layers.%d.mlp.%s.weight", l, mlp[i].name);
            t[n].rows = mlp[i].rows;
            t[n++].cols = mlp[i].cols;
        }
        snprintf(t[n].name, sizeof t[n].name, "model.layers.%d.input_layernorm.weight", l);
        t[n].rows = HIDDEN;
        t[n++].cols = 0;
    }
    t[n++] = (tensor){"model.norm.weight", HIDDEN, 0};
    t[n++] = (tensor){"lm_head.weight", VOCAB, HIDDEN};
    return n;
}

static int64_t bytes_of(const tensor *t)
{
    return t->rows * (t->cols ? t->cols : 1) * 2;
}

static bool write_all(int fd, const void *p, size_t n, off_t at)
{
    return pwrite(fd, p, n, at) == (ssize_t)n;
}

/* Shard s of the tensors [first, last): header, then the data (sparse but for layer 0's
 * attention). */
static bool write_shard(const char *dir, int s, const tensor *t, size_t first, size_t last,
                        json_t *weight_map, int64_t *total)
{
    char file[64], path[512];
    snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, SHARDS);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_t *h = json_object();
    int64_t at = 0;
    for (size_t i = first; i < last; i++) {
        json_t *shape = t[i].cols ? json_pack("[I,I]", (json_int_t)t[i].rows, (json_int_t)t[i].cols)
                                  : json_pack("[I]", (json_int_t)t[i].rows);
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "BF16", "shape", shape,
                                      "data_offsets", (json_int_t)at,
                                      (json_int_t)(at + bytes_of(&t[i]))));
        json_object_set_new(weight_map, t[i].name, json_string(file));
        at += bytes_of(&t[i]);
    }
    char *text = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hlen = (strlen(text) + 7) / 8 * 8;
    char *header = malloc(hlen);
    memset(header, ' ', hlen);
    memcpy(header, text, strlen(text));
    free(text);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    bool ok = fd >= 0 && write_all(fd, len8, 8, 0) && write_all(fd, header, hlen, 8) &&
              ftruncate(fd, (off_t)(8 + hlen) + at) == 0;
    /* Layer 0's attention gets values: a bf16 pattern of small numbers. */
    uint16_t *row = malloc(HIDDEN * sizeof *row);
    for (int c = 0; c < HIDDEN; c++)
        row[c] = (uint16_t)(0x3c00 + (c % 64)); /* ~0.0078 .. 0.015 */
    int64_t off = 0;
    for (size_t i = first; ok && i < last; i++) {
        if (strstr(t[i].name, "layers.0.self_attn."))
            for (int64_t r = 0; ok && r < t[i].rows; r++)
                ok = write_all(fd, row, HIDDEN * sizeof *row,
                               (off_t)(8 + hlen) + off + r * HIDDEN * 2);
        off += bytes_of(&t[i]);
    }
    free(row);
    free(header);
    if (fd >= 0)
        close(fd);
    *total += at;
    return ok;
}

static bool generate(const char *dir, int64_t *total)
{
    tensor *t = calloc(LAYERS * 8 + 3, sizeof *t);
    size_t n = tensor_list(t);
    int64_t all = 0;
    for (size_t i = 0; i < n; i++)
        all += bytes_of(&t[i]);
    json_t *map = json_object();
    size_t first = 0;
    bool ok = true;
    *total = 0;
    for (int s = 0; s < SHARDS && ok; s++) { /* about a quarter of the bytes each */
        size_t last = first;
        int64_t acc = 0;
        while (last < n && (s == SHARDS - 1 || acc < all / SHARDS))
            acc += bytes_of(&t[last++]);
        ok = write_shard(dir, s, t, first, last, map, total);
        first = last;
    }
    json_t *index =
        json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)*total, "weight_map", map);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    ok = ok && json_dump_file(index, path, JSON_INDENT(1)) == 0;
    json_decref(index);
    json_t *cfg = json_pack(
        "{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:{s:s,s:f}}", "model_type", "llama", "hidden_size",
        HIDDEN, "num_attention_heads", HEADS, "num_key_value_heads", HEADS, "num_hidden_layers",
        LAYERS, "intermediate_size", MLP, "vocab_size", VOCAB, "max_position_embeddings", 4096,
        "rope_parameters", "rope_type", "default", "rope_theta", 10000.0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ok = ok && json_dump_file(cfg, path, JSON_INDENT(1)) == 0;
    json_decref(cfg);
    free(t);
    return ok;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Starts the daemon with `args`; its start-up time and RSS (MiB), or false. */
static bool measure(const char *const *args, double *ms, double *rss_mib)
{
    daemon_proc d;
    double t0 = now_ms();
    if (daemon_start(&d, args) != 0)
        return false;
    *ms = now_ms() - t0;
    long kib = daemon_rss_kib(&d);
    *rss_mib = (double)kib / 1024.0;
    return daemon_stop(&d) == 0 && kib > 0;
}

int main(void)
{
    char dir[] = "/tmp/attnd_bench_ckpt_XXXXXX", model[128], cmd[160];
    int64_t total = 0;
    if (!mkdtemp(dir) || !generate(dir, &total)) {
        printf("bench_checkpoint: cannot generate the checkpoint in /tmp\n");
        return 1;
    }
    snprintf(model, sizeof model, "m=%s:layer=0", dir);
    const char *with[] = {"--model", model, "--threads", "2", NULL};
    const char *without[] = {"--threads", "2", NULL};
    double ms = 0, rss = 0, base_ms = 0, base_rss = 0;
    bool ok = measure(without, &base_ms, &base_rss) && measure(with, &ms, &rss);
    double attn_mib = 4.0 * HIDDEN * HIDDEN * 2 / (1024.0 * 1024.0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (getenv("ATTND_BENCH_KEEP"))
        printf("kept %s\n", dir);
    else if (system(cmd) != 0)
        printf("bench_checkpoint: could not remove %s\n", dir);
    if (!ok) {
        printf("bench_checkpoint: the daemon did not start with the checkpoint\n");
        return 1;
    }
    printf("checkpoint layer 0 of %d layers, %.2f GiB in %d bf16 shards: start-up %.0f ms "
           "(%.0f ms without it), RSS %.1f MiB (%.1f MiB without it) for %.1f MiB of attention "
           "weights: %s the weights + 64 MiB\n",
           LAYERS, (double)total / (1024.0 * 1024.0 * 1024.0), SHARDS, ms, base_ms, rss, base_rss,
           attn_mib, rss <= attn_mib + 64.0 ? "within" : "OVER");
    return rss <= attn_mib + 64.0 ? 0 : 1;
}
