/* daemon.c - starting and stopping attnd for integration tests, and talking HTTP to it. */
#include "daemon.h"
#include "rng.h"
#include "util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Small utilities --------------------------------------------------------------------- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

bool daemon_quick(void)
{
    return test_quick();
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *data = NULL;
    size_t n = 0, cap = 0;
    if (!f)
        return NULL;
    for (;;) {
        size_t got;
        if (cap - n < 4096) {
            char *grown = realloc(data, cap * 2 + 4096 + 1);
            if (!grown) {
                free(data);
                fclose(f);
                return NULL;
            }
            data = grown;
            cap = cap * 2 + 4096;
        }
        got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    data[n] = '\0';
    if (len)
        *len = n;
    return data;
}

/* ---- The daemon ---------------------------------------------------------------------------- */

/* The port file holds "NNN\n"; anything else (a partial write cannot happen: the daemon
 * renames it into place) is 0. */
static int parse_port(const char *text)
{
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || end == text || (*end != '\n' && *end != '\0') || v <= 0 || v > 65535)
        return 0;
    return (int)v;
}

static void path_in(const daemon_proc *d, const char *name, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s/%s", d->dir, name);
}

static void print_log_tail(const daemon_proc *d)
{
    char *log = daemon_log(d);
    if (log) {
        size_t n = strlen(log);
        printf("--- attnd stderr (tail) ---\n%s\n---\n", n > 3000 ? log + n - 3000 : log);
        free(log);
    }
}

int daemon_start(daemon_proc *d, const char *const *args)
{
    const char *bin = getenv("ATTND_BIN");
    char port_path[128], out_path[128], err_path[128];
    const char *argv[64];
    int argc = 0;
    double deadline;

    memset(d, 0, sizeof *d);
    d->pid = -1;
    if (!bin || !bin[0])
        bin = "build/attnd";
    snprintf(d->dir, sizeof d->dir, "/tmp/attnd-test-XXXXXX");
    if (!mkdtemp(d->dir)) {
        printf("daemon_start: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    path_in(d, "port", port_path, sizeof port_path);
    path_in(d, "stdout", out_path, sizeof out_path);
    path_in(d, "stderr", err_path, sizeof err_path);

    argv[argc++] = bin;
    argv[argc++] = "--host";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "--port";
    argv[argc++] = "0";
    argv[argc++] = "--port-file";
    argv[argc++] = port_path;
    for (int i = 0; args && args[i] && argc < 62; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;

    fflush(stdout);
    pid_t parent = getpid();
    d->pid = fork();
    if (d->pid < 0) {
        printf("daemon_start: fork: %s\n", strerror(errno));
        return -1;
    }
    if (d->pid == 0) {
        /* A test that crashes or is killed takes its daemon with it (the signal comes when the
         * thread that forked ends: tests start daemons from their main thread). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0 || err < 0)
            _exit(127);
        dup2(out, STDOUT_FILENO);
        dup2(err, STDERR_FILENO);
        close(out);
        close(err);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }

    /* A sanitizer build starts slowly; 30 s is far beyond any healthy start. */
    deadline = now_s() + 30;
    while (now_s() < deadline) {
        char *text = read_file(port_path, NULL);
        if (text) {
            d->port = parse_port(text);
            free(text);
            if (d->port > 0)
                return 0;
        }
        if (daemon_wait(d, 0) >= 0) {
            printf("daemon_start: %s exited with %d before listening\n", bin, d->exit_code);
            print_log_tail(d);
            return -1;
        }
        sleep_ms(5);
    }
    printf("daemon_start: %s did not write its port file in 30 s\n", bin);
    print_log_tail(d);
    kill(d->pid, SIGKILL);
    daemon_wait(d, 5000);
    return -1;
}

int daemon_start_grpc(daemon_proc *d, const char *const *args, int *grpc_port)
{
    char dir[] = "/tmp/attnd-grpc-XXXXXX", file[64];
    const char *all[64];
    int n = 0, rc;
    *grpc_port = 0;
    if (!mkdtemp(dir)) {
        printf("daemon_start_grpc: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(file, sizeof file, "%s/port", dir);
    all[n++] = "--grpc-port";
    all[n++] = "0";
    all[n++] = "--grpc-port-file";
    all[n++] = file;
    for (int i = 0; args && args[i] && n < 63; i++)
        all[n++] = args[i];
    all[n] = NULL;
    rc = daemon_start(d, all);
    FILE *f = rc == 0 ? fopen(file, "r") : NULL;
    if (rc == 0 && (!f || fscanf(f, "%d", grpc_port) != 1 || *grpc_port <= 0)) {
        printf("daemon_start_grpc: no port in %s\n", file);
        rc = -1;
    }
    if (f)
        fclose(f);
    unlink(file);
    rmdir(dir);
    return rc;
}

int daemon_signal(daemon_proc *d, int sig)
{
    if (d->pid <= 0 || d->exited)
        return -1;
    return kill(d->pid, sig);
}

int daemon_wait(daemon_proc *d, int timeout_ms)
{
    double deadline = now_s() + timeout_ms / 1000.0;
    if (d->exited)
        return d->exit_code;
    if (d->pid <= 0)
        return -1;
    for (;;) {
        int status = 0;
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid) {
            d->exited = true;
            if (WIFEXITED(status))
                d->exit_code = WEXITSTATUS(status);
            else if (WIFSIGNALED(status))
                d->exit_code = 128 + WTERMSIG(status);
            else
                d->exit_code = 255;
            return d->exit_code;
        }
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_s() >= deadline)
            return -1;
        sleep_ms(2);
    }
}

static void remove_dir(daemon_proc *d)
{
    static const char *const names[] = {"port", "port.tmp", "stdout", "stderr"};
    char path[160];
    const char *keep = getenv("ATTND_TEST_KEEP");
    if (!d->dir[0] || (keep && keep[0])) {
        if (d->dir[0])
            printf("kept %s\n", d->dir);
        return;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(d, names[i], path, sizeof path);
        unlink(path);
    }
    rmdir(d->dir);
    d->dir[0] = '\0';
}

int daemon_stop(daemon_proc *d)
{
    int code;
    if (d->pid <= 0)
        return -1;
    if (!d->exited)
        kill(d->pid, SIGTERM);
    code = daemon_wait(d, 60000);
    if (code < 0) {
        printf("daemon_stop: no exit 60 s after SIGTERM; killing it\n");
        print_log_tail(d);
        kill(d->pid, SIGKILL);
        daemon_wait(d, 10000);
        code = -1;
    } else if (code != 0) {
        printf("daemon_stop: exit code %d\n", code);
        print_log_tail(d);
    }
    remove_dir(d);
    return code;
}

long daemon_rss_kib(const daemon_proc *d)
{
    char path[64], line[256];
    long kib = -1;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            char *end = NULL;
            errno = 0;
            kib = strtol(line + 6, &end, 10);
            if (errno != 0 || end == line + 6)
                kib = -1;
            break;
        }
    }
    fclose(f);
    return kib;
}

double daemon_cpu_s(const daemon_proc *d)
{
    clockid_t clock;
    struct timespec ts;
    if (clock_getcpuclockid(d->pid, &clock) == 0 && clock_gettime(clock, &ts) == 0)
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    char path[64], text[1024];
    unsigned long long utime = 0, stime = 0;
    const char *p;
    FILE *f;
    size_t n;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)d->pid);
    f = fopen(path, "r");
    if (!f)
        return 0;
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    p = strrchr(text, ')'); /* the command name may hold spaces */
    if (!p ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return 0;
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

int daemon_fd_count(const daemon_proc *d)
{
    char path[64];
    struct dirent *e;
    int n = 0;
    DIR *dir;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
    dir = opendir(path);
    if (!dir)
        return -1;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] != '.')
            n++;
    }
    closedir(dir);
    return n;
}

char *daemon_log(const daemon_proc *d)
{
    char path[160];
    path_in(d, "stderr", path, sizeof path);
    return read_file(path, NULL);
}

static int lines_with(char *log, const char *a, const char *b)
{
    int n = 0;
    for (char *line = log; line && *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        n += strstr(line, a) && strstr(line, b);
        line = end ? end + 1 : line + strlen(line);
    }
    return n;
}

int daemon_log_lines(const daemon_proc *d, const char *a, const char *b, int want, int timeout_ms)
{
    int n = 0;
    for (int waited = 0;; waited += 20) {
        char *log = daemon_log(d);
        n = lines_with(log, a, b);
        free(log);
        if (n >= want || waited >= timeout_ms)
            return n;
        usleep(20 * 1000);
    }
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

void *http_handle_new(void)
{
    pthread_once(&curl_once, curl_init_once);
    return curl_easy_init();
}

void http_handle_free(void *handle)
{
    if (handle)
        curl_easy_cleanup(handle);
}

typedef struct {
    char *data;
    size_t len, cap;
} grow_buf;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    grow_buf *b = userdata;
    size_t n = size * nmemb;
    if (b->cap - b->len < n + 1) {
        size_t cap = (b->cap + n + 1) * 2;
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

/* Copies the value of header `name` from a header line into `out` (trimmed). */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t outlen)
{
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
        return;
    line += k + 1;
    n -= k + 1;
    while (n > 0 && (*line == ' ' || *line == '\t')) {
        line++;
        n--;
    }
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == '\n' || line[n - 1] == ' '))
        n--;
    snprintf(out, outlen, "%.*s", (int)n, line);
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    http_resp *r = userdata;
    size_t n = size * nmemb;
    header_value(ptr, n, "X-Request-Id", r->request_id, sizeof r->request_id);
    header_value(ptr, n, "Retry-After", r->retry_after, sizeof r->retry_after);
    header_value(ptr, n, "Allow", r->allow, sizeof r->allow);
    header_value(ptr, n, "Content-Type", r->content_type, sizeof r->content_type);
    header_value(ptr, n, "Connection", r->connection, sizeof r->connection);
    header_value(ptr, n, "WWW-Authenticate", r->www_authenticate, sizeof r->www_authenticate);
    header_value(ptr, n, "Server-Timing", r->server_timing, sizeof r->server_timing);
    header_value(ptr, n, "Inference-Header-Content-Length", r->inference_header_len,
                 sizeof r->inference_header_len);
    return n;
}

double server_timing_ms(const char *value, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = value; p && *p;) {
        p += strspn(p, ", ");
        size_t len = strcspn(p, ",");
        if (strncmp(p, name, n) == 0 && strncmp(p + n, ";dur=", 5) == 0) {
            char *end;
            double ms = strtod(p + n + 5, &end);
            return end > p + n + 5 && end <= p + len ? ms : -1;
        }
        p += len;
    }
    return -1;
}

const char *http_scheme = "http";

long http_do(void *handle, int port, const char *method, const char *path,
             const char *const *headers, const char *body, size_t body_len, http_resp *r)
{
    CURL *h = handle ? handle : http_handle_new();
    struct curl_slist *hl = NULL;
    grow_buf b = {0};
    char url[512];
    double t0 = now_s();
    CURLcode rc;

    memset(r, 0, sizeof *r);
    if (!h) {
        snprintf(r->error, sizeof r->error, "curl_easy_init failed");
        return 0;
    }
    snprintf(url, sizeof url, "%s://127.0.0.1:%d%s", http_scheme, port, path);
    hl = curl_slist_append(hl, "Expect:");
    for (int i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_NOBODY, strcmp(method, "HEAD") == 0 ? 1L : 0L);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(h, CURLOPT_NOBODY, strcmp(method, "HEAD") == 0 ? 1L : 0L);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 120000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    rc = curl_easy_perform(h);
    r->seconds = now_s() - t0;
    if (rc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &r->new_connections);
    } else {
        snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(rc));
    }
    if (!b.data) {
        b.data = calloc(1, 1);
        b.len = 0;
    }
    r->body = b.data;
    r->body_len = b.len;
    /* The handle keeps pointers to our locals: clear them before a caller reuses it. */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
    curl_slist_free_all(hl);
    if (!handle)
        curl_easy_cleanup(h);
    return r->status;
}

long http_post_json(void *handle, int port, const char *body, http_resp *r)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    return http_do(handle, port, "POST", "/v1/attention", json, body, strlen(body), r);
}

void http_resp_free(http_resp *r)
{
    free(r->body);
    r->body = NULL;
}

double metric_value(int port, const char *series)
{
    http_resp r;
    double v = -1;
    size_t k = strlen(series);
    if (http_do(NULL, port, "GET", "/metrics", NULL, NULL, 0, &r) == 200) {
        const char *p = r.body;
        while (p && *p) {
            if (strncmp(p, series, k) == 0 && p[k] == ' ') {
                v = strtod(p + k + 1, NULL);
                break;
            }
            p = strchr(p, '\n');
            if (p)
                p++;
        }
    }
    http_resp_free(&r);
    return v;
}

bool metric_wait(int port, const char *series, double want, int timeout_ms)
{
    double deadline = now_s() + timeout_ms / 1000.0;
    do {
        if (metric_value(port, series) >= want)
            return true;
        sleep_ms(10);
    } while (now_s() < deadline);
    return false;
}

bool metric_wait_le(int port, const char *series, double want, int timeout_ms)
{
    double deadline = now_s() + timeout_ms / 1000.0;
    do {
        double v = metric_value(port, series);
        if (v >= 0 && v <= want)
            return true;
        sleep_ms(10);
    } while (now_s() < deadline);
    return false;
}

/* ---- Raw sockets ------------------------------------------------------------------------------
 */

int raw_connect(int port)
{
    struct sockaddr_in a;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int raw_send(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

char *raw_read_all(int fd, int timeout_ms, bool *closed)
{
    grow_buf b = {0};
    double deadline = now_s() + timeout_ms / 1000.0;
    char chunk[16384];
    *closed = false;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)((deadline - now_s()) * 1000);
        ssize_t n;
        if (left <= 0)
            break;
        if (poll(&p, 1, left) <= 0)
            continue;
        n = recv(fd, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *closed = true;
            break;
        }
        on_body(chunk, 1, (size_t)n, &b);
    }
    if (!b.data)
        b.data = calloc(1, 1);
    return b.data;
}

char *raw_read_response(int fd, int timeout_ms)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    double deadline = now_s() + timeout_ms / 1000.0;
    if (!buf)
        return NULL;
    buf[0] = '\0';
    while (now_s() < deadline) {
        const char *end = strstr(buf, "\r\n\r\n"), *cl = strcasestr(buf, "\r\nContent-Length:");
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (end && cl && cl < end && len >= (size_t)(end + 4 - buf) + strtoull(cl + 17, NULL, 10))
            break;
        if (len == cap)
            break;
        if (poll(&p, 1, 100) <= 0)
            continue;
        n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
    }
    return buf;
}

char *raw_exchange(int port, const char *data, size_t len, int timeout_ms)
{
    bool closed;
    char *out;
    int fd = raw_connect(port);
    if (fd < 0)
        return NULL;
    if (raw_send(fd, data, len) != 0) {
        /* The server may answer and close before taking everything: read what it said. */
    }
    out = raw_read_all(fd, timeout_ms, &closed);
    close(fd);
    return out;
}

int raw_status(const char *response)
{
    int code = 0;
    if (!response || strncmp(response, "HTTP/1.", 7) != 0 || strlen(response) < 12)
        return 0;
    for (int i = 9; i < 12; i++) {
        if (response[i] < '0' || response[i] > '9')
            return 0;
        code = code * 10 + (response[i] - '0');
    }
    return code;
}

/* ---- Request bodies ----------------------------------------------------------------------------
 */

char *b64_encode(const void *data, size_t n)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = data;
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    size_t i = 0;
    if (!out)
        return NULL;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = tbl[v >> 18];
        *o++ = tbl[(v >> 12) & 63];
        *o++ = tbl[(v >> 6) & 63];
        *o++ = tbl[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = tbl[v >> 18];
        *o++ = tbl[(v >> 12) & 63];
        *o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

char *json_tensor_b64(const float *data, const int64_t *shape, int rank)
{
    int64_t n = 1;
    char *b64, *out;
    char dims[128] = "";
    size_t used = 0, len;
    for (int i = 0; i < rank; i++) {
        int w =
            snprintf(dims + used, sizeof dims - used, "%s%lld", i ? "," : "", (long long)shape[i]);
        if (w > 0)
            used += (size_t)w;
        n *= shape[i];
    }
    b64 = b64_encode(data, (size_t)n * sizeof(float));
    if (!b64)
        return NULL;
    len = strlen(b64) + used + 64;
    out = malloc(len);
    if (out)
        snprintf(out, len, "{\"shape\":[%s],\"dtype\":\"float32\",\"base64\":\"%s\"}", dims, b64);
    free(b64);
    return out;
}

char *json_random_tensor_b64(int64_t rows, int64_t width, uint64_t *rng)
{
    size_t count = (size_t)(rows * width);
    float *x = malloc(count * sizeof *x);
    int64_t shape[2] = {rows, width};
    if (!x)
        return NULL;
    for (size_t i = 0; i < count; i++)
        x[i] = rng_sym(rng, 1.0);
    char *t = json_tensor_b64(x, shape, 2);
    free(x);
    return t;
}

char *slow_attention_body(int64_t rows, int64_t keys, size_t *len)
{
    const int64_t D = 8, H = 8;
    int64_t L = rows / H;
    int64_t qs[4] = {1, H, L, D}, ks[4] = {1, 1, keys, D};
    float *q = malloc((size_t)(H * L * D) * sizeof *q);
    float *k = malloc((size_t)(keys * D) * sizeof *k);
    char *tq = NULL, *tk = NULL, *out = NULL;
    uint64_t seed = 0x9E3779B97F4A7C15u;
    size_t n;
    if (!q || !k)
        goto done;
    for (int64_t i = 0; i < H * L * D; i++)
        q[i] = rng_sym(&seed, 1.0);
    for (int64_t i = 0; i < keys * D; i++)
        k[i] = rng_sym(&seed, 1.0);
    tq = json_tensor_b64(q, qs, 4);
    tk = json_tensor_b64(k, ks, 4);
    if (!tq || !tk)
        goto done;
    n = strlen(tq) + 2 * strlen(tk) + 64;
    out = malloc(n);
    if (out) {
        int w = snprintf(out, n, "{\"query\":%s,\"key\":%s,\"value\":%s}", tq, tk, tk);
        if (len)
            *len = w > 0 ? (size_t)w : 0;
    }
done:
    free(q);
    free(k);
    free(tq);
    free(tk);
    return out;
}

long json_numbers(const char *body, const char *key, double *out, size_t max)
{
    char pattern[80];
    const char *p;
    int depth = 0;
    long count = 0;
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    p = body ? strstr(body, pattern) : NULL;
    if (!p)
        return -1;
    p += strlen(pattern);
    while (*p == ' ')
        p++;
    if (*p == '{') {
        /* The flat form {"shape": [...], "data": [...]}: the numbers are under "data". */
        p = strstr(p, "\"data\":");
        if (!p)
            return -1;
        p += 7;
        while (*p == ' ')
            p++;
    }
    do {
        if (*p == '[') {
            depth++;
            p++;
        } else if (*p == ']') {
            depth--;
            p++;
        } else if (*p == ',' || *p == ' ' || *p == '\n') {
            p++;
        } else if (strncmp(p, "null", 4) == 0) {
            if ((size_t)count < max)
                out[count] = NAN;
            count++;
            p += 4;
        } else {
            char *end = NULL;
            double v = strtod(p, &end);
            if (end == p)
                break; /* not a number: the value ended (or was not numeric) */
            if ((size_t)count < max)
                out[count] = v;
            count++;
            p = end;
        }
    } while (depth > 0 && *p);
    return count;
}
