/*
 * rng.h - the one random generator of attnd's tests: splitmix64 over a caller-held state, so
 * that every run sees the same cases and each thread or case can own its own sequence.
 *
 *     uint64_t rng = 42;                  // the seed; any value, 0 included
 *     float x = rng_sym(&rng, 1.0);       // uniform in [-1, 1)
 *     int64_t n = rng_int(&rng, 1, 6);    // uniform integer in [1, 6]
 *     rng_fill(&rng, buf, 64, 0.5);       // buf[0..64) uniform in [-0.5, 0.5)
 *
 * Test files outside tests/support must not carry a generator of their own (an LCG, xorshift,
 * the C library's): tests/check_rng.sh fails the build when one appears. The functions keep no
 * global state, so they are safe from any thread as long as each thread has its own state.
 */
#ifndef ATTND_TESTS_RNG_H
#define ATTND_TESTS_RNG_H

#include <stddef.h>
#include <stdint.h>

/* The next 64 random bits of the splitmix64 sequence whose state is *s. */
uint64_t rng_next(uint64_t *s);

/* The next 32 random bits (the high half of rng_next). */
uint32_t rng_u32(uint64_t *s);

/* Uniform in [0, 1), 53 bits. */
double rng_unit(uint64_t *s);

/* Uniform in [-amp, amp). */
float rng_sym(uint64_t *s, double amp);

/* Uniform in [lo, hi). */
double rng_range(uint64_t *s, double lo, double hi);

/* Uniform integer in [lo, hi] (lo <= hi). */
int64_t rng_int(uint64_t *s, int64_t lo, int64_t hi);

/* Uniform in [0, n) for n > 0 (modulo bias below 2^-32 for the n tests use). */
uint64_t rng_below(uint64_t *s, uint64_t n);

/* x[0..n) uniform in [-amp, amp), each as rng_sym draws it in turn. */
void rng_fill(uint64_t *s, float *x, size_t n, double amp);

/* Fills n bytes with random bits. */
void rng_bytes(uint64_t *s, void *dst, size_t n);

#endif
