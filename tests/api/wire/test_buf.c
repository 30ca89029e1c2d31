/* test_buf.c - api/wire/buf.c: the capped reply buffer and the float writer, which must print
 * exactly what printf("%.9g") prints, and so read back as the same float. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/buf.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static bool quick(void)
{
    const char *q = getenv("ATTND_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static float from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Reproducible random bit patterns (tests/support/rng.h). */
static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static const char *fmt(float f, char *buf)
{
    size_t n = api__float_format(f, buf);
    buf[n] = '\0';
    return buf;
}

/* The writer agrees with printf and reads back as the same bits; false (with a message) if
 * not. */
static bool agrees(float f)
{
    char mine[API_FLOAT_MAX_CHARS + 1], ref[32];
    fmt(f, mine);
    snprintf(ref, sizeof ref, "%.9g", (double)f);
    if (strcmp(mine, ref) != 0) {
        CHECKF(0, "%a: wrote \"%s\", printf says \"%s\"", (double)f, mine, ref);
        return false;
    }
    float back = strtof(mine, NULL);
    if (memcmp(&back, &f, 4) != 0) {
        CHECKF(0, "%a: \"%s\" reads back as %a", (double)f, mine, (double)back);
        return false;
    }
    return true;
}

static void test_writes_known_floats(void)
{
    static const struct {
        float f;
        const char *text;
    } known[] = {
        {0.0f, "0"},
        {-0.0f, "-0"},
        {1.0f, "1"},
        {-2.5f, "-2.5"},
        {100.0f, "100"},
        {0.1f, "0.100000001"},
        {0.33333334f, "0.333333343"},
        {1.60444836f, "1.60444832"},
        {123456789.0f, "123456792"},
        {1e9f, "1e+09"},
        {1e-4f, "9.99999975e-05"},
        {1e-3f, "0.00100000005"},
        {FLT_MAX, "3.40282347e+38"},
        {-FLT_MAX, "-3.40282347e+38"},
        {FLT_MIN, "1.17549435e-38"},
        {FLT_TRUE_MIN, "1.40129846e-45"},
        {16777216.0f, "16777216"},
        {0x1p-20f, "9.53674316e-07"},
    };
    char buf[API_FLOAT_MAX_CHARS + 1];
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        CHECKF(strcmp(fmt(known[i].f, buf), known[i].text) == 0, "%a: \"%s\", want \"%s\"",
               (double)known[i].f, buf, known[i].text);
}

static void test_matches_printf_on_every_power_of_two_and_ten(void)
{
    for (int e = -149; e <= 127; e++)
        agrees(ldexpf(1.0f, e));
    for (int e = -45; e <= 38; e++) {
        char s[16];
        snprintf(s, sizeof s, "1e%d", e);
        float p = strtof(s, NULL);
        agrees(p);
        agrees(nextafterf(p, 0));
        agrees(nextafterf(p, INFINITY));
    }
}

static void test_matches_printf_on_random_floats(void)
{
    long n = quick() ? 100000 : 2000000;
    for (long i = 0; i < n; i++) {
        float f = from_bits(rng_u32(&rng_state));
        if (!isfinite(f))
            continue;
        if (!agrees(f) && check__failures_in_test > 5)
            return;
    }
}

static void test_matches_printf_on_short_decimals(void)
{
    /* Values people type (0.001 steps) and their neighbours: where ties are most likely. */
    for (int i = -20000; i <= 20000; i++) {
        float f = (float)i / 1000.0f;
        agrees(f);
        agrees(nextafterf(f, INFINITY));
    }
}

static void test_buffer_stops_at_its_maximum(void)
{
    api_buf w;
    api_buf_init(&w, 10);
    api_buf_cstr(&w, "0123456789");
    CHECK_EQ_INT(w.state, API_BUF_OK);
    CHECK_EQ_INT(w.len, 10);
    api_buf_char(&w, 'x');
    CHECK_EQ_INT(w.state, API_BUF_FULL);
    api_buf_cstr(&w, ""); /* sticky: nothing more is written */
    CHECK_EQ_INT(w.len, 10);
    CHECK(w.cap <= 10);
    api_buf_free(&w);
}

static void test_buffer_grows_to_large_sizes(void)
{
    api_buf w;
    api_buf_init(&w, (size_t)1 << 24);
    for (int i = 0; i < 100000; i++)
        api_buf_float(&w, (float)i * 0.5f);
    CHECK_EQ_INT(w.state, API_BUF_OK);
    CHECK(w.cap <= (size_t)1 << 24);
    CHECK(w.len > 500000);
    api_buf_free(&w);
}

static void test_strings_are_escaped(void)
{
    api_buf w;
    api_buf_init(&w, 1000);
    const char s[] = "a\"b\\c\nd\te\x01\x7f\xc3\xa9";
    api_buf_json_string(&w, s, sizeof s - 1);
    api_buf_char(&w, ' ');
    api_buf_int(&w, INT64_MIN);
    const char want[] = "\"a\\\"b\\\\c\\nd\\te\\u0001\\u007f\xc3\xa9\" -9223372036854775808";
    CHECKF(w.len == sizeof want - 1 && memcmp(w.data, want, w.len) == 0, "got %.*s", (int)w.len,
           w.data);
    api_buf_free(&w);
}

/* JSON text is UTF-8 (RFC 8259), and error messages quote request bytes that may not be:
 * well-formed sequences pass through, every other byte becomes U+FFFD. */
static void test_strings_are_valid_utf8_whatever_the_input(void)
{
    api_buf w;
    api_buf_init(&w, 1000);
    /* valid 2-, 3- and 4-byte sequences; a stray continuation byte; a truncated sequence; an
     * overlong '/'; a surrogate; a code point beyond U+10FFFF; a lead byte at the very end */
    const char s[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|\x8a|\xe2\x82|\xc0\xaf|\xed\xa0\x80|"
                     "\xf4\x90\x80\x80|\xd0";
    api_buf_json_string(&w, s, sizeof s - 1);
    const char want[] = "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80|\\ufffd|\\ufffd\\ufffd|"
                        "\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd\\ufffd|"
                        "\\ufffd\"";
    CHECKF(w.len == sizeof want - 1 && memcmp(w.data, want, w.len) == 0, "got %.*s", (int)w.len,
           w.data);
    api_buf_free(&w);
}

int main(void)
{
    RUN(test_writes_known_floats);
    RUN(test_matches_printf_on_every_power_of_two_and_ten);
    RUN(test_matches_printf_on_random_floats);
    RUN(test_matches_printf_on_short_decimals);
    RUN(test_buffer_stops_at_its_maximum);
    RUN(test_buffer_grows_to_large_sizes);
    RUN(test_strings_are_escaped);
    RUN(test_strings_are_valid_utf8_whatever_the_input);
    return check_report();
}
