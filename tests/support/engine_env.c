/* engine_env.c - the engine's options from ATTND_KERNELS and ATTND_BF16 (see engine_env.h). */
#include "engine_env.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define OPTION_NAME(value, name) name,
static const char *const kernel_names[ENG_KERNEL_CHOICE_COUNT] = {
    ENG_KERNEL_CHOICE_LIST(OPTION_NAME)};
static const char *const bf16_names[ENG_BF16_PATH_COUNT] = {ENG_BF16_PATH_LIST(OPTION_NAME)};
#undef OPTION_NAME

/* The index of variable `var`'s value among `names` (0, auto, when unset or empty); false, with
 * `why` naming the variable and its values, when it is none of them. */
static bool read_choice(const char *var, const char *const *names, int n, int *out, char *why,
                        size_t len)
{
    const char *v = getenv(var);
    *out = 0;
    if (!v || !v[0])
        return true;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return true;
        }
    int at = snprintf(why, len, "%s=%s is none of", var, v);
    for (int i = 0; i < n && at >= 0 && (size_t)at < len; i++)
        at += snprintf(why + at, len - (size_t)at, " %s", names[i]);
    return false;
}

test_engine_state test_engine_init(char *why, size_t len)
{
    int kernels, bf16;
    if (!read_choice("ATTND_KERNELS", kernel_names, ENG_KERNEL_CHOICE_COUNT, &kernels, why, len) ||
        !read_choice("ATTND_BF16", bf16_names, ENG_BF16_PATH_COUNT, &bf16, why, len))
        return TEST_ENGINE_BAD;
    eng_options opts = {(eng_kernel_choice)kernels, (eng_bf16_path)bf16};
    eng_error err;
    if (eng_init(&opts, &err) == ENG_OK)
        return TEST_ENGINE_READY;
    snprintf(why, len, "ATTND_KERNELS=%s: %s", kernel_names[kernels], err.message);
    /* The names were checked above: what eng_init refuses is a set this CPU cannot run. */
    return TEST_ENGINE_UNSUPPORTED;
}
