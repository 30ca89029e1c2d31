/*
 * hf_case.h - the reference cases of tests/api/hf/cases (cases/README.md): one layer's
 * attention input and output as transformers computed them in the model's own forward pass,
 * read from <dir>/<family>/attnd_case.json.
 *
 *     hf_case c;
 *     if (hf_case_load("tests/api/hf/cases", "llama", &c)) {
 *         ... c.input [c.L, c.E], c.output [c.L, c.E] of layer c.layer ...
 *         hf_case_free(&c);
 *     }
 */
#ifndef ATTND_TESTS_SUPPORT_HF_CASE_H
#define ATTND_TESTS_SUPPORT_HF_CASE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t layer, L, E;
    float *input, *output; /* [L, E] each */
} hf_case;

/* The case of `family` under `dir`; false (nothing to free) when it cannot be read. */
bool hf_case_load(const char *dir, const char *family, hf_case *c);
void hf_case_free(hf_case *c);

#endif
