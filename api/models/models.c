/*
 * models.c - the registry of named layers (the built-in "demo" and every --model); the
 * replies of GET /v1/models are proto/native_models.c's.
 *
 * The registry is an array in registration order, filled on the main thread at start-up and
 * read-only afterwards, so lookups take no lock. There are a handful of models, so a lookup is
 * a linear scan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/models/models.h"

struct api_models {
    eng_layer **layers;
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
    free(models);
}

bool api_models_add(api_models *models, eng_layer *layer, char *err, size_t errlen)
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
        if (!p) {
            snprintf(err, errlen, "out of memory");
            eng_layer_free(layer);
            return false;
        }
        models->layers = p;
        models->cap = cap;
    }
    models->layers[models->count++] = layer;
    return true;
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
