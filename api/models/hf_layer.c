/*
 * hf_layer.c - one layer's attention tensors of a checkpoint, each in its role and laid out as
 * eng_layer_decoder takes them (eng_layer_weights).
 *
 * Separate projections are used where they lie in the mapped shard. Fused ones are split:
 * [q; k; v] rows (Phi-3's qkv_proj, Falcon's multi-query query_key_value) by pointer; groups
 * of (q heads, k head, v head) rows (GPT-NeoX, Falcon) and GPT-2's Conv1D (stored [in, out])
 * through a copy in the engine's order. Every tensor's shape is checked here against the
 * config, so that a failure names the checkpoint's tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/models/hf.h"

#define MAX_REFS 16

typedef struct {
    const hf_config *c;
    hf_files *files;
    char prefix[96];
    eng_layer_weights w;
    char names[MAX_REFS][160]; /* checkpoint names of the weights: their labels */
    size_t n;
    void *copies[MAX_REFS]; /* buffers of rearranged tensors, freed at the end */
    size_t n_copies;
} gather;

static size_t elem_size(eng_dtype dt)
{
    return dt == ENG_DTYPE_F32 ? 4 : 2;
}

/* Tensor `stem` + `suffix` of the layer into *t (NULL: only whether it is there); absent: 0
 * (or a failure when `required`). */
static int find(gather *g, const char *stem, const char *suffix, bool required, eng_weight *t,
                char *full, size_t full_len, hf_error *e)
{
    snprintf(full, full_len, "%s%s%s", g->prefix, stem, suffix);
    int rc = api__hf_files_tensor(g->files, full, t, e);
    if (rc == 0 && required)
        return api__hf_fail(e, full, "the checkpoint has no tensor '%s' (layer %lld of %s)", full,
                            (long long)g->c->layer, g->c->family->model_type);
    return rc;
}

static int expect_shape(const eng_weight *t, const char *full, int rank, int64_t d0, int64_t d1,
                        hf_error *e)
{
    bool ok = t->rank == rank && t->shape[0] == d0 && (rank == 1 || t->shape[1] == d1);
    if (ok)
        return 0;
    char want[64];
    if (rank == 1)
        snprintf(want, sizeof want, "[%lld]", (long long)d0);
    else
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
    char have[64] = "[";
    for (int d = 0; d < t->rank && d < 4; d++)
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
                 (long long)t->shape[d]);
    snprintf(have + strlen(have), sizeof have - strlen(have), "]");
    return api__hf_fail(e, full, "tensor '%s' has shape %s; the config makes it %s", full, have,
                        want);
}

/* Gives `t` the role `slot` (a field of g->w), labelled with its checkpoint name. */
static int add_ref(gather *g, eng_weight *slot, eng_weight t, const char *full)
{
    snprintf(g->names[g->n], sizeof g->names[0], "%s", full);
    t.label = g->names[g->n++];
    *slot = t;
    return 0;
}

static void *keep_copy(gather *g, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        g->copies[g->n_copies++] = p;
    return p;
}

/* A weight ([rows, E]) or bias ([rows]) with rows at byte `offset` of `t`. */
static eng_weight slice(const eng_weight *t, int64_t first_row, int64_t rows, int64_t cols)
{
    eng_weight s = *t;
    s.data = (const unsigned char *)t->data + (size_t)(first_row * cols) * elem_size(t->dtype);
    s.rank = cols > 1 || t->rank == 2 ? 2 : 1;
    s.shape[0] = rows;
    s.shape[1] = s.rank == 2 ? cols : 0;
    return s;
}

/* The fused q/k/v tensor's rows in [q; k; v] order: grouped rows reordered, Conv1D transposed;
 * `cols` is 1 for a bias. */
static int reorder(gather *g, const eng_weight *t, int64_t cols, hf_qkv qkv, eng_weight *out,
                   hf_error *e)
{
    const hf_config *c = g->c;
    int64_t D = c->D, rows = c->H * D + 2 * c->Hkv * D;
    size_t es = elem_size(t->dtype), row_bytes = (size_t)cols * es;
    unsigned char *dst = keep_copy(g, (size_t)rows * row_bytes);
    const unsigned char *src = t->data;
    if (!dst)
        return api__hf_fail(e, "", "out of memory");
    *out = *t;
    out->data = dst;
    out->rank = cols > 1 ? 2 : 1;
    out->shape[0] = rows;
    out->shape[1] = cols > 1 ? cols : 0;
    if (qkv == HF_QKV_CONV1D) {
        if (cols == 1) {
            memcpy(dst, src, (size_t)rows * es);
            return 0;
        }
        for (int64_t r = 0; r < rows; r++) /* stored [cols (in), rows (out)] */
            for (int64_t k = 0; k < cols; k++)
                memcpy(dst + (size_t)(r * cols + k) * es, src + (size_t)(k * rows + r) * es, es);
        return 0;
    }
    /* Groups of (per q heads, one k, one v) heads of D rows each. */
    int64_t per = c->H / c->groups, kv_per_group = c->Hkv / c->groups;
    int64_t group_rows = (per + 2 * kv_per_group) * D;
    for (int64_t gi = 0; gi < c->groups; gi++) {
        const unsigned char *in = src + (size_t)(gi * group_rows) * row_bytes;
        size_t q_at = (size_t)(gi * per * D), k_at = (size_t)(c->H * D + gi * kv_per_group * D);
        size_t v_at = k_at + (size_t)(c->Hkv * D);
        memcpy(dst + q_at * row_bytes, in, (size_t)(per * D) * row_bytes);
        memcpy(dst + k_at * row_bytes, in + (size_t)(per * D) * row_bytes,
               (size_t)(kv_per_group * D) * row_bytes);
        memcpy(dst + v_at * row_bytes, in + (size_t)((per + kv_per_group) * D) * row_bytes,
               (size_t)(kv_per_group * D) * row_bytes);
    }
    return 0;
}

/* The fused tensor `suffix` (".weight" or ".bias") split into q, k and v refs. */
static int fused(gather *g, const char *suffix, hf_error *e)
{
    const hf_config *c = g->c;
    bool weight = strcmp(suffix, ".weight") == 0;
    int64_t E = c->E, Q = c->H * c->D, W = c->Hkv * c->D, rows = Q + 2 * W;
    eng_weight t;
    char full[160];
    if (find(g, c->family->q, suffix, true, &t, full, sizeof full, e) != 1)
        return -1;
    bool conv = c->qkv == HF_QKV_CONV1D;
    if (expect_shape(&t, full, weight ? 2 : 1, weight && conv ? E : rows, weight && conv ? rows : E,
                     e))
        return -1;
    eng_weight ordered = t;
    int64_t cols = weight ? E : 1;
    if (c->qkv != HF_QKV_SPLIT && reorder(g, &t, cols, c->qkv, &ordered, e) != 0)
        return -1;
    eng_weight *w_roles[3] = {&g->w.q_w, &g->w.k_w, &g->w.v_w};
    eng_weight *b_roles[3] = {&g->w.q_b, &g->w.k_b, &g->w.v_b};
    int64_t first[3] = {0, Q, Q + W}, count[3] = {Q, W, W};
    for (int i = 0; i < 3; i++) {
        eng_weight s = slice(&ordered, first[i], count[i], cols);
        if (!weight) {
            s.rank = 1;
            s.shape[1] = 0;
        }
        add_ref(g, weight ? w_roles[i] : b_roles[i], s, full);
    }
    return 0;
}

static int separate(gather *g, hf_error *e)
{
    const hf_config *c = g->c;
    int64_t E = c->E, W = c->Hkv * c->D;
    const char *stems[3] = {c->family->q, c->family->k, c->family->v};
    eng_weight *w_roles[3] = {&g->w.q_w, &g->w.k_w, &g->w.v_w};
    eng_weight *b_roles[3] = {&g->w.q_b, &g->w.k_b, &g->w.v_b};
    int64_t rows[3] = {c->H * c->D, W, W};
    for (int i = 0; i < 3; i++) {
        eng_weight t;
        char full[160];
        if (find(g, stems[i], ".weight", true, &t, full, sizeof full, e) != 1 ||
            expect_shape(&t, full, 2, rows[i], E, e))
            return -1;
        add_ref(g, w_roles[i], t, full);
        if (!c->bias_qkv)
            continue;
        if (find(g, stems[i], ".bias", true, &t, full, sizeof full, e) != 1 ||
            expect_shape(&t, full, 1, rows[i], 0, e))
            return -1;
        add_ref(g, b_roles[i], t, full);
    }
    return 0;
}

static int output(gather *g, hf_error *e)
{
    const hf_config *c = g->c;
    eng_weight t;
    char full[160];
    if (find(g, c->family->o, ".weight", true, &t, full, sizeof full, e) != 1 ||
        expect_shape(&t, full, 2, c->E, c->H * c->D, e))
        return -1;
    if (c->qkv == HF_QKV_CONV1D) { /* Conv1D: [in, out] (square: GPT-2's heads split E) */
        size_t es = elem_size(t.dtype);
        unsigned char *dst = keep_copy(g, (size_t)(c->E * c->E) * es);
        const unsigned char *src = t.data;
        if (!dst)
            return api__hf_fail(e, "", "out of memory");
        for (int64_t r = 0; r < c->E; r++)
            for (int64_t k = 0; k < c->E; k++)
                memcpy(dst + (size_t)(r * c->E + k) * es, src + (size_t)(k * c->E + r) * es, es);
        t.data = dst;
    }
    add_ref(g, &g->w.o_w, t, full);
    if (!c->bias_o)
        return 0;
    if (find(g, c->family->o, ".bias", true, &t, full, sizeof full, e) != 1 ||
        expect_shape(&t, full, 1, c->E, 0, e))
        return -1;
    return add_ref(g, &g->w.o_b, t, full);
}

/* StableLM's per-head norms (q_layernorm.norms.{h}.weight, [D] each) as one [heads D]. */
static int per_head_norm(gather *g, const char *stem, int64_t heads, eng_weight *role, hf_error *e)
{
    int64_t D = g->c->D;
    unsigned char *dst = NULL;
    eng_weight joined;
    char full[160];
    memset(&joined, 0, sizeof joined);
    for (int64_t h = 0; h < heads; h++) {
        char suffix[48];
        eng_weight t;
        snprintf(suffix, sizeof suffix, ".norms.%lld.weight", (long long)h);
        if (find(g, stem, suffix, true, &t, full, sizeof full, e) != 1 ||
            expect_shape(&t, full, 1, D, 0, e))
            return -1;
        if (h == 0) {
            joined = t;
            joined.shape[0] = heads * D;
            if (!(dst = keep_copy(g, (size_t)(heads * D) * elem_size(t.dtype))))
                return api__hf_fail(e, "", "out of memory");
            joined.data = dst;
        }
        if (t.dtype != joined.dtype)
            return api__hf_fail(e, full, "tensor '%s' has another dtype than the first head's",
                                full);
        memcpy(dst + (size_t)(h * D) * elem_size(t.dtype), t.data, (size_t)D * elem_size(t.dtype));
    }
    return add_ref(g, role, joined, full);
}

static int norms(gather *g, hf_error *e)
{
    const hf_config *c = g->c;
    if (c->spec.qk_norm == ENG_QK_NORM_NONE)
        return 0;
    if (c->qk_norm_per_head_tensors)
        return per_head_norm(g, c->family->norm_q, c->H, &g->w.q_norm_w, e) ||
                       per_head_norm(g, c->family->norm_k, c->Hkv, &g->w.k_norm_w, e)
                   ? -1
                   : 0;
    const char *stems[2] = {c->family->norm_q, c->family->norm_k};
    eng_weight *w_roles[2] = {&g->w.q_norm_w, &g->w.k_norm_w};
    eng_weight *b_roles[2] = {&g->w.q_norm_b, &g->w.k_norm_b};
    int64_t widths[2] = {c->H * c->D, c->Hkv * c->D};
    for (int i = 0; i < 2; i++) {
        eng_weight t;
        char full[160];
        int64_t want = c->spec.qk_norm_whole ? widths[i] : c->D;
        if (find(g, stems[i], ".weight", true, &t, full, sizeof full, e) != 1 ||
            expect_shape(&t, full, 1, want, 0, e))
            return -1;
        add_ref(g, w_roles[i], t, full);
        if (c->spec.qk_norm != ENG_QK_NORM_LAYER)
            continue;
        int rc = find(g, stems[i], ".bias", false, &t, full, sizeof full, e);
        if (rc < 0 || (rc == 1 && expect_shape(&t, full, 1, want, 0, e)))
            return -1;
        if (rc == 1)
            add_ref(g, b_roles[i], t, full);
    }
    return 0;
}

static int sinks(gather *g, hf_error *e)
{
    eng_weight t;
    char full[160];
    if (!g->c->sinks)
        return 0;
    if (find(g, "sinks", "", true, &t, full, sizeof full, e) != 1 ||
        expect_shape(&t, full, 1, g->c->H, 0, e))
        return -1;
    return add_ref(g, &g->w.sinks, t, full);
}

/* A family's prefix template with the layer index in place of its "%lld". */
static void expand_prefix(const char *tmpl, int64_t layer, char *out, size_t n)
{
    const char *at = strstr(tmpl, "%lld");
    if (!at) {
        snprintf(out, n, "%s", tmpl);
        return;
    }
    snprintf(out, n, "%.*s%lld%s", (int)(at - tmpl), tmpl, (long long)layer, at + 4);
}

/* The prefix under which the layer's output projection lies (families have one or two). */
static int choose_prefix(gather *g, hf_error *e)
{
    const hf_family *f = g->c->family;
    for (int i = 0; i < 2 && f->prefix[i]; i++) {
        expand_prefix(f->prefix[i], g->c->layer, g->prefix, sizeof g->prefix);
        char full[160];
        int rc = find(g, f->o, ".weight", false, NULL, full, sizeof full, e);
        if (rc != 0)
            return rc < 0 ? -1 : 0;
    }
    expand_prefix(f->prefix[0], g->c->layer, g->prefix, sizeof g->prefix);
    return api__hf_fail(e, "", "the checkpoint has no tensor '%s%s.weight' (layer %lld of %s)",
                        g->prefix, f->o, (long long)g->c->layer, f->model_type);
}

/* The layer of a checkpoint: api__hf_config_read, then its tensors from `files`, each given to
 * the engine in its role (eng_layer_weights). */
static eng_layer *layer_build(const char *name, const hf_config *c, hf_files *files, hf_error *e)
{
    gather *g = calloc(1, sizeof *g);
    eng_layer *l = NULL;
    if (!g) {
        api__hf_fail(e, "", "out of memory");
        return NULL;
    }
    g->c = c;
    g->files = files;
    int rc = choose_prefix(g, e);
    if (rc == 0 && c->qkv == HF_QKV_SEPARATE)
        rc = separate(g, e);
    else if (rc == 0)
        rc = fused(g, ".weight", e) || (c->bias_qkv && fused(g, ".bias", e)) ? -1 : 0;
    if (rc == 0 && (output(g, e) || norms(g, e) || sinks(g, e)))
        rc = -1;
    if (rc == 0) {
        eng_error err;
        memset(&err, 0, sizeof err);
        l = eng_layer_decoder(name, &g->w, c->H, c->Hkv, &c->spec, &err);
        if (!l) {
            /* The engine names a weight by its label, cut to its field's size: name it whole. */
            const char *field = err.field;
            for (size_t i = 0; i < g->n && field[0]; i++)
                if (strncmp(g->names[i], err.field, strlen(err.field)) == 0)
                    field = g->names[i];
            api__hf_fail(e, field, "%s (%s)", err.message, field);
        }
    }
    for (size_t i = 0; i < g->n_copies; i++)
        free(g->copies[i]);
    free(g);
    return l;
}

#define MAX_CONFIG_BYTES ((size_t)16 << 20)

/* config.json of `dir`, parsed. */
static json_t *read_config(const char *dir, hf_error *e)
{
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    FILE *fp = path ? fopen((snprintf(path, n, "%s/config.json", dir), path), "rb") : NULL;
    json_t *cfg = NULL;
    if (!fp) {
        api__hf_fail(e, "config.json", "%.200s: no config.json (a checkpoint directory has one)",
                     dir);
    } else {
        json_error_t je;
        cfg = json_loadf(fp, JSON_REJECT_DUPLICATES, &je);
        if (!cfg)
            api__hf_fail(e, "config.json", "%.200s is not JSON: line %d: %.120s", path, je.line,
                         je.text);
        else if (je.position > (int)MAX_CONFIG_BYTES || !json_is_object(cfg)) {
            api__hf_fail(e, "config.json", "%.200s is not a JSON object (of at most 16 MiB)", path);
            json_decref(cfg);
            cfg = NULL;
        }
        fclose(fp);
    }
    free(path);
    return cfg;
}

/* A load: the checkpoint, its layers asked for, and what comes back. */
typedef struct {
    const char *name, *dir;
    int64_t first; /* < 0: 0 */
    bool all;      /* every layer from `first` on; else `first` alone */
    eng_layer **layers;
    int64_t n;
    size_t bytes_read;
    api_model_about about;
} hf_load;

/* Builds ld's layers from the parsed config and the open files; -1 with `e` filled (and every
 * layer made so far freed) when one cannot be. */
static int layers_build(hf_load *ld, const json_t *cfg, hf_files *files, hf_error *e)
{
    hf_config *c = malloc(sizeof *c);
    if (!c)
        return api__hf_fail(e, "", "out of memory");
    int rc = api__hf_config_read(cfg, ld->first, c, e);
    int64_t count = rc == 0 && ld->all ? c->layers - c->layer : 1;
    ld->layers = rc == 0 ? calloc((size_t)count, sizeof *ld->layers) : NULL;
    if (rc == 0 && !ld->layers)
        rc = api__hf_fail(e, "", "out of memory");
    if (rc == 0) {
        snprintf(ld->about.family, sizeof ld->about.family, "%s", c->family->model_type);
        ld->about.layer = c->layer;
    }
    for (int64_t i = 0; rc == 0 && i < count; i++) {
        if (i > 0)
            rc = api__hf_config_read(cfg, ld->about.layer + i, c, e);
        if (rc == 0 && !(ld->layers[i] = layer_build(ld->name, c, files, e)))
            rc = -1;
        ld->n = rc == 0 ? i + 1 : ld->n;
    }
    if (rc != 0) {
        for (int64_t i = 0; i < ld->n; i++)
            eng_layer_free(ld->layers[i]);
        free(ld->layers);
        ld->layers = NULL;
        ld->n = 0;
    }
    free(c);
    return rc;
}

/* Reads the checkpoint's config and files and builds ld's layers; false with `err` filled. */
static bool checkpoint_read(hf_load *ld, char *err, size_t errlen)
{
    hf_error e;
    memset(&e, 0, sizeof e);
    json_t *cfg = read_config(ld->dir, &e);
    hf_files *files = cfg ? api__hf_files_open(ld->dir, &e) : NULL;
    bool ok = files && layers_build(ld, cfg, files, &e) == 0;
    ld->bytes_read = files ? api__hf_files_bytes_read(files) : 0;
    api__hf_files_close(files);
    json_decref(cfg);
    if (!ok)
        snprintf(err, errlen, "%s: %s%s%s", ld->dir, e.message, e.field[0] ? " [field: " : "",
                 e.field[0] ? e.field : "");
    if (!ok && e.field[0] && errlen > 1)
        snprintf(err + strlen(err), errlen - strlen(err), "]");
    return ok;
}

eng_layer *api_checkpoint_load(const char *name, const char *dir, int64_t layer, size_t *bytes_read,
                               char *err, size_t errlen)
{
    hf_load ld = {.name = name, .dir = dir, .first = layer};
    bool ok = checkpoint_read(&ld, err, errlen);
    eng_layer *l = ok ? ld.layers[0] : NULL;
    free(ld.layers);
    if (bytes_read)
        *bytes_read = ld.bytes_read;
    return l;
}

eng_layer **api__checkpoint_layers(const char *name, const char *dir, int64_t layer, int64_t *n,
                                   api_model_about *about, char *err, size_t errlen)
{
    hf_load ld = {.name = name, .dir = dir, .first = layer, .all = layer < 0};
    bool ok = checkpoint_read(&ld, err, errlen);
    *n = ld.n;
    if (ok)
        *about = ld.about;
    return ld.layers;
}
