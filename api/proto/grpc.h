/*
 * grpc.h - what the files of the v2 gRPC protocol (proto/grpc_*.c) share: the content type of
 * an error reply, a cursor over protobuf's wire format (grpc_wire.c), the packing of a response
 * (grpc_unary.c) and the converter from the JSON of the HTTP routes to a protobuf-c message
 * (grpc_json.c). Nothing outside proto/grpc_*.c includes it.
 */
#ifndef ATTND_API_PROTO_GRPC_H
#define ATTND_API_PROTO_GRPC_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "api/api.h"

#define API_GRPC_ERROR_TYPE   API_ERRORS_GRPC_TYPE
#define API_GRPC_MESSAGE_TYPE "application/grpc"

/* Outputs of one inference reply, at most (sdpa has three). */
#define API__GRPC_MAX_OUTPUTS 8

/* Fields of a protobuf message in wire order, without decoding them. */
typedef struct {
    const char *data;
    size_t len, pos;
    bool bad; /* a malformed field ended the walk */
} api__pb_cursor;

typedef struct {
    uint32_t number;
    int type;         /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    const char *data; /* types 1, 2, 5: the bytes */
    size_t len;
    uint64_t value; /* types 0, 1, 5: the value */
} api__pb_field;

/* The next field; false at the end or (c->bad) at a malformed one. */
bool api__pb_next(api__pb_cursor *c, api__pb_field *f);

/* Turns the JSON reply of an HTTP route (the configuration) into the response message of
 * descriptor d, from the whole reply or, with `wrap`, the field of the response named so holding
 * it; an error reply's message becomes plain text, status kept. grpc_json.c. */
void api__grpc_reply_convert(api_reply *reply, const ProtobufCMessageDescriptor *d,
                             const char *wrap);

/* Packs `msg` into reply->body (200, application/grpc), reserving nothing (small messages);
 * 503 when memory runs out. grpc_unary.c. */
void api__grpc_reply_pack(api_reply *reply, const ProtobufCMessage *msg);

#endif
