/* check.c - counting and reporting for the test harness in check.h. */
#include "check.h"

#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

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

static void watchdog_fire(int sig)
{
    (void)sig;
    /* Only async-signal-safe calls here. */
    static const char head[] = "FAIL ";
    static const char tail[] = ": still running after its time limit (hang or deadlock)\n";
    ssize_t r = write(STDOUT_FILENO, head, sizeof head - 1);
    r = write(STDOUT_FILENO, current_test, strlen(current_test));
    r = write(STDOUT_FILENO, tail, sizeof tail - 1);
    (void)r;
    _exit(1);
}

void check__run_within(const char *name, void (*fn)(void), unsigned seconds)
{
    signal(SIGALRM, watchdog_fire);
    current_test = name;
    alarm(seconds);
    check__run(name, fn);
    alarm(0);
}
