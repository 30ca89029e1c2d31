/*
 * hf_case.c - reading tests/api/hf's reference cases (hf_case.h).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/hf_case.h"

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

void hf_case_free(hf_case *c)
{
    free(c->input);
    free(c->output);
    c->input = c->output = NULL;
}
