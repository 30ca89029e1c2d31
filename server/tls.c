/*
 * tls.c - HTTPS: the certificate and key (--tls-cert, --tls-key, --tls-key-password-file), the
 * protocol and cipher priorities (--tls-priorities), client certificates (--tls-client-ca), and
 * their reload on SIGHUP.
 *
 * libmicrohttpd 0.9.75 loads a certificate given as MHD_OPTION_HTTPS_MEM_CERT/KEY once, into
 * credentials it owns and never lets go of, so a renewed certificate would need a restart.
 * MHD_OPTION_HTTPS_CERT_CALLBACK instead hands GnuTLS a retrieve function that picks the
 * certificate during each handshake: attnd loads the chain and key itself and the callback
 * returns the newest one, so a reload changes what new handshakes get without touching the
 * connections already open.
 *
 * A replaced chain is not freed while the daemon runs: GnuTLS keeps the pointers the callback
 * returned for the lifetime of each session, and nothing tells attnd when the last session that
 * got an old chain has ended. A chain is a few KiB and certificates rotate every few weeks.
 *
 * Client certificates: libmicrohttpd 0.9.75 takes a CA file only as MHD_OPTION_HTTPS_MEM_TRUST,
 * which it loads once into the credentials it owns (gnutls_certificate_set_x509_trust_mem at
 * start) and offers no way to change while the daemon runs; and all it does with it is ask for
 * a certificate (GNUTLS_CERT_REQUEST), verifying nothing. So attnd does not hand it the CA at
 * all. It keeps its own trust list (gnutls_x509_trust_list_t) behind a read-write lock, and the
 * retrieve function, which runs before the server's CertificateRequest is written, makes the
 * certificate a requirement (GNUTLS_CERT_REQUIRE) and installs a verify function on the session
 * (gnutls_session_set_verify_function): GnuTLS calls it once the client's chain has arrived,
 * during the handshake, and it verifies the chain against attnd's list (key purpose client
 * authentication, validity times). A client without a valid certificate never gets to send a
 * request. SIGHUP builds a new list from the file and swaps it in under the write lock: new
 * handshakes verify against the new CAs, open connections stay as they are, and a file that
 * cannot be loaded leaves the previous list in force. The CertificateRequest then names no CA
 * (the credentials hold none), which TLS allows: a client sends the certificate it has, and one
 * from a CA added by a reload is not held back by a stale list of names.
 */
#include "server/tls.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

/* Longest chain accepted in --tls-cert (leaf plus intermediates). */
#define TLS_MAX_CHAIN 8
/* Largest PEM file read (certificates, keys, CA bundles, the password). */
#define TLS_MAX_FILE ((size_t)1 << 20)
/* Longest client chain verified (leaf plus intermediates); longer ones are refused. */
#define TLS_MAX_PEER_CHAIN 16

/* One certificate chain and its key, as GnuTLS wants them from a retrieve function. */
typedef struct tls_cert {
    gnutls_pcert_st chain[TLS_MAX_CHAIN];
    unsigned n_chain;
    gnutls_privkey_t key;
    struct tls_cert *older; /* the chain it replaced, kept until srv__tls_free */
} tls_cert;

struct srv_tls {
    char *cert_path, *key_path, *password_path;
    char *priorities;
    char *client_ca_path;     /* --tls-client-ca; NULL: client certificates are not asked for */
    pthread_rwlock_t ca_lock; /* readers verify, a reload swaps */
    gnutls_x509_trust_list_t client_ca; /* the CAs of client_ca_path, under ca_lock */
    unsigned client_ca_count;           /* how many, for the log */
    pthread_mutex_t mu;
    tls_cert *current;
    struct MHD_OptionItem options[4];
    gnutls_certificate_credentials_t grpc_cred; /* --grpc-port's, made at its first handshake */
};

/* The retrieve function has no user pointer, so the server with TLS is found here: one per
 * process (srv__tls_options refuses a second). */
static _Atomic(srv_tls *) active_tls;

static char *dup_or_null(const char *s)
{
    char *d;
    size_t n;
    if (!s)
        return NULL;
    n = strlen(s) + 1;
    d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Reads the whole file at `path` (at most TLS_MAX_FILE bytes) into a NUL-terminated buffer. */
static char *read_file(const char *flag, const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *data;
    size_t n;
    if (!f) {
        snprintf(err, errlen, "%s %s: cannot open it: %s", flag, path, strerror(errno));
        return NULL;
    }
    data = malloc(TLS_MAX_FILE + 1);
    if (!data) {
        fclose(f);
        snprintf(err, errlen, "%s %s: out of memory", flag, path);
        return NULL;
    }
    n = fread(data, 1, TLS_MAX_FILE + 1, f);
    if (ferror(f) || n > TLS_MAX_FILE) {
        snprintf(err, errlen, "%s %s: %s", flag, path,
                 ferror(f) ? "cannot read it" : "larger than 1 MiB");
        fclose(f);
        explicit_bzero(data, TLS_MAX_FILE + 1);
        free(data);
        return NULL;
    }
    fclose(f);
    data[n] = '\0';
    *len = n;
    return data;
}

/* Frees a buffer that held key material, wiping it first. */
static void free_secret(char *data, size_t len)
{
    if (data) {
        explicit_bzero(data, len);
        free(data);
    }
}

static void cert_free(tls_cert *c)
{
    while (c) {
        tls_cert *older = c->older;
        for (unsigned i = 0; i < c->n_chain; i++)
            gnutls_pcert_deinit(&c->chain[i]);
        if (c->key)
            gnutls_privkey_deinit(c->key);
        free(c);
        c = older;
    }
}

/* Checks that the key belongs to the leaf certificate: GnuTLS does when it sets both in a
 * credentials structure, with a message worth passing on. */
static int check_pair(const gnutls_datum_t *cert, const gnutls_datum_t *key, const char *password)
{
    gnutls_certificate_credentials_t cred;
    int rc = gnutls_certificate_allocate_credentials(&cred);
    if (rc < 0)
        return rc;
    rc = gnutls_certificate_set_x509_key_mem2(cred, cert, key, GNUTLS_X509_FMT_PEM, password, 0);
    gnutls_certificate_free_credentials(cred);
    return rc < 0 ? rc : 0;
}

/* Parses the chain and key in memory into `c`. */
static int import_pair(tls_cert *c, const gnutls_datum_t *cert, const gnutls_datum_t *key,
                       const char *password)
{
    int rc;
    c->n_chain = TLS_MAX_CHAIN;
    rc = gnutls_pcert_list_import_x509_raw(c->chain, &c->n_chain, cert, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0) {
        c->n_chain = 0;
        return rc;
    }
    rc = gnutls_privkey_init(&c->key);
    if (rc < 0) {
        c->key = NULL;
        return rc;
    }
    return gnutls_privkey_import_x509_raw(c->key, key, GNUTLS_X509_FMT_PEM, password, 0);
}

/* The password of the key, without the line break that ends the file; NULL without one. */
static char *read_password(const srv_tls *t, size_t *len, char *err, size_t errlen, bool *failed)
{
    char *pw;
    *failed = false;
    *len = 0;
    if (!t->password_path)
        return NULL;
    pw = read_file("--tls-key-password-file", t->password_path, len, err, errlen);
    if (!pw) {
        *failed = true;
        return NULL;
    }
    while (*len > 0 && (pw[*len - 1] == '\n' || pw[*len - 1] == '\r'))
        pw[--*len] = '\0';
    return pw;
}

/* Reads --tls-cert and --tls-key (with the password, if any) into a new chain. */
static tls_cert *load_cert(const srv_tls *t, char *err, size_t errlen)
{
    size_t cert_len = 0, key_len = 0, pw_len = 0;
    char *cert_pem = NULL, *key_pem = NULL, *pw;
    bool pw_failed;
    tls_cert *c = NULL;
    int rc;

    pw = read_password(t, &pw_len, err, errlen, &pw_failed);
    if (pw_failed)
        return NULL;
    cert_pem = read_file("--tls-cert", t->cert_path, &cert_len, err, errlen);
    if (cert_pem)
        key_pem = read_file("--tls-key", t->key_path, &key_len, err, errlen);
    if (!cert_pem || !key_pem)
        goto done;
    {
        gnutls_datum_t cert = {(unsigned char *)cert_pem, (unsigned)cert_len};
        gnutls_datum_t key = {(unsigned char *)key_pem, (unsigned)key_len};
        rc = check_pair(&cert, &key, pw);
        if (rc == 0) {
            c = calloc(1, sizeof *c);
            rc = c ? import_pair(c, &cert, &key, pw) : GNUTLS_E_MEMORY_ERROR;
        }
    }
    if (rc < 0) {
        snprintf(err, errlen, "--tls-cert %s, --tls-key %s: cannot load them: %s%s", t->cert_path,
                 t->key_path, gnutls_strerror(rc),
                 rc == GNUTLS_E_DECRYPTION_FAILED && !pw
                     ? " (an encrypted key needs --tls-key-password-file)"
                     : "");
        cert_free(c);
        c = NULL;
    }
done:
    free_secret(key_pem, key_len);
    free_secret(pw, pw_len);
    free(cert_pem);
    return c;
}

static srv_status check_priorities(const char *priorities, char *err, size_t errlen)
{
    gnutls_priority_t p;
    const char *at = NULL;
    int rc = gnutls_priority_init(&p, priorities, &at);
    if (rc < 0) {
        snprintf(err, errlen, "--tls-priorities: GnuTLS rejects it (%s) at \"%.64s\"",
                 gnutls_strerror(rc), at ? at : priorities);
        return SRV_EINVAL;
    }
    gnutls_priority_deinit(p);
    return SRV_OK;
}

/* Reads the CA file at `path` into a new trust list; SRV_EINVAL with `err` naming the file when
 * it cannot be read or holds no certificate. */
static srv_status load_client_ca(const char *path, gnutls_x509_trust_list_t *out, unsigned *count,
                                 char *err, size_t errlen)
{
    size_t len = 0;
    gnutls_x509_trust_list_t list;
    char *pem = read_file("--tls-client-ca", path, &len, err, errlen);
    int rc;
    if (!pem)
        return SRV_EINVAL;
    rc = gnutls_x509_trust_list_init(&list, 0);
    if (rc < 0) {
        free(pem);
        snprintf(err, errlen, "--tls-client-ca %s: %s", path, gnutls_strerror(rc));
        return SRV_EINVAL;
    }
    {
        gnutls_datum_t d = {(unsigned char *)pem, (unsigned)len};
        rc = gnutls_x509_trust_list_add_trust_mem(list, &d, NULL, GNUTLS_X509_FMT_PEM, 0, 0);
    }
    free(pem);
    if (rc <= 0) {
        gnutls_x509_trust_list_deinit(list, 1);
        snprintf(err, errlen, "--tls-client-ca %s: no CA certificate in it: %s", path,
                 gnutls_strerror(rc < 0 ? rc : GNUTLS_E_NO_CERTIFICATE_FOUND));
        return SRV_EINVAL;
    }
    *out = list;
    *count = (unsigned)rc;
    return SRV_OK;
}

srv_status srv__tls_new(const srv_config *cfg, srv_tls **out, char *err, size_t errlen)
{
    srv_tls *t;
    srv_status st;
    *out = NULL;
    if (!cfg->tls_cert)
        return SRV_OK;
    assert(cfg->tls_key); /* srv_config_parse refuses a certificate without its key */
    st = check_priorities(cfg->tls_priorities, err, errlen);
    if (st != SRV_OK)
        return st;
    t = calloc(1, sizeof *t);
    if (!t)
        return SRV_ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    pthread_rwlock_init(&t->ca_lock, NULL);
    t->cert_path = dup_or_null(cfg->tls_cert);
    t->key_path = dup_or_null(cfg->tls_key);
    t->password_path = dup_or_null(cfg->tls_key_password_file);
    t->priorities = dup_or_null(cfg->tls_priorities);
    t->client_ca_path = dup_or_null(cfg->tls_client_ca);
    if (!t->cert_path || !t->key_path || !t->priorities ||
        (cfg->tls_key_password_file && !t->password_path) ||
        (cfg->tls_client_ca && !t->client_ca_path)) {
        srv__tls_free(t);
        return SRV_ENOMEM;
    }
    if (t->client_ca_path && load_client_ca(t->client_ca_path, &t->client_ca, &t->client_ca_count,
                                            err, errlen) != SRV_OK) {
        srv__tls_free(t);
        return SRV_EINVAL;
    }
    t->current = load_cert(t, err, errlen);
    if (!t->current) {
        srv__tls_free(t);
        return SRV_EINVAL;
    }
    *out = t;
    return SRV_OK;
}

srv_status srv__tls_reload(srv_tls *t, char *err, size_t errlen)
{
    tls_cert *c = load_cert(t, err, errlen);
    if (!c)
        return SRV_EINVAL;
    pthread_mutex_lock(&t->mu);
    c->older = t->current;
    t->current = c;
    pthread_mutex_unlock(&t->mu);
    return SRV_OK;
}

srv_status srv__tls_reload_client_ca(srv_tls *t, char *err, size_t errlen)
{
    gnutls_x509_trust_list_t list, old;
    unsigned count;
    if (!t->client_ca_path)
        return SRV_OK;
    if (load_client_ca(t->client_ca_path, &list, &count, err, errlen) != SRV_OK)
        return SRV_EINVAL;
    pthread_rwlock_wrlock(&t->ca_lock);
    old = t->client_ca;
    t->client_ca = list;
    t->client_ca_count = count;
    pthread_rwlock_unlock(&t->ca_lock);
    /* No verification holds the old list now: each reads it under the read lock. */
    gnutls_x509_trust_list_deinit(old, 1);
    return SRV_OK;
}

bool srv__tls_describe_client_ca(srv_tls *t, char *out, size_t outlen)
{
    if (!t->client_ca_path)
        return false;
    pthread_rwlock_rdlock(&t->ca_lock);
    snprintf(out, outlen, "%u CA certificate%s of %s", t->client_ca_count,
             t->client_ca_count == 1 ? "" : "s", t->client_ca_path);
    pthread_rwlock_unlock(&t->ca_lock);
    return true;
}

void srv__tls_free(srv_tls *t)
{
    if (t && t->grpc_cred)
        gnutls_certificate_free_credentials(t->grpc_cred);
    srv_tls *self;
    if (!t)
        return;
    self = t;
    atomic_compare_exchange_strong(&active_tls, &self, NULL);
    cert_free(t->current);
    if (t->client_ca)
        gnutls_x509_trust_list_deinit(t->client_ca, 1);
    pthread_rwlock_destroy(&t->ca_lock);
    pthread_mutex_destroy(&t->mu);
    free(t->cert_path);
    free(t->key_path);
    free(t->password_path);
    free(t->priorities);
    free(t->client_ca_path);
    free(t);
}

/* GnuTLS' verify function of a session that requires a client certificate (MHD thread, during
 * the handshake, once the client's chain has arrived): 0 when the chain verifies against the
 * current --tls-client-ca list for client authentication, else an error, which ends the
 * handshake. */
static int verify_client(gnutls_session_t session)
{
    srv_tls *t = atomic_load(&active_tls);
    gnutls_x509_crt_t chain[TLS_MAX_PEER_CHAIN];
    gnutls_typed_vdata_st purpose = {GNUTLS_DT_KEY_PURPOSE_OID,
                                     (unsigned char *)(uintptr_t)GNUTLS_KP_TLS_WWW_CLIENT, 0};
    unsigned n = 0, got = 0, status = 1;
    const gnutls_datum_t *der = gnutls_certificate_get_peers(session, &n);
    int rc = GNUTLS_E_CERTIFICATE_ERROR;
    if (!t || !der || n == 0)
        return GNUTLS_E_NO_CERTIFICATE_FOUND;
    if (n > TLS_MAX_PEER_CHAIN)
        return GNUTLS_E_CERTIFICATE_ERROR;
    for (; got < n; got++) {
        if (gnutls_x509_crt_init(&chain[got]) < 0)
            goto done;
        if (gnutls_x509_crt_import(chain[got], &der[got], GNUTLS_X509_FMT_DER) < 0) {
            got++; /* initialised: deinit it below */
            goto done;
        }
    }
    pthread_rwlock_rdlock(&t->ca_lock);
    rc = gnutls_x509_trust_list_verify_crt2(t->client_ca, chain, n, &purpose, 1, 0, &status, NULL);
    pthread_rwlock_unlock(&t->ca_lock);
done:
    for (unsigned i = 0; i < got; i++)
        gnutls_x509_crt_deinit(chain[i]);
    if (rc < 0)
        return rc;
    return status == 0 ? 0 : GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR;
}

/* GnuTLS' retrieve function (MHD thread, during a handshake): the newest chain, and for
 * --tls-client-ca a required, verified client certificate (see the top of the file). */
static int retrieve_cert(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
                         const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                         gnutls_pcert_st **pcert, unsigned int *pcert_length,
                         gnutls_privkey_t *pkey)
{
    srv_tls *t = atomic_load(&active_tls);
    tls_cert *c;
    (void)req_ca_rdn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    if (!t)
        return -1;
    pthread_mutex_lock(&t->mu);
    c = t->current;
    pthread_mutex_unlock(&t->mu);
    *pcert = c->chain;
    *pcert_length = c->n_chain;
    *pkey = c->key;
    if (t->client_ca_path) {
        gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
        gnutls_session_set_verify_function(session, verify_client);
    }
    return 0;
}

const struct MHD_OptionItem *srv__tls_options(srv_tls *t, unsigned *flags, char *err, size_t errlen)
{
    static const struct MHD_OptionItem none[] = {{MHD_OPTION_END, 0, NULL}};
    srv_tls *expected = NULL;
    size_t n = 0;
    if (!t)
        return none;
    if (!atomic_compare_exchange_strong(&active_tls, &expected, t)) {
        snprintf(err, errlen, "only one server per process can serve TLS");
        return NULL;
    }
    /* A function pointer travels as the item's pointer (libmicrohttpd reads it back as one). */
    t->options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_CERT_CALLBACK, 0,
                                              (void *)(uintptr_t)retrieve_cert};
    t->options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0, t->priorities};
    t->options[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    *flags |= MHD_USE_TLS;
    return t->options;
}

void srv__tls_describe(srv_tls *t, char *out, size_t outlen)
{
    gnutls_x509_crt_t crt;
    char dn[256];
    size_t dn_len = sizeof dn;
    time_t expires;
    struct tm tm;
    tls_cert *c;

    snprintf(out, outlen, "a certificate GnuTLS cannot describe");
    pthread_mutex_lock(&t->mu);
    c = t->current;
    pthread_mutex_unlock(&t->mu);
    if (gnutls_x509_crt_init(&crt) < 0)
        return;
    if (gnutls_x509_crt_import(crt, &c->chain[0].cert, GNUTLS_X509_FMT_DER) >= 0 &&
        gnutls_x509_crt_get_dn(crt, dn, &dn_len) >= 0) {
        expires = gnutls_x509_crt_get_expiration_time(crt);
        gmtime_r(&expires, &tm);
        snprintf(out, outlen, "%s (chain of %u, expires %04d-%02d-%02dT%02d:%02d:%02dZ)%s", dn,
                 c->n_chain, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, t->client_ca_path ? ", client certificates required" : "");
    }
    gnutls_x509_crt_deinit(crt);
}

/* Makes `fd` blocking with send and receive timeouts of what is left until `deadline_ms`
 * (CLOCK_MONOTONIC), so that GnuTLS' blocking calls cannot outlive the probe. */
static bool block_until(int fd, int64_t deadline_ms)
{
    struct timespec ts;
    struct timeval tv;
    int64_t left;
    int flags = fcntl(fd, F_GETFL);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    left = deadline_ms - ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    if (left <= 0 || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        return false;
    tv.tv_sec = (time_t)(left / 1000);
    tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
           setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0;
}

size_t srv__tls_exchange(const srv_config *cfg, int fd, const char *req, size_t req_len, char *out,
                         size_t out_len, int64_t deadline_ms)
{
    gnutls_certificate_credentials_t cred;
    gnutls_session_t session;
    size_t got = 0;
    int rc;
    if (!block_until(fd, deadline_ms) || gnutls_certificate_allocate_credentials(&cred) < 0)
        return 0;
    /* The daemon's own certificate doubles as the client's when client certificates are
     * required (it then needs the client-auth usage too). Nothing is verified: this process
     * probes the daemon of its own container over loopback. */
    if (cfg->tls_client_ca && !cfg->tls_key_password_file)
        gnutls_certificate_set_x509_key_file(cred, cfg->tls_cert, cfg->tls_key,
                                             GNUTLS_X509_FMT_PEM);
    rc = gnutls_init(&session, GNUTLS_CLIENT);
    if (rc < 0) {
        gnutls_certificate_free_credentials(cred);
        return 0;
    }
    if (gnutls_priority_set_direct(session, cfg->tls_priorities, NULL) >= 0 &&
        gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, cred) >= 0) {
        gnutls_transport_set_int(session, fd);
        do
            rc = gnutls_handshake(session);
        while (rc < 0 && !gnutls_error_is_fatal(rc));
        if (rc >= 0 && gnutls_record_send(session, req, req_len) == (ssize_t)req_len) {
            ssize_t n;
            while (got < out_len && (n = gnutls_record_recv(session, out + got, out_len - got)) > 0)
                got += (size_t)n;
        }
    }
    gnutls_deinit(session);
    gnutls_certificate_free_credentials(cred);
    return got;
}

gnutls_session_t srv__tls_grpc_session(srv_tls *t, int fd)
{
    static const gnutls_datum_t h2 = {(unsigned char *)"h2", 2};
    gnutls_session_t session;
    if (!t->grpc_cred) {
        if (gnutls_certificate_allocate_credentials(&t->grpc_cred) < 0)
            return NULL;
        gnutls_certificate_set_retrieve_function2(t->grpc_cred, retrieve_cert);
    }
    if (gnutls_init(&session, GNUTLS_SERVER | GNUTLS_NONBLOCK) < 0)
        return NULL;
    if (gnutls_priority_set_direct(session, t->priorities, NULL) < 0 ||
        gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, t->grpc_cred) < 0 ||
        gnutls_alpn_set_protocols(session, &h2, 1, GNUTLS_ALPN_MANDATORY) < 0) {
        gnutls_deinit(session);
        return NULL;
    }
    gnutls_transport_set_int(session, fd);
    return session;
}
