/*
 * models.c - the registry of named models (the built-in "demo" and every --model), and loading
 * a --model path: a checkpoint directory (hf_*.c), whose every layer or one makes the model, or
 * one safetensors file (safetensors.c). The replies of GET /v1/models are
 * proto/native_models.c's.
 *
 * The registry is an array in registration order, filled on the main thread at start-up and
 * read-only afterwards, so lookups take no lock. There are a handful of models, so a lookup is
 * a linear scan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api.h"
#include "api/models/hf.h"
#include "api/models/models.h"
#include "api/models/safetensors.h"

/* A model as the registry keeps it: what api_model shows, the layers it owns and its
 * description. Each is its own allocation, so that pointers to it outlive the array's growth. */
typedef struct {
    api_model view;
    eng_layer **owned; /* [view.layers] */
    api_model_about about;
} entry;

struct api_models {
    entry **entries;
    size_t count, cap;
};

bool api__model_name_ok(const char *name)
{
    size_t n = 0;
    for (; name[n]; n++) {
        char c = name[n];
        if (n >= API_MODEL_NAME_MAX)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return n > 0;
}

api_models *api_models_new(void)
{
    api_models *m = calloc(1, sizeof *m);
    char err[128];
    if (!m)
        return NULL;
    if (!api_models_add(m, eng_layer_demo(), err, sizeof err)) {
        api_models_free(m);
        return NULL;
    }
    return m;
}

static void free_layers(eng_layer **layers, int64_t n)
{
    for (int64_t i = 0; layers && i < n; i++)
        eng_layer_free(layers[i]);
    free(layers);
}

void api_models_free(api_models *models)
{
    if (!models)
        return;
    for (size_t i = 0; i < models->count; i++) {
        free_layers(models->entries[i]->owned, models->entries[i]->view.layers);
        free(models->entries[i]);
    }
    free(models->entries);
    free(models);
}

/* Why layers[i] cannot be a layer of the same model as layers[0] (a session keeps one shape
 * of cache for every layer), or NULL. */
static const char *unlike_first(eng_layer *const *layers, int64_t i)
{
    const eng_layer *a = layers[0], *b = layers[i];
    if (a->embed_dim != b->embed_dim || a->kdim != b->kdim || a->vdim != b->vdim)
        return "embed_dim";
    if (a->num_heads != b->num_heads || a->num_kv_heads != b->num_kv_heads)
        return "heads";
    return eng_layer_head_dim(a) != eng_layer_head_dim(b) ? "head_dim" : NULL;
}

/* Whether the n layers `layers` may be registered as one model under their name; false with
 * `err` saying why not. */
static bool model_ok(const api_models *models, eng_layer *const *layers, int64_t n, char *err,
                     size_t errlen)
{
    const char *name = layers[0]->name;
    for (int64_t i = 1; i < n; i++) {
        const char *unlike = unlike_first(layers, i);
        if (unlike) {
            snprintf(err, errlen,
                     "layer %lld differs from layer 0 in its %s, which a model's layers share",
                     (long long)i, unlike);
            return false;
        }
    }
    if (!api__model_name_ok(name)) {
        snprintf(err, errlen,
                 "model name \"%.64s\" is not valid: use 1 to %d characters from [A-Za-z0-9_.-]",
                 name, API_MODEL_NAME_MAX);
        return false;
    }
    if (api_models_find(models, name)) {
        snprintf(err, errlen, "model name \"%s\" is taken (each --model needs its own name)", name);
        return false;
    }
    return true;
}

/* Registers the n layers `layers` (taken over: freed on failure too) as one model named after
 * them, with its description when `about` is given. */
static bool add_model(api_models *models, eng_layer **layers, int64_t n,
                      const api_model_about *about, char *err, size_t errlen)
{
    if (!model_ok(models, layers, n, err, errlen)) {
        free_layers(layers, n);
        return false;
    }
    entry *e = calloc(1, sizeof *e);
    if (e && models->count == models->cap) {
        size_t cap = models->cap ? models->cap * 2 : 4;
        entry **grown = realloc(models->entries, cap * sizeof *grown);
        if (grown) {
            models->entries = grown;
            models->cap = cap;
        }
    }
    if (!e || models->count == models->cap) {
        snprintf(err, errlen, "out of memory");
        free(e);
        free_layers(layers, n);
        return false;
    }
    e->owned = layers;
    e->view = (api_model){layers[0]->name, n, (const eng_layer *const *)layers, NULL};
    if (about) {
        e->about = *about;
        e->view.about = &e->about;
    }
    models->entries[models->count++] = e;
    return true;
}

bool api_models_add(api_models *models, eng_layer *layer, char *err, size_t errlen)
{
    eng_layer **one = layer ? malloc(sizeof *one) : NULL;
    if (!one) {
        eng_layer_free(layer);
        snprintf(err, errlen, "out of memory");
        return false;
    }
    one[0] = layer;
    return add_model(models, one, 1, NULL, err, errlen);
}

/* A --model path's layers: a checkpoint directory's (every one, or src->layer), or a safetensors
 * file's one. */
static eng_layer **load_source(const api_model_source *src, int64_t *n, api_model_about *about,
                               bool *has_about, char *err, size_t errlen)
{
    struct stat st;
    *has_about = false;
    *n = 0;
    if (stat(src->path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        if (src->layer >= 0) {
            snprintf(err, errlen,
                     "%.120s: :layer=%lld applies to a checkpoint directory, not a file", src->path,
                     (long long)src->layer);
            return NULL;
        }
        eng_error e;
        memset(&e, 0, sizeof e);
        eng_layer *l = api__st_layer_load(src->name, src->path, src->heads, src->kv_heads, &e);
        eng_layer **one = l ? malloc(sizeof *one) : NULL;
        if (!one) {
            snprintf(err, errlen, "%s", l ? "out of memory" : e.message);
            eng_layer_free(l);
            return NULL;
        }
        one[0] = l;
        *n = 1;
        return one;
    }
    if (src->heads > 0) {
        snprintf(err, errlen,
                 "%.120s is a checkpoint directory: its heads come from config.json, not :heads=",
                 src->path);
        return NULL;
    }
    eng_layer **layers =
        api__checkpoint_layers(src->name, src->path, src->layer, n, about, err, errlen);
    *has_about = layers != NULL;
    return layers;
}

const api_model *api_models_load(api_models *models, const api_model_source *src, char *err,
                                 size_t errlen)
{
    api_model_about about;
    bool has_about;
    int64_t n;
    memset(&about, 0, sizeof about);
    eng_layer **layers = load_source(src, &n, &about, &has_about, err, errlen);
    if (!layers)
        return NULL;
    char why[256];
    if (!add_model(models, layers, n, has_about ? &about : NULL, why, sizeof why)) {
        snprintf(err, errlen, "%s: %s", src->path, why);
        return NULL;
    }
    return &models->entries[models->count - 1]->view;
}

const api_model *api_models_find(const api_models *models, const char *name)
{
    if (!models || !name)
        return NULL;
    for (size_t i = 0; i < models->count; i++)
        if (strcmp(models->entries[i]->view.name, name) == 0)
            return &models->entries[i]->view;
    return NULL;
}

size_t api_models_count(const api_models *models)
{
    return models ? models->count : 0;
}

const api_model *api_models_at(const api_models *models, size_t i)
{
    return models && i < models->count ? &models->entries[i]->view : NULL;
}

int64_t api_model_params(const api_model *model)
{
    int64_t n = 0;
    for (int64_t i = 0; i < model->layers; i++)
        n += eng_layer_params(model->layer[i]);
    return n;
}

size_t api_model_bytes(const api_model *model)
{
    size_t n = 0;
    for (int64_t i = 0; i < model->layers; i++)
        n += eng_layer_bytes(model->layer[i]);
    return n;
}
