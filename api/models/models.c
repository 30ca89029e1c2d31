/*
 * models.c - the registry of named layers (the built-in "demo" and every --model), and loading
 * a --model path: a checkpoint directory (hf_*.c) or one safetensors file (safetensors.c). The
 * replies of GET /v1/models are proto/native_models.c's.
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

struct api_models {
    eng_layer **layers;
    api_model_about *abouts; /* abouts[i] describes layers[i] when has_about[i] */
    bool *has_about;
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

void api_models_free(api_models *models)
{
    if (!models)
        return;
    for (size_t i = 0; i < models->count; i++)
        eng_layer_free(models->layers[i]);
    free(models->layers);
    free(models->abouts);
    free(models->has_about);
    free(models);
}

/* api_models_add, with the layer's description when `about` is given. */
static bool add_layer(api_models *models, eng_layer *layer, const api_model_about *about, char *err,
                      size_t errlen)
{
    if (!layer) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    if (!api__model_name_ok(layer->name)) {
        snprintf(err, errlen,
                 "model name \"%.64s\" is not valid: use 1 to %d characters from [A-Za-z0-9_.-]",
                 layer->name, API_MODEL_NAME_MAX);
        eng_layer_free(layer);
        return false;
    }
    if (api_models_find(models, layer->name)) {
        snprintf(err, errlen, "model name \"%s\" is taken (each --model needs its own name)",
                 layer->name);
        eng_layer_free(layer);
        return false;
    }
    if (models->count == models->cap) {
        size_t cap = models->cap ? models->cap * 2 : 4;
        eng_layer **p = realloc(models->layers, cap * sizeof *p);
        if (p)
            models->layers = p;
        api_model_about *a = p ? realloc(models->abouts, cap * sizeof *a) : NULL;
        if (a)
            models->abouts = a;
        bool *h = a ? realloc(models->has_about, cap * sizeof *h) : NULL;
        if (!h) {
            snprintf(err, errlen, "out of memory");
            eng_layer_free(layer);
            return false;
        }
        models->has_about = h;
        models->cap = cap;
    }
    models->has_about[models->count] = about != NULL;
    if (about)
        models->abouts[models->count] = *about;
    models->layers[models->count++] = layer;
    return true;
}

bool api_models_add(api_models *models, eng_layer *layer, char *err, size_t errlen)
{
    return add_layer(models, layer, NULL, err, errlen);
}

const api_model_about *api_models_about(const api_models *models, const eng_layer *layer)
{
    for (size_t i = 0; models && i < models->count; i++)
        if (models->layers[i] == layer)
            return models->has_about[i] ? &models->abouts[i] : NULL;
    return NULL;
}

/* A --model path's layer: a checkpoint directory's, or a safetensors file's. */
static eng_layer *load_source(const api_model_source *src, api_model_about *about, bool *has_about,
                              char *err, size_t errlen)
{
    struct stat st;
    *has_about = false;
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
        if (!l)
            snprintf(err, errlen, "%s", e.message);
        return l;
    }
    if (src->heads > 0) {
        snprintf(err, errlen,
                 "%.120s is a checkpoint directory: its heads come from config.json, not :heads=",
                 src->path);
        return NULL;
    }
    eng_layer *l = api__checkpoint_load(src->name, src->path, src->layer > 0 ? src->layer : 0, NULL,
                                        about, err, errlen);
    *has_about = l != NULL;
    return l;
}

const eng_layer *api_models_load(api_models *models, const api_model_source *src, char *err,
                                 size_t errlen)
{
    api_model_about about;
    bool has_about;
    memset(&about, 0, sizeof about);
    eng_layer *l = load_source(src, &about, &has_about, err, errlen);
    if (!l)
        return NULL;
    char why[256];
    if (!add_layer(models, l, has_about ? &about : NULL, why, sizeof why)) {
        snprintf(err, errlen, "%s: %s", src->path, why);
        return NULL;
    }
    return l;
}

const eng_layer *api_models_find(const api_models *models, const char *name)
{
    if (!models || !name)
        return NULL;
    for (size_t i = 0; i < models->count; i++)
        if (strcmp(models->layers[i]->name, name) == 0)
            return models->layers[i];
    return NULL;
}

size_t api_models_count(const api_models *models)
{
    return models ? models->count : 0;
}

const eng_layer *api_models_at(const api_models *models, size_t i)
{
    return models && i < models->count ? models->layers[i] : NULL;
}

/* ---- Replies ------------------------------------------------------------------------------ */
