/*
 * models.h - what the registry of named models (api_models, api.h) checks of a name.
 */
#ifndef ATTND_API_MODELS_MODELS_H
#define ATTND_API_MODELS_MODELS_H

#include <stdbool.h>

#define API_MODEL_NAME_MAX 63

/* The most layers a model may have (a checkpoint's num_hidden_layers), and so the most caches a
 * session may hold. */
#define API_MODEL_LAYERS_MAX ((int64_t)1 << 20)

/* [A-Za-z0-9_.-], 1 to API_MODEL_NAME_MAX bytes. */
bool api__model_name_ok(const char *name);

#endif
