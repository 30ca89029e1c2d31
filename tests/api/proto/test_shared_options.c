/* test_shared_options.c - an operation's options are options of every protocol: each name in
 * api__sdpa_options and api__layer_options is read by POST /v1/attention or /v1/mha (as a
 * field) and by the v2 infer route of model sdpa or a layer (as a parameter), with the same
 * parser, so that an option is added to its operation alone. */
#include <stdio.h>
#include <string.h>

#include "api/ops/layer.h"
#include "api/ops/sdpa.h"
#include "tests/support/check.h"

static eng_pool *pool;
static api_models *models;

static const char QKV_NATIVE[] =
    "\"query\": [[[1, 0]]], \"key\": [[[1, 0]]], \"value\": [[[1, 2]]]";
static const char QKV_V2[] =
    "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,1,1,2],\"data\":[1,0]},"
    "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,1,1,2],\"data\":[1,0]},"
    "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,1,1,2],\"data\":[1,2]}";
static const char INPUT_NATIVE[] = "\"model\": \"demo\", \"input\": [[0, 0, 0, 0]]";

/* Calls `route` on `body`; the reply's status and body (NUL-terminated in buf). */
static int call(api_route_fn route, const char *model, const char *body, char *buf, size_t n)
{
    api_call c = {.body = body,
                  .body_len = strlen(body),
                  .pool = pool,
                  .models = models,
                  .model = model,
                  .content_type = "application/json"};
    api_reply r;
    route(&c, &r);
    size_t len = r.body_len < n - 1 ? r.body_len : n - 1;
    if (r.body)
        memcpy(buf, r.body, len);
    buf[len] = '\0';
    int status = r.status;
    api_reply_free(&r);
    return status;
}

/* A body with one name in it: before, the name, after. */
typedef struct {
    char before[512];
    const char *after;
} body_form;

/* {} is no option's value: every protocol must reach the option's parser, which names it. */
static void check_option_known(api_route_fn route, const char *model, const body_form *f,
                               const char *name)
{
    char body[1024], reply[2048];
    snprintf(body, sizeof body, "%s%s%s", f->before, name, f->after);
    int status = call(route, model, body, reply, sizeof reply);
    CHECKF(status == 422 || status == 400, "%s on %s: status %d", name, model ? model : "native",
           status);
    CHECKF(!strstr(reply, "unknown"), "%s is unknown to %s: %s", name, model ? model : "native",
           reply);
    CHECKF(strstr(reply, name) != NULL, "the error does not name %s: %s", name, reply);
}

/* An unknown name is refused with the list of what the route takes, options included. */
static void check_listed(api_route_fn route, const char *model, const body_form *f,
                         const api__option_def *opts, size_t n)
{
    char body[1024], reply[2048];
    snprintf(body, sizeof body, "%szzzzzzzzzz%s", f->before, f->after);
    call(route, model, body, reply, sizeof reply);
    CHECKF(strstr(reply, "unknown") && strstr(reply, "takes"), "no list: %s", reply);
    for (size_t i = 0; i < n; i++)
        CHECKF(strstr(reply, opts[i].name) != NULL, "%s is not listed: %s", opts[i].name, reply);
}

static void test_sdpa_options_reach_both_protocols(void)
{
    body_form native = {.after = "\": {}}"}, v2 = {.before = "{\"parameters\": {\""};
    char after[512];
    snprintf(native.before, sizeof native.before, "{%s, \"", QKV_NATIVE);
    snprintf(after, sizeof after, "\": {}}, \"inputs\": [%s]}", QKV_V2);
    v2.after = after;
    for (size_t i = 0; i < api__sdpa_n_options; i++) {
        check_option_known(api_attention, NULL, &native, api__sdpa_options[i].name);
        check_option_known(api_v2_infer, "sdpa", &v2, api__sdpa_options[i].name);
    }
    check_listed(api_attention, NULL, &native, api__sdpa_options, api__sdpa_n_options);
    check_listed(api_v2_infer, "sdpa", &v2, api__sdpa_options, api__sdpa_n_options);
}

static void test_layer_options_reach_both_protocols(void)
{
    body_form native = {.after = "\": {}}"}, v2 = {.before = "{\"parameters\": {\""};
    snprintf(native.before, sizeof native.before, "{%s, \"", INPUT_NATIVE);
    v2.after = "\": {}}, \"inputs\": [{\"name\":\"input\",\"datatype\":\"FP32\","
               "\"shape\":[1,1,4],\"data\":[0,0,0,0]}]}";
    for (size_t i = 0; i < api__layer_n_options; i++) {
        check_option_known(api_mha, NULL, &native, api__layer_options[i].name);
        check_option_known(api_v2_infer, "demo", &v2, api__layer_options[i].name);
    }
    check_listed(api_mha, NULL, &native, api__layer_options, api__layer_n_options);
    check_listed(api_v2_infer, "demo", &v2, api__layer_options, api__layer_n_options);
}

/* The native format allows null for "not given"; the option keeps its default. */
static void test_native_null_is_the_default(void)
{
    char body[512], reply[2048];
    for (size_t i = 0; i < api__sdpa_n_options; i++) {
        snprintf(body, sizeof body, "{%s, \"%s\": null}", QKV_NATIVE, api__sdpa_options[i].name);
        CHECKF(call(api_attention, NULL, body, reply, sizeof reply) == 200, "%s: null: %s",
               api__sdpa_options[i].name, reply);
    }
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(1, &err);
    models = api_models_new();
    if (!pool || !models) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    RUN(test_sdpa_options_reach_both_protocols);
    RUN(test_layer_options_reach_both_protocols);
    RUN(test_native_null_is_the_default);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
