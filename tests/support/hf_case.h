/*
 * hf_case.h - the reference cases of tests/api/hf/cases (cases/README.md): one layer's
 * attention input and output as transformers computed them in the model's own forward pass,
 * read from <dir>/<family>/attnd_case.json; and what the hf suites do with them: serve a
 * family's checkpoint as a model, ask it for rows of the case's input, and measure a reply
 * against the case's output.
 *
 *     const char *dir = hf_cases_dir();
 *     hf_case c;
 *     if (hf_case_serve(models, dir, "llama", "llama", -1) && hf_case_read(dir, "llama", &c)) {
 *         char *body = hf_case_v2_body(&c, 0, c.L, "\"layer\":0");
 *         ... POST it to /v2/models/llama/infer; its outputs[0].data is data ...
 *         CHECK(hf_case_error(data, &c, 0, c.L) <= 1e-5);
 *         free(body);
 *         hf_case_free(&c);
 *     }
 */
#ifndef ATTND_TESTS_SUPPORT_HF_CASE_H
#define ATTND_TESTS_SUPPORT_HF_CASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"

/* Every family of tests/api/hf/cases. */
#define HF_FAMILIES 18
extern const char *const hf_families[HF_FAMILIES];

typedef struct {
    int64_t layer, L, E;
    float *input, *output; /* [L, E] each */
} hf_case;

/* The folder of the cases: $ATTND_HF_CASES, else tests/api/hf/cases. */
const char *hf_cases_dir(void);

/* The case of `family` under `dir`; false (nothing to free) when it cannot be read. */
bool hf_case_load(const char *dir, const char *family, hf_case *c);

/* As hf_case_load, a case that cannot be read being a failed check. */
bool hf_case_read(const char *dir, const char *family, hf_case *c);

void hf_case_free(hf_case *c);

/* The checkpoint <dir>/<family> added to `models` as `name` (api_models_load): its layer
 * `layer`, or every layer when layer < 0. False, a failed check naming why, when it is not. */
bool hf_case_serve(api_models *models, const char *dir, const char *family, const char *name,
                   int64_t layer);

/* A KServe v2 inference body of rows [t0, t0 + n) of the case's input as [1, n, E], with
 * `params` (JSON members, or "" for none) as its parameters (malloc'd). */
char *hf_case_v2_body(const hf_case *c, int64_t t0, int64_t n, const char *params);

/* max |got - want| / max |want| of `data`, a JSON array of n * E numbers, against rows
 * [t0, t0 + n) of the case's output; INFINITY when data holds another count. */
double hf_case_error(const json_t *data, const hf_case *c, int64_t t0, int64_t n);

#endif
