/*
 * shard_client.c - proves against a running attnd that attention over keys split into shards,
 * each sent as its own /v1/attention request with "return_lse": true, merges into the unsharded
 * answer. This is how one sequence too long for a replica is spread over several replicas
 * (deploy/README.md, "One sequence over several replicas"):
 *
 *     lse = logsumexp_k(lse_k),   out = sum_k exp(lse_k - lse) * out_k
 *
 * where shard k's lse_k is -inf (null in JSON) for a query row that sees none of its keys; such
 * a shard weighs 0. Each case sends the unsharded request, then the shards, merges, and checks
 * that the merged output equals the unsharded one within 1e-5 * max|V| and the merged lse the
 * unsharded lse within 1e-5 * max(1, |lse|). Cases: uneven splits into 1, 2, 3 and 7 shards;
 * two heads with causal "bottom_right" alignment and ALiBi (each shard gets causal: true and
 * query_offset = S - L - start, so positions stay global); and a shard whose keys are all
 * padding (its lse is null).
 *
 * Build (libcurl and jansson from Debian: libcurl4-openssl-dev, libjansson-dev):
 *
 *     gcc -std=c11 -D_GNU_SOURCE tests/deploy/shard_client.c -lcurl -ljansson -lm -o shard_client
 *
 * `make test` builds it with the project's warnings (-Wall -Wextra -Wconversion ... -Werror).
 *
 * Sessions mode (tests/deploy/check_compose.sh, through the balancer): `--sessions N STEPS
 * FILE` creates N KV-cache sessions, each with its own X-Session-Key, and steps each STEPS
 * times (one new token and one query), checking every step against /v1/attention over the
 * session's whole history (1e-5 * max|V|), which only holds when every step reached the replica
 * that holds the session; it writes the sessions to FILE. `--sessions-after N STEPS FILE`,
 * once a replica is stopped, steps each session once more: a session must either answer as
 * before (its replica lives) or 404 session_evicted (it was on the stopped one), and both must
 * happen. The data of a token is a function of its session and position, so the second run
 * rebuilds every history.
 *
 * Run: build/tests/deploy/shard_client http://127.0.0.1:8080
 * (tests/deploy/check_live.sh starts build/attnd on an ephemeral port and runs it). Prints one
 * line per case and ends with "N passed, N failed"; exits 1 on a failure, 2 on bad usage.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/rng.h"

/* Replies bigger than this are refused: the cases here produce a few kilobytes. */
#define MAX_REPLY_BYTES ((size_t)64 << 20)
#define MAX_SHARDS      16

static const char *base_url;
static int n_passed, n_failed;

/* ---- Deterministic data -------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u; /* tests/support/rng.h */

static float *random_matrix(size_t rows, size_t cols, float amplitude)
{
    float *m = malloc(rows * cols * sizeof *m);
    if (!m)
        return NULL;
    for (size_t i = 0; i < rows * cols; i++)
        m[i] = rng_sym(&rng_state, amplitude);
    return m;
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    bool too_big;
} buffer;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    buffer *b = userdata;
    size_t n = size * nmemb;
    if (n > MAX_REPLY_BYTES - b->len) {
        b->too_big = true;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown)
            return 0;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* POSTs `request` to /v1/attention and returns the parsed reply of a 200, or NULL with the
 * reason in `err`. Takes ownership of nothing. */
static json_t *post_attention(CURL *curl, const json_t *request, char *err, size_t errlen)
{
    char url[512];
    char *body = json_dumps(request, JSON_COMPACT);
    struct curl_slist *headers = NULL;
    buffer reply = {0};
    long status = 0;
    json_t *parsed = NULL;
    json_error_t jerr;
    CURLcode rc;

    if (!body) {
        snprintf(err, errlen, "cannot encode the request");
        return NULL;
    }
    snprintf(url, sizeof url, "%s/v1/attention", base_url);
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
    rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    free(body);

    if (rc != CURLE_OK) {
        snprintf(err, errlen, "%.200s: %s%s", url, curl_easy_strerror(rc),
                 reply.too_big ? " (reply too big)" : "");
    } else if (status != 200) {
        snprintf(err, errlen, "HTTP %ld: %.300s", status, reply.data ? reply.data : "");
    } else if (!(parsed = json_loadb(reply.data, reply.len, 0, &jerr))) {
        snprintf(err, errlen, "reply is not JSON: %s", jerr.text);
    }
    free(reply.data);
    return parsed;
}

/* POSTs `request` to `path` with an X-Session-Key header when `key` is not NULL; the reply
 * parsed as JSON (NULL when it is none) and its status in *status (0: no reply). */
static json_t *post_json(CURL *curl, const char *path, const char *key, const json_t *request,
                         long *status)
{
    char url[512], header[160];
    char *body = json_dumps(request, JSON_COMPACT);
    struct curl_slist *headers = NULL;
    buffer reply = {0};
    json_t *parsed = NULL;
    *status = 0;
    if (!body)
        return NULL;
    snprintf(url, sizeof url, "%s%s", base_url, path);
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    if (key) {
        snprintf(header, sizeof header, "X-Session-Key: %s", key);
        headers = curl_slist_append(headers, header);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(curl) == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
        parsed = reply.data ? json_loadb(reply.data, reply.len, 0, NULL) : NULL;
    }
    curl_slist_free_all(headers);
    free(body);
    free(reply.data);
    return parsed;
}

/* ---- Request bodies and replies ------------------------------------------------------------ */

/* rows x cols of m, from row `first`, as nested JSON arrays. */
static json_t *json_matrix(const float *m, size_t first, size_t rows, size_t cols)
{
    json_t *outer = json_array();
    for (size_t i = 0; outer && i < rows; i++) {
        json_t *row = json_array();
        for (size_t j = 0; row && j < cols; j++)
            json_array_append_new(row, json_real((double)m[(first + i) * cols + j]));
        json_array_append_new(outer, row);
    }
    return outer;
}

/* Reads a rank-2 reply tensor of exactly rows x cols numbers into out[]; null reads as -inf
 * (the wire form of an lse with no visible key). false if the shape or a value is wrong. */
static bool read_matrix(const json_t *t, size_t rows, size_t cols, double *out)
{
    if (!json_is_array(t) || json_array_size(t) != rows)
        return false;
    for (size_t i = 0; i < rows; i++) {
        const json_t *row = json_array_get(t, i);
        if (!json_is_array(row) || json_array_size(row) != cols)
            return false;
        for (size_t j = 0; j < cols; j++) {
            const json_t *x = json_array_get(row, j);
            if (json_is_null(x))
                out[i * cols + j] = -INFINITY;
            else if (json_is_number(x))
                out[i * cols + j] = json_number_value(x);
            else
                return false;
        }
    }
    return true;
}

/* The lse of a rank-2 query, read as [H, L]: docs/semantics.md#outputs gives [H, L] (the batch
 * axis dropped); a one-head reply written as [L] is accepted too. */
static bool read_lse(const json_t *t, size_t heads, size_t rows, double *out)
{
    json_t *wrapped;
    bool ok;
    if (read_matrix(t, heads, rows, out) || heads > 1)
        return read_matrix(t, heads, rows, out);
    wrapped = json_array();
    json_array_append(wrapped, (json_t *)t);
    ok = read_matrix(wrapped, 1, rows, out);
    json_decref(wrapped);
    return ok;
}

/* ---- One case ------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    size_t L, S, H, D, Dv; /* query rows, keys, heads, head widths */
    size_t n_shards;
    size_t bounds[MAX_SHARDS + 1]; /* shard k holds keys [bounds[k], bounds[k+1]) */
    bool causal_bottom_right, alibi;
    size_t pad_from, pad_to; /* keys in [pad_from, pad_to) are padding (none when equal) */
    bool expect_nulls;       /* some shard must see no key for some row (lse null) */
} shard_case;

/* The request for keys [s0, s1) (the whole sequence when s0 = 0, s1 = S, sharded = false). */
static json_t *case_request(const shard_case *c, const float *q, const float *k, const float *v,
                            size_t s0, size_t s1, bool sharded)
{
    json_t *req = json_object();
    json_object_set_new(req, "query", json_matrix(q, 0, c->L, c->H * c->D));
    json_object_set_new(req, "key", json_matrix(k, s0, s1 - s0, c->H * c->D));
    json_object_set_new(req, "value", json_matrix(v, s0, s1 - s0, c->H * c->Dv));
    json_object_set_new(req, "return_lse", json_true());
    if (c->H > 1)
        json_object_set_new(req, "num_heads", json_integer((json_int_t)c->H));
    if (c->causal_bottom_right) {
        if (sharded) {
            /* Query i sits at global position i + S - L; in the shard's coordinates key j is
             * j - s0, so the query's offset moves by -s0 (negative for late shards). */
            json_object_set_new(req, "causal", json_true());
            json_object_set_new(req, "query_offset",
                                json_integer((json_int_t)c->S - (json_int_t)c->L - (json_int_t)s0));
        } else {
            json_object_set_new(req, "causal", json_string("bottom_right"));
        }
    }
    if (c->alibi)
        json_object_set_new(req, "alibi", json_true());
    if (c->pad_to > c->pad_from) {
        json_t *mask = json_array();
        for (size_t j = s0; j < s1; j++)
            json_array_append_new(mask, json_boolean(j >= c->pad_from && j < c->pad_to));
        json_object_set_new(req, "key_padding_mask", mask);
    }
    return req;
}

static void report(bool ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(bool ok, const char *name, const char *fmt, ...)
{
    va_list ap;
    printf("%s %s: ", ok ? "ok" : "FAIL", name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (ok)
        n_passed++;
    else
        n_failed++;
}

static void run_case(CURL *curl, const shard_case *c)
{
    const size_t E = c->H * c->D, Ev = c->H * c->Dv;
    const size_t n_out = c->L * Ev, n_lse = c->H * c->L;
    float *q = random_matrix(c->L, E, 1.0f);
    float *k = random_matrix(c->S, E, 1.0f);
    float *v = random_matrix(c->S, Ev, 3.0f);
    double *full_out = calloc(n_out, sizeof(double)), *full_lse = calloc(n_lse, sizeof(double));
    double *all_lse = calloc(n_lse * c->n_shards, sizeof(double));
    double *all_out = calloc(n_out * c->n_shards, sizeof(double));
    double *merged = calloc(n_out, sizeof(double)), *merged_lse = calloc(n_lse, sizeof(double));
    char err[512];
    json_t *req = NULL, *reply = NULL;
    double vmax = 0, out_err = 0, lse_err = 0;
    size_t null_rows = 0, shard_nulls = 0;

    if (!q || !k || !v || !full_out || !full_lse || !all_lse || !all_out || !merged ||
        !merged_lse) {
        report(false, c->name, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < c->S * Ev; i++)
        vmax = fmax(vmax, fabs((double)v[i]));

    /* The unsharded answer. */
    req = case_request(c, q, k, v, 0, c->S, false);
    reply = post_attention(curl, req, err, sizeof err);
    if (!reply) {
        report(false, c->name, "unsharded request: %s", err);
        goto done;
    }
    if (!read_matrix(json_object_get(reply, "output"), c->L, Ev, full_out) ||
        !read_lse(json_object_get(reply, "lse"), c->H, c->L, full_lse)) {
        report(false, c->name, "unsharded reply lacks output [%zu, %zu] or lse [%zu, %zu]", c->L,
               Ev, c->H, c->L);
        goto done;
    }
    json_decref(req);
    json_decref(reply);
    req = reply = NULL;

    /* Each shard on its own. */
    for (size_t s = 0; s < c->n_shards; s++) {
        size_t s0 = c->bounds[s], s1 = c->bounds[s + 1];
        req = case_request(c, q, k, v, s0, s1, true);
        reply = post_attention(curl, req, err, sizeof err);
        if (!reply) {
            report(false, c->name, "shard %zu [%zu, %zu): %s", s, s0, s1, err);
            goto done;
        }
        if (!read_matrix(json_object_get(reply, "output"), c->L, Ev, all_out + s * n_out) ||
            !read_lse(json_object_get(reply, "lse"), c->H, c->L, all_lse + s * n_lse)) {
            report(false, c->name, "shard %zu reply lacks output or lse of the expected shape", s);
            goto done;
        }
        json_decref(req);
        json_decref(reply);
        req = reply = NULL;
    }

    /* Merge by LSE: per head h and query row i, weights exp(lse_k - lse). Output column
     * h * Dv + d belongs to head h (the [L, H*Dv] layout of a rank-2 reply). */
    for (size_t h = 0; h < c->H; h++) {
        for (size_t i = 0; i < c->L; i++) {
            double m = -INFINITY, sum = 0, lse;
            for (size_t s = 0; s < c->n_shards; s++) {
                m = fmax(m, all_lse[s * n_lse + h * c->L + i]);
                if (isinf(all_lse[s * n_lse + h * c->L + i]))
                    shard_nulls++;
            }
            if (m == -INFINITY) {
                merged_lse[h * c->L + i] = -INFINITY;
                null_rows++;
                continue; /* no key visible anywhere: output 0, as attnd answers */
            }
            for (size_t s = 0; s < c->n_shards; s++)
                sum += exp(all_lse[s * n_lse + h * c->L + i] - m);
            lse = m + log(sum);
            merged_lse[h * c->L + i] = lse;
            for (size_t s = 0; s < c->n_shards; s++) {
                double w = exp(all_lse[s * n_lse + h * c->L + i] - lse);
                for (size_t d = 0; d < c->Dv; d++) {
                    size_t at = i * Ev + h * c->Dv + d;
                    merged[at] += w * all_out[s * n_out + at];
                }
            }
        }
    }

    for (size_t i = 0; i < n_out; i++)
        out_err = fmax(out_err, fabs(merged[i] - full_out[i]));
    for (size_t i = 0; i < n_lse; i++) {
        double a = merged_lse[i], b = full_lse[i];
        if (isinf(a) || isinf(b)) {
            if (a != b)
                lse_err = INFINITY;
        } else {
            lse_err = fmax(lse_err, fabs(a - b) / fmax(1.0, fabs(b)));
        }
    }
    report(out_err <= 1e-5 * vmax && lse_err <= 1e-5 && (!c->expect_nulls || shard_nulls > 0),
           c->name,
           "%zu shard(s) of %zu keys, L=%zu H=%zu D=%zu Dv=%zu: max |merged - unsharded| = %.3g "
           "(tolerance %.3g), max lse error %.3g, %zu shard rows with lse null%s, %zu merged",
           c->n_shards, c->S, c->L, c->H, c->D, c->Dv, out_err, 1e-5 * vmax, lse_err, shard_nulls,
           c->expect_nulls ? " (some expected)" : "", null_rows);

done:
    json_decref(req);
    json_decref(reply);
    free(q);
    free(k);
    free(v);
    free(full_out);
    free(full_lse);
    free(all_lse);
    free(all_out);
    free(merged);
    free(merged_lse);
}

/* Fills c->bounds with n_shards uneven pieces of S keys: shard k gets a share that grows with
 * k, so that no two shards are alike and none is empty. */
static void uneven_bounds(shard_case *c)
{
    size_t total_weight = c->n_shards * (c->n_shards + 1) / 2, at = 0;
    c->bounds[0] = 0;
    for (size_t s = 0; s < c->n_shards; s++) {
        size_t share = c->S * (s + 1) / total_weight;
        at += share ? share : 1;
        c->bounds[s + 1] = s + 1 == c->n_shards ? c->S : at;
    }
}

/* ---- Sessions through the balancer ---------------------------------------------------------- */

enum { SESSION_HEADS = 2, SESSION_DIM = 8, SESSION_WIDTH = SESSION_HEADS * SESSION_DIM };

/* Value `j` of row `which` (0 query, 1 key, 2 value) of token `t` of session `i`. */
static float token_value(size_t i, size_t t, int which, size_t j)
{
    uint64_t x = ((uint64_t)i * 1000003u + t) * 4u + (uint64_t)which;
    x = x * 64u + j;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdu;
    x ^= x >> 33;
    return (float)(x >> 40) / (float)(1u << 23) - 1.0f;
}

static json_t *token_row(size_t i, size_t t, int which)
{
    json_t *row = json_array();
    for (size_t j = 0; j < SESSION_WIDTH; j++)
        json_array_append_new(row, json_real((double)token_value(i, t, which, j)));
    return row;
}

/* Session i's step at position t (appending token t, attending its query), checked against
 * /v1/attention over tokens 0..t. Returns the step's status (200 only when it also matched). */
static long session_step(CURL *curl, size_t i, const char *id, size_t t, char *why, size_t n)
{
    char path[128], key[32];
    long status, ref_status;
    json_t *q = json_array(), *k = json_array(), *v = json_array(), *hk = json_array(),
           *hv = json_array();
    json_array_append_new(q, token_row(i, t, 0));
    json_array_append_new(k, token_row(i, t, 1));
    json_array_append_new(v, token_row(i, t, 2));
    double vmax = 0;
    for (size_t s = 0; s <= t; s++) {
        json_array_append_new(hk, token_row(i, s, 1));
        json_array_append_new(hv, token_row(i, s, 2));
        for (size_t j = 0; j < SESSION_WIDTH; j++)
            vmax = fmax(vmax, fabs((double)token_value(i, s, 2, j)));
    }
    json_t *step = json_pack("{s:O,s:o,s:o,s:I}", "query", q, "key", k, "value", v, "expect_length",
                             (json_int_t)t);
    json_t *ref = json_pack("{s:o,s:o,s:o,s:i,s:s}", "query", q, "key", hk, "value", hv,
                            "num_heads", SESSION_HEADS, "causal", "bottom_right");
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
    snprintf(key, sizeof key, "conversation-%zu", i);
    json_t *got = post_json(curl, path, key, step, &status);
    json_t *want = post_json(curl, "/v1/attention", NULL, ref, &ref_status);
    double a[SESSION_WIDTH], b[SESSION_WIDTH];
    if (status == 200) {
        bool read = ref_status == 200 &&
                    read_matrix(json_object_get(got, "output"), 1, SESSION_WIDTH, a) &&
                    read_matrix(json_object_get(want, "output"), 1, SESSION_WIDTH, b);
        double d = read ? 0 : INFINITY;
        for (size_t j = 0; read && j < SESSION_WIDTH; j++)
            d = fmax(d, fabs(a[j] - b[j]));
        if (!(d <= 1e-5 * vmax)) {
            snprintf(why, n, "step %zu of session %zu differs from /v1/attention by %g", t, i, d);
            status = -1;
        }
    } else {
        const char *code =
            json_string_value(json_object_get(json_object_get(got, "error"), "code"));
        snprintf(why, n, "%s", code ? code : "");
    }
    json_decref(got);
    json_decref(want);
    json_decref(step);
    json_decref(ref);
    return status;
}

static int sessions_mode(CURL *curl, bool after, size_t n, size_t steps, const char *file)
{
    char(*ids)[64] = calloc(n, sizeof *ids), why[256];
    FILE *f = fopen(file, after ? "r" : "w");
    long status;
    if (!ids || !f) {
        fprintf(stderr, "cannot open %s\n", file);
        return 1;
    }
    if (after) {
        for (size_t i = 0; i < n; i++)
            if (fscanf(f, "%63s", ids[i]) != 1) {
                fprintf(stderr, "%s holds fewer than %zu sessions\n", file, n);
                return 1;
            }
        size_t kept = 0, evicted = 0, bad = 0;
        for (size_t i = 0; i < n; i++) {
            status = session_step(curl, i, ids[i], steps, why, sizeof why);
            if (status == 200)
                kept++;
            else if (status == 404 && strcmp(why, "session_evicted") == 0)
                evicted++;
            else {
                bad++;
                printf("FAIL session %zu after the loss: %ld %s\n", i, status, why);
            }
        }
        report(bad == 0 && kept > 0 && evicted > 0, "sessions after a replica stopped",
               "%zu stepped on, %zu answered session_evicted", kept, evicted);
    } else {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            char key[32];
            snprintf(key, sizeof key, "conversation-%zu", i);
            json_t *create =
                json_pack("{s:i,s:i}", "num_heads", SESSION_HEADS, "head_dim", SESSION_DIM);
            json_t *r = post_json(curl, "/v1/sessions", key, create, &status);
            const char *id = json_string_value(json_object_get(r, "id"));
            snprintf(ids[i], sizeof ids[i], "%s", status == 201 && id ? id : "none");
            fprintf(f, "%s\n", ids[i]);
            json_decref(r);
            json_decref(create);
        }
        for (size_t t = 0; t < steps; t++)
            for (size_t i = 0; i < n; i++)
                if ((status = session_step(curl, i, ids[i], t, why, sizeof why)) != 200 &&
                    bad++ < 5)
                    printf("FAIL session %zu step %zu: %ld %s\n", i, t, status, why);
        report(bad == 0, "sessions through the balancer",
               "%zu sessions x %zu steps, each equal to /v1/attention over its history", n, steps);
    }
    fclose(f);
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    CURL *curl;
    static const size_t shard_counts[] = {1, 2, 3, 7};

    if (argc == 6 &&
        (strcmp(argv[2], "--sessions") == 0 || strcmp(argv[2], "--sessions-after") == 0)) {
        base_url = argv[1];
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || !(curl = curl_easy_init()))
            return 1;
        sessions_mode(curl, strcmp(argv[2], "--sessions-after") == 0,
                      (size_t)strtoul(argv[3], NULL, 10), (size_t)strtoul(argv[4], NULL, 10),
                      argv[5]);
        curl_easy_cleanup(curl);
        curl_global_cleanup();
        printf("%d passed, %d failed\n", n_passed, n_failed);
        return n_failed ? 1 : 0;
    }

    if (argc != 2 || strncmp(argv[1], "http", 4) != 0) {
        fprintf(stderr, "usage: %s http://HOST:PORT\n", argv[0]);
        return 2;
    }
    base_url = argv[1];
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0 || !(curl = curl_easy_init())) {
        fprintf(stderr, "cannot initialise libcurl\n");
        return 1;
    }

    for (size_t n = 0; n < sizeof shard_counts / sizeof shard_counts[0]; n++) {
        char name[64];
        shard_case c = {.L = 7, .S = 301, .H = 1, .D = 16, .Dv = 12};
        snprintf(name, sizeof name, "one head, %zu uneven shard%s", shard_counts[n],
                 shard_counts[n] == 1 ? "" : "s");
        c.name = name;
        c.n_shards = shard_counts[n];
        uneven_bounds(&c);
        run_case(curl, &c);
    }
    {
        /* Decode-shaped: 5 new tokens at the end of 240 keys, causal and ALiBi with global
         * positions; the last shard starts after some queries' positions, so those rows see
         * none of its keys (lse null) and it weighs 0 for them. */
        shard_case c = {.name = "two heads, causal bottom_right + ALiBi, 4 shards",
                        .L = 5,
                        .S = 240,
                        .H = 2,
                        .D = 8,
                        .Dv = 8,
                        .n_shards = 4,
                        .bounds = {0, 60, 130, 237, 240},
                        .causal_bottom_right = true,
                        .alibi = true,
                        .expect_nulls = true};
        run_case(curl, &c);
    }
    {
        shard_case c = {.name = "a shard of padding only (lse null), 4 shards",
                        .L = 6,
                        .S = 64,
                        .H = 1,
                        .D = 8,
                        .Dv = 4,
                        .n_shards = 4,
                        .bounds = {0, 16, 32, 48, 64},
                        .pad_from = 16,
                        .pad_to = 32,
                        .expect_nulls = true};
        run_case(curl, &c);
    }

    curl_easy_cleanup(curl);
    curl_global_cleanup();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
