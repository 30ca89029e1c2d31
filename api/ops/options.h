/*
 * options.h - the options of the operations, read from JSON values the same way by every
 * route that takes them (native and v2), so that the same mistake gets the same status and
 * message: bounded integers and floats, causal alignment, windows, weights modes, positional
 * encodings, tensor fields, and the "did you mean" of unknown names. Each parser returns 0, or
 * -1 with a 422 naming the field.
 */
#ifndef ATTND_API_OPS_OPTIONS_H
#define ATTND_API_OPS_OPTIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/ops/request.h"

typedef enum {
    API_CAUSAL_UNSET = -1, /* not given: a route that has a default of its own (sessions:
                              bottom_right) sets it before reading the options */
    API_CAUSAL_OFF = 0,
    API_CAUSAL_ON,
    API_CAUSAL_TOP_LEFT,
    API_CAUSAL_BOTTOM_RIGHT,
} api__causal;

/* Bounds that keep the engine's position arithmetic (i + query_offset - left, ...) far from
 * int64 overflow. A window side beyond API_WINDOW_MAX reaches past any position and is the
 * same as none. */
#define API_QUERY_OFFSET_MAX ((int64_t)1 << 48)
#define API_WINDOW_MAX       ((int64_t)1 << 50)

typedef struct {
    bool left_set, right_set;
    int64_t left, right;
} api__window;

/* A JSON integer in [lo, hi], or a 422 naming `name`. */
int api__option_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                    api__error *err);
/* A JSON number finite as float32, or a 422 naming `name`. */
int api__option_float(const json_t *v, const char *name, float *out, api__error *err);
/* A softcap: a number >= 0 finite as float32, 0 meaning none. */
int api__option_softcap(const json_t *v, const char *name, float *out, api__error *err);
/* "float32" | "bfloat16": the precision of the products (engine.h eng_precision). */
int api__option_precision(const json_t *v, const char *name, eng_precision *out, api__error *err);
/* The name of a precision as requests spell it. */
const char *api__precision_name(eng_precision precision);
/* false | null | true | "top_left" | "bottom_right". */
int api__option_causal(const json_t *v, const char *name, api__causal *out, api__error *err);

/* [left, right], each a non-negative integer or null (unbounded); null is no window. */
int api__option_window(const json_t *v, const char *name, api__window *w, api__error *err);
/* "per_head" | "mean" | false | null. */
int api__option_weights(const json_t *v, const char *name, eng_weights_mode *out, api__error *err);
/* "nested" | "flat" | "base64" (sets *set) | null. */
int api__option_encoding(const json_t *v, const char *name, bool *set, api__form *out,
                         api__error *err);
/* A tensor field: null leaves it absent; otherwise the tensor is probed (not decoded) with the
 * request's element limit, which marks it present. */
int api__req_tensor(const api__req *rq, const json_t *v, const char *name, api__tensor *t,
                    api__error *err);
/* true | false (null is the caller's to handle). */
int api__option_bool(const json_t *v, const char *name, bool *out, api__error *err);
/* "sinusoidal" | "rope" | "alibi" | "none" | null (unchanged). */
int api__option_positional(const json_t *v, const char *name, eng_positional *out, api__error *err);
/* A number > 0, finite as float32 (sets *set) | null. */
int api__option_rope_base(const json_t *v, const char *name, bool *set, float *out,
                          api__error *err);
/* "half" | "interleaved" (sets *set) | null. */
int api__option_rope_style(const json_t *v, const char *name, bool *set, eng_rope_style *out,
                           api__error *err);

/* The closest of `names[0..n)` to `key` within an edit distance of 2, or NULL: for "did you
 * mean" in messages about unknown fields. */
const char *api__closest_name(const char *key, const char *const *names, size_t n);

/* An option of an operation: a setting given as one JSON value under one name, read the same
 * way by every protocol (a native field, a v2 parameter). Each operation lists its own
 * (api__sdpa_options, api__layer_options) and every protocol looks names up there, so a new
 * option is added to its operation alone. `req` is the operation's request (api__sdpa_req,
 * api__layer_req). A protocol whose format allows null skips it before calling. */
typedef struct {
    const char *name;
    int (*parse)(void *req, const json_t *v, const char *name, api__error *err);
} api__option_def;

/* The option of defs[0..n) called `name`, or NULL. */
const api__option_def *api__option_find(const api__option_def *defs, size_t n, const char *name);

/* The names a route takes, for the message about one it does not: what they are ("field",
 * "parameter"), whose they are (a route, a model), a protocol's own and its operation's. */
typedef struct {
    const char *kind, *what;
    const char *const *own;
    size_t n_own;
    const api__option_def *opts;
    size_t n_opts;
} api__names;

/* The 422 for an unknown `key` (the error's field is `field`): "did you mean" the closest of
 * the names, else a list of them all: "unknown <kind> "<key>"; <what> takes a, b and c". */
int api__unknown_name(const char *key, const char *field, const api__names *names, api__error *err);

#endif
