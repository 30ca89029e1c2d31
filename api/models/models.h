/*
 * models.h - what the registry of named models (api_models, api.h) checks of a name.
 */
#ifndef ATTND_API_MODELS_MODELS_H
#define ATTND_API_MODELS_MODELS_H

#include <stdbool.h>

#define API_MODEL_NAME_MAX 63

/* [A-Za-z0-9_.-], 1 to API_MODEL_NAME_MAX bytes. */
bool api__model_name_ok(const char *name);

#endif
