/* test_cases.c - the data-driven API cases: tests/api/cases/<name>.request.json is sent as it is
 * to api_attention (with a real engine pool), and <name>.expected.json says what must come back:
 *
 *   {"about": "...",                  what the case shows (optional)
 *    "status": 200,                   the HTTP status
 *    "reply": {...},                  the reply body, compared as JSON (see below)
 *    "tolerance": 1e-5,               for numbers: |got - want| <= tol + tol * |want| (optional)
 *    "route": "/v1/mha",              the route to call: "/v1/attention" (default) or
 *                                     "/v1/mha" (with a registry holding the demo layer)
 *    "call": {                        how to call (optional): "content_type" (string or null;
 *      ...}}                          default application/json), "max_body_bytes",
 *                                     "max_elements", "max_timeout_ms", "budget_bytes",
 *                                     "budget_in_use", "started_ms_ago", "cancelled"
 *
 * Replies compare structurally: objects must have the same keys, arrays the same length,
 * strings and booleans must be equal, numbers equal within the tolerance. Three strings in
 * the expected reply are patterns: "<any>" matches anything, "<number>" any number, and
 * "<contains:TEXT>" a string that contains TEXT. Where the expected tensor gives "data" and
 * the reply has "base64", the base64 is decoded (its dtype must be float32) and compared as
 * numbers. ATTND_API_CASES names another folder of cases. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "api/wire/body.h"
#include "tests/support/check.h"

static eng_pool *pool;
static api_models *models;
static const char *cases_dir;
static char current[256];
static double tolerance;

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    fclose(f);
    *len = n;
    return buf;
}

/* ---- Comparing replies ------------------------------------------------------------------- */

static bool match(const json_t *want, const json_t *got, const char *path);

/* A reply tensor in base64 against expected numbers in "data". */
static bool match_base64(const json_t *want, const json_t *got, const char *path)
{
    char sub[512];
    const char *dtype = json_string_value(json_object_get(got, "dtype"));
    const char *b64 = json_string_value(json_object_get(got, "base64"));
    const json_t *data = json_object_get(want, "data");
    snprintf(sub, sizeof sub, "%s.shape", path);
    if (!match(json_object_get(want, "shape"), json_object_get(got, "shape"), sub))
        return false;
    if (!dtype || strcmp(dtype, "float32") != 0 || !b64 || !json_is_array(data)) {
        CHECKF(0, "%s: want data, got a base64 tensor of dtype %s", path, dtype ? dtype : "?");
        return false;
    }
    size_t len = strlen(b64), n = api__base64_decoded_len(b64, len), got_len, bad;
    float *x = malloc(n + 4);
    bool ok = api__base64_decode(b64, len, x, &got_len, &bad) == API_B64_OK &&
              got_len == json_array_size(data) * 4;
    CHECKF(ok, "%s: base64 of %zu bytes for %zu numbers", path, got_len, json_array_size(data));
    for (size_t i = 0; ok && i < json_array_size(data); i++) {
        const json_t *w = json_array_get(data, i);
        double v = json_is_null(w) ? -INFINITY : json_number_value(w);
        if (!(x[i] == v || fabs(x[i] - v) <= tolerance + tolerance * fabs(v))) {
            CHECKF(0, "%s.data[%zu]: got %.9g, want %.9g", path, i, (double)x[i], v);
            ok = false;
        }
    }
    free(x);
    return ok;
}

static bool match(const json_t *want, const json_t *got, const char *path)
{
    char sub[512];
    const char *ws = json_string_value(want);
    if (ws && strcmp(ws, "<any>") == 0)
        return true;
    if (ws && strcmp(ws, "<number>") == 0) {
        CHECKF(json_is_number(got), "%s: want a number", path);
        return json_is_number(got);
    }
    if (ws && strncmp(ws, "<contains:", 10) == 0) {
        size_t n = strlen(ws) - 11;
        const char *gs = json_string_value(got);
        bool ok = gs && memmem(gs, strlen(gs), ws + 10, n) != NULL;
        CHECKF(ok, "%s: \"%s\" does not contain \"%.*s\"", path, gs ? gs : "(not a string)", (int)n,
               ws + 10);
        return ok;
    }
    if (!got) {
        CHECKF(0, "%s: missing", path);
        return false;
    }
    if (json_is_object(want) && json_is_object(got) && json_object_get(want, "data") &&
        json_object_get(got, "base64"))
        return match_base64(want, got, path);
    if (json_is_number(want)) {
        double w = json_number_value(want), g = json_number_value(got);
        bool ok = json_is_number(got) && fabs(g - w) <= tolerance + tolerance * fabs(w);
        CHECKF(ok, "%s: got %.9g, want %.9g", path, g, w);
        return ok;
    }
    if (json_typeof(want) != json_typeof(got)) {
        char *g = json_dumps(got, JSON_ENCODE_ANY | JSON_COMPACT);
        CHECKF(0, "%s: got %.200s", path, g ? g : "?");
        free(g);
        return false;
    }
    switch (json_typeof(want)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *v;
        bool ok = true;
        json_object_foreach((json_t *)got, key, v)
        {
            if (!json_object_get(want, key)) {
                CHECKF(0, "%s.%s: not expected", path, key);
                ok = false;
            }
        }
        json_object_foreach((json_t *)want, key, v)
        {
            snprintf(sub, sizeof sub, "%s.%s", path, key);
            ok = match(v, json_object_get(got, key), sub) && ok;
        }
        return ok;
    }
    case JSON_ARRAY:
        if (json_array_size(want) != json_array_size(got)) {
            CHECKF(0, "%s: %zu elements, want %zu", path, json_array_size(got),
                   json_array_size(want));
            return false;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (!match(json_array_get(want, i), json_array_get(got, i), sub))
                return false;
        }
        return true;
    case JSON_STRING:
        CHECKF(strcmp(ws, json_string_value(got)) == 0, "%s: got \"%s\", want \"%s\"", path,
               json_string_value(got), ws);
        return strcmp(ws, json_string_value(got)) == 0;
    default:
        CHECKF(json_equal((json_t *)want, (json_t *)got), "%s differs", path);
        return json_equal((json_t *)want, (json_t *)got);
    }
}

/* ---- One case ---------------------------------------------------------------------------- */

static const char *const expected_keys[] = {"about",     "status", "reply",
                                            "tolerance", "call",   "route"};
static const char *const call_keys[] = {"content_type",   "max_body_bytes", "max_elements",
                                        "max_timeout_ms", "budget_bytes",   "budget_in_use",
                                        "started_ms_ago", "cancelled"};

static bool known_keys(const json_t *obj, const char *const *keys, size_t n, const char *what)
{
    const char *key;
    json_t *v;
    bool ok = true;
    json_object_foreach((json_t *)obj, key, v)
    {
        size_t i = 0;
        while (i < n && strcmp(keys[i], key) != 0)
            i++;
        CHECKF(i < n, "%s: unknown key \"%s\" in %s", current, key, what);
        ok = ok && i < n;
    }
    return ok;
}

static void run_current_case(void)
{
    char path[1024];
    size_t req_len, exp_len;
    snprintf(path, sizeof path, "%s/%s.request.json", cases_dir, current);
    char *request = read_file(path, &req_len);
    snprintf(path, sizeof path, "%s/%s.expected.json", cases_dir, current);
    char *expected_text = read_file(path, &exp_len);
    json_error_t jerr;
    json_t *expected =
        expected_text ? json_loadb(expected_text, exp_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    CHECKF(request != NULL, "cannot read %s.request.json", current);
    CHECKF(expected != NULL, "%s.expected.json: %s", current,
           expected_text ? jerr.text : "cannot read it");
    if (!request || !expected ||
        !known_keys(expected, expected_keys, sizeof expected_keys / sizeof expected_keys[0],
                    "expected")) {
        free(request);
        free(expected_text);
        json_decref(expected);
        return;
    }

    const json_t *c = json_object_get(expected, "call");
    if (c)
        known_keys(c, call_keys, sizeof call_keys / sizeof call_keys[0], "call");
    api_limits limits = api_limits_default();
    api_budget *budget = NULL;
    int64_t start_ns = eng_now_ns();
    api_lease lease;
    api_call call = {.body = request,
                     .body_len = req_len,
                     .pool = pool,
                     .lease = &lease,
                     .limits = &limits,
                     .models = models,
                     .content_type = "application/json"};
    const json_t *v;
    if ((v = json_object_get(c, "content_type")))
        call.content_type = json_string_value(v); /* null: no header */
    if ((v = json_object_get(c, "max_body_bytes")))
        limits.max_body_bytes = (size_t)json_integer_value(v);
    if ((v = json_object_get(c, "max_elements")))
        limits.max_elements = (size_t)json_integer_value(v);
    if ((v = json_object_get(c, "max_timeout_ms")))
        limits.max_timeout_ms = json_integer_value(v);
    if ((v = json_object_get(c, "budget_bytes")))
        budget = api_budget_new((size_t)json_integer_value(v));
    if ((v = json_object_get(c, "budget_in_use")) && budget)
        api_budget_reserve(budget, (size_t)json_integer_value(v));
    if ((v = json_object_get(c, "started_ms_ago")))
        start_ns -= json_integer_value(v) * 1000000;
    api_lease_start(&lease, budget, start_ns, 0);
    if (json_is_true(json_object_get(c, "cancelled")))
        atomic_store(&lease.ctl.cancel, true);
    tolerance = json_is_number(json_object_get(expected, "tolerance"))
                    ? json_number_value(json_object_get(expected, "tolerance"))
                    : 1e-5;

    api_reply r;
    const char *route = json_string_value(json_object_get(expected, "route"));
    if (route && strcmp(route, "/v1/mha") == 0) {
        api_mha(&call, &r);
    } else {
        CHECKF(!route || strcmp(route, "/v1/attention") == 0, "%s: unknown route %s", current,
               route);
        api_attention(&call, &r);
    }
    int want_status = (int)json_integer_value(json_object_get(expected, "status"));
    CHECKF(r.status == want_status, "%s: status %d, want %d: %.*s", current, r.status, want_status,
           (int)(r.body_len < 400 ? r.body_len : 400), r.body ? r.body : "");
    json_t *got = r.body ? json_loadb(r.body, r.body_len, 0, &jerr) : NULL;
    CHECKF(got != NULL, "%s: the reply is not JSON", current);
    if (got && json_object_get(expected, "reply"))
        match(json_object_get(expected, "reply"), got, "reply");
    CHECKF(json_object_get(expected, "reply") != NULL, "%s: no \"reply\" to compare", current);
    CHECKF(r.status != 200 || !budget || lease.held >= r.body_len,
           "%s: the lease holds %zu bytes for a reply of %zu", current, lease.held, r.body_len);
    api_lease_end(&lease);
    if (budget) {
        v = json_object_get(c, "budget_in_use");
        CHECKF(api_budget_in_use(budget) == (v ? (size_t)json_integer_value(v) : 0),
               "%s: the budget was not given back", current);
        api_budget_free(budget);
    }
    json_decref(got);
    api_reply_free(&r);
    json_decref(expected);
    free(expected_text);
    free(request);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    static const char suffix[] = ".request.json";
    cases_dir = getenv("ATTND_API_CASES") ? getenv("ATTND_API_CASES") : "tests/api/cases";
    DIR *dir = opendir(cases_dir);
    if (!dir) {
        printf("cannot open %s (run from the repository root)\n0 passed, 1 failed\n", cases_dir);
        return 1;
    }
    char *names[1024];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < sizeof names / sizeof names[0]) {
        size_t len = strlen(e->d_name);
        if (len > sizeof suffix - 1 && strcmp(e->d_name + len - (sizeof suffix - 1), suffix) == 0)
            names[n++] = strndup(e->d_name, len - (sizeof suffix - 1));
    }
    closedir(dir);
    qsort(names, n, sizeof names[0], compare_names);

    eng_error err;
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models) {
        printf("eng_pool_new: %s\n0 passed, 1 failed\n", err.message);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(current, sizeof current, "%s", names[i]);
        check__run(names[i], run_current_case);
        free(names[i]);
    }
    eng_pool_free(pool);
    api_models_free(models);
    if (n == 0)
        printf("no cases in %s\n", cases_dir);
    return n == 0 ? 1 : check_report();
}
