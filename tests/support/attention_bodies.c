/*
 * attention_bodies.c - one attention problem as a native base64 body and a KServe v2 binary
 * one, and its output read back from either reply (attention_bodies.h).
 */
#include "tests/support/attention_bodies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "tests/support/daemon.h"

static const char *const names[3] = {"query", "key", "value"};

size_t attn_problem_count(const attn_problem *p)
{
    return (size_t)(p->shape[0] * p->shape[1] * p->shape[2] * p->shape[3]);
}

/* A body being built: its bytes so far and its room. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} body_buf;

static void put(body_buf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = (b->len + n + 1) * 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void put_str(body_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* The body, or NULL (and nothing to free) when memory ran out on the way. */
static char *finish(body_buf *b, size_t *len)
{
    if (b->failed) {
        free(b->data);
        return NULL;
    }
    *len = b->len;
    return b->data;
}

char *attn_body_native(const attn_problem *p, size_t *len)
{
    body_buf b = {0};
    const float *data[3] = {p->q, p->k, p->v};
    put_str(&b, "{\"output_encoding\":\"base64\"");
    if (p->causal)
        put_str(&b, ",\"causal\":true");
    for (int t = 0; t < 3; t++) {
        char *tensor = json_tensor_b64(data[t], p->shape, 4);
        b.failed = b.failed || !tensor;
        put_str(&b, ",\"");
        put_str(&b, names[t]);
        put_str(&b, "\":");
        put_str(&b, tensor ? tensor : "");
        free(tensor);
    }
    put_str(&b, "}");
    return finish(&b, len);
}

char *attn_body_v2(const attn_problem *p, size_t *len, size_t *header_len)
{
    body_buf b = {0};
    char tmp[256];
    size_t bytes = attn_problem_count(p) * sizeof(float);
    const float *data[3] = {p->q, p->k, p->v};
    put_str(&b, "{\"parameters\":{\"binary_data_output\":true");
    put_str(&b, p->causal ? ",\"causal\":true}" : "}");
    put_str(&b, ",\"inputs\":[");
    for (int t = 0; t < 3; t++) {
        snprintf(tmp, sizeof tmp,
                 "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld,%lld,%lld],"
                 "\"parameters\":{\"binary_data_size\":%zu}}",
                 t ? "," : "", names[t], (long long)p->shape[0], (long long)p->shape[1],
                 (long long)p->shape[2], (long long)p->shape[3], bytes);
        put_str(&b, tmp);
    }
    /* The output alone, as the native route returns it (without "outputs" lse comes too). */
    put_str(&b, "],\"outputs\":[{\"name\":\"output\"}]}");
    *header_len = b.len;
    for (int t = 0; t < 3; t++)
        put(&b, data[t], bytes);
    return finish(&b, len);
}

bool attn_reply_output(const attn_reply *r, const float *want, size_t count)
{
    size_t n = count * sizeof(float);
    if (r->v2)
        return r->len == r->header_len + n && memcmp(r->body + r->header_len, want, n) == 0;
    const char *p = r->body ? strstr(r->body, "\"output\"") : NULL;
    p = p ? strstr(p, "\"base64\":\"") : NULL;
    if (!p)
        return false;
    p += strlen("\"base64\":\"");
    const char *end = memchr(p, '"', r->len - (size_t)(p - r->body));
    if (!end)
        return false;
    float *got = malloc(n + 4);
    size_t got_len = 0, bad;
    bool same = got &&
                api__base64_decode(p, (size_t)(end - p), got, &got_len, &bad) == API_B64_OK &&
                got_len == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}
