/*
 * reply.h - filling an api_reply (api.h): from an api__error in a protocol's style, or with the
 * JSON of a writer. The HTTP code of a status comes from status.h and nowhere else.
 */
#ifndef ATTND_API_WIRE_REPLY_H
#define ATTND_API_WIRE_REPLY_H

#include "api/core/error.h"
#include "api/wire/buf.h"

/* Turns `err` into an error reply in `style`, freeing any body `reply` held; its other fields
 * must be initialised. */
void api__reply_from_error(api_reply *reply, api_error_style style, const api__error *err);

/* Fills a 200 application/json reply with the text of `w`, taking its buffer; a 503 in `style`
 * when the writer ran out of memory. */
void api__reply_json(api_reply *reply, api_buf *w, api_error_style style);

#endif
