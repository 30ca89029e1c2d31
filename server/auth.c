/*
 * auth.c - bearer tokens (--auth-token-file): every route but the health probes and the
 * inspector page's shell needs "Authorization: Bearer <token>" with one of the file's tokens.
 *
 * The file holds one token per line (blank lines and lines starting with '#' are skipped), so
 * that a new token can be added, rolled out to callers, and the old one removed, each step a
 * SIGHUP. A token is compared with every configured token in time that depends only on the
 * configured tokens' lengths, never on where the first difference is, so a client cannot find
 * a token byte by byte from response times. Tokens never reach a log line, a metric or an
 * error message: messages name the file and the line, not its content.
 */
#include "server/auth.h"

#include <pthread.h>
#include <stdio.h>

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Bounds on the file: enough for rotation, small enough to compare against on every request. */
#define AUTH_MAX_FILE   ((size_t)64 * 1024)
#define AUTH_MAX_TOKENS 64
/* Shorter tokens can be guessed; 16 random base64 characters are 96 bits. */
#define AUTH_MIN_TOKEN 16

typedef struct {
    char *data; /* the file, tokens NUL-terminated in place */
    size_t data_len;
    const char *token[AUTH_MAX_TOKENS];
    size_t len[AUTH_MAX_TOKENS];
    size_t n;
} token_set;

struct srv_auth {
    char *path;
    pthread_mutex_t mu;
    token_set *tokens;
};

const char *const srv__auth_challenge[] = {"WWW-Authenticate", "Bearer realm=\"attnd\"", NULL};

static void set_free(token_set *set)
{
    if (!set)
        return;
    explicit_bzero(set->data, set->data_len);
    free(set->data);
    free(set);
}

/* RFC 6750's b64token: the characters a bearer token may have. */
static bool token_char(unsigned char c)
{
    return isalnum(c) || strchr("-._~+/=", c) != NULL;
}

/* Splits the file into tokens; the error names the line, never its content. */
static srv_status parse_tokens(token_set *set, const char *path, char *err, size_t errlen)
{
    char *line = set->data;
    size_t line_no = 0;
    while (line && *line) {
        char *next = strchr(line, '\n');
        size_t n;
        line_no++;
        if (next)
            *next++ = '\0';
        while (*line == ' ' || *line == '\t')
            line++;
        n = strlen(line);
        while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n > 0 && line[0] != '#') {
            for (size_t i = 0; i < n; i++) {
                if (!token_char((unsigned char)line[i])) {
                    snprintf(err, errlen,
                             "--auth-token-file %s: line %zu: a token is made of A-Z a-z 0-9 "
                             "- . _ ~ + / = only",
                             path, line_no);
                    return SRV_EINVAL;
                }
            }
            if (n < AUTH_MIN_TOKEN) {
                snprintf(err, errlen,
                         "--auth-token-file %s: line %zu: a token needs at least %d "
                         "characters",
                         path, line_no, AUTH_MIN_TOKEN);
                return SRV_EINVAL;
            }
            if (set->n == AUTH_MAX_TOKENS) {
                snprintf(err, errlen, "--auth-token-file %s: more than %d tokens", path,
                         AUTH_MAX_TOKENS);
                return SRV_EINVAL;
            }
            set->token[set->n] = line;
            set->len[set->n++] = n;
        }
        line = next;
    }
    if (set->n == 0) {
        snprintf(err, errlen, "--auth-token-file %s: no token in it (one per line)", path);
        return SRV_EINVAL;
    }
    return SRV_OK;
}

static token_set *load_tokens(const char *path, char *err, size_t errlen)
{
    token_set *set = calloc(1, sizeof *set);
    FILE *f = fopen(path, "rb");
    size_t n;
    if (!f || !set) {
        snprintf(err, errlen, "--auth-token-file %s: %s", path,
                 f ? "out of memory" : strerror(errno));
        if (f)
            fclose(f);
        free(set);
        return NULL;
    }
    set->data_len = AUTH_MAX_FILE + 1;
    set->data = calloc(1, set->data_len);
    n = set->data ? fread(set->data, 1, AUTH_MAX_FILE + 1, f) : 0;
    if (!set->data || ferror(f) || n > AUTH_MAX_FILE) {
        snprintf(err, errlen, "--auth-token-file %s: %s", path,
                 !set->data  ? "out of memory"
                 : ferror(f) ? "cannot read it"
                             : "larger than 64 KiB");
        fclose(f);
        set_free(set);
        return NULL;
    }
    fclose(f);
    if (memchr(set->data, '\0', n)) {
        snprintf(err, errlen, "--auth-token-file %s: a NUL byte in it", path);
        set_free(set);
        return NULL;
    }
    if (parse_tokens(set, path, err, errlen) != SRV_OK) {
        set_free(set);
        return NULL;
    }
    return set;
}

srv_status srv__auth_new(const srv_config *cfg, srv_auth **out, char *err, size_t errlen)
{
    srv_auth *a;
    *out = NULL;
    if (!cfg->auth_token_file)
        return SRV_OK;
    a = calloc(1, sizeof *a);
    if (!a)
        return SRV_ENOMEM;
    pthread_mutex_init(&a->mu, NULL);
    size_t path_len = strlen(cfg->auth_token_file) + 1;
    a->path = malloc(path_len);
    if (!a->path) {
        srv__auth_free(a);
        return SRV_ENOMEM;
    }
    memcpy(a->path, cfg->auth_token_file, path_len);
    a->tokens = load_tokens(a->path, err, errlen);
    if (!a->tokens) {
        srv__auth_free(a);
        return SRV_EINVAL;
    }
    *out = a;
    return SRV_OK;
}

srv_status srv__auth_reload(srv_auth *a, size_t *count, char *err, size_t errlen)
{
    token_set *set = load_tokens(a->path, err, errlen), *old;
    if (!set)
        return SRV_EINVAL;
    *count = set->n;
    pthread_mutex_lock(&a->mu);
    old = a->tokens;
    a->tokens = set;
    pthread_mutex_unlock(&a->mu);
    set_free(old);
    return SRV_OK;
}

void srv__auth_free(srv_auth *a)
{
    if (!a)
        return;
    set_free(a->tokens);
    pthread_mutex_destroy(&a->mu);
    free(a->path);
    free(a);
}

/* 1 when `given` equals `token`. The loop runs over the configured token whatever is given,
 * and nothing in it branches on the bytes. */
static unsigned token_equal(const char *given, size_t given_len, const char *token, size_t len)
{
    volatile unsigned char diff = given_len == len ? 0 : 1;
    for (size_t i = 0; i < len; i++)
        diff |= (unsigned char)(given[i % given_len] ^ token[i]);
    return diff == 0;
}

/* The token of an "Authorization: Bearer <token>" value, or NULL. */
static const char *bearer_token(const char *value, size_t *len)
{
    size_t n;
    if (!value || strncasecmp(value, "Bearer ", 7) != 0)
        return NULL;
    value += 7;
    while (*value == ' ')
        value++;
    n = strlen(value);
    while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t'))
        n--;
    *len = n;
    return n > 0 ? value : NULL;
}

bool srv__auth_allows(srv_auth *a, const char *authorization)
{
    const char *given;
    size_t given_len = 0;
    unsigned ok = 0;

    if (!a)
        return true;
    given = bearer_token(authorization, &given_len);
    if (!given)
        return false;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->tokens->n; i++)
        ok |= token_equal(given, given_len, a->tokens->token[i], a->tokens->len[i]);
    pthread_mutex_unlock(&a->mu);
    return ok != 0;
}

const char *srv__auth_refusal(bool sent)
{
    return sent ? "the bearer token is not valid (Authorization: Bearer <token>, "
                  "--auth-token-file)"
                : "authentication required: send Authorization: Bearer <token> "
                  "(--auth-token-file)";
}
