/* test_config.c - the daemon's configuration: defaults, flags, environment mirrors, errors. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "server/server.h"
#include "tests/support/check.h"

static const char *const all_env[] = {
    "ATTND_HOST",
    "ATTND_PORT",
    "ATTND_PORT_FILE",
    "ATTND_THREADS",
    "ATTND_MAX_BODY_BYTES",
    "ATTND_MAX_ELEMENTS",
    "ATTND_MAX_MEMORY_BYTES",
    "ATTND_MAX_QUEUE",
    "ATTND_REQUEST_TIMEOUT_MS",
    "ATTND_RECEIVE_TIMEOUT_S",
    "ATTND_CONNECTION_LIMIT",
    "ATTND_IDLE_TIMEOUT_S",
    "ATTND_DRAIN_TIMEOUT_S",
    "ATTND_MODEL",
    "ATTND_LOG_LEVEL",
    "ATTND_DEFAULT_PRECISION",
};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof all_env / sizeof all_env[0]; i++)
        unsetenv(all_env[i]);
}

/* Parses a NULL-terminated flag list (argv[0] is added). */
static srv_status parse(srv_config *cfg, const char *const *flags, char *err, size_t errlen)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"attnd";
    for (int i = 0; flags && flags[i] && argc < 31; i++)
        argv[argc++] = (char *)flags[i];
    argv[argc] = NULL;
    return srv_config_parse(cfg, argc, argv, err, errlen);
}

/* Expects parsing `flags` to fail with a message containing `needle`. */
static void expect_error(const char *const *flags, const char *needle)
{
    srv_config cfg;
    char err[512] = "";
    srv_status st = parse(&cfg, flags, err, sizeof err);
    CHECKF(st == SRV_EINVAL, "%s: status %s", flags[0], srv_status_str(st));
    CHECKF(strstr(err, needle) != NULL, "error \"%s\" does not mention \"%s\"", err, needle);
    srv_config_free(&cfg);
}

static void test_defaults(void)
{
    srv_config cfg;
    char err[256];
    clear_env();
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK(strcmp(cfg.host, "127.0.0.1") == 0);
    CHECK_EQ_INT(cfg.port, 8080);
    CHECK(cfg.port_file == NULL);
    CHECK_EQ_INT(cfg.threads, 0);
    CHECK_EQ_INT(cfg.max_body_bytes, 256u << 20);
    CHECK_EQ_INT(cfg.max_memory_bytes, (size_t)4 << 30);
    CHECK_EQ_INT(cfg.max_queue, 64);
    CHECK_EQ_INT(cfg.drain_timeout_s, 30);
    CHECK_EQ_INT(cfg.n_models, 0);
    CHECK_EQ_INT(cfg.log_level, SRV_LOG_INFO);
    srv_config_free(&cfg);
}

/* api_limits_default() promises to match the daemon's flag defaults: hold it to that. */
static void test_defaults_match_api_limits(void)
{
    srv_config cfg;
    char err[256];
    api_limits lim = api_limits_default();
    clear_env();
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.max_body_bytes, lim.max_body_bytes);
    CHECK_EQ_INT(cfg.max_elements, lim.max_elements);
    CHECK_EQ_INT(cfg.request_timeout_ms, lim.max_timeout_ms);
    srv_config_free(&cfg);
}

static void test_flag_forms(void)
{
    srv_config cfg;
    char err[256];
    const char *const a[] = {"--port",      "9000",   "--threads=3", "--host=::1",
                             "--max-queue", "7",      "--log-level", "debug",
                             "--port-file", "/tmp/p", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.port, 9000);
    CHECK_EQ_INT(cfg.threads, 3);
    CHECK(strcmp(cfg.host, "::1") == 0);
    CHECK_EQ_INT(cfg.max_queue, 7);
    CHECK_EQ_INT(cfg.log_level, SRV_LOG_DEBUG);
    CHECK(cfg.port_file && strcmp(cfg.port_file, "/tmp/p") == 0);
    srv_config_free(&cfg);
    srv_config_free(&cfg); /* a second free is harmless */
}

static void test_env_mirrors_and_flag_wins(void)
{
    srv_config cfg;
    char err[256];
    const char *const port_flag[] = {"--port", "9100", NULL};
    clear_env();
    setenv("ATTND_PORT", "7000", 1);
    setenv("ATTND_MAX_BODY_BYTES", "2MiB", 1);
    setenv("ATTND_LOG_LEVEL", "warn", 1);
    setenv("ATTND_DRAIN_TIMEOUT_S", "0", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.port, 7000);
    CHECK_EQ_INT(cfg.max_body_bytes, 2u << 20);
    CHECK_EQ_INT(cfg.log_level, SRV_LOG_WARN);
    CHECK_EQ_INT(cfg.drain_timeout_s, 0);
    srv_config_free(&cfg);
    CHECK_EQ_INT(parse(&cfg, port_flag, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.port, 9100);
    CHECK_EQ_INT(cfg.max_body_bytes, 2u << 20); /* untouched by flags: still from env */
    srv_config_free(&cfg);
    clear_env();
}

static void test_bad_integers_name_the_flag(void)
{
    const char *const cases[][3] = {
        {"--port", "abc", NULL}, {"--port", "70000", NULL},
        {"--port", "-1", NULL},  {"--port", " 80", NULL},
        {"--port", "80x", NULL}, {"--port", "", NULL},
        {"--port", "+80", NULL}, {"--port", "99999999999999999999999", NULL},
    };
    clear_env();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i], "--port");
    {
        const char *const a[] = {"--threads", "1025", NULL};
        expect_error(a, "--threads");
    }
    {
        const char *const a[] = {"--max-queue", "0", NULL};
        expect_error(a, "--max-queue");
    }
    {
        const char *const a[] = {"--request-timeout-ms=0", NULL};
        expect_error(a, "--request-timeout-ms");
    }
}

static void test_bad_environment_names_the_variable(void)
{
    const char *const none[] = {NULL};
    clear_env();
    setenv("ATTND_THREADS", "many", 1);
    expect_error(none, "ATTND_THREADS");
    clear_env();
    setenv("ATTND_MAX_MEMORY_BYTES", "lots", 1);
    expect_error(none, "ATTND_MAX_MEMORY_BYTES");
    clear_env();
}

static void test_sizes(void)
{
    static const struct {
        const char *text;
        uint64_t want;
    } good[] = {
        {"0", 0},
        {"1024", 1024},
        {"64K", 65536},
        {"64k", 65536},
        {"64KiB", 65536},
        {"64kb", 65536},
        {"1M", 1u << 20},
        {"256MiB", 256u << 20},
        {"2G", (uint64_t)2 << 30},
        {"1T", (uint64_t)1 << 40},
        {"12B", 12},
    };
    static const char *const bad[] = {"",
                                      "K",
                                      "1X",
                                      "-1",
                                      "1.5G",
                                      " 1",
                                      "1 K",
                                      "1KK",
                                      "16E",
                                      "1Kib2",
                                      "0x10",
                                      "18446744073709551616",
                                      "99999999999999T"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 12345;
        CHECKF(srv_parse_size(good[i].text, &v) == SRV_OK, "\"%s\" rejected", good[i].text);
        CHECKF(v == good[i].want, "\"%s\" -> %llu", good[i].text, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v;
        CHECKF(srv_parse_size(bad[i], &v) == SRV_EINVAL, "\"%s\" accepted", bad[i]);
    }
}

static void test_size_flags(void)
{
    srv_config cfg;
    char err[256];
    const char *const a[] = {"--max-body-bytes=1G", "--max-memory-bytes", "512MiB", NULL};
    const char *const zero[] = {"--max-body-bytes", "0", NULL};
    const char *const tiny_budget[] = {"--max-memory-bytes", "1K", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.max_body_bytes, 1u << 30);
    CHECK_EQ_INT(cfg.max_memory_bytes, 512u << 20);
    srv_config_free(&cfg);
    expect_error(zero, "--max-body-bytes");
    expect_error(tiny_budget, "--max-memory-bytes");
}

static void test_unknown_and_malformed_arguments(void)
{
    const char *const unknown[] = {"--prot", "80", NULL};
    const char *const positional[] = {"serve", NULL};
    const char *const missing[] = {"--port", NULL};
    const char *const level[] = {"--log-level", "verbose", NULL};
    clear_env();
    expect_error(unknown, "--prot");
    expect_error(positional, "serve");
    expect_error(missing, "--port");
    expect_error(level, "--log-level");
}

static void test_help(void)
{
    srv_config cfg;
    char err[256];
    const char *const a[] = {"--port", "1", "--help", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_HELP);
    srv_config_free(&cfg);
}

/* --help lists every flag with its default and its environment variable. */
static void test_usage_lists_everything(void)
{
    static const char *const flags[] = {
        "--host",
        "--port",
        "--port-file",
        "--threads",
        "--max-body-bytes",
        "--max-elements",
        "--max-memory-bytes",
        "--max-queue",
        "--request-timeout-ms",
        "--receive-timeout-s",
        "--connection-limit",
        "--idle-timeout-s",
        "--drain-timeout-s",
        "--model",
        "--log-level",
        "--help",
    };
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f)
        return;
    srv_config_usage(f);
    fclose(f);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        CHECKF(strstr(text, flags[i]) != NULL, "--help lacks %s", flags[i]);
    for (size_t i = 0; i < sizeof all_env / sizeof all_env[0]; i++)
        CHECKF(strstr(text, all_env[i]) != NULL, "--help lacks %s", all_env[i]);
    CHECK(strstr(text, "default: 8080") != NULL);
    CHECK(strstr(text, "default: 256MiB") != NULL);
    free(text);
}

static void test_models(void)
{
    srv_config cfg;
    char err[256];
    const char *const two[] = {"--model", "enc=/m/enc.safetensors", "--model=dec=/m/dec", NULL};
    const char *const no_eq[] = {"--model", "enc", NULL};
    const char *const no_path[] = {"--model", "enc=", NULL};
    const char *const bad_name[] = {"--model", "a b=/x", NULL};
    const char *const dup[] = {"--model", "a=/x", "--model", "a=/y", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, two, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 2);
    if (cfg.n_models == 2) {
        CHECK(strcmp(cfg.models[0].name, "enc") == 0);
        CHECK(strcmp(cfg.models[0].path, "/m/enc.safetensors") == 0);
        CHECK(strcmp(cfg.models[1].name, "dec") == 0);
        CHECK(strcmp(cfg.models[1].path, "/m/dec") == 0);
    }
    srv_config_free(&cfg);
    expect_error(no_eq, "--model");
    expect_error(no_path, "--model");
    expect_error(bad_name, "--model");
    expect_error(dup, "twice");

    setenv("ATTND_MODEL", "x=/a,y=/b", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 2);
    srv_config_free(&cfg);
    /* Flags replace the environment's list, as for any option. */
    CHECK_EQ_INT(parse(&cfg, two, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 2);
    if (cfg.n_models == 2)
        CHECK(strcmp(cfg.models[0].name, "enc") == 0);
    srv_config_free(&cfg);
    clear_env();
}

/* A --model whose file cannot be read stops the start with a message naming flag and file. */
static void test_model_refused_at_start(void)
{
    srv_config cfg;
    char err[512] = "";
    const char *const a[] = {"--model", "enc=/nonexistent.safetensors", "--port", "0", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_OK);
    CHECK(srv_models_load(&cfg, err, sizeof err) == NULL);
    CHECKF(strstr(err, "--model") && strstr(err, "/nonexistent.safetensors"), "error: %s", err);
    err[0] = '\0';
    CHECK(srv_server_start(&cfg, err, sizeof err) == NULL);
    CHECKF(strstr(err, "--model") && strstr(err, "/nonexistent.safetensors"), "error: %s", err);
    srv_config_free(&cfg);
}

/* --default-precision: float32 unless set; a name other than float32 or bfloat16 stops the
 * start with a message naming the flag and both names. */
static void test_default_precision(void)
{
    srv_config cfg;
    char err[512] = "";
    clear_env();
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK(cfg.default_precision && strcmp(cfg.default_precision, "float32") == 0);
    srv_config_free(&cfg);
    setenv("ATTND_DEFAULT_PRECISION", "bfloat16", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK(cfg.default_precision && strcmp(cfg.default_precision, "bfloat16") == 0);
    srv_config_free(&cfg);
    clear_env();
    const char *const a[] = {"--default-precision", "fp8", "--port", "0", NULL};
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_OK);
    CHECK(srv_server_start(&cfg, err, sizeof err) == NULL);
    CHECKF(strstr(err, "--default-precision fp8") && strstr(err, "float32") &&
               strstr(err, "bfloat16"),
           "error: %s", err);
    srv_config_free(&cfg);
}

/* The :heads=N[:kv_heads=M] suffixes, read from the end so that a path may hold ':'. */
static void test_model_suffixes(void)
{
    srv_config cfg;
    char err[256];
    const char *const ok[] = {
        "--model", "a=/m/a.st:heads=8",   "--model", "b=/m/b:x.st:heads=8:kv_heads=2",
        "--model", "c=/m/c:heads=1/f.st", NULL};
    const char *const zero[] = {"--model", "a=/m/a:heads=0", NULL};
    const char *const word[] = {"--model", "a=/m/a:heads=eight", NULL};
    const char *const kv_only[] = {"--model", "a=/m/a:kv_heads=2", NULL};
    const char *const order[] = {"--model", "a=/m/a:kv_heads=2:heads=8", NULL};
    const char *const no_path[] = {"--model", "a=:heads=8", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, ok, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 3);
    if (cfg.n_models == 3) {
        CHECK(strcmp(cfg.models[0].path, "/m/a.st") == 0);
        CHECK_EQ_INT(cfg.models[0].heads, 8);
        CHECK_EQ_INT(cfg.models[0].kv_heads, 0);
        CHECK(strcmp(cfg.models[1].path, "/m/b:x.st") == 0);
        CHECK_EQ_INT(cfg.models[1].heads, 8);
        CHECK_EQ_INT(cfg.models[1].kv_heads, 2);
        CHECK(strcmp(cfg.models[2].path, "/m/c:heads=1/f.st") == 0);
        CHECK_EQ_INT(cfg.models[2].heads, 0);
    }
    srv_config_free(&cfg);
    expect_error(zero, "heads");
    expect_error(word, "heads");
    expect_error(kv_only, "heads");
    expect_error(order, "heads");
    expect_error(no_path, "NAME=PATH");

    setenv("ATTND_MODEL", "x=/a:heads=4,y=/b:heads=4:kv_heads=1", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 2);
    if (cfg.n_models == 2) {
        CHECK(strcmp(cfg.models[1].path, "/b") == 0);
        CHECK_EQ_INT(cfg.models[1].kv_heads, 1);
    }
    srv_config_free(&cfg);
    clear_env();
}

/* A checkpoint directory's :layer=K (0 counts; -1 when not given), flag and variable alike. */
static void test_model_layer_suffix(void)
{
    srv_config cfg;
    char err[256];
    const char *const ok[] = {"--model", "a=/hf/llama:layer=0", "--model", "b=/hf/q:x:layer=31",
                              "--model", "c=/hf/gemma",         NULL};
    const char *const word[] = {"--model", "a=/hf/llama:layer=last", NULL};
    const char *const negative[] = {"--model", "a=/hf/llama:layer=-1", NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, ok, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 3);
    if (cfg.n_models == 3) {
        CHECK(strcmp(cfg.models[0].path, "/hf/llama") == 0);
        CHECK_EQ_INT(cfg.models[0].layer, 0);
        CHECK(strcmp(cfg.models[1].path, "/hf/q:x") == 0);
        CHECK_EQ_INT(cfg.models[1].layer, 31);
        CHECK_EQ_INT(cfg.models[2].layer, -1);
    }
    srv_config_free(&cfg);
    expect_error(word, "layer=K");
    expect_error(negative, "layer=K");
    setenv("ATTND_MODEL", "x=/hf/a:layer=3,y=/hf/b", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.n_models, 2);
    if (cfg.n_models == 2) {
        CHECK_EQ_INT(cfg.models[0].layer, 3);
        CHECK(strcmp(cfg.models[0].path, "/hf/a") == 0);
    }
    srv_config_free(&cfg);
    clear_env();
}

int main(void)
{
    RUN(test_defaults);
    RUN(test_defaults_match_api_limits);
    RUN(test_default_precision);
    RUN(test_flag_forms);
    RUN(test_env_mirrors_and_flag_wins);
    RUN(test_bad_integers_name_the_flag);
    RUN(test_bad_environment_names_the_variable);
    RUN(test_sizes);
    RUN(test_size_flags);
    RUN(test_unknown_and_malformed_arguments);
    RUN(test_model_layer_suffix);
    RUN(test_help);
    RUN(test_usage_lists_everything);
    RUN(test_models);
    RUN(test_model_refused_at_start);
    RUN(test_model_suffixes);
    return check_report();
}
