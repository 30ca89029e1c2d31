/*
 * healthcheck.c - `attnd --healthcheck`: is the daemon configured like this one ready?
 *
 * A container's HEALTHCHECK runs a second process from the same image, with the same ATTND_*
 * variables but not the container's command line, so the image needs no curl: this asks GET
 * /v2/health/ready over plain TCP and turns the answer into an exit status. The port is the one
 * the daemon wrote to its --port-file (the image sets ATTND_PORT_FILE), so `docker run image
 * --port 9000` is probed on 9000; without that file, the configured --port. With --tls-cert
 * the probe speaks TLS (tls.c). With an --admin-port the probe asks that listener instead (its
 * --admin-port-file, else the port; always plain HTTP): it keeps answering while the serving
 * port is saturated, which is what it is for.
 */
#include "server/tls.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A wildcard listen address is reached through loopback. */
static const char *probe_host(const char *host)
{
    if (strcmp(host, "0.0.0.0") == 0)
        return "127.0.0.1";
    if (strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0)
        return "::1";
    return host;
}

/* Waits for `events` on fd until the deadline; false on timeout or error. */
static bool wait_fd(int fd, short events, int64_t deadline_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (now >= deadline_ms)
        return false;
    struct pollfd p = {.fd = fd, .events = events};
    int rc;
    do
        rc = poll(&p, 1, (int)(deadline_ms - now));
    while (rc < 0 && errno == EINTR);
    return rc == 1 && !(p.revents & POLLERR);
}

static int connect_within(const char *host, int64_t port, int64_t deadline_ms)
{
    char service[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    snprintf(service, sizeof service, "%lld", (long long)port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int err = 0;
        socklen_t len = sizeof err;
        if ((connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 &&
             (errno != EINPROGRESS || !wait_fd(fd, POLLOUT, deadline_ms))) ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* The port in a --port-file ("8080\n"), or -1 when there is no such file or it holds no port. */
static int64_t port_from_file(const char *path)
{
    char text[32];
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return -1;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *end = NULL;
    errno = 0;
    long long port = strtoll(text, &end, 10);
    if (errno != 0 || end == text || (*end != '\n' && *end != '\0') || port < 1 || port > 65535)
        return -1;
    return (int64_t)port;
}

int srv_healthcheck(const srv_config *cfg, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t deadline = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + timeout_ms;
    const char *host = probe_host(cfg->host);
    bool admin = cfg->admin_port >= 0;
    int64_t port = port_from_file(admin ? cfg->admin_port_file : cfg->port_file);
    if (port < 0)
        port = admin ? cfg->admin_port : cfg->port;
    int fd = connect_within(host, port, deadline);
    if (fd < 0) {
        fprintf(stderr, "attnd: healthcheck: cannot connect to %s port %lld\n", host,
                (long long)port);
        return 1;
    }
    char req[320];
    int n = snprintf(req, sizeof req,
                     "GET /v2/health/ready HTTP/1.1\r\nHost: %.200s\r\nConnection: close\r\n\r\n",
                     host);
    char status[16] = "";
    size_t got = 0;
    if (n > 0 && cfg->tls_cert && !admin) {
        got = srv__tls_exchange(cfg, fd, req, (size_t)n, status, sizeof status - 1, deadline);
    } else if (n > 0 && send(fd, req, (size_t)n, MSG_NOSIGNAL) == n) {
        while (got < sizeof status - 1 && wait_fd(fd, POLLIN, deadline)) {
            ssize_t r = recv(fd, status + got, sizeof status - 1 - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
    }
    close(fd);
    status[got] = '\0';
    /* "HTTP/1.1 200 ..." */
    bool ready =
        got >= 12 && strncmp(status, "HTTP/1.", 7) == 0 && strncmp(status + 9, "200", 3) == 0;
    if (!ready)
        fprintf(stderr, "attnd: healthcheck: %s port %lld is not ready\n", host, (long long)port);
    return ready ? 0 : 1;
}
