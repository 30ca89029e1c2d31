/*
 * half_close.h - replies to clients that closed their sending side while their request was
 * suspended (half_close.c explains why libmicrohttpd 0.9.75 would drop them).
 */
#ifndef ATTND_SERVER_HALF_CLOSE_H
#define ATTND_SERVER_HALF_CLOSE_H

#include "server/reply.h"

/* Whether the peer of socket `fd` (-1: none) has sent its FIN and nothing else is unread. */
bool srv__peer_sent_fin(int fd);
/* Writes `r` (its body freed, taken over) to socket `fd` with `request_id`, ending the
 * exchange with "Connection: close" (the connection must then close), before `deadline_ns`.
 * Returns whether all of it was written. Called by
 * the worker that owns a suspended request, before resuming it, or on the MHD thread for a
 * small error reply (it then fits the empty socket buffer at once). */
bool srv__reply_direct(int fd, srv_reply *r, const char *request_id, int64_t deadline_ns);

#endif
