/*
 * hf_case.c - tests/api/hf's reference cases read, served and measured against (hf_case.h).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/hf_case.h"

#include "tests/support/check.h"

const char *const hf_families[HF_FAMILIES] = {
    "llama",    "llama31_scaled", "mistral_window", "qwen2",      "qwen3",
    "gemma2",   "gemma3",         "phi3",           "phi",        "gpt2",
    "gpt_neox", "falcon",         "olmo2",          "starcoder2", "gptj",
    "gpt_oss",  "granite",        "stablelm",
};

const char *hf_cases_dir(void)
{
    const char *dir = getenv("ATTND_HF_CASES");
    return dir ? dir : "tests/api/hf/cases";
}

/* A JSON array of rows as a [*L, *E] float matrix (malloc'd). */
static bool read_matrix(const json_t *m, int64_t *L, int64_t *E, float **out)
{
    *L = (int64_t)json_array_size(m);
    *E = *L ? (int64_t)json_array_size(json_array_get(m, 0)) : 0;
    *out = NULL;
    if (*L == 0 || *E == 0)
        return false;
    *out = calloc((size_t)(*L * *E), sizeof(float));
    if (!*out)
        return false;
    for (int64_t t = 0; t < *L; t++)
        for (int64_t c = 0; c < *E; c++)
            (*out)[t * *E + c] =
                (float)json_number_value(json_array_get(json_array_get(m, (size_t)t), (size_t)c));
    return true;
}

bool hf_case_load(const char *dir, const char *family, hf_case *c)
{
    char path[512];
    int64_t L2 = 0, E2 = 0;
    snprintf(path, sizeof path, "%s/%s/attnd_case.json", dir, family);
    json_t *j = json_load_file(path, 0, NULL);
    c->input = c->output = NULL;
    bool ok = j && read_matrix(json_object_get(j, "input"), &c->L, &c->E, &c->input) &&
              read_matrix(json_object_get(j, "output"), &L2, &E2, &c->output) && L2 == c->L &&
              E2 == c->E;
    c->layer = json_integer_value(json_object_get(j, "layer"));
    json_decref(j);
    if (!ok)
        hf_case_free(c);
    return ok;
}

bool hf_case_read(const char *dir, const char *family, hf_case *c)
{
    bool ok = hf_case_load(dir, family, c);
    CHECKF(ok, "%s/%s: cannot read the case", dir, family);
    return ok;
}

void hf_case_free(hf_case *c)
{
    free(c->input);
    free(c->output);
    c->input = c->output = NULL;
}

bool hf_case_serve(api_models *models, const char *dir, const char *family, const char *name,
                   int64_t layer)
{
    char path[512], err[600];
    snprintf(path, sizeof path, "%s/%s", dir, family);
    api_model_source src = {.name = name, .path = path, .layer = layer};
    const api_model *m = api_models_load(models, &src, err, sizeof err);
    CHECKF(m != NULL, "%s: %s", name, err);
    return m != NULL;
}

char *hf_case_v2_body(const hf_case *c, int64_t t0, int64_t n, const char *params)
{
    size_t cap = (size_t)(n * c->E) * 24 + 512, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b, cap,
                            "{%s%s%s\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\","
                            "\"shape\":[1,%lld,%lld],\"data\":[",
                            params[0] ? "\"parameters\":{" : "", params, params[0] ? "}," : "",
                            (long long)n, (long long)c->E);
    for (int64_t i = 0; i < n * c->E; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s%.9g", i ? "," : "",
                                (double)c->input[t0 * c->E + i]);
    snprintf(b + len, cap - len, "]}]}");
    return b;
}

double hf_case_error(const json_t *data, const hf_case *c, int64_t t0, int64_t n)
{
    if (json_array_size(data) != (size_t)(n * c->E))
        return INFINITY;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < c->L * c->E; i++)
        scale = fmax(scale, fabs((double)c->output[i]));
    for (int64_t i = 0; i < n * c->E; i++)
        worst = fmax(worst, fabs(json_number_value(json_array_get(data, (size_t)i)) -
                                 (double)c->output[t0 * c->E + i]));
    return worst / scale;
}
