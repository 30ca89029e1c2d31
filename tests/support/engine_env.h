/*
 * engine_env.h - the engine's options for a test or benchmark process, from the variables the
 * Makefile and the scripts set for it: ATTND_KERNELS and ATTND_BF16, with the names and values
 * the daemon takes (server/config.c). The engine reads no environment; a test process reads
 * these two here, once, at the start of its main:
 *
 *     char why[320];
 *     if (test_engine_init(why, sizeof why) != TEST_ENGINE_READY) {
 *         printf("%s\n", why);
 *         return 2;
 *     }
 */
#ifndef ATTND_TESTS_ENGINE_ENV_H
#define ATTND_TESTS_ENGINE_ENV_H

#include <stddef.h>

typedef enum {
    TEST_ENGINE_READY,       /* eng_init took the options */
    TEST_ENGINE_UNSUPPORTED, /* this CPU or OS cannot run the kernel set ATTND_KERNELS names */
    TEST_ENGINE_BAD,         /* a variable holds a value that is none of its names */
} test_engine_state;

/* Reads ATTND_KERNELS and ATTND_BF16 (unset or empty: auto) and passes them to eng_init. On
 * anything but TEST_ENGINE_READY, `why` (len bytes) says what, naming the variable, and the
 * engine keeps the options it had. */
test_engine_state test_engine_init(char *why, size_t len);

#endif
