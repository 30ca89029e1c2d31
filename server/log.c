/*
 * log.c - JSON lines on stderr: the daemon's messages, one line per request, and
 * libmicrohttpd's own error log, all through one writer so that lines never interleave.
 *
 * Each line is built in memory and written with a single locked write loop; --log-level
 * filters by severity before anything is formatted.
 */
#include "server/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = SRV_LOG_INFO;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_str[] = {"error", "warn", "info", "debug"};

/* "error", "warn", "info" or "debug". */
static const char *level_name(srv_log_level level)
{
    return (unsigned)level < 4 ? level_str[level] : "info";
}

void srv_log_set_level(srv_log_level level)
{
    atomic_store(&log_level, (int)level);
}

bool srv_log_enabled(srv_log_level level)
{
    return (int)level <= atomic_load(&log_level);
}

/* Writes the RFC 3339 UTC time with milliseconds ("2024-05-01T12:00:00.123Z") into out[32]. */
static void log_time(char out[32])
{
    struct timespec ts;
    struct tm tm;
    size_t n;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
}

void srv__log_begin(api_buf *b, srv_log_level level)
{
    char now[32];
    log_time(now);
    api_buf_printf(b, "{\"time\":\"%s\",\"level\":\"%s\"", now, level_name(level));
}

void srv__log_write(const char *line, size_t len)
{
    pthread_mutex_lock(&log_mu);
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, line, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break; /* stderr is gone: nothing useful left to do with the line */
        }
        line += w;
        len -= (size_t)w;
    }
    pthread_mutex_unlock(&log_mu);
}

/* Writes {"time","level","msg": <text>, <extra>} where `extra` is a JSON fragment or NULL. */
static void log_line(srv_log_level level, const char *text, size_t text_len, const char *extra)
{
    api_buf b;
    api_buf_init(&b, 64 * 1024);
    srv__log_begin(&b, level);
    api_buf_cstr(&b, ",\"msg\":");
    api_buf_json_string(&b, text, text_len);
    if (extra)
        api_buf_cstr(&b, extra);
    api_buf_cstr(&b, "}\n");
    if (b.state == API_BUF_OK)
        srv__log_write(b.data, b.len);
    api_buf_free(&b);
}

void srv_log(srv_log_level level, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    int n;
    if (!srv_log_enabled(level))
        return;
    va_start(ap, fmt);
    n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    log_line(level, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1, NULL);
}

/* Messages libmicrohttpd writes when a client misbehaves or goes away: expected on a public
 * port, so they are debug lines; anything else it says is a warning. */
static bool mhd_message_is_client_fault(const char *msg)
{
    static const char *const patterns[] = {
        "closed by remote",
        "incomplete request",
        "timed out",
        "Error processing request",
        "Failed to parse",
        "Failed to receive",
        "Failed to send",
        "reset by",
        "syntactically incorrect",
        "Connection was closed",
        "Not enough memory",
        "Connection socket is closed",
        "connection closure",
        /* what it says when our handler returns MHD_NO on purpose, e.g. to drop the connection
         * of a client that hung up */
        "Application reported internal error",
    };
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        if (strstr(msg, patterns[i]))
            return true;
    }
    return false;
}

void srv__log_mhd(void *cls, const char *fmt, va_list ap)
{
    char msg[1024];
    int n;
    srv_log_level level;
    (void)cls;
    n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof msg)
        n = (int)sizeof msg - 1;
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    level = mhd_message_is_client_fault(msg) ? SRV_LOG_DEBUG : SRV_LOG_WARN;
    if (!srv_log_enabled(level))
        return;
    log_line(level, msg, (size_t)n, ",\"source\":\"libmicrohttpd\"");
}
