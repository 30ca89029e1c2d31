/* test_cases.c - the data-driven API cases: tests/api/cases/<name>.request.json (and those of
 * its subfolders, tests/api/cases/v2/<name>.request.json: the KServe v2 routes) is sent as it
 * is to its route's api/ function (with a real engine pool and a registry holding the demo
 * layer), and <name>.expected.json says what must come back:
 *
 *   {"about": "...",                  what the case shows (optional)
 *    "status": 200,                   the HTTP status
 *    "reply": {...},                  the reply body, compared as JSON (see below), or
 *    "reply_contains": ["..."],       texts the raw body must contain (a body JSON cannot
 *                                     parse, such as v2's -Infinity); one of the two is needed
 *    "retry_after_s": 1,              the Retry-After the reply asks for (optional)
 *    "tolerance": 1e-5,               for numbers: |got - want| <= tol + tol * |want| (optional)
 *    "route": "/v1/mha",              the route to call (below); default "/v1/attention"
 *    "call": {                        how to call (optional): "content_type" (string or null;
 *      ...}}                          default application/json, none on /v2), "max_body_bytes",
 *                                     "max_elements", "max_timeout_ms", "budget_bytes",
 *                                     "budget_in_use", "started_ms_ago", "cancelled",
 *                                     "request_id" (X-Request-Id), "inference_header_length"
 *                                     (a string, or "auto": the length of the request file),
 *                                     "binary_tail_hex" (bytes sent after the request file:
 *                                     Triton's binary tensor data, in hex), "sessions" (true:
 *                                     KV-cache sessions on, a registry of the case's own,
 *                                     empty; default off, as --kv-cache-bytes 0)
 *
 * Routes: "/v1/attention", "/v1/mha", and on v2 "/v2/models/M[/versions/V]" (metadata), the
 * same with "/ready", "/config" or "/infer" (M may be empty: "/v2/models//infer"). A v2
 * inference runs under a memory budget (1 GiB unless "budget_bytes" says otherwise) that must
 * be given back in full, whatever the status.
 *
 * Replies compare structurally: objects must have the same keys, arrays the same length,
 * strings and booleans must be equal, numbers equal within the tolerance. Four strings in
 * the expected reply are patterns: "<any>" matches anything, "<number>" any number,
 * "<string>" any string, and "<contains:TEXT>" a string that contains TEXT. Where the expected
 * tensor gives "data" and the reply has "base64", the base64 is decoded (its dtype must be
 * float32) and compared as numbers. ATTND_API_CASES names another folder of cases. */
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
    if (ws && strcmp(ws, "<string>") == 0) {
        CHECKF(json_is_string(got), "%s: want a string", path);
        return json_is_string(got);
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

static const char *const expected_keys[] = {"about",     "status", "reply", "reply_contains",
                                            "tolerance", "call",   "route", "retry_after_s"};
static const char *const call_keys[] = {
    "content_type", "max_body_bytes",          "max_elements",    "max_timeout_ms",
    "budget_bytes", "budget_in_use",           "started_ms_ago",  "cancelled",
    "request_id",   "inference_header_length", "binary_tail_hex", "sessions"};

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

/* A route of the case: which api/ function answers it and, on v2, the model and version the
 * path names. */
typedef enum {
    ROUTE_ATTENTION,
    ROUTE_MHA,
    ROUTE_V2_METADATA,
    ROUTE_V2_READY,
    ROUTE_V2_CONFIG,
    ROUTE_V2_INFER,
    ROUTE_UNKNOWN
} case_route;

typedef struct {
    case_route route;
    char model[128], version[32];
    bool has_version;
} route_info;

/* Parses "/v1/attention", "/v1/mha" and "/v2/models/M[/versions/V][/ready|/config|/infer]". */
static route_info route_parse(const char *route)
{
    route_info ri;
    memset(&ri, 0, sizeof ri);
    ri.route = ROUTE_UNKNOWN;
    static const char models_prefix[] = "/v2/models/";
    if (!route || strcmp(route, "/v1/attention") == 0) {
        ri.route = ROUTE_ATTENTION;
        return ri;
    }
    if (strcmp(route, "/v1/mha") == 0) {
        ri.route = ROUTE_MHA;
        return ri;
    }
    if (strncmp(route, models_prefix, sizeof models_prefix - 1) != 0)
        return ri;
    const char *m = route + sizeof models_prefix - 1, *slash = strchr(m, '/');
    size_t n = slash ? (size_t)(slash - m) : strlen(m);
    if (n >= sizeof ri.model)
        return ri;
    memcpy(ri.model, m, n);
    ri.model[n] = '\0';
    const char *rest = slash ? slash : "";
    if (strncmp(rest, "/versions/", 10) == 0) {
        const char *v = rest + 10, *vs = strchr(v, '/');
        size_t vn = vs ? (size_t)(vs - v) : strlen(v);
        if (vn == 0 || vn >= sizeof ri.version)
            return ri;
        memcpy(ri.version, v, vn);
        ri.version[vn] = '\0';
        ri.has_version = true;
        rest = vs ? vs : "";
    }
    if (*rest == '\0')
        ri.route = ROUTE_V2_METADATA;
    else if (strcmp(rest, "/ready") == 0)
        ri.route = ROUTE_V2_READY;
    else if (strcmp(rest, "/config") == 0)
        ri.route = ROUTE_V2_CONFIG;
    else if (strcmp(rest, "/infer") == 0)
        ri.route = ROUTE_V2_INFER;
    return ri;
}

/* Decodes the hex of "binary_tail_hex" onto the end of the request (which has room for it:
 * len / 2 bytes more than req_len). Returns false on a malformed string. */
static bool append_hex(const char *hex, char *dst, size_t *len)
{
    size_t n = strlen(hex);
    if (n % 2)
        return false;
    for (size_t i = 0; i < n; i += 2) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[i + (size_t)k];
            unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                         : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                                : 16u;
            if (d > 15)
                return false;
            v = v * 16 + d;
        }
        dst[(*len)++] = (char)v;
    }
    return true;
}

/* The one place that builds an api_call: the request bytes, the engine pool, the registry, the
 * memory budget (NULL: none), the arrival time the deadline counts from, and the defaults every
 * case starts from; the "call" fields then adjust the HTTP details. */
static api_call case_call_init(const char *body, size_t len, api_lease *lease,
                               const api_limits *limits, const route_info *ri)
{
    bool v2 = ri->route >= ROUTE_V2_METADATA;
    api_call call = {.body = body,
                     .body_len = len,
                     .pool = pool,
                     .lease = lease,
                     .limits = limits,
                     .models = models,
                     .content_type = v2 ? NULL : "application/json",
                     .model = v2 ? ri->model : NULL,
                     .version = ri->has_version ? ri->version : NULL};
    return call;
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
    const char *route = json_string_value(json_object_get(expected, "route"));
    route_info ri = route_parse(route);
    CHECKF(ri.route != ROUTE_UNKNOWN, "%s: unknown route %s", current, route);
    api_limits limits = api_limits_default();
    api_lease lease;
    const json_t *v;
    size_t file_len = req_len;
    const char *tail = json_string_value(json_object_get(c, "binary_tail_hex"));
    if (tail) {
        request = realloc(request, req_len + strlen(tail) / 2 + 1);
        CHECKF(append_hex(tail, request, &req_len), "%s: binary_tail_hex is not hex", current);
    }
    api_budget *budget = NULL;
    if ((v = json_object_get(c, "budget_bytes")))
        budget = api_budget_new((size_t)json_integer_value(v));
    else if (ri.route == ROUTE_V2_INFER)
        budget = api_budget_new((size_t)1 << 30);
    if ((v = json_object_get(c, "budget_in_use")) && budget)
        api_budget_reserve(budget, (size_t)json_integer_value(v));
    int64_t start_ns = eng_now_ns();
    if ((v = json_object_get(c, "started_ms_ago")))
        start_ns -= json_integer_value(v) * 1000000;
    api_lease_start(&lease, budget, start_ns, 0);
    api_call call = case_call_init(request, req_len, &lease, &limits, &ri);
    char header_len[32];
    if ((v = json_object_get(c, "content_type")))
        call.content_type = json_string_value(v); /* null: no header */
    if ((v = json_object_get(c, "request_id")))
        call.request_id = json_string_value(v);
    if ((v = json_object_get(c, "inference_header_length"))) {
        const char *h = json_string_value(v);
        if (h && strcmp(h, "auto") == 0) {
            snprintf(header_len, sizeof header_len, "%zu", file_len);
            h = header_len;
        }
        call.inference_header_length = h;
    }
    if ((v = json_object_get(c, "max_body_bytes")))
        limits.max_body_bytes = (size_t)json_integer_value(v);
    if ((v = json_object_get(c, "max_elements")))
        limits.max_elements = (size_t)json_integer_value(v);
    if ((v = json_object_get(c, "max_timeout_ms")))
        limits.max_timeout_ms = json_integer_value(v);
    if (json_is_true(json_object_get(c, "cancelled")))
        atomic_store(&lease.ctl.cancel, true);
    api_sessions *sessions = NULL;
    if (json_is_true(json_object_get(c, "sessions"))) {
        api_sessions_config scfg = {.capacity_bytes = (size_t)16 << 20, .block_tokens = 16};
        char msg[256];
        sessions = api_sessions_new(&scfg, msg, sizeof msg);
        CHECKF(sessions != NULL, "%s: api_sessions_new: %s", current, msg);
        call.sessions = sessions;
    }
    tolerance = json_is_number(json_object_get(expected, "tolerance"))
                    ? json_number_value(json_object_get(expected, "tolerance"))
                    : 1e-5;

    api_reply r;
    memset(&r, 0, sizeof r);
    switch (ri.route) {
    case ROUTE_MHA:
        api_mha(&call, &r);
        break;
    case ROUTE_V2_METADATA:
        api_v2_model_metadata(&call, &r);
        break;
    case ROUTE_V2_READY:
        api_v2_model_ready(&call, &r);
        break;
    case ROUTE_V2_CONFIG:
        api_v2_model_config(&call, &r);
        break;
    case ROUTE_V2_INFER:
        api_v2_infer(&call, &r);
        break;
    case ROUTE_ATTENTION:
        api_attention(&call, &r);
        break;
    case ROUTE_UNKNOWN:
        break;
    }
    int want_status = (int)json_integer_value(json_object_get(expected, "status"));
    CHECKF(r.status == want_status, "%s: status %d, want %d: %.*s", current, r.status, want_status,
           (int)(r.body_len < 400 ? r.body_len : 400), r.body ? r.body : "");
    if ((v = json_object_get(expected, "retry_after_s")))
        CHECKF(r.retry_after_s == json_integer_value(v), "%s: Retry-After %d, want %lld", current,
               r.retry_after_s, (long long)json_integer_value(v));
    const json_t *want_reply = json_object_get(expected, "reply");
    const json_t *contains = json_object_get(expected, "reply_contains");
    CHECKF(want_reply || json_array_size(contains) > 0,
           "%s: no \"reply\" or \"reply_contains\" to compare", current);
    if (want_reply) {
        json_t *got = r.body ? json_loadb(r.body, r.body_len, 0, &jerr) : NULL;
        CHECKF(got != NULL, "%s: the reply is not JSON", current);
        if (got)
            match(want_reply, got, "reply");
        json_decref(got);
    }
    for (size_t i = 0; i < json_array_size(contains); i++) {
        const char *text = json_string_value(json_array_get(contains, i));
        CHECKF(text && r.body && memmem(r.body, r.body_len, text, strlen(text)) != NULL,
               "%s: the reply lacks \"%s\": %.*s", current, text ? text : "(not a string)",
               (int)(r.body_len < 400 ? r.body_len : 400), r.body ? r.body : "");
    }
    CHECKF(r.status != 200 || !budget || lease.held >= r.body_len,
           "%s: the lease holds %zu bytes for a reply of %zu", current, lease.held, r.body_len);
    api_lease_end(&lease);
    if (budget) {
        v = json_object_get(c, "budget_in_use");
        CHECKF(api_budget_in_use(budget) == (v ? (size_t)json_integer_value(v) : 0),
               "%s: the budget was not given back", current);
        api_budget_free(budget);
    }
    api_reply_free(&r);
    api_sessions_free(sessions);
    json_decref(expected);
    free(expected_text);
    free(request);
}

/* Adds the case names of folder dir/sub ("sub/name" in a subfolder) to names, and those of
 * its subfolders one level down. Returns false when dir/sub cannot be opened. */
static bool scan_cases(const char *dir, const char *sub, char **names, size_t *n, size_t cap)
{
    static const char suffix[] = ".request.json";
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", dir, *sub ? "/" : "", sub);
    DIR *d = opendir(path);
    if (!d)
        return false;
    struct dirent *e;
    while ((e = readdir(d)) && *n < cap) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.')
            continue;
        if (len > sizeof suffix - 1 && strcmp(e->d_name + len - (sizeof suffix - 1), suffix) == 0) {
            char name[512];
            snprintf(name, sizeof name, "%s%s%.*s", sub, *sub ? "/" : "",
                     (int)(len - (sizeof suffix - 1)), e->d_name);
            names[(*n)++] = strdup(name);
        } else if (!*sub && e->d_type == DT_DIR) {
            scan_cases(dir, e->d_name, names, n, cap);
        }
    }
    closedir(d);
    return true;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    cases_dir = getenv("ATTND_API_CASES") ? getenv("ATTND_API_CASES") : "tests/api/cases";
    char *names[1024];
    size_t n = 0;
    if (!scan_cases(cases_dir, "", names, &n, sizeof names / sizeof names[0])) {
        printf("cannot open %s (run from the repository root)\n0 passed, 1 failed\n", cases_dir);
        return 1;
    }
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
