/*
 * log.h - the pieces of log.c that other server files build their own lines with (the request
 * line of http.c) and libmicrohttpd's logger. srv_log itself is public (server.h).
 */
#ifndef ATTND_SERVER_LOG_H
#define ATTND_SERVER_LOG_H

#include "api/api.h"
#include "server/server.h"

/* Appends the opening of a log line, {"time":"...","level":"...", to `b`. */
void srv__log_begin(api_buf *b, srv_log_level level);
/* Writes a complete line (without its newline) to stderr in one piece. Any thread. */
void srv__log_write(const char *line, size_t len);
/* libmicrohttpd's error-log callback (MHD_OPTION_EXTERNAL_LOGGER). */
void srv__log_mhd(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

#endif
