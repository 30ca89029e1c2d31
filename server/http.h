/*
 * http.h - libmicrohttpd's callbacks (http.c), which server.c hands to each listener with the
 * srv_server as their closure. They own every request (srv_req) from its request line to its
 * completion. Each runs on the I/O thread of its connection (--io-threads of them on --port, one
 * on --admin-port), those of different connections at once.
 */
#ifndef ATTND_SERVER_HTTP_H
#define ATTND_SERVER_HTTP_H

#include <microhttpd.h>

enum MHD_Result srv__mhd_access(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls);
/* The URI callbacks of --port and of --admin-port: each listener has its own, so that a request
 * knows where it arrived without reading the daemon handles, which the main thread is still
 * storing while the first listener already runs. */
void *srv__mhd_uri(void *cls, const char *uri, struct MHD_Connection *conn);
void *srv__mhd_uri_admin(void *cls, const char *uri, struct MHD_Connection *conn);
void srv__mhd_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                        enum MHD_RequestTerminationCode toe);
void srv__mhd_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);

#endif
