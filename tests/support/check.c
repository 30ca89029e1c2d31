/* check.c - counting and reporting for the test harness in check.h. */
#include "check.h"

#include <stdarg.h>

int check__failures_in_test;
static int tests_passed, tests_failed;
static const char *current_test = "(none)";

void check__fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    check__failures_in_test++;
    /* Past a few failures a test is broken anyway; keep the log readable. */
    if (check__failures_in_test > 10)
        return;
    fprintf(stdout, "FAIL %s (%s:%d): ", current_test, file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

void check__run(const char *name, void (*fn)(void))
{
    current_test = name;
    check__failures_in_test = 0;
    fn();
    if (check__failures_in_test == 0) {
        tests_passed++;
        printf("ok   %s\n", name);
    } else {
        tests_failed++;
        printf("FAIL %s: %d failed check(s)\n", name, check__failures_in_test);
    }
    fflush(stdout);
}

int check_report(void)
{
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed == 0 ? 0 : 1;
}
