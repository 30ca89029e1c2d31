/*
 * main.c - attnd's entry point: configuration, signals, serve, drain, exit.
 *
 * Signal handlers only write one byte to a self-pipe; the main thread sleeps on the pipe and
 * runs the drain itself, so nothing unsafe ever runs inside a handler. A second SIGTERM or
 * SIGINT during the drain ends its grace period at once. SIGHUP reloads the TLS certificate, the
 * client CA file and the token file; SIGUSR1, SIGUSR2 and SIGPIPE are ignored.
 *
 * Exit status: 0 after a drain, 1 when the server cannot start, 2 for a bad configuration.
 * `attnd --healthcheck [options]` instead probes a running daemon with those options.
 */
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define HEALTHCHECK_TIMEOUT_MS 2000

static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    char c = (char)sig;
    ssize_t w = write(signal_pipe[1], &c, 1);
    (void)w; /* a full pipe already holds a pending signal */
    errno = saved;
}

static int install_signals(void)
{
    struct sigaction sa;
    if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return -1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        sigaction(SIGHUP, &sa, NULL) != 0)
        return -1;
    /* Writes to a closed socket must fail with EPIPE, not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    /* Their default action ends the process at once, without a drain: a stray SIGUSR1/2 would
     * drop every request in flight, so they are ignored. SIGHUP (a supervisor asking for a
     * reload, a terminal going away) has the handler above: it reloads the certificate and
     * the token file, and nothing else. */
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    return 0;
}

/* Blocks until a signal byte arrives; returns the signal number. */
static int wait_for_signal(void)
{
    for (;;) {
        struct pollfd p = {.fd = signal_pipe[0], .events = POLLIN};
        char c;
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            return SIGTERM; /* cannot wait any more: treat as a stop request */
        if (read(signal_pipe[0], &c, 1) == 1)
            return (int)(unsigned char)c;
    }
}

int main(int argc, char **argv)
{
    srv_config cfg;
    char err[512];
    srv_server *s;
    struct api_models *models;
    srv_status st;
    int sig;

    /* --healthcheck is a mode, not an option: it reads the same configuration and probes. */
    bool healthcheck = false;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--healthcheck") == 0) {
            healthcheck = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            break;
        }
    st = srv_config_parse(&cfg, argc, argv, err, sizeof err);
    if (st == SRV_HELP) {
        srv_config_usage(stdout);
        return 0;
    }
    if (st != SRV_OK) {
        fprintf(stderr, "attnd: %s\n", err);
        return 2;
    }
    if (healthcheck) {
        int code = srv_healthcheck(&cfg, HEALTHCHECK_TIMEOUT_MS);
        srv_config_free(&cfg);
        return code;
    }
    srv_log_set_level(cfg.log_level);
    if (install_signals() != 0) {
        fprintf(stderr, "attnd: cannot install signal handlers: %s\n", strerror(errno));
        srv_config_free(&cfg);
        return 1;
    }
    /* A certificate, key or token file that cannot be used, like a model file that cannot be
     * loaded, is a configuration error, as a bad flag is. */
    if (srv_security_check(&cfg, err, sizeof err) != SRV_OK) {
        fprintf(stderr, "attnd: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    models = srv_models_load(&cfg, err, sizeof err);
    if (!models) {
        fprintf(stderr, "attnd: %s\n", err);
        srv_config_free(&cfg);
        return 2;
    }
    s = srv_server_start_models(&cfg, models, err, sizeof err);
    if (!s) {
        fprintf(stderr, "attnd: %s\n", err);
        srv_config_free(&cfg);
        return 1;
    }

    while ((sig = wait_for_signal()) == SIGHUP)
        srv_server_reload(s);
    srv_log(SRV_LOG_INFO, "received %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_server_drain(s, signal_pipe[0]);
    srv_server_free(s);
    srv_config_free(&cfg);
    srv_log(SRV_LOG_INFO, "stopped");
    return 0;
}
