/* test_sessions.c - KV-cache sessions through api/ (api.h api_sessions_*, api_session_*), no
 * daemon: every step of a session gives what POST /v1/attention gives over the concatenated
 * history (prefill then single-token decoding, float32 and bfloat16 caches, fork, truncate,
 * append-only then attend-only), and the registry's life cycle: eviction of the least recently
 * used idle session under a cache of three, 429 when every session is pinned, TTL expiry,
 * tombstones, 409 on expect_length, 413 past max_tokens, 422 on shapes, malformed and unknown
 * ids, sessions off. The ticket test runs the order of one session's requests from several
 * threads that park and resume each other (make test runs it under TSan too). */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/util.h"

static eng_pool *pool;

/* ---- Helpers ------------------------------------------------------------------------------ */

typedef struct {
    int status;
    json_t *json; /* NULL for an empty body */
    char location[96];
    int retry_after_s;
} result;

static void result_free(result *r)
{
    json_decref(r->json);
    r->json = NULL;
}

static result call_route(void (*fn)(const api_call *, api_reply *), api_sessions *reg,
                         const char *id, const char *body)
{
    api_call call = {.body = body,
                     .body_len = body ? strlen(body) : 0,
                     .content_type = "application/json",
                     .pool = pool,
                     .sessions = reg,
                     .session = id};
    api_reply reply;
    result r = {0};
    fn(&call, &reply);
    r.status = reply.status;
    r.retry_after_s = reply.retry_after_s;
    memcpy(r.location, reply.location, sizeof r.location);
    if (reply.body && reply.body_len) {
        json_error_t e;
        r.json = json_loadb(reply.body, reply.body_len, 0, &e);
        CHECKF(r.json != NULL, "reply is not JSON: %.*s", (int)reply.body_len, reply.body);
    }
    api_reply_free(&reply);
    return r;
}

static result cheap(void (*fn)(api_sessions *, const char *, api_reply *), api_sessions *reg,
                    const char *id)
{
    api_reply reply;
    result r = {0};
    fn(reg, id, &reply);
    r.status = reply.status;
    if (reply.body && reply.body_len)
        r.json = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    return r;
}

static const char *error_code(const result *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static int64_t length_of(const result *r)
{
    return json_integer_value(json_object_get(r->json, "length"));
}

/* Creates a session from `body`; its id into id[34]. */
static bool create(api_sessions *reg, const char *body, char id[40])
{
    result r = call_route(api_sessions_create, reg, NULL, body);
    CHECKF(r.status == 201, "create %s: %d", body, r.status);
    const char *s = json_string_value(json_object_get(r.json, "id"));
    bool ok = r.status == 201 && s && strlen(s) < 40;
    if (ok) {
        snprintf(id, 40, "%s", s);
        CHECK(strcmp(r.location + strlen("/v1/sessions/"), s) == 0);
    }
    result_free(&r);
    return ok;
}

/* A JSON tensor [rows, width] in base64, written into a malloc'd string. */
static char *tensor(const float *x, int64_t rows, int64_t width)
{
    int64_t shape[2] = {rows, width};
    return json_tensor_b64(x, shape, 2);
}

/* The body of a step: q (nq rows) and k, v (nk rows), each may be absent (n = 0). */
static char *step_body(const float *q, int64_t nq, int64_t qw, const float *k, const float *v,
                       int64_t nk, int64_t kw, int64_t vw, const char *extra)
{
    char *qt = nq ? tensor(q, nq, qw) : NULL, *kt = nk ? tensor(k, nk, kw) : NULL;
    char *vt = nk ? tensor(v, nk, vw) : NULL;
    size_t n = (qt ? strlen(qt) : 0) + (kt ? strlen(kt) : 0) + (vt ? strlen(vt) : 0) + 512;
    char *b = malloc(n);
    snprintf(b, n, "{\"output_encoding\":\"flat\"%s%s%s%s%s%s%s%s}", qt ? ",\"query\":" : "",
             qt ? qt : "", kt ? ",\"key\":" : "", kt ? kt : "", vt ? ",\"value\":" : "",
             vt ? vt : "", extra ? "," : "", extra ? extra : "");
    free(qt);
    free(kt);
    free(vt);
    return b;
}

/* POST /v1/attention of q (nq rows) over the history k, v (S rows): the reference. */
static result reference(const float *q, int64_t nq, const float *k, const float *v, int64_t S,
                        int64_t H, int64_t Hkv, int64_t D, const char *causal)
{
    char extra[160];
    snprintf(extra, sizeof extra, "\"num_heads\":%lld,\"num_kv_heads\":%lld,\"causal\":%s",
             (long long)H, (long long)Hkv, causal);
    char *body = step_body(q, nq, H * D, k, v, S, Hkv * D, Hkv * D, extra);
    result r = call_route(api_attention, NULL, NULL, body);
    free(body);
    return r;
}

/* The largest |a - b| over the "output" data of two flat replies; -1 when they differ in size. */
static double output_diff(const result *a, const result *b)
{
    json_t *da = json_object_get(json_object_get(a->json, "output"), "data");
    json_t *db = json_object_get(json_object_get(b->json, "output"), "data");
    if (!da || !db || json_array_size(da) != json_array_size(db) || json_array_size(da) == 0)
        return -1;
    double m = 0;
    for (size_t i = 0; i < json_array_size(da); i++) {
        double d = fabs(json_number_value(json_array_get(da, i)) -
                        json_number_value(json_array_get(db, i)));
        m = d > m ? d : m;
    }
    return m;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* One sequence's history on the test's side: what the session should hold. */
typedef struct {
    int64_t H, Hkv, D, n, cap;
    float *k, *v;
} history;

static void history_init(history *h, int64_t H, int64_t Hkv, int64_t D, int64_t cap)
{
    *h = (history){
        H, Hkv, D, 0, cap, calloc((size_t)(cap * Hkv * D), 4), calloc((size_t)(cap * Hkv * D), 4)};
}

static void history_free(history *h)
{
    free(h->k);
    free(h->v);
}

static void fill(float *x, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(rng, 1.0);
}

/* A step of nq queries after appending nk random tokens, checked against the reference over the
 * whole history within tol * max|V|; returns false when a check failed. */
static bool step_checked(api_sessions *reg, const char *id, history *h, int64_t nq, int64_t nk,
                         uint64_t *rng, double tol, const char *causal)
{
    int64_t W = h->Hkv * h->D;
    float *q = malloc((size_t)((nq ? nq : 1) * h->H * h->D) * 4);
    fill(q, (size_t)(nq * h->H * h->D), rng);
    fill(h->k + h->n * W, (size_t)(nk * W), rng);
    fill(h->v + h->n * W, (size_t)(nk * W), rng);
    char extra[64] = "";
    snprintf(extra, sizeof extra, "\"expect_length\":%lld%s%s", (long long)h->n,
             causal ? ",\"causal\":" : "", causal ? causal : "");
    char *body = step_body(q, nq, h->H * h->D, h->k + h->n * W, h->v + h->n * W, nk, W, W, extra);
    result r = call_route(api_session_attention, reg, id, body);
    free(body);
    h->n += nk;
    bool ok = r.status == 200 && length_of(&r) == h->n;
    CHECKF(ok, "step at %lld: status %d, length %lld", (long long)(h->n - nk), r.status,
           (long long)length_of(&r));
    if (ok && nq) {
        result ref = reference(q, nq, h->k, h->v, h->n, h->H, h->Hkv, h->D,
                               causal ? causal : "\"bottom_right\"");
        double d = output_diff(&r, &ref), bound = tol * max_abs(h->v, (size_t)(h->n * W));
        CHECKF(ref.status == 200 && d >= 0 && d <= bound,
               "step at length %lld: |session - /v1/attention| = %g > %g", (long long)h->n, d,
               bound);
        ok = ref.status == 200 && d >= 0 && d <= bound;
        result_free(&ref);
    }
    result_free(&r);
    free(q);
    return ok;
}

static api_sessions *registry(size_t bytes, int64_t block_tokens, int64_t ttl_s)
{
    char msg[256];
    api_sessions_config cfg = {
        .capacity_bytes = bytes, .block_tokens = block_tokens, .ttl_s = ttl_s};
    api_sessions *reg = api_sessions_new(&cfg, msg, sizeof msg);
    CHECKF(reg != NULL, "%s", msg);
    return reg;
}

/* ---- Steps against /v1/attention -------------------------------------------------------- */

static void decode_run(const char *dtype, double tol)
{
    bool quick = daemon_quick();
    int64_t prefill = quick ? 300 : 1000, steps = quick ? 40 : 200;
    api_sessions *reg = registry((size_t)64 << 20, 64, 600);
    char id[40], body[160];
    uint64_t rng = 16;
    history h;
    snprintf(body, sizeof body,
             "{\"num_heads\":4,\"num_kv_heads\":2,\"head_dim\":16,\"cache_dtype\":\"%s\"}", dtype);
    if (!reg || !create(reg, body, id)) {
        api_sessions_free(reg);
        return;
    }
    history_init(&h, 4, 2, 16, prefill + steps);
    bool ok = step_checked(reg, id, &h, prefill, prefill, &rng, tol, NULL);
    for (int64_t i = 0; ok && i < steps; i++)
        ok = step_checked(reg, id, &h, 1, 1, &rng, tol, NULL);
    result g = cheap(api_sessions_get, reg, id);
    CHECK_EQ_INT(g.status, 200);
    CHECK_EQ_INT(length_of(&g), prefill + steps);
    CHECK(strcmp(json_string_value(json_object_get(g.json, "cache_dtype")), dtype) == 0);
    result_free(&g);
    history_free(&h);
    api_sessions_free(reg);
}

static void test_prefill_then_decode_float32(void)
{
    decode_run("float32", 1e-5);
}

static void test_prefill_then_decode_bfloat16(void)
{
    decode_run("bfloat16", 2.8e-3);
}

static void test_fork_then_diverge(void)
{
    api_sessions *reg = registry((size_t)16 << 20, 16, 600);
    char a[40], b[40];
    uint64_t rng = 7;
    history ha, hb;
    if (!reg || !create(reg, "{\"num_heads\":2,\"head_dim\":8}", a)) {
        api_sessions_free(reg);
        return;
    }
    history_init(&ha, 2, 2, 8, 200);
    history_init(&hb, 2, 2, 8, 200);
    step_checked(reg, a, &ha, 1, 37, &rng, 1e-5, NULL); /* ends inside a block: copy-on-write */
    result f = call_route(api_session_fork, reg, a, NULL);
    CHECK_EQ_INT(f.status, 201);
    CHECK_EQ_INT(length_of(&f), 37);
    snprintf(b, sizeof b, "%s", json_string_value(json_object_get(f.json, "id")));
    CHECK(strcmp(a, b) != 0);
    result_free(&f);
    memcpy(hb.k, ha.k, (size_t)(37 * 16) * 4);
    memcpy(hb.v, ha.v, (size_t)(37 * 16) * 4);
    hb.n = 37;
    for (int i = 0; i < 5; i++) {
        step_checked(reg, a, &ha, 1, 3, &rng, 1e-5, NULL);
        step_checked(reg, b, &hb, 2, 2, &rng, 1e-5, NULL);
    }
    CHECK_EQ_INT(ha.n, 52);
    CHECK_EQ_INT(hb.n, 47);
    history_free(&ha);
    history_free(&hb);
    api_sessions_free(reg);
}

static void test_truncate_then_continue(void)
{
    api_sessions *reg = registry((size_t)16 << 20, 16, 600);
    char id[40];
    uint64_t rng = 8;
    history h;
    if (!reg || !create(reg, "{\"num_heads\":2,\"num_kv_heads\":1,\"head_dim\":8}", id)) {
        api_sessions_free(reg);
        return;
    }
    history_init(&h, 2, 1, 8, 200);
    step_checked(reg, id, &h, 4, 50, &rng, 1e-5, NULL);
    step_checked(reg, id, &h, 1, 20, &rng, 1e-5, NULL);
    result t = call_route(api_session_truncate, reg, id, "{\"length\":45,\"expect_length\":70}");
    CHECK_EQ_INT(t.status, 200);
    CHECK_EQ_INT(length_of(&t), 45);
    result_free(&t);
    h.n = 45;
    for (int i = 0; i < 4; i++)
        step_checked(reg, id, &h, 1, 1, &rng, 1e-5, NULL);
    t = call_route(api_session_truncate, reg, id, "{\"length\":500}");
    CHECK_EQ_INT(t.status, 422);
    result_free(&t);
    history_free(&h);
    api_sessions_free(reg);
}

static void test_append_only_then_attend_only(void)
{
    api_sessions *reg = registry((size_t)16 << 20, 16, 600);
    char id[40];
    uint64_t rng = 9;
    history h;
    if (!reg || !create(reg, "{\"num_heads\":2,\"head_dim\":8}", id)) {
        api_sessions_free(reg);
        return;
    }
    history_init(&h, 2, 2, 8, 200);
    CHECK(step_checked(reg, id, &h, 0, 30, &rng, 1e-5, NULL)); /* append only */
    CHECK(step_checked(reg, id, &h, 0, 10, &rng, 1e-5, NULL));
    /* Attend only, as cross-attention over a stored memory: every query sees every key. */
    CHECK(step_checked(reg, id, &h, 3, 0, &rng, 1e-5, "false"));
    CHECK(step_checked(reg, id, &h, 2, 0, &rng, 1e-5, NULL));
    CHECK_EQ_INT(h.n, 40);
    result r = call_route(api_session_attention, reg, id, "{}");
    CHECK_EQ_INT(r.status, 422); /* nothing to do */
    result_free(&r);
    history_free(&h);
    api_sessions_free(reg);
}

/* ---- The registry --------------------------------------------------------------------------- */

/* Appends `tokens` zero tokens of a [num_heads 1, head_dim 8] session. */
static result append_zeros(api_sessions *reg, const char *id, int64_t tokens)
{
    float *z = calloc((size_t)(tokens * 8), 4);
    char *body = step_body(NULL, 0, 0, z, z, tokens, 8, 8, NULL);
    result r = call_route(api_session_attention, reg, id, body);
    free(body);
    free(z);
    return r;
}

static void test_eviction_under_a_cache_of_three(void)
{
    /* One block of 16 tokens x 1 head x (8 + 8) floats is 1 KiB: the cache holds three. */
    api_sessions *reg = registry(3 * 1024, 16, 600);
    char id[4][40];
    if (!reg)
        return;
    for (int i = 0; i < 3; i++) {
        CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", id[i]));
        result r = append_zeros(reg, id[i], 16);
        CHECK_EQ_INT(r.status, 200);
        result_free(&r);
    }
    result r = append_zeros(reg, id[0], 0 + 1); /* id[0] needs a second block: evicts id[1] */
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    r = cheap(api_sessions_get, reg, id[1]);
    CHECK_EQ_INT(r.status, 404);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", id[3]));
    /* Every other session is pinned by a ticket (a step admitted): none may be evicted. */
    api_session_ticket t0, t2;
    CHECK(api_session_ticket_take(reg, id[0], &t0));
    CHECK(api_session_ticket_take(reg, id[2], &t2));
    r = append_zeros(reg, id[3], 16);
    CHECK_EQ_INT(r.status, 429);
    CHECK_EQ_INT(r.retry_after_s, 1);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
                 "--kv-cache-bytes") != NULL);
    result_free(&r);
    api_session_turn_end(reg, &t0);
    r = append_zeros(reg, id[3], 16); /* now id[0] is idle and the least recently used */
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    api_session_turn_end(reg, &t2);
    r = cheap(api_sessions_get, reg, id[0]);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT(st.live, 2);
    CHECK_EQ_INT(st.evicted_pressure, 2);
    CHECK(st.bytes_used <= st.bytes_capacity);
    /* A session that could never fit: 413 naming the flag. */
    r = append_zeros(reg, id[3], 16 * 4);
    CHECK_EQ_INT(r.status, 413);
    result_free(&r);
    api_sessions_free(reg);
}

static void test_ttl_expiry(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char a[40], b[40];
    if (!reg)
        return;
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8,\"ttl_s\":1}", a));
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", b));
    result r = append_zeros(reg, a, 4);
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    sleep_ms(1300);
    r = append_zeros(reg, a, 1);
    CHECK_EQ_INT(r.status, 404);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    r = cheap(api_sessions_get, reg, b);
    CHECK_EQ_INT(r.status, 200); /* the flag's TTL, 600 s */
    CHECK_EQ_INT(json_integer_value(json_object_get(r.json, "ttl_s")), 600);
    result_free(&r);
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT(st.evicted_ttl, 1);
    CHECK_EQ_INT(st.live, 1);
    api_sessions_free(reg);
}

/* A step takes its ticket at admission, with nothing else touching the registry in between:
 * a session idle past its TTL is gone then too, however quiet the daemon is. */
static void test_ttl_expiry_at_the_ticket(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char a[40];
    if (!reg)
        return;
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8,\"ttl_s\":1}", a));
    result r = append_zeros(reg, a, 4);
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    sleep_ms(1300);
    api_session_ticket t;
    CHECK(!api_session_ticket_take(reg, a, &t));
    CHECK(t.session == NULL);
    r = append_zeros(reg, a, 1);
    CHECK_EQ_INT(r.status, 404);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT(st.evicted_ttl, 1);
    api_sessions_free(reg);
}

static void test_expect_length_conflict(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char id[40];
    if (!reg || !create(reg, "{\"num_heads\":1,\"head_dim\":8}", id)) {
        api_sessions_free(reg);
        return;
    }
    result r = append_zeros(reg, id, 3);
    result_free(&r);
    float z[8] = {0};
    char *body = step_body(z, 1, 8, z, z, 1, 8, 8, "\"expect_length\":2");
    r = call_route(api_session_attention, reg, id, body);
    CHECK_EQ_INT(r.status, 409);
    CHECK(strcmp(error_code(&r), "conflict") == 0);
    result_free(&r);
    free(body);
    r = cheap(api_sessions_get, reg, id);
    CHECK_EQ_INT(length_of(&r), 3); /* nothing appended */
    result_free(&r);
    api_sessions_free(reg);
}

static void test_limits_and_shapes(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char id[40];
    if (!reg || !create(reg, "{\"num_heads\":1,\"head_dim\":8,\"max_tokens\":10}", id)) {
        api_sessions_free(reg);
        return;
    }
    result r = append_zeros(reg, id, 11);
    CHECK_EQ_INT(r.status, 413);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
                 "max_tokens") != NULL);
    result_free(&r);
    float z[16] = {0};
    char *body = step_body(NULL, 0, 0, z, z, 1, 16, 8, NULL); /* key rows of 16, not 8 */
    r = call_route(api_session_attention, reg, id, body);
    free(body);
    CHECK_EQ_INT(r.status, 422);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")),
                 "key") == 0);
    result_free(&r);
    r = call_route(api_session_attention, reg, id, "{\"query\":[[1,2,3,4,5,6,7,8]]}");
    CHECK_EQ_INT(r.status, 422); /* an empty session has nothing to attend */
    result_free(&r);
    r = call_route(api_session_attention, reg, id, "{\"casual\":true}");
    CHECK_EQ_INT(r.status, 422);
    result_free(&r);
    r = call_route(api_sessions_create, reg, NULL,
                   "{\"num_heads\":3,\"num_kv_heads\":2,"
                   "\"head_dim\":8}");
    CHECK_EQ_INT(r.status, 422);
    result_free(&r);
    r = call_route(api_sessions_create, reg, NULL, "{\"head_dim\":8}");
    CHECK_EQ_INT(r.status, 422);
    result_free(&r);
    api_sessions_free(reg);
}

static void test_malformed_and_unknown_ids(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char id[40];
    if (!reg || !create(reg, "{\"num_heads\":1,\"head_dim\":8}", id)) {
        api_sessions_free(reg);
        return;
    }
    const char *bad[] = {
        "nope", "s0123", "S0123456789abcdef0123456789abcdef", "s0123456789abcdef0123456789abcdeg",
        "",     NULL};
    for (int i = 0; bad[i]; i++) {
        result r = cheap(api_sessions_get, reg, bad[i]);
        CHECK_EQ_INT(r.status, 404);
        CHECK(strcmp(error_code(&r), "session_not_found") == 0);
        result_free(&r);
    }
    /* Well-formed: one of ours that never was, and one of another replica's. */
    char unknown[40], foreign[40];
    snprintf(unknown, sizeof unknown, "%s", id);
    unknown[32] = unknown[32] == '0' ? '1' : '0';
    snprintf(foreign, sizeof foreign, "%s", id);
    foreign[1] = foreign[1] == '0' ? '1' : '0';
    result r = call_route(api_session_attention, reg, unknown, "{}");
    CHECK_EQ_INT(r.status, 404);
    CHECK(strcmp(error_code(&r), "session_not_found") == 0);
    result_free(&r);
    r = cheap(api_sessions_get, reg, foreign);
    CHECK_EQ_INT(r.status, 404);
    CHECK(strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    r = cheap(api_sessions_delete, reg, id);
    CHECK_EQ_INT(r.status, 204);
    result_free(&r);
    r = cheap(api_sessions_delete, reg, id);
    CHECK_EQ_INT(r.status, 404);
    CHECK(strcmp(error_code(&r), "session_not_found") == 0); /* deleted, not evicted */
    result_free(&r);
    api_sessions_free(reg);
}

static void test_sessions_off(void)
{
    result r = call_route(api_sessions_create, NULL, NULL, "{\"num_heads\":1,\"head_dim\":8}");
    CHECK_EQ_INT(r.status, 501);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
                 "--kv-cache-bytes") != NULL);
    result_free(&r);
    r = cheap(api_sessions_get, NULL, "s0123456789abcdef0123456789abcdef");
    CHECK_EQ_INT(r.status, 501);
    result_free(&r);
}

static void test_list_pages(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char id[5][40];
    if (!reg)
        return;
    for (int i = 0; i < 5; i++)
        CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", id[i]));
    api_reply reply;
    char after[40] = "";
    int seen = 0;
    for (int page = 0; page < 4; page++) {
        api_sessions_list(reg, "2", after[0] ? after : NULL, &reply);
        CHECK_EQ_INT(reply.status, 200);
        json_t *j = json_loadb(reply.body, reply.body_len, 0, NULL);
        json_t *list = json_object_get(j, "sessions");
        for (size_t i = 0; i < json_array_size(list); i++, seen++)
            CHECK(strcmp(json_string_value(json_object_get(json_array_get(list, i), "id")),
                         id[seen]) == 0);
        const char *next = json_string_value(json_object_get(j, "next"));
        snprintf(after, sizeof after, "%s", next ? next : "");
        json_decref(j);
        api_reply_free(&reply);
        if (!next)
            break;
    }
    CHECK_EQ_INT(seen, 5);
    api_sessions_list(reg, "0", NULL, &reply);
    CHECK_EQ_INT(reply.status, 422);
    api_reply_free(&reply);
    /* 1,000 sessions created and deleted leave nothing behind. */
    for (int i = 0; i < 1000; i++) {
        char x[40];
        if (!create(reg, "{\"num_heads\":1,\"head_dim\":8}", x))
            break;
        result r = append_zeros(reg, x, 20);
        result_free(&r);
        r = cheap(api_sessions_delete, reg, x);
        result_free(&r);
    }
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT(st.live, 5);
    CHECK_EQ_INT(st.bytes_used, 0);
    CHECK_EQ_INT(st.deleted, 1000);
    api_sessions_free(reg);
}

/* Writes x (with a comma when more follows) into p; returns the characters written. */
static int put_float(char *p, float x, bool more)
{
    return snprintf(p, 24, "%.9g%s", (double)x, more ? "," : "");
}

/* ---- KServe v2 sequences ----------------------------------------------------------------- */

static void put_floats(char **p, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        *p += put_float(*p, x[i], i + 1 < n);
}

/* One v2 inference on model sdpa: rank-2 q (nq rows), k and v (nk rows) of width w, with the
 * parameters `params` (JSON members). */
static result v2_infer(api_sessions *reg, const float *q, int64_t nq, int64_t qw, const float *k,
                       const float *v, int64_t nk, int64_t w, const char *params)
{
    size_t cap = (size_t)(nq * qw + 2 * nk * w) * 20 + 1024;
    char *b = malloc(cap), *p = b;
    p += snprintf(p, cap, "{\"parameters\":{%s},\"inputs\":[", params);
    const float *x[3] = {q, k, v};
    int64_t rows[3] = {nq, nk, nk}, width[3] = {qw, w, w};
    const char *names[3] = {"query", "key", "value"};
    for (int t = 0; t < 3; t++) {
        p += snprintf(p, 200,
                      "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],"
                      "\"data\":[",
                      t ? "," : "", names[t], (long long)rows[t], (long long)width[t]);
        put_floats(&p, x[t], (size_t)(rows[t] * width[t]));
        p += snprintf(p, 8, "]}");
    }
    snprintf(p, 8, "]}");
    api_call call = {.body = b,
                     .body_len = strlen(b),
                     .content_type = "application/json",
                     .pool = pool,
                     .sessions = reg,
                     .model = "sdpa"};
    api_reply reply;
    result r = {0};
    api_v2_infer(&call, &reply);
    r.status = reply.status;
    if (reply.body)
        r.json = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    free(b);
    return r;
}

static void test_v2_sequence_matches_attention(void)
{
    int64_t H = 4, Hkv = 2, D = 8, W = Hkv * D, prefill = daemon_quick() ? 100 : 1000;
    int64_t steps = daemon_quick() ? 20 : 200;
    api_sessions *reg = registry((size_t)64 << 20, 64, 600);
    history h;
    uint64_t rng = 21;
    if (!reg)
        return;
    history_init(&h, H, Hkv, D, prefill + steps);
    float *q = malloc((size_t)(prefill * H * D) * 4);
    for (int64_t i = 0; i <= steps; i++) {
        int64_t n = i == 0 ? prefill : 1;
        fill(q, (size_t)(n * H * D), &rng);
        fill(h.k + h.n * W, (size_t)(n * W), &rng);
        fill(h.v + h.n * W, (size_t)(n * W), &rng);
        char params[160];
        snprintf(params, sizeof params, "\"sequence_id\":42,\"num_heads\":4,\"num_kv_heads\":2%s%s",
                 i == 0 ? ",\"sequence_start\":true" : "",
                 i == steps ? ",\"sequence_end\":true" : "");
        result r = v2_infer(reg, q, n, H * D, h.k + h.n * W, h.v + h.n * W, n, W, params);
        h.n += n;
        CHECKF(r.status == 200, "v2 step %lld: %d %s", (long long)i, r.status,
               r.json ? json_string_value(json_object_get(r.json, "error")) : "");
        result ref = reference(q, n, h.k, h.v, h.n, H, Hkv, D, "\"bottom_right\"");
        json_t *out = json_array_get(json_object_get(r.json, "outputs"), 0);
        json_t *da = json_object_get(out, "data");
        json_t *db = json_object_get(json_object_get(ref.json, "output"), "data");
        double m = -1;
        if (da && db && json_array_size(da) == json_array_size(db)) {
            m = 0;
            for (size_t j = 0; j < json_array_size(da); j++) {
                double dd = fabs(json_number_value(json_array_get(da, j)) -
                                 json_number_value(json_array_get(db, j)));
                m = dd > m ? dd : m;
            }
        }
        double bound = 1e-5 * max_abs(h.v, (size_t)(h.n * W));
        CHECKF(m >= 0 && m <= bound, "v2 step %lld: diff %g > %g", (long long)i, m, bound);
        result_free(&r);
        result_free(&ref);
        if (m < 0 || m > bound)
            break;
    }
    /* The end freed the session: the next request needs START again, in Triton's words. */
    result r = v2_infer(reg, q, 1, H * D, h.k, h.v, 1, W,
                        "\"sequence_id\":42,\"num_heads\":4,"
                        "\"num_kv_heads\":2");
    CHECK_EQ_INT(r.status, 400);
    const char *msg = json_string_value(json_object_get(r.json, "error"));
    CHECK(msg && strstr(msg, "must specify the START flag on the first request of the "
                             "sequence") != NULL);
    result_free(&r);
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT(st.ended, 1);
    CHECK_EQ_INT(st.live, 0);
    /* The configuration says the model takes sequences. */
    api_call call = {.sessions = reg, .model = "sdpa"};
    api_reply reply;
    api_v2_model_config(&call, &reply);
    CHECK(reply.body && memmem(reply.body, reply.body_len, "\"sequence_batching\"", 19) != NULL);
    api_reply_free(&reply);
    free(q);
    history_free(&h);
    api_sessions_free(reg);
}

/* ---- Order ------------------------------------------------------------------------------- */

/* Requests of one session taken in order 0..N-1 run, from four threads that take them in a
 * scrambled order, exactly in ticket order and never two at once: an out-of-turn one parks
 * (its thread moves on), and the end of a turn resumes the next by putting it back in the
 * work list, as the server resubmits it to the pool. */
enum { ORDER_N = 400, ORDER_THREADS = 4 };

typedef struct {
    api_sessions *reg;
    pthread_mutex_t lock;
    api_session_ticket tickets[ORDER_N];
    int work[ORDER_N * 2]; /* indices of tickets to run */
    int n_work, next_work;
    int log[ORDER_N], n_log;
    atomic_int running;
    atomic_int overlaps;
} order_state;

static order_state order;

static void order_resume(void *arg)
{
    int i = (int)(intptr_t)arg;
    pthread_mutex_lock(&order.lock);
    order.work[order.n_work++] = i;
    pthread_mutex_unlock(&order.lock);
}

static void *order_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&order.lock);
        if (order.n_log == ORDER_N) {
            pthread_mutex_unlock(&order.lock);
            return NULL;
        }
        int i = order.next_work < order.n_work ? order.work[order.next_work++] : -1;
        pthread_mutex_unlock(&order.lock);
        if (i < 0) {
            sched_yield();
            continue;
        }
        if (!api_session_turn(order.reg, &order.tickets[i], order_resume, (void *)(intptr_t)i))
            continue; /* parked */
        if (atomic_fetch_add(&order.running, 1) != 0)
            atomic_fetch_add(&order.overlaps, 1);
        pthread_mutex_lock(&order.lock);
        order.log[order.n_log++] = i;
        pthread_mutex_unlock(&order.lock);
        atomic_fetch_sub(&order.running, 1);
        api_session_turn_end(order.reg, &order.tickets[i]);
    }
}

/* Runs order.tickets (taken in order 0..ORDER_N-1) from the threads, in a scrambled order, and
 * checks that they ran in ticket order, one at a time. */
static void run_in_scrambled_order(void)
{
    uint64_t rng = 3;
    pthread_t th[ORDER_THREADS];
    for (int i = 0; i < ORDER_N; i++)
        order.work[i] = i;
    /* Scrambled within windows of 16, as a pool with priorities might dequeue them. */
    for (int i = 0; i < ORDER_N; i++) {
        int j = (int)rng_int(&rng, i, (i | 15) < ORDER_N - 1 ? (i | 15) : ORDER_N - 1);
        int t = order.work[i];
        order.work[i] = order.work[j];
        order.work[j] = t;
    }
    order.n_work = ORDER_N;
    for (int i = 0; i < ORDER_THREADS; i++)
        pthread_create(&th[i], NULL, order_worker, NULL);
    for (int i = 0; i < ORDER_THREADS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(order.n_log, ORDER_N);
    CHECK_EQ_INT(atomic_load(&order.overlaps), 0);
    for (int i = 0; i < ORDER_N; i++)
        CHECKF(order.log[i] == i, "the %dth request to run was ticket %d", i, order.log[i]);
}

static void test_tickets_keep_arrival_order(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    char id[40];
    if (!reg || !create(reg, "{\"num_heads\":1,\"head_dim\":8}", id)) {
        api_sessions_free(reg);
        return;
    }
    memset(&order, 0, sizeof order);
    order.reg = reg;
    pthread_mutex_init(&order.lock, NULL);
    for (int i = 0; i < ORDER_N; i++)
        CHECK(api_session_ticket_take(reg, id, &order.tickets[i]));
    run_in_scrambled_order();
    /* A ticket dropped before its turn (the watcher answered it) does not stall the order. */
    api_session_ticket a, b, c;
    CHECK(api_session_ticket_take(reg, id, &a));
    CHECK(api_session_ticket_take(reg, id, &b));
    CHECK(api_session_ticket_take(reg, id, &c));
    api_session_turn_end(reg, &b); /* dropped out of turn */
    CHECK(api_session_turn(reg, &a, order_resume, NULL));
    api_session_turn_end(reg, &a);
    CHECK(api_session_turn(reg, &c, order_resume, NULL)); /* b was skipped */
    api_session_turn_end(reg, &c);
    pthread_mutex_destroy(&order.lock);
    api_sessions_free(reg);
}

/* The tickets of a v2 sequence, taken before its session exists (as the server takes them, its
 * START among them), keep the same order from the same threads. */
static void test_sequence_tickets_keep_arrival_order(void)
{
    api_sessions *reg = registry((size_t)1 << 20, 16, 600);
    if (!reg)
        return;
    memset(&order, 0, sizeof order);
    order.reg = reg;
    pthread_mutex_init(&order.lock, NULL);
    for (int i = 0; i < ORDER_N; i++)
        CHECK(api_sequence_ticket_take(reg, "sdpa", "chat-1", 6, &order.tickets[i]));
    run_in_scrambled_order();
    pthread_mutex_destroy(&order.lock);
    api_sessions_free(reg);
}

static void count_resume(void *arg)
{
    (*(int *)arg)++;
}

/* A step of sequence 7 (1 query, `tokens` zero tokens of [1 head, head_dim 8]). */
static result sequence_step(api_sessions *reg, int64_t tokens, bool start)
{
    float *z = calloc((size_t)(tokens * 8), 4);
    result r = v2_infer(reg, z, 1, 8, z, z, tokens, 8,
                        start ? "\"sequence_id\":7,\"sequence_start\":true" : "\"sequence_id\":7");
    free(z);
    return r;
}

/* One sequence's requests wait for its START, another sequence's do not, and while a sequence
 * has requests admitted (tickets outstanding) its session is not evicted, however long unused;
 * the line goes with its last ticket, and then the session can be. */
static void test_sequence_order_and_eviction(void)
{
    /* One block of 16 tokens x 1 head x (8 + 8) floats is 1 KiB: the cache holds three. */
    api_sessions *reg = registry(3 * 1024, 16, 600);
    api_session_ticket start, step, other, none;
    char a[40], b[40];
    int resumed = 0;
    if (!reg)
        return;
    CHECK(api_sequence_ticket_take(reg, "sdpa", "7", 1, &start));
    CHECK(api_sequence_ticket_take(reg, "sdpa", "7", 1, &step));
    CHECK(api_sequence_ticket_take(reg, "sdpa", "8", 1, &other));
    CHECK(!api_sequence_ticket_take(reg, "sdpa", "", 0, &none) && !none.sequence);
    CHECK(!api_session_turn(reg, &step, count_resume, &resumed)); /* parked behind the START */
    CHECK(api_session_turn(reg, &other, count_resume, &resumed)); /* its own line: at once */
    CHECK(api_session_turn(reg, &start, count_resume, &resumed));
    result r = sequence_step(reg, 15, true); /* one block, with room for the step's token */
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    api_session_turn_end(reg, &other);
    CHECK_EQ_INT(resumed, 0);
    api_session_turn_end(reg, &start);
    CHECK_EQ_INT(resumed, 1); /* the step's turn came with the end of the START */

    /* Two sessions used after it fill the cache; a third block evicts the least recently used
     * idle one, which is not the sequence's while its step is admitted. */
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", a));
    CHECK(create(reg, "{\"num_heads\":1,\"head_dim\":8}", b));
    r = append_zeros(reg, a, 16);
    result_free(&r);
    r = append_zeros(reg, b, 16);
    result_free(&r);
    r = append_zeros(reg, a, 1);
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    r = cheap(api_sessions_get, reg, b);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_evicted") == 0);
    result_free(&r);
    CHECK(api_session_turn(reg, &step, count_resume, &resumed));
    r = sequence_step(reg, 1, false);
    CHECK_EQ_INT(r.status, 200); /* its session was kept */
    result_free(&r);
    api_session_turn_end(reg, &step);

    /* No ticket left: the sequence's session is idle, and the least recently used now. */
    r = append_zeros(reg, a, 16);
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    r = sequence_step(reg, 1, false);
    CHECK_EQ_INT(r.status, 400); /* evicted: the next request needs START again */
    result_free(&r);
    api_sessions_free(reg);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool) {
        fprintf(stderr, "pool: %s\n", err.message);
        return 1;
    }
    RUN_WITHIN(test_prefill_then_decode_float32, 240);
    RUN_WITHIN(test_prefill_then_decode_bfloat16, 240);
    RUN(test_fork_then_diverge);
    RUN(test_truncate_then_continue);
    RUN(test_append_only_then_attend_only);
    RUN(test_eviction_under_a_cache_of_three);
    RUN(test_ttl_expiry);
    RUN(test_ttl_expiry_at_the_ticket);
    RUN(test_expect_length_conflict);
    RUN(test_limits_and_shapes);
    RUN(test_malformed_and_unknown_ids);
    RUN(test_sessions_off);
    RUN(test_list_pages);
    RUN_WITHIN(test_v2_sequence_matches_attention, 240);
    RUN_WITHIN(test_tickets_keep_arrival_order, 120);
    RUN_WITHIN(test_sequence_tickets_keep_arrival_order, 120);
    RUN(test_sequence_order_and_eviction);
    eng_pool_free(pool);
    return check_report();
}
