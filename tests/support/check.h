/*
 * check.h - the test harness shared by every attnd test binary.
 *
 * A test binary is a main() that runs named test functions; a test passes when none of its
 * checks failed. The binary prints one line per failed check and ends with
 * "N passed, N failed", which tests/run.sh adds up over all binaries.
 *
 *     static void test_softmax_sums_to_one(void) {
 *         CHECK(sum > 0.999);
 *         CHECK_NEAR(out[0], 1.60444836, 1e-5);
 *     }
 *     int main(void) {
 *         RUN(test_softmax_sums_to_one);
 *         return check_report();
 *     }
 */
#ifndef ATTND_TESTS_CHECK_H
#define ATTND_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>

extern int check__failures_in_test;

/* Records a failed check; prints where and why. */
void check__fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Runs one test function and counts it as passed or failed. */
void check__run(const char *name, void (*fn)(void));

/* Like check__run, but a test still running after `seconds` ends the binary with a FAIL line
 * naming it, instead of leaving the runner's timeout to say only that something hung. */
void check__run_within(const char *name, void (*fn)(void), unsigned seconds);

/* Prints "N passed, N failed" and returns the exit status (0 when nothing failed). */
int check_report(void);

#define RUN(fn)                 check__run(#fn, fn)
#define RUN_WITHIN(fn, seconds) check__run_within(#fn, fn, seconds)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check__fail(__FILE__, __LINE__, "%s", #cond);                                          \
    } while (0)

/* Like CHECK, with a printf-style explanation of the failure. */
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check__fail(__FILE__, __LINE__, __VA_ARGS__);                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long check__a = (long long)(a), check__b = (long long)(b);                            \
        if (check__a != check__b)                                                                  \
            check__fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, check__a, check__b); \
    } while (0)

/* |a - b| <= tol, and NaN never passes. */
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double check__a = (double)(a), check__b = (double)(b);                                     \
        if (!(fabs(check__a - check__b) <= (double)(tol)))                                         \
            check__fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, check__a,    \
                        check__b, (double)(tol));                                                  \
    } while (0)

#endif
