/*
 * test_concurrency.c - 32 concurrent clients get the same answers as one client alone.
 *
 * A set of requests (the golden seed example plus random Q/K/V of varied shapes, in nested
 * JSON and base64 forms, with and without a causal mask) is first sent one at a time; then 32
 * threads send them all again at once, in different orders, and every output must equal the
 * serial one. Request ids must stay unique across all of them.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/rng.h"

#define CLIENTS 32
#define N_REQ   17
#define MAX_OUT 8192

typedef struct {
    char *body;
    double *expect;
    long n_expect;
} case_t;

static daemon_proc d;
static case_t cases[N_REQ];
static int rounds;

typedef struct {
    pthread_t thread;
    int index;
    int ok, mismatched, failed;
    char ids[8][160];
    int n_ids;
} client_t;

static uint64_t rng_state;

static float rnd(void)
{
    return rng_sym(&rng_state, 2.0);
}

/* Appends a nested [rows][cols] JSON array of random values to `out`. */
static size_t nested(char *out, size_t cap, int rows, int cols)
{
    size_t n = 0;
    n += (size_t)snprintf(out + n, cap - n, "[");
    for (int r = 0; r < rows; r++) {
        n += (size_t)snprintf(out + n, cap - n, "%s[", r ? "," : "");
        for (int c = 0; c < cols; c++)
            n += (size_t)snprintf(out + n, cap - n, "%s%.9g", c ? "," : "", (double)rnd());
        n += (size_t)snprintf(out + n, cap - n, "]");
    }
    n += (size_t)snprintf(out + n, cap - n, "]");
    return n;
}

static char *random_nested_case(int i)
{
    int L = 1 + (i * 11) % 40, S = 1 + (i * 7) % 60;
    int heads = 1 << (i % 3), D = 8 * (1 + i % 2);
    int E = heads * D;
    size_t cap = (size_t)(L + 2 * S) * (size_t)E * 20 + 512, n = 0;
    char *b = malloc(cap);
    if (!b)
        return NULL;
    n += (size_t)snprintf(b + n, cap - n, "{\"num_heads\":%d,\"causal\":%s,\"query\":", heads,
                          i % 4 == 0 ? "\"bottom_right\""
                          : i % 2    ? "true"
                                     : "false");
    n += nested(b + n, cap - n, L, E);
    n += (size_t)snprintf(b + n, cap - n, ",\"key\":");
    n += nested(b + n, cap - n, S, E);
    n += (size_t)snprintf(b + n, cap - n, ",\"value\":");
    n += nested(b + n, cap - n, S, E);
    snprintf(b + n, cap - n, "}");
    return b;
}

static char *random_b64_case(int i)
{
    int64_t H = 2, L = 16 + i, S = 100 + 13 * i, D = 32;
    int64_t qs[4] = {1, H, L, D}, ks[4] = {1, H, S, D};
    float *q = malloc((size_t)(H * L * D) * sizeof *q),
          *k = malloc((size_t)(H * S * D) * sizeof *k);
    float *v = malloc((size_t)(H * S * D) * sizeof *v);
    char *tq = NULL, *tk = NULL, *tv = NULL, *out = NULL;
    if (q && k && v) {
        for (int64_t j = 0; j < H * L * D; j++)
            q[j] = rnd();
        for (int64_t j = 0; j < H * S * D; j++) {
            k[j] = rnd();
            v[j] = rnd();
        }
        tq = json_tensor_b64(q, qs, 4);
        tk = json_tensor_b64(k, ks, 4);
        tv = json_tensor_b64(v, ks, 4);
    }
    if (tq && tk && tv) {
        size_t n = strlen(tq) + strlen(tk) + strlen(tv) + 128;
        out = malloc(n);
        if (out)
            snprintf(out, n, "{\"query\":%s,\"key\":%s,\"value\":%s,\"output_encoding\":\"flat\"}",
                     tq, tk, tv);
    }
    free(q);
    free(k);
    free(v);
    free(tq);
    free(tk);
    free(tv);
    return out;
}

static bool same_output(const double *got, long n_got, const case_t *c)
{
    if (n_got != c->n_expect)
        return false;
    for (long i = 0; i < n_got; i++) {
        double tol = 1e-6 * fmax(1.0, fabs(c->expect[i]));
        if (!(fabs(got[i] - c->expect[i]) <= tol))
            return false;
    }
    return true;
}

static void *client_main(void *arg)
{
    client_t *cl = arg;
    void *h = http_handle_new();
    double *out = malloc(MAX_OUT * sizeof *out);
    for (int r = 0; r < rounds && out; r++) {
        for (int j = 0; j < N_REQ; j++) {
            const case_t *c = &cases[(cl->index * 5 + j * (r + 1)) % N_REQ];
            http_resp resp;
            long n;
            if (http_post_json(h, d.port, c->body, &resp) != 200) {
                cl->failed++;
                http_resp_free(&resp);
                continue;
            }
            n = json_numbers(resp.body, "output", out, MAX_OUT);
            if (same_output(out, n, c))
                cl->ok++;
            else
                cl->mismatched++;
            if (cl->n_ids < 8)
                snprintf(cl->ids[cl->n_ids++], sizeof cl->ids[0], "%s", resp.request_id);
            http_resp_free(&resp);
        }
    }
    free(out);
    http_handle_free(h);
    return NULL;
}

static void test_serial_answers(void)
{
    static const double seed_out[6] = {1, 0, 0.33023845, 1.33952310, 1.75872460, 1.0};
    double *out = malloc(MAX_OUT * sizeof *out);
    CHECK(out != NULL);
    for (int i = 0; i < N_REQ && out; i++) {
        http_resp r;
        CHECKF(http_post_json(NULL, d.port, cases[i].body, &r) == 200, "case %d: %ld %.200s", i,
               r.status, r.body);
        cases[i].n_expect = json_numbers(r.body, "output", out, MAX_OUT);
        CHECKF(cases[i].n_expect > 0 && cases[i].n_expect <= MAX_OUT, "case %d: %ld outputs", i,
               cases[i].n_expect);
        if (cases[i].n_expect > 0 && cases[i].n_expect <= MAX_OUT) {
            cases[i].expect = malloc((size_t)cases[i].n_expect * sizeof(double));
            if (cases[i].expect)
                memcpy(cases[i].expect, out, (size_t)cases[i].n_expect * sizeof(double));
        }
        http_resp_free(&r);
    }
    /* Case 0 is the golden example. */
    CHECK_EQ_INT(cases[0].n_expect, 6);
    for (int i = 0; i < 6 && cases[0].n_expect == 6; i++)
        CHECK_NEAR(cases[0].expect[i], seed_out[i], 1e-5);
    free(out);
}

static void test_concurrent_answers_equal_serial(void)
{
    client_t *cl = calloc(CLIENTS, sizeof *cl);
    int ok = 0, mismatched = 0, failed = 0;
    CHECK(cl != NULL);
    if (!cl)
        return;
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].index = i;
        pthread_create(&cl[i].thread, NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(cl[i].thread, NULL);
        ok += cl[i].ok;
        mismatched += cl[i].mismatched;
        failed += cl[i].failed;
    }
    CHECK_EQ_INT(ok, CLIENTS * rounds * N_REQ);
    CHECK_EQ_INT(mismatched, 0);
    CHECK_EQ_INT(failed, 0);
    /* Generated request ids are unique. */
    for (int a = 0; a < CLIENTS; a++)
        for (int i = 0; i < cl[a].n_ids; i++)
            for (int b = a; b < CLIENTS; b++)
                for (int j = (b == a ? i + 1 : 0); j < cl[b].n_ids; j++)
                    CHECKF(strcmp(cl[a].ids[i], cl[b].ids[j]) != 0, "id %s repeated", cl[a].ids[i]);
    free(cl);
    CHECK(metric_value(d.port, "attnd_queue_depth") == 0);
    CHECK(metric_value(d.port, "attnd_running_requests") == 0);
    CHECK(metric_wait_le(d.port, "attnd_memory_reserved_bytes", 0, 2000));
}

int main(void)
{
    const char *const args[] = {"--max-queue", "64", NULL};
    rounds = daemon_quick() ? 1 : 3;
    rng_state = 0x2545F4914F6CDD1Du;
    cases[0].body = strdup("{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], "
                           "[1, 1]], \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}");
    for (int i = 1; i < N_REQ; i++)
        cases[i].body = i % 3 == 0 ? random_b64_case(i) : random_nested_case(i);
    for (int i = 0; i < N_REQ; i++) {
        if (!cases[i].body) {
            printf("out of memory\n0 passed, 1 failed\n");
            return 1;
        }
    }
    if (daemon_start(&d, args) != 0) {
        printf("FAIL cannot start attnd\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_serial_answers);
    RUN(test_concurrent_answers_equal_serial);
    CHECK_EQ_INT(daemon_stop(&d), 0);
    for (int i = 0; i < N_REQ; i++) {
        free(cases[i].body);
        free(cases[i].expect);
    }
    return check_report();
}
