/* test_config.c - the daemon's configuration: defaults, flags, environment mirrors, errors,
 * --help, the exit status of a bad configuration and what --healthcheck probes. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "server/server.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"

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
    "ATTND_KERNELS",
    "ATTND_BF16",
    "ATTND_BUFFER_CACHE_BYTES",
    "ATTND_KV_CACHE_BYTES",
    "ATTND_MIN_UPLOAD_RATE",
    "ATTND_PRIORITY_LEVELS",
    "ATTND_DEFAULT_PRIORITY_LEVEL",
    "ATTND_ADMIN_PORT",
    "ATTND_ADMIN_PORT_FILE",
    "ATTND_GRPC_PORT",
    "ATTND_GRPC_PORT_FILE",
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

/* Exactly the forms --help and docs/operations.md write: a whole number of bytes, or one
 * followed by KiB, MiB, GiB or TiB, or by K, M, G or T alone (the same binary units). */
static void test_sizes(void)
{
    static const struct {
        const char *text;
        uint64_t want;
    } good[] = {
        {"0", 0},
        {"1024", 1024},
        {"64K", 65536},
        {"64KiB", 65536},
        {"1M", 1u << 20},
        {"256MiB", 256u << 20},
        {"2G", (uint64_t)2 << 30},
        {"1GiB", (uint64_t)1 << 30},
        {"1T", (uint64_t)1 << 40},
        {"3TiB", (uint64_t)3 << 40},
        {"16777215TiB", (uint64_t)16777215 << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    static const char *const bad[] = {"",
                                      "K",
                                      "KiB",
                                      "1X",
                                      "-1",
                                      "+1",
                                      "1.5G",
                                      "1.5GiB",
                                      " 1",
                                      "1 ",
                                      "1 K",
                                      "1KK",
                                      "16E",
                                      "1EiB",
                                      "1Kib2",
                                      "0x10",
                                      "1GB",
                                      "1gb",
                                      "1Gb",
                                      "64k",
                                      "64kb",
                                      "64kib",
                                      "64KIB",
                                      "1Ki",
                                      "1iB",
                                      "12B",
                                      "18446744073709551616",
                                      "16777216TiB",
                                      "99999999999999T",
                                      "17179869184G"};
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

/* Every size option, flag and variable alike, refuses what the size parser refuses, naming
 * itself and the accepted suffixes; none of them takes "1GB" as 1 GiB. */
static void test_size_flags(void)
{
    static const char *const sizes[][2] = {
        {"--max-body-bytes", "ATTND_MAX_BODY_BYTES"},
        {"--max-memory-bytes", "ATTND_MAX_MEMORY_BYTES"},
        {"--buffer-cache-bytes", "ATTND_BUFFER_CACHE_BYTES"},
        {"--kv-cache-bytes", "ATTND_KV_CACHE_BYTES"},
        {"--min-upload-rate", "ATTND_MIN_UPLOAD_RATE"},
    };
    static const char *const refused[] = {"1GB", "1gb", "1.5GiB", "-1", "99999999999999999999"};
    srv_config cfg;
    char err[512];
    const char *const a[] = {"--max-body-bytes=1G", "--max-memory-bytes", "512MiB", NULL};
    const char *const zero[] = {"--max-body-bytes", "0", NULL};
    const char *const tiny_budget[] = {"--max-memory-bytes", "1K", NULL};
    const char *const none[] = {NULL};
    clear_env();
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.max_body_bytes, 1u << 30);
    CHECK_EQ_INT(cfg.max_memory_bytes, 512u << 20);
    srv_config_free(&cfg);
    expect_error(zero, "--max-body-bytes");
    expect_error(tiny_budget, "--max-memory-bytes");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t r = 0; r < sizeof refused / sizeof refused[0]; r++) {
            const char *const flag[] = {sizes[i][0], refused[r], NULL};
            expect_error(flag, sizes[i][0]);
            expect_error(flag, "KiB, MiB, GiB or TiB");
            setenv(sizes[i][1], refused[r], 1);
            expect_error(none, sizes[i][1]);
            expect_error(none, "KiB, MiB, GiB or TiB");
            clear_env();
        }
    }
}

static void test_unknown_and_malformed_arguments(void)
{
    const char *const unknown[] = {"--prot", "80", NULL};
    const char *const positional[] = {"serve", NULL};
    const char *const missing[] = {"--port", NULL};
    clear_env();
    expect_error(unknown, "--prot");
    expect_error(positional, "serve");
    expect_error(missing, "--port");
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

/* --help, as attnd prints it; malloc'd, NULL when it cannot be made. */
static char *usage_text(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    srv_config_usage(f);
    fclose(f);
    return text;
}

/* The entry of --help that starts with the line "  <head>" (up to the next entry or the end),
 * malloc'd; NULL when there is none. */
static char *usage_entry(const char *text, const char *head)
{
    char line[96];
    snprintf(line, sizeof line, "\n  %s", head);
    const char *at = strstr(text, line);
    while (at && at[strlen(line)] != ' ' && at[strlen(line)] != '\n' && at[strlen(line)] != '=')
        at = strstr(at + 1, line);
    if (!at)
        return NULL;
    at++;
    const char *end = at + 1;
    while (*end && !(end[0] == '\n' &&
                     (end[1] == '\n' || (end[1] == ' ' && end[2] == ' ' && end[3] != ' '))))
        end++;
    size_t n = (size_t)(end - at);
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, at, n);
        out[n] = '\0';
    }
    return out;
}

/* The entry of --help for `head`, checked to mention each of words[0..n); malloc'd, NULL when
 * --help has no such entry (a failed check). */
static char *usage_entry_mentioning(const char *head, const char *const *words, size_t n)
{
    char *text = usage_text();
    char *entry = text ? usage_entry(text, head) : NULL;
    CHECKF(entry != NULL, "--help has no entry %s", head);
    for (size_t i = 0; entry && i < n; i++)
        CHECKF(strstr(entry, words[i]) != NULL, "%s's help lacks \"%s\": %s", head, words[i],
               entry);
    free(text);
    return entry;
}

/* --help lists every flag with its default and its environment variable. */
static void test_usage_lists_everything(void)
{
    static const char *const flags[] = {
        "--host",
        "--port",
        "--port-file",
        "--threads",
        "--kernels",
        "--default-precision",
        "--max-body-bytes",
        "--max-elements",
        "--max-memory-bytes",
        "--max-queue",
        "--request-timeout-ms",
        "--receive-timeout-s",
        "--connection-limit",
        "--admin-port",
        "--admin-port-file",
        "--grpc-port",
        "--grpc-port-file",
        "--idle-timeout-s",
        "--drain-timeout-s",
        "--model",
        "--log-level",
        "--healthcheck",
        "--help",
    };
    char *text = usage_text();
    CHECK(text != NULL);
    if (!text)
        return;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        char *entry = usage_entry(text, flags[i]);
        CHECKF(entry != NULL, "--help has no entry %s", flags[i]);
        free(entry);
    }
    for (size_t i = 0; i < sizeof all_env / sizeof all_env[0]; i++)
        CHECKF(strstr(text, all_env[i]) != NULL, "--help lacks %s", all_env[i]);
    CHECK(strstr(text, "default: 8080") != NULL);
    CHECK(strstr(text, "default: 256MiB") != NULL);
    /* The forms test_sizes holds the parser to. */
    CHECK(strstr(text, "KiB, MiB, GiB or TiB") != NULL);
    free(text);
}

/* --help says what healthcheck.c does: the admin listener when there is one (its port file,
 * else its port; plain HTTP), else the serving port (its port file, else --port; TLS with
 * --tls-cert), and the exit statuses. */
static void test_usage_says_what_healthcheck_probes(void)
{
    static const char *const names[] = {
        "--admin-port-file",
        "else on --admin-port",
        "plain HTTP",
        "--port-file",
        "else --port",
        "--tls-cert",
        "--host",
        "exit 0",
        "else 1",
        "2 for a bad",
    };
    char *entry = usage_entry_mentioning("--healthcheck", names, sizeof names / sizeof names[0]);
    /* The admin listener comes first: the serving port is the fallback, not the rule. */
    CHECK(entry && strstr(entry, "--admin-port") < strstr(entry, "--port-file"));
    free(entry);
}

/* ATTND_BF16 has no flag, but --help lists it (from the same table) with every value it takes,
 * what each does, and what another value does. */
static void test_usage_lists_the_variables_without_a_flag(void)
{
    static const char *const values[] = {"auto:",         "native:", "emulated:",       "amx:",
                                         "amx-emulated:", "exit 2",  "env: ATTND_BF16", "no flag",
                                         "default: auto"};
    char *entry = usage_entry_mentioning("ATTND_BF16", values, sizeof values / sizeof values[0]);
    char *text = usage_text();
    CHECK(text && strstr(text, "--bf16") == NULL);
    free(entry);
    free(text);
}

/* Runs $ATTND_BIN (default build/attnd) with `args` after --host 127.0.0.1, with `env`
 * ("NAME=VALUE", or NULL) added to its environment, its stdout discarded and its stderr into
 * `err`. Returns its exit status; -1 when it could not run, or ran past 20 s and was killed
 * (a configuration that was not refused starts a daemon). */
static int run_attnd(const char *const *args, const char *env, char *err, size_t errlen)
{
    const char *bin = getenv("ATTND_BIN");
    const char *argv[40];
    int argc = 0, fds[2], status = 0;
    size_t got = 0;
    if (!bin || !bin[0])
        bin = "build/attnd";
    argv[argc++] = bin;
    argv[argc++] = "--host";
    argv[argc++] = "127.0.0.1";
    for (int i = 0; args[i] && argc < 39; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    err[0] = '\0';
    if (pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(fds[1], STDERR_FILENO);
        if (null >= 0)
            dup2(null, STDOUT_FILENO);
        close(fds[0]);
        if (env)
            putenv((char *)env);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    double deadline = now_s() + 20;
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t n = read(fds[0], err + got, errlen - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == errlen - 1)
            break;
    }
    err[got] = '\0';
    close(fds[0]);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        sleep_ms(10);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A bad configuration exits 2 with a line naming the flag or variable and what it accepts,
 * before anything starts: named values (the kernel set among them, which the engine would only
 * have refused at start-up, exit 1), sizes in forms the docs do not write, and levels that
 * contradict each other. */
static void test_bad_configuration_exits_2(void)
{
    static const struct {
        const char *args[4];
        const char *env;
        const char *names[2];
    } cases[] = {
        {{"--kernels", "bogus"}, NULL, {"--kernels", "openblas"}},
        {{"--default-precision", "bogus"}, NULL, {"--default-precision", "bfloat16"}},
        {{"--log-level", "bogus"}, NULL, {"--log-level", "debug"}},
        {{"--max-body-bytes", "1GB"}, NULL, {"--max-body-bytes", "GiB"}},
        {{"--max-body-bytes", "1.5GiB"}, NULL, {"--max-body-bytes", "GiB"}},
        {{"--kv-cache-bytes", "-1"}, NULL, {"--kv-cache-bytes", "GiB"}},
        {{NULL}, "ATTND_KERNELS=bogus", {"ATTND_KERNELS", "avx512"}},
        {{NULL}, "ATTND_BF16=bogus", {"ATTND_BF16", "amx-emulated"}},
        {{NULL}, "ATTND_MAX_MEMORY_BYTES=4gb", {"ATTND_MAX_MEMORY_BYTES", "GiB"}},
        {{"--default-priority-level", "3"},
         NULL,
         {"--default-priority-level", "--priority-levels"}},
    };
    clear_env();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[8] = {"--port", "0", "--log-level", "error"};
        int n = 4;
        char err[1024];
        for (int a = 0; cases[i].args[a]; a++)
            args[n++] = cases[i].args[a];
        args[n] = NULL;
        int code = run_attnd(args, cases[i].env, err, sizeof err);
        CHECKF(code == 2, "case %zu (%s): exit %d, stderr: %s", i, cases[i].names[0], code, err);
        for (int k = 0; k < 2; k++)
            CHECKF(strstr(err, cases[i].names[k]) != NULL, "case %zu: stderr lacks %s: %s", i,
                   cases[i].names[k], err);
    }
}

/* A loopback port where nothing listens: bound (so that no one else takes it) but not
 * listening, so a connection is refused at once. Returns the socket (close it after) and
 * writes the port as text; -1 on failure. */
static int closed_port(char *port, size_t len)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    snprintf(port, len, "%d", ntohs(a.sin_port));
    return fd;
}

/* `attnd --healthcheck` asks the admin listener whenever --admin-port is set, through its port
 * file, whatever --port and --port-file say; without one, the serving port's file, else
 * --port. */
static void test_healthcheck_probes_the_admin_port_first(void)
{
    char dir[] = "/tmp/attnd-hc-XXXXXX", admin_file[64], err[1024], closed[16];
    daemon_proc d;
    int hold = closed_port(closed, sizeof closed);
    if (hold < 0 || !mkdtemp(dir)) {
        CHECK(!"a closed port and a folder");
        if (hold >= 0)
            close(hold);
        return;
    }
    snprintf(admin_file, sizeof admin_file, "%s/admin", dir);
    const char *const daemon_args[] = {"--admin-port", "0",         "--admin-port-file",
                                       admin_file,     "--threads", "1",
                                       "--log-level",  "warn",      NULL};
    clear_env();
    if (daemon_start(&d, daemon_args) != 0) {
        CHECK(!"daemon_start");
        close(hold);
        rmdir(dir);
        return;
    }
    char serving_file[96], port[16];
    snprintf(serving_file, sizeof serving_file, "%s/port", d.dir);
    snprintf(port, sizeof port, "%d", d.port);
    for (int i = 0; i < 500 && access(admin_file, R_OK) != 0; i++)
        sleep_ms(10);
    {
        /* --port names a closed port: it does not matter, the admin listener answers */
        const char *const a[] = {"--healthcheck",     "--port",   closed, "--admin-port", "0",
                                 "--admin-port-file", admin_file, NULL};
        CHECKF(run_attnd(a, NULL, err, sizeof err) == 0, "stderr: %s", err);
    }
    {
        /* the admin port set, its file missing: --admin-port itself (closed), never the
         * serving port's file, which names a ready daemon */
        const char *const a[] = {"--healthcheck", "--port-file", serving_file,
                                 "--admin-port",  closed,        NULL};
        int code = run_attnd(a, NULL, err, sizeof err);
        CHECKF(code == 1, "exit %d, stderr: %s", code, err);
    }
    {
        /* no admin port: the serving port's file, then --port */
        const char *const from_file[] = {"--healthcheck", "--port",     closed,
                                         "--port-file",   serving_file, NULL};
        const char *const from_flag[] = {"--healthcheck", "--port", port, NULL};
        const char *const nothing[] = {"--healthcheck", "--port", closed, NULL};
        CHECKF(run_attnd(from_file, NULL, err, sizeof err) == 0, "stderr: %s", err);
        CHECKF(run_attnd(from_flag, NULL, err, sizeof err) == 0, "stderr: %s", err);
        int code = run_attnd(nothing, NULL, err, sizeof err);
        CHECKF(code == 1, "exit %d, stderr: %s", code, err);
    }
    CHECK_EQ_INT(daemon_stop(&d), 0);
    close(hold);
    unlink(admin_file);
    rmdir(dir);
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
    srv_config_free(&cfg);
}

/* --default-precision: float32 unless set; a name other than float32 or bfloat16 is refused
 * with the other options (exit 2), naming the flag and both names. */
static void test_default_precision(void)
{
    srv_config cfg;
    char err[512] = "";
    clear_env();
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.default_precision, ENG_PRECISION_FLOAT32);
    srv_config_free(&cfg);
    setenv("ATTND_DEFAULT_PRECISION", "bfloat16", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.default_precision, ENG_PRECISION_BFLOAT16);
    srv_config_free(&cfg);
    clear_env();
    const char *const a[] = {"--default-precision", "fp8", "--port", "0", NULL};
    CHECK_EQ_INT(parse(&cfg, a, err, sizeof err), SRV_EINVAL);
    CHECKF(strstr(err, "--default-precision") && strstr(err, "fp8") && strstr(err, "float32") &&
               strstr(err, "bfloat16"),
           "error: %s", err);
    srv_config_free(&cfg);
}

/* The engine's options are read into eng_options, as values, for eng_init: --kernels (or
 * ATTND_KERNELS; the flag wins) and ATTND_BF16, auto for both by default. */
static void test_engine_options(void)
{
    static const struct {
        const char *name;
        eng_bf16_path path;
    } paths[] = {{"auto", ENG_BF16_AUTO},
                 {"native", ENG_BF16_NATIVE},
                 {"emulated", ENG_BF16_EMULATED},
                 {"amx", ENG_BF16_AMX},
                 {"amx-emulated", ENG_BF16_AMX_EMULATED}};
    srv_config cfg;
    char err[512] = "";
    clear_env();
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.engine.kernels, ENG_KERNELS_AUTO);
    CHECK_EQ_INT(cfg.engine.bf16, ENG_BF16_AUTO);
    srv_config_free(&cfg);
    const char *const generic[] = {"--kernels", "generic", NULL};
    setenv("ATTND_KERNELS", "avx2", 1);
    CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.engine.kernels, ENG_KERNELS_AVX2);
    srv_config_free(&cfg);
    CHECK_EQ_INT(parse(&cfg, generic, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.engine.kernels, ENG_KERNELS_GENERIC);
    srv_config_free(&cfg);
    clear_env();
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        setenv("ATTND_BF16", paths[i].name, 1);
        CHECKF(parse(&cfg, NULL, err, sizeof err) == SRV_OK, "ATTND_BF16=%s: %s", paths[i].name,
               err);
        CHECKF(cfg.engine.bf16 == paths[i].path, "ATTND_BF16=%s: path %d", paths[i].name,
               (int)cfg.engine.bf16);
        srv_config_free(&cfg);
    }
    /* Another value, an empty one and another case are refused, naming the variable and
     * every value it takes. */
    static const char *const bad[] = {"bogus", "", "AMX"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("ATTND_BF16", bad[i], 1);
        CHECK_EQ_INT(parse(&cfg, NULL, err, sizeof err), SRV_EINVAL);
        CHECKF(strstr(err, "ATTND_BF16") != NULL, "error: %s", err);
        for (size_t n = 0; n < sizeof paths / sizeof paths[0]; n++)
            CHECKF(strstr(err, paths[n].name) != NULL, "error \"%s\" lacks %s", err, paths[n].name);
        srv_config_free(&cfg);
    }
    clear_env();
}

/* Every option that takes one of a few names refuses any other while the configuration is
 * read, naming the flag (or its variable) and every accepted name: --kernels, as the engine
 * would only have found it at start-up, --default-precision and --log-level. */
static void test_named_values_are_checked_with_the_others(void)
{
    static const struct {
        const char *flag, *env, *bad;
        const char *names[5];
    } cases[] = {
        {"--kernels", "ATTND_KERNELS", "bogus", {"auto", "avx512", "avx2", "generic", "openblas"}},
        {"--default-precision", "ATTND_DEFAULT_PRECISION", "fp16", {"float32", "bfloat16"}},
        {"--log-level", "ATTND_LOG_LEVEL", "verbose", {"error", "warn", "info", "debug"}},
    };
    const char *const none[] = {NULL};
    clear_env();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const flag[] = {cases[i].flag, cases[i].bad, NULL};
        const char *const upper[] = {cases[i].flag, "AUTO", NULL};
        srv_config cfg;
        char err[512] = "";
        CHECK_EQ_INT(parse(&cfg, flag, err, sizeof err), SRV_EINVAL);
        CHECKF(strstr(err, cases[i].flag) && strstr(err, cases[i].bad), "error: %s", err);
        for (size_t n = 0; n < 5 && cases[i].names[n]; n++) {
            const char *const good[] = {cases[i].flag, cases[i].names[n], NULL};
            char why[512] = "";
            CHECKF(strstr(err, cases[i].names[n]), "error \"%s\" lacks %s", err, cases[i].names[n]);
            CHECKF(parse(&cfg, good, why, sizeof why) == SRV_OK, "%s %s: %s", cases[i].flag,
                   cases[i].names[n], why);
            srv_config_free(&cfg);
        }
        expect_error(upper, cases[i].flag); /* names are exact */
        setenv(cases[i].env, cases[i].bad, 1);
        expect_error(none, cases[i].env);
        clear_env();
    }
}

/* The TLS flags come with what they need: a certificate with its key, a client CA or a key's
 * password with both. srv_config_parse refuses the others before any file is read (the paths
 * here name nothing), naming the flag and what it lacks. */
static void test_tls_flags_in_pairs(void)
{
    srv_config cfg;
    char err[512] = "";
    const char *const cert[] = {"--tls-cert", "/nonexistent/cert.pem", NULL};
    const char *const key[] = {"--tls-key", "/nonexistent/key.pem", NULL};
    const char *const ca[] = {"--tls-client-ca", "/nonexistent/ca.pem", NULL};
    const char *const password[] = {"--tls-key-password-file", "/nonexistent/pw", NULL};
    const char *const both[] = {
        "--tls-cert",      "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem",
        "--tls-client-ca", "/nonexistent/ca.pem",   NULL};
    clear_env();
    expect_error(cert, "--tls-cert needs --tls-key");
    expect_error(key, "--tls-key needs --tls-cert");
    expect_error(ca, "--tls-client-ca needs --tls-cert and --tls-key");
    expect_error(password, "--tls-key-password-file needs --tls-cert and --tls-key");
    CHECK_EQ_INT(parse(&cfg, both, err, sizeof err), SRV_OK);
    srv_config_free(&cfg);
}

/* --default-priority-level must be one of the levels: a configuration error, found with the
 * others, whichever of the two is given. */
static void test_default_priority_level_within_the_levels(void)
{
    srv_config cfg;
    char err[512] = "";
    const char *const above[] = {"--default-priority-level", "3", NULL};
    const char *const fewer[] = {"--priority-levels", "1", NULL};
    const char *const both[] = {"--priority-levels", "4", "--default-priority-level", "4", NULL};
    clear_env();
    expect_error(above, "--default-priority-level");
    expect_error(fewer, "--priority-levels");
    CHECK_EQ_INT(parse(&cfg, both, err, sizeof err), SRV_OK);
    srv_config_free(&cfg);
    setenv("ATTND_PRIORITY_LEVELS", "5", 1);
    CHECK_EQ_INT(parse(&cfg, above, err, sizeof err), SRV_OK);
    CHECK_EQ_INT(cfg.default_priority_level, 3);
    srv_config_free(&cfg);
    clear_env();
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
    RUN(test_engine_options);
    RUN(test_named_values_are_checked_with_the_others);
    RUN(test_default_priority_level_within_the_levels);
    RUN(test_tls_flags_in_pairs);
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
    RUN(test_usage_says_what_healthcheck_probes);
    RUN(test_usage_lists_the_variables_without_a_flag);
    RUN_WITHIN(test_bad_configuration_exits_2, 120);
    RUN_WITHIN(test_healthcheck_probes_the_admin_port_first, 120);
    RUN(test_models);
    RUN(test_model_refused_at_start);
    RUN(test_model_suffixes);
    return check_report();
}
