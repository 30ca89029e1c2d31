/*
 * bench_decode.c - decoding through a served model layer: many sequences, each stepping one
 * token at a time through the attention of a Llama-shaped bf16 layer, with dynamic batching on
 * (the default, --max-batch-rows 64) and off (--max-batch-rows 1).
 *
 * Two layers are generated in a temporary folder as Hugging Face checkpoints (config.json with
 * model_type llama and default RoPE, model.safetensors with layer 0's q/k/v/o_proj in BF16):
 *
 *   hidden 2048   32 heads of 64, 8 kv heads (Llama 3.2 1B's attention), 21 MB of weights;
 *   hidden 4096   32 heads of 128, 8 kv heads (Llama 3 8B's attention), 84 MB of weights.
 *
 * Each is served as `--model big=DIR:layer=0` with --threads equal to this machine's CPUs, by
 * one daemon batching and one not. On each, every client (a thread with its own connection)
 * has its own sequence with a prompt of 256 tokens, then steps it one token at a time for
 * SECONDS, at 1, 8, 32 and 64 clients at once, over
 *
 *   http   POST /v1/mha {"session", "input": [1, hidden] base64 float32, "expect_length"};
 *   grpc   ModelInfer of the layer model with a raw FP32 input [1, 1, hidden] and the
 *          parameter sequence_id (a KServe v2 sequence, started by its prompt with
 *          sequence_start).
 *
 * A line per case: steps/s over all clients, p50 and p99 of a step's latency as its client
 * sees it, and the mean batch size of the case (attnd_batched_requests_total over
 * attnd_batches_total; "-" where the daemon made no batches). Per layer and daemon, a line sets
 * one step against the time a streaming read of the weights' bytes takes in this process right
 * before (stream_ratio = the step's engine time, meta.compute_ms of 1 client's steps, over
 * that), and the prompts' engine time (their projections' GFLOPS against the in-register FMA
 * loop of the kernel set in use, tests/bench/harness). At hidden 2048 a cache of 4,096 tokens is
 * stepped too, by 1 and 8 clients over HTTP. A case whose steps fail prints FAILED and the bench
 * exits 1.
 *
 *     build/tests/bench/bench_decode [--seconds S] [--hidden 2048|4096|all]
 *
 * Absolute times on a shared machine drift; compare lines of one run.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "grpc_service.pb-c.h"
#include "tests/bench/harness/harness.h"
#include "tests/support/daemon.h"
#include "tests/support/grpc.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

enum { RETRY_MS = 5 };
enum { PROMPT = 256, LONG_PROMPT = 4096, LONG_CHUNK = 512, MAX_CLIENTS = 64, MAX_LAT = 1 << 14 };

static const int CLIENTS[] = {1, 8, 32, 64};
static double SECONDS = 2.0;

static const char *const JSON[] = {"Content-Type: application/json", NULL};

/* A layer's shape, and which cases it runs: gRPC up to grpc_clients clients (every client
 * costs a prompt of PROMPT tokens on each daemon), the cache of LONG_PROMPT tokens or not. */
typedef struct {
    int64_t hidden, heads, kv_heads, head_dim;
    int grpc_clients;
    bool long_cache;
} shape;

static int64_t weight_bytes(const shape *s)
{
    return 2 * (2 * s->heads * s->head_dim * s->hidden + 2 * s->kv_heads * s->head_dim * s->hidden);
}

/* ---- The checkpoint ------------------------------------------------------------------------ */

/* config.json and model.safetensors of a one-layer Llama with shape s in dir. */
static bool checkpoint_write(const char *dir, const shape *s)
{
    char path[512];
    int64_t q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    json_t *cfg = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:i,s:I,s:i,s:i,s:b,s:f,s:{s:s,s:f}}", "model_type", "llama",
        "hidden_size", (json_int_t)s->hidden, "num_attention_heads", (json_int_t)s->heads,
        "num_key_value_heads", (json_int_t)s->kv_heads, "head_dim", (json_int_t)s->head_dim,
        "num_hidden_layers", 1, "intermediate_size", (json_int_t)(4 * s->hidden), "vocab_size",
        32000, "max_position_embeddings", 131072, "attention_bias", 0, "rms_norm_eps", 1e-5,
        "rope_parameters", "rope_type", "default", "rope_theta", 500000.0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    bool ok = cfg && json_dump_file(cfg, path, JSON_INDENT(1)) == 0;
    json_decref(cfg);

    size_t n = (size_t)(2 * q * s->hidden + 2 * kv * s->hidden);
    float *w = malloc(n * sizeof *w);
    uint64_t rng = 7;
    if (!w)
        return false;
    for (size_t i = 0; i < n; i++)
        w[i] = (float)rng_sym(&rng, 0.02);
    float *wq = w, *wk = wq + q * s->hidden, *wv = wk + kv * s->hidden, *wo = wv + kv * s->hidden;
    stw_tensor t[] = {
        {"model.layers.0.self_attn.q_proj.weight", STW_BF16, 2, {q, s->hidden}, wq},
        {"model.layers.0.self_attn.k_proj.weight", STW_BF16, 2, {kv, s->hidden}, wk},
        {"model.layers.0.self_attn.v_proj.weight", STW_BF16, 2, {kv, s->hidden}, wv},
        {"model.layers.0.self_attn.o_proj.weight", STW_BF16, 2, {s->hidden, q}, wo},
    };
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ok = ok && stw_save(path, t, 4, NULL, 0);
    free(w);
    return ok;
}

/* ---- Streaming read ------------------------------------------------------------------------ */

/* The best of eight streaming reads of `bytes` over `threads` threads, in ms: a step reads the
 * weights from wherever they sit between steps, and so does this read of a buffer of their
 * size. */
static double stream_ms(int64_t bytes, int threads)
{
    return bench_stream_seconds((size_t)bytes, threads, 8) * 1e3;
}

/* ---- Requests ------------------------------------------------------------------------------ */

/* {"session": id, "input": tensor, "expect_length": n} (n < 0: none), malloc'd, into *len. */
static char *step_body(const char *id, const char *tensor, int64_t expect, size_t *len)
{
    size_t cap = strlen(tensor) + 160;
    char *b = malloc(cap);
    if (!b)
        return NULL;
    int w = expect < 0
                ? snprintf(b, cap, "{\"session\":\"%s\",\"input\":%s}", id, tensor)
                : snprintf(b, cap, "{\"session\":\"%s\",\"input\":%s,\"expect_length\":%lld}", id,
                           tensor, (long long)expect);
    *len = (size_t)w;
    return b;
}

/* A packed ModelInferRequest of model big: `rows` tokens of `x` as raw FP32 [1, rows, hidden],
 * in sequence `seq` (started by it when `start`); malloc'd, *len bytes. */
static uint8_t *grpc_step(const float *x, int64_t rows, int64_t hidden, int64_t seq, bool start,
                          size_t *len)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in, *inp = &in;
    Inference__ModelInferRequest__ParametersEntry e[2], *ep[2] = {&e[0], &e[1]};
    Inference__InferParameter p[2];
    ProtobufCBinaryData raw = {.len = (size_t)(rows * hidden) * sizeof(float),
                               .data = (uint8_t *)x};
    int64_t dims[3] = {1, rows, hidden};
    inference__model_infer_request__infer_input_tensor__init(&in);
    req.model_name = (char *)"big";
    in.name = (char *)"input";
    in.datatype = (char *)"FP32";
    in.n_shape = 3;
    in.shape = dims;
    req.n_inputs = req.n_raw_input_contents = 1;
    req.inputs = &inp;
    req.raw_input_contents = &raw;
    for (int i = 0; i < 2; i++) {
        inference__model_infer_request__parameters_entry__init(&e[i]);
        inference__infer_parameter__init(&p[i]);
        e[i].value = &p[i];
    }
    e[0].key = (char *)"sequence_id";
    p[0].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
    p[0].int64_param = seq;
    e[1].key = (char *)"sequence_start";
    p[1].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    p[1].bool_param = 1;
    req.n_parameters = start ? 2 : 1;
    req.parameters = ep;
    *len = inference__model_infer_request__get_packed_size(&req);
    uint8_t *msg = malloc(*len);
    if (msg)
        inference__model_infer_request__pack(&req, msg);
    return msg;
}

/* True when st answered OK with one raw output of `floats` float32 values. */
static bool grpc_reply_ok(const grpc_stream *st, size_t floats)
{
    size_t len;
    const char *msg = st->grpc_status == 0 ? grpc_message_at(st, 0, &len) : NULL;
    Inference__ModelInferResponse *resp =
        msg ? inference__model_infer_response__unpack(NULL, len, (const uint8_t *)msg) : NULL;
    bool ok = resp && resp->n_raw_output_contents == 1 &&
              resp->raw_output_contents[0].len == floats * sizeof(float);
    if (resp)
        inference__model_infer_response__free_unpacked(resp, NULL);
    return ok;
}

/* ---- A daemon and its sequences -------------------------------------------------------------- */

typedef struct {
    daemon_proc d;
    int grpc_port;
    bool batching;
    shape s;
    char id[MAX_CLIENTS][40];      /* HTTP sessions */
    int64_t length[MAX_CLIENTS];   /* their tokens so far */
    int64_t seq_base;              /* gRPC sequences seq_base + i */
    char long_id[MAX_CLIENTS][40]; /* sessions of LONG_PROMPT tokens (hidden 2048) */
    int64_t long_length[MAX_CLIENTS];
    int n_long;
    bool running; /* the daemon was started (and is to be stopped) */
} server;

static bool server_start(server *sv, const char *model, bool batching)
{
    char dir[] = "/tmp/attnd_bench_decode_XXXXXX", file[64], th[16];
    if (!mkdtemp(dir))
        return false;
    snprintf(file, sizeof file, "%s/port", dir);
    snprintf(th, sizeof th, "%d", eng_cpu_count());
    /* --max-queue: every client's step in flight at once, with room. */
    const char *args[20] = {
        "--model",     model,  "--threads",   th,  "--kv-cache-bytes", "3GiB", "--max-queue", "512",
        "--log-level", "warn", "--grpc-port", "0", "--grpc-port-file", file,   NULL};
    if (!batching) {
        args[14] = "--max-batch-rows";
        args[15] = "1";
        args[16] = NULL;
    }
    sv->batching = batching;
    bool started = daemon_start(&sv->d, args) == 0, ok = started;
    FILE *f = started ? fopen(file, "r") : NULL;
    sv->grpc_port = 0;
    if (!f || fscanf(f, "%d", &sv->grpc_port) != 1)
        ok = false;
    if (f)
        fclose(f);
    unlink(file);
    rmdir(dir);
    sv->running = started;
    return ok;
}

/* How a step ended. A rejection (429: the queue or the memory budget is full now) changes
 * nothing in the session: a client tries again, as Retry-After asks. */
typedef enum { STEP_OK, STEP_REJECTED, STEP_FAILED } step_end;

/* POST `body` to /v1/mha: its engine time into *compute_ms (may be NULL). STEP_OK when it
 * answers 200 with an output; a failure is printed. */
static step_end mha_post(void *h, int port, const char *body, size_t len, double *compute_ms)
{
    http_resp r;
    http_do(h, port, "POST", "/v1/mha", JSON, body, len, &r);
    double cms[1] = {0};
    step_end end = r.status == 429 ? STEP_REJECTED : STEP_FAILED;
    if (r.status == 200 && r.body && strstr(r.body, "\"output\":") &&
        json_numbers(r.body, "compute_ms", cms, 1) == 1)
        end = STEP_OK;
    if (end == STEP_FAILED)
        fprintf(stderr, "bench_decode: /v1/mha: %ld %.300s\n", r.status, r.body ? r.body : "");
    if (compute_ms)
        *compute_ms = cms[0];
    http_resp_free(&r);
    return end;
}

/* A session of model big into id[40]. */
static bool session_new(void *h, int port, char id[40])
{
    http_resp r;
    const char *body = "{\"model\":\"big\"}";
    http_do(h, port, "POST", "/v1/sessions", JSON, body, strlen(body), &r);
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    const char *s = json_string_value(json_object_get(j, "id"));
    bool ok = r.status == 201 && s && strlen(s) < 40;
    if (ok)
        snprintf(id, 40, "%s", s);
    else
        fprintf(stderr, "bench_decode: create: %ld %.300s\n", r.status, r.body ? r.body : "");
    json_decref(j);
    http_resp_free(&r);
    return ok;
}

/* MAX_CLIENTS sessions with a prompt of PROMPT tokens each, and sv->s.grpc_clients gRPC
 * sequences; the median engine time of the HTTP prompts into *prefill_ms. */
static bool sequences_make(server *sv, double *prefill_ms)
{
    uint64_t rng = 21;
    int64_t E = sv->s.hidden;
    char *prompt = json_random_tensor_b64(PROMPT, E, &rng);
    float *x = malloc((size_t)(PROMPT * E) * sizeof *x);
    void *h = http_handle_new();
    double ms[MAX_CLIENTS];
    bool ok = prompt && x;
    for (int64_t i = 0; ok && i < PROMPT * E; i++)
        x[i] = (float)rng_sym(&rng, 1.0);
    for (int i = 0; ok && i < MAX_CLIENTS; i++) {
        size_t len;
        ok = session_new(h, sv->d.port, sv->id[i]);
        char *body = ok ? step_body(sv->id[i], prompt, -1, &len) : NULL;
        ok = body && mha_post(h, sv->d.port, body, len, &ms[i]) == STEP_OK;
        sv->length[i] = PROMPT;
        free(body);
    }
    grpc_client c;
    sv->seq_base = 1000;
    bool open = ok && grpc_client_open(&c, sv->grpc_port) == 0;
    ok = open;
    for (int i = 0; ok && i < sv->s.grpc_clients; i++) {
        size_t len;
        grpc_stream st = {.grpc_status = -1};
        uint8_t *msg = grpc_step(x, PROMPT, E, sv->seq_base + i, true, &len);
        ok = msg && grpc_call(&c, "/inference.GRPCInferenceService/ModelInfer", NULL, msg, len,
                              120000, &st);
        if (ok && !grpc_reply_ok(&st, (size_t)(PROMPT * E))) {
            fprintf(stderr, "bench_decode: gRPC prompt: %d %s\n", st.grpc_status, st.message);
            ok = false;
        }
        grpc_stream_free(&st);
        free(msg);
    }
    if (open)
        grpc_client_close(&c);
    if (ok) {
        for (int i = 1; i < MAX_CLIENTS; i++)
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double t = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = t;
            }
        *prefill_ms = ms[MAX_CLIENTS / 2];
    }
    free(prompt);
    free(x);
    http_handle_free(h);
    return ok;
}

/* n sessions of LONG_PROMPT tokens, their prompts in chunks of LONG_CHUNK. */
static bool long_sessions_make(server *sv, int n)
{
    uint64_t rng = 22;
    char *chunk = json_random_tensor_b64(LONG_CHUNK, sv->s.hidden, &rng);
    void *h = http_handle_new();
    bool ok = chunk != NULL;
    for (sv->n_long = 0; ok && sv->n_long < n; sv->n_long++) {
        char *id = sv->long_id[sv->n_long];
        ok = session_new(h, sv->d.port, id);
        for (int64_t at = 0; ok && at < LONG_PROMPT; at += LONG_CHUNK) {
            size_t len;
            char *body = step_body(id, chunk, at, &len);
            ok = body && mha_post(h, sv->d.port, body, len, NULL) == STEP_OK;
            free(body);
        }
        sv->long_length[sv->n_long] = LONG_PROMPT;
    }
    free(chunk);
    http_handle_free(h);
    return ok;
}

/* ---- Clients stepping at once ------------------------------------------------------------- */

typedef enum { HTTP, GRPC } transport;

typedef struct {
    server *sv;
    transport via;
    int index;
    bool long_cache;
    const char *tensor;    /* HTTP: the step's input, base64 JSON */
    const float *token;    /* gRPC: the step's input */
    double start_s, end_s; /* steps start in [start_s, end_s) */
    pthread_barrier_t *go;
    double *lat_ms; /* MAX_LAT */
    int64_t steps, rejected;
    double compute_ms; /* HTTP: the sum of the steps' engine times */
    double last_s;
    bool failed;
} client;

static void http_steps(client *c)
{
    server *sv = c->sv;
    char *id = c->long_cache ? sv->long_id[c->index] : sv->id[c->index];
    int64_t *length = c->long_cache ? &sv->long_length[c->index] : &sv->length[c->index];
    void *h = http_handle_new();
    pthread_barrier_wait(c->go);
    while (!c->failed && now_s() < c->end_s) {
        size_t len;
        double cms = 0;
        char *body = step_body(id, c->tensor, *length, &len);
        double t0 = now_s();
        step_end end = body ? mha_post(h, sv->d.port, body, len, &cms) : STEP_FAILED;
        double t1 = now_s();
        free(body);
        if (end == STEP_REJECTED) {
            c->rejected++;
            sleep_ms(RETRY_MS);
            continue;
        }
        if (end == STEP_FAILED) {
            c->failed = true;
            break;
        }
        ++*length;
        if (c->steps < MAX_LAT)
            c->lat_ms[c->steps] = (t1 - t0) * 1e3;
        c->steps++;
        c->compute_ms += cms;
        c->last_s = t1;
    }
    http_handle_free(h);
}

static void grpc_steps(client *c)
{
    server *sv = c->sv;
    size_t len;
    grpc_client g;
    uint8_t *msg = grpc_step(c->token, 1, sv->s.hidden, sv->seq_base + c->index, false, &len);
    bool open = grpc_client_open(&g, sv->grpc_port) == 0;
    c->failed = !msg || !open;
    pthread_barrier_wait(c->go);
    while (!c->failed && now_s() < c->end_s) {
        grpc_stream st = {.grpc_status = -1};
        double t0 = now_s();
        bool ok = grpc_call(&g, "/inference.GRPCInferenceService/ModelInfer", NULL, msg, len,
                            120000, &st);
        double t1 = now_s();
        /* RESOURCE_EXHAUSTED and UNAVAILABLE: the queue or the memory budget is full now. */
        if (ok && (st.grpc_status == 8 || st.grpc_status == 14)) {
            c->rejected++;
            grpc_stream_free(&st);
            sleep_ms(RETRY_MS);
            continue;
        }
        if (!ok || !grpc_reply_ok(&st, (size_t)sv->s.hidden)) {
            fprintf(stderr, "bench_decode: gRPC step: %d %s\n", st.grpc_status, st.message);
            c->failed = true;
        } else {
            if (c->steps < MAX_LAT)
                c->lat_ms[c->steps] = (t1 - t0) * 1e3;
            c->steps++;
            c->last_s = t1;
        }
        grpc_stream_free(&st);
    }
    if (open)
        grpc_client_close(&g);
    free(msg);
}

static void *client_run(void *p)
{
    client *c = p;
    if (c->via == HTTP)
        http_steps(c);
    else
        grpc_steps(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What one case measured. */
typedef struct {
    int64_t steps, rejected;
    double seconds, p50_ms, p99_ms, mean_batch, compute_ms; /* mean_batch 0: no batches */
    bool ok;
} result;

/* `n` clients step at once over `via` for SECONDS from a barrier. */
static result clients_run(server *sv, transport via, int n, bool long_cache)
{
    static client cl[MAX_CLIENTS];
    pthread_t tid[MAX_CLIENTS];
    pthread_barrier_t go;
    uint64_t rng = 31;
    result res = {.ok = true};
    int64_t E = sv->s.hidden;
    char *tensor = json_random_tensor_b64(1, E, &rng);
    float *token = malloc((size_t)E * sizeof *token);
    double *lat = malloc((size_t)n * MAX_LAT * sizeof *lat);
    if (!tensor || !token || !lat) {
        free(tensor);
        free(token);
        free(lat);
        res.ok = false;
        return res;
    }
    for (int64_t i = 0; i < E; i++)
        token[i] = (float)rng_sym(&rng, 1.0);
    double batches0 = metric_value(sv->d.port, "attnd_batches_total");
    double members0 = metric_value(sv->d.port, "attnd_batched_requests_total");
    pthread_barrier_init(&go, NULL, (unsigned)n + 1);
    double start = now_s() + 0.2; /* every client is at the barrier by then */
    for (int i = 0; i < n; i++) {
        cl[i] = (client){.sv = sv,
                         .via = via,
                         .index = i,
                         .long_cache = long_cache,
                         .tensor = tensor,
                         .token = token,
                         .end_s = start + SECONDS,
                         .go = &go,
                         .lat_ms = lat + (size_t)i * MAX_LAT};
        pthread_create(&tid[i], NULL, client_run, &cl[i]);
    }
    while (now_s() < start)
        sleep_ms(10);
    start = now_s();
    pthread_barrier_wait(&go);
    double last = start;
    size_t nlat = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(tid[i], NULL);
        res.steps += cl[i].steps;
        res.rejected += cl[i].rejected;
        res.compute_ms += cl[i].compute_ms;
        res.ok = res.ok && !cl[i].failed;
        last = cl[i].last_s > last ? cl[i].last_s : last;
        int64_t k = cl[i].steps < MAX_LAT ? cl[i].steps : MAX_LAT;
        memmove(lat + nlat, cl[i].lat_ms, (size_t)k * sizeof *lat);
        nlat += (size_t)k;
    }
    pthread_barrier_destroy(&go);
    res.seconds = last - start;
    if (nlat > 0) {
        qsort(lat, nlat, sizeof *lat, cmp_double);
        res.p50_ms = lat[nlat / 2];
        res.p99_ms = lat[(nlat * 99) / 100 < nlat ? (nlat * 99) / 100 : nlat - 1];
    }
    if (res.steps > 0)
        res.compute_ms /= (double)res.steps;
    /* The counters move when a request completes, just after its client has the reply. */
    metric_wait(sv->d.port, "attnd_batched_requests_total",
                members0 + (sv->batching ? (double)res.steps : 0), 2000);
    double batches = metric_value(sv->d.port, "attnd_batches_total") - batches0;
    double members = metric_value(sv->d.port, "attnd_batched_requests_total") - members0;
    res.mean_batch = batches > 0 ? members / batches : 0;
    res.ok = res.ok && res.steps > 0;
    free(tensor);
    free(token);
    free(lat);
    return res;
}

static void case_print(const server *sv, int64_t cache, int n, transport via, const result *r)
{
    char batch[32] = "-";
    if (r->mean_batch > 0)
        snprintf(batch, sizeof batch, "%.2f", r->mean_batch);
    printf("decode hidden=%lld heads=%lld kv_heads=%lld head_dim=%lld cache=%lld clients=%d "
           "transport=%s batching=%s steps=%lld seconds=%.2f steps_per_s=%.1f p50_ms=%.1f "
           "p99_ms=%.1f mean_batch=%s rejected=%lld%s\n",
           (long long)sv->s.hidden, (long long)sv->s.heads, (long long)sv->s.kv_heads,
           (long long)sv->s.head_dim, (long long)cache, n, via == HTTP ? "http" : "grpc",
           sv->batching ? "on" : "off", (long long)r->steps, r->seconds,
           r->seconds > 0 ? (double)r->steps / r->seconds : 0, r->p50_ms, r->p99_ms, batch,
           (long long)r->rejected, r->ok ? "" : " FAILED");
    fflush(stdout);
}

/* Every case of one layer on one daemon. 0 on success. */
static int server_cases(server *sv, const char *model, int threads)
{
    const shape *s = &sv->s;
    double prefill_ms = 0, t0 = now_s();
    if (!server_start(sv, model, sv->batching) || !sequences_make(sv, &prefill_ms)) {
        printf("decode hidden=%lld batching=%s FAILED (start-up or prompts; stderr says why)\n",
               (long long)s->hidden, sv->batching ? "on" : "off");
        if (sv->running)
            daemon_stop(&sv->d);
        return 1;
    }
    fprintf(stderr, "bench_decode: hidden %lld, batching %s: started and prompted in %.1f s\n",
            (long long)s->hidden, sv->batching ? "on" : "off", now_s() - t0);
    int rc = 0;
    for (size_t k = 0; k < sizeof CLIENTS / sizeof CLIENTS[0]; k++)
        for (int via = HTTP; via <= GRPC; via++) {
            if (via == GRPC && CLIENTS[k] > s->grpc_clients) {
                printf("decode hidden=%lld clients=%d transport=grpc batching=%s skipped: "
                       "%d more prompts of %d tokens on each daemon would take longer than "
                       "the bench should\n",
                       (long long)s->hidden, CLIENTS[k], sv->batching ? "on" : "off",
                       CLIENTS[k] - s->grpc_clients, PROMPT);
                continue;
            }
            result r = clients_run(sv, (transport)via, CLIENTS[k], false);
            case_print(sv, PROMPT, CLIENTS[k], (transport)via, &r);
            rc |= !r.ok;
            if (CLIENTS[k] == 1 && via == HTTP) {
                /* One step alone against the weights' streaming read, measured right now with
                 * the daemon idle. */
                double wms = stream_ms(weight_bytes(s), threads);
                double peak = bench_peak_gflops(eng_kernels_name(), threads);
                double flop = 2.0 * PROMPT * (double)weight_bytes(s) / 2;
                double gflops = prefill_ms > 0 ? flop / prefill_ms * 1e-6 : 0;
                printf("decode step hidden=%lld batching=%s weights_mb=%.1f threads=%d "
                       "stream_ms=%.2f stream_gbps=%.1f compute_ms=%.2f http_p50_ms=%.2f "
                       "stream_ratio=%.2f prefill_rows=%d prefill_ms=%.1f prefill_gflops=%.1f "
                       "kernels=%s peak_gflops=%.1f prefill_peak_ratio=%.2f%s\n",
                       (long long)s->hidden, sv->batching ? "on" : "off",
                       (double)weight_bytes(s) / 1e6, threads, wms,
                       wms > 0 ? (double)weight_bytes(s) / wms * 1e-6 : 0, r.compute_ms, r.p50_ms,
                       wms > 0 ? r.compute_ms / wms : 0, PROMPT, prefill_ms, gflops,
                       eng_kernels_name(), peak, peak > 0 ? gflops / peak : 0,
                       r.ok ? "" : " FAILED");
                fflush(stdout);
            }
        }
    if (!s->long_cache) {
        printf("decode hidden=%lld cache=%d batching=%s skipped: the prompts of %d tokens "
               "would take longer than the bench should\n",
               (long long)s->hidden, LONG_PROMPT, sv->batching ? "on" : "off", LONG_PROMPT);
    } else {
        t0 = now_s();
        bool made = long_sessions_make(sv, 8);
        fprintf(stderr, "bench_decode: 8 prompts of %d tokens in %.1f s\n", LONG_PROMPT,
                now_s() - t0);
        if (!made) {
            printf("decode hidden=%lld cache=%d batching=%s FAILED (prompts; stderr says why)\n",
                   (long long)s->hidden, LONG_PROMPT, sv->batching ? "on" : "off");
            rc = 1;
        } else {
            int long_clients[] = {1, 8};
            for (int k = 0; k < 2; k++) {
                result r = clients_run(sv, HTTP, long_clients[k], true);
                case_print(sv, LONG_PROMPT, long_clients[k], HTTP, &r);
                rc |= !r.ok;
            }
        }
    }
    rc |= daemon_stop(&sv->d) != 0;
    return rc;
}

int main(int argc, char **argv)
{
    const char *which = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seconds") == 0)
            SECONDS = strtod(argv[i + 1], NULL);
        else if (strcmp(argv[i], "--hidden") == 0)
            which = argv[i + 1];
    }
    if (!(SECONDS > 0 && SECONDS <= 60) ||
        (strcmp(which, "all") && strcmp(which, "2048") && strcmp(which, "4096"))) {
        fprintf(stderr, "usage: bench_decode [--seconds S] [--hidden 2048|4096|all]\n");
        return 2;
    }
    static const shape shapes[] = {{2048, 32, 8, 64, 64, true}, {4096, 32, 8, 128, 32, false}};
    double t0 = now_s();
    int threads = eng_cpu_count(), rc = 0;
    eng_options opts;
    eng_error err;
    eng_options_get(&opts);
    if (eng_init(&opts, &err) != ENG_OK) /* the kernel set the daemon picks, for the peak */
        fprintf(stderr, "bench_decode: eng_init: %s\n", err.message);
    static server sv;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (size_t k = 0; k < 2; k++) {
        const shape *s = &shapes[k];
        char dir[] = "/tmp/attnd_bench_decode_XXXXXX", model[128], cmd[160];
        char name[8];
        snprintf(name, sizeof name, "%lld", (long long)s->hidden);
        if (strcmp(which, "all") && strcmp(which, name))
            continue;
        if (!mkdtemp(dir) || !checkpoint_write(dir, s)) {
            printf("decode hidden=%lld FAILED (cannot write the checkpoint in /tmp)\n",
                   (long long)s->hidden);
            rc = 1;
            continue;
        }
        snprintf(model, sizeof model, "big=%s:layer=0", dir);
        for (int b = 1; b >= 0; b--) {
            memset(&sv, 0, sizeof sv);
            sv.s = *s;
            sv.batching = b;
            rc |= server_cases(&sv, model, threads);
        }
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_decode: could not remove %s\n", dir);
    }
    printf("decode bench seconds=%.0f\n", now_s() - t0);
    return rc;
}
