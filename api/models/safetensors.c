/*
 * safetensors.c - attnd's one reader of safetensors files, and the layer of a --model FILE.
 *
 * The format: an unsigned 64-bit little-endian header length N, N bytes of JSON, then the data.
 * The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the data) plus an optional "__metadata__" object of strings. jansson reads the
 * header (strict UTF-8, no repeated key, nothing after the object); every entry is then
 * checked before any tensor is used, so a file is refused whole or read safely. It is fuzzed
 * (tests/fuzz/fuzz_safetensors.c, fuzz_hf_checkpoint.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/models/safetensors.h"
#include "api/models/weights.h"

#define MAX_TENSORS 64 /* in one --model FILE: a layer has at most 12 */
#define MAX_RANK    8

/* ---- The header --------------------------------------------------------------------------- */

typedef struct {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* The byte size of a dtype's element (negative: a dtype no weight may have), 0: unknown. */
static int dtype_size(const char *dtype, eng_dtype *out)
{
    static const struct {
        const char *name;
        eng_dtype dtype;
        int size;
    } known[] = {{"F32", ENG_DTYPE_F32, 4}, {"F16", ENG_DTYPE_F16, 2}, {"BF16", ENG_DTYPE_BF16, 2}};
    for (size_t i = 0; dtype && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(dtype, known[i].name) == 0) {
            if (out)
                *out = known[i].dtype;
            return known[i].size;
        }
    /* Other dtypes may sit in a shard (int64 buffers, say) as long as the layer needs none. */
    static const char *const other[][2] = {{"F64", "8"},  {"I64", "8"},     {"U64", "8"},
                                           {"I32", "4"},  {"U32", "4"},     {"I16", "2"},
                                           {"U16", "2"},  {"I8", "1"},      {"U8", "1"},
                                           {"BOOL", "1"}, {"F8_E4M3", "1"}, {"F8_E5M2", "1"}};
    for (size_t i = 0; dtype && i < sizeof other / sizeof other[0]; i++)
        if (strcmp(dtype, other[i][0]) == 0)
            return -(other[i][1][0] - '0');
    return 0;
}

/* One entry's byte span, checked against its dtype and shape and the data's length. */
static int check_entry(const char *file, const char *name, const json_t *v, uint64_t data_len,
                       span *out, hf_error *e)
{
    const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    const json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || json_object_size(v) != 3 || !json_is_string(dt) ||
        !json_is_array(shape) || !json_is_array(off) || json_array_size(off) != 2 ||
        json_array_size(shape) > MAX_RANK)
        return api__hf_fail(e, name,
                            "%s: tensor '%.100s' needs dtype, shape and data_offsets (and nothing "
                            "else)",
                            file, name);
    int size = dtype_size(json_string_value(dt), NULL);
    if (size == 0)
        return api__hf_fail(e, name, "%s: tensor '%.100s' has unknown dtype \"%.16s\"", file, name,
                            json_string_value(dt));
    uint64_t bytes = (uint64_t)(size < 0 ? -size : size);
    for (size_t d = 0; d < json_array_size(shape); d++) {
        const json_t *n = json_array_get(shape, d);
        if (!json_is_integer(n) || json_integer_value(n) < 0 ||
            __builtin_mul_overflow(bytes, (uint64_t)json_integer_value(n), &bytes))
            return api__hf_fail(e, name, "%s: tensor '%.100s' has a bad shape", file, name);
    }
    const json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return api__hf_fail(e, name, "%s: tensor '%.100s' has bad data_offsets", file, name);
    out->begin = (uint64_t)json_integer_value(b);
    out->end = (uint64_t)json_integer_value(en);
    out->name = name;
    if (out->end > data_len)
        return api__hf_fail(e, name, "%s: tensor '%.100s' runs past the end of the file", file,
                            name);
    if (out->end - out->begin != bytes)
        return api__hf_fail(
            e, name, "%s: tensor '%.100s': data_offsets do not match dtype and shape", file, name);
    return 0;
}

static int check_metadata(const char *file, const json_t *m, hf_error *e)
{
    const char *key;
    const json_t *v;
    if (!json_is_object(m))
        return api__hf_fail(e, "__metadata__", "%s: __metadata__ is not an object", file);
    json_object_foreach((json_t *)m, key, v)
    {
        if (!json_is_string(v))
            return api__hf_fail(e, "__metadata__", "%s: __metadata__[\"%.80s\"] is not a string",
                                file, key);
    }
    return 0;
}

/* Checks every entry of a parsed header against `data_len` bytes of data. */
static int check_header(const char *file, const json_t *h, uint64_t data_len, hf_error *e)
{
    size_t n = json_object_size(h), k = 0;
    span *spans = calloc(n ? n : 1, sizeof *spans);
    const char *name;
    const json_t *v;
    int rc = 0;
    if (!spans)
        return api__hf_fail(e, file, "%s: out of memory", file);
    json_object_foreach((json_t *)h, name, v)
    {
        if (strcmp(name, "__metadata__") == 0)
            rc = check_metadata(file, v, e);
        else if ((rc = check_entry(file, name, v, data_len, &spans[k], e)) == 0)
            k++;
        if (rc != 0)
            break;
    }
    if (rc == 0) {
        qsort(spans, k, sizeof *spans, span_cmp);
        for (size_t i = 1; i < k && rc == 0; i++)
            if (spans[i].begin < spans[i - 1].end && spans[i].begin != spans[i].end)
                rc = api__hf_fail(e, spans[i].name, "%s: tensors '%.80s' and '%.80s' overlap", file,
                                  spans[i - 1].name, spans[i].name);
    }
    free(spans);
    return rc;
}

/* The top-level name whose entry holds byte `at` of the header's text, into out ("" for none):
 * jansson places a syntax error by position only, and a message should name the tensor. */
static void name_at(const char *text, size_t len, size_t at, char *out, size_t cap)
{
    int depth = 0;
    size_t start = 0;
    bool in_string = false;
    out[0] = '\0';
    for (size_t i = 0; i < len && i < at; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"') {
                in_string = false;
                if (depth == 1) /* a string directly in the top-level object: a name */
                    snprintf(out, cap, "%.*s", (int)(i - start), text + start);
            }
        } else if (c == '"') {
            in_string = true;
            start = i + 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
}

int api__st_parse(api__st *st, const unsigned char *bytes, size_t size, const char *file,
                  hf_error *e)
{
    uint64_t n = 0;
    memset(st, 0, sizeof *st);
    if (size < 8)
        return api__hf_fail(e, "header", "%s: shorter than the 8-byte header length", file);
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n > API_ST_MAX_HEADER_BYTES || n > size - 8)
        return api__hf_fail(
            e, "header", "%s: header length beyond the file or the 100,000,000-byte limit", file);
    json_error_t je;
    const char *text = (const char *)bytes + 8;
    json_t *h = json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        char name[128] = "";
        if (!h && je.position > 0)
            name_at(text, (size_t)n, (size_t)je.position, name, sizeof name);
        json_decref(h);
        if (name[0] && strcmp(name, "__metadata__") != 0)
            return api__hf_fail(e, name,
                                "%s: tensor '%.100s': the header is not a JSON object: %.120s",
                                file, name, h ? "not an object" : je.text);
        return api__hf_fail(e, "header", "%s: the header is not a JSON object: %.120s", file,
                            h ? "another value" : je.text);
    }
    if (check_header(file, h, size - 8 - n, e) != 0) {
        json_decref(h);
        return -1;
    }
    st->bytes = bytes;
    st->size = size;
    st->header = h;
    st->data_start = 8 + (size_t)n;
    st->file = file;
    return 0;
}

void api__st_release(api__st *st)
{
    if (!st)
        return;
    json_decref(st->header);
    st->header = NULL;
}

int api__st_tensor(const api__st *st, const char *name, eng_weight *out, size_t *bytes, hf_error *e)
{
    const json_t *t = strcmp(name, "__metadata__") == 0 ? NULL : json_object_get(st->header, name);
    if (!t)
        return 0;
    eng_dtype dt = ENG_DTYPE_F32;
    const json_t *shape = json_object_get(t, "shape");
    const char *dtype = json_string_value(json_object_get(t, "dtype"));
    if (dtype_size(dtype, &dt) <= 0)
        return api__hf_fail(e, name, "%s: tensor '%.100s' is %s; attnd reads F32, F16 and BF16",
                            st->file, name, dtype);
    if (json_array_size(shape) < 1 || json_array_size(shape) > 4)
        return api__hf_fail(e, name, "%s: tensor '%.100s' has rank %zu", st->file, name,
                            json_array_size(shape));
    const json_t *offsets = json_object_get(t, "data_offsets");
    uint64_t begin = (uint64_t)json_integer_value(json_array_get(offsets, 0));
    uint64_t end = (uint64_t)json_integer_value(json_array_get(offsets, 1));
    if (bytes)
        *bytes = (size_t)(end - begin);
    if (!out)
        return 1;
    memset(out, 0, sizeof *out);
    /* The header's own copy of the name: valid as long as st. */
    void *iter = json_object_iter_at((json_t *)st->header, name);
    out->label = iter ? json_object_iter_key(iter) : name;
    out->dtype = dt;
    out->data = st->bytes + st->data_start + begin;
    out->rank = (int)json_array_size(shape);
    for (int d = 0; d < out->rank; d++)
        out->shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
    return 1;
}

/* ---- Files -------------------------------------------------------------------------------- */

int api__st_map(const char *path, unsigned char **map, size_t *size, hf_error *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    *map = NULL;
    *size = 0;
    if (fd < 0)
        return api__hf_fail(e, "", "%.200s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return api__hf_fail(e, "", "%.200s: not a readable, non-empty regular file", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (m == MAP_FAILED)
        return api__hf_fail(e, "", "%.200s: cannot map: %s", path, strerror(saved));
    *map = m;
    *size = (size_t)st.st_size;
    return 0;
}

void api__st_unmap(unsigned char *map, size_t size)
{
    if (map)
        munmap(map, size);
}

/* ---- The layer of a --model FILE ---------------------------------------------------------- */

static void to_eng_error(const hf_error *e, eng_status status, eng_error *err)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    err->status = status;
    snprintf(err->field, sizeof err->field, "%.47s", e->field);
    snprintf(err->message, sizeof err->message, "%.239s", e->message);
}

/* A head count of __metadata__ (key absent: *out stays 0). */
static int metadata_count(const api__st *st, const char *key, int64_t *out, eng_error *err)
{
    const json_t *v = json_object_get(json_object_get(st->header, "__metadata__"), key);
    if (!v)
        return 0;
    const char *s = json_string_value(v);
    char *end;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno || end == s || *end || n <= 0 || n > 65536) {
        hf_error e;
        memset(&e, 0, sizeof e);
        api__hf_fail(&e, key, "%.80s: __metadata__ head counts must be integers in [1, 65536]",
                     st->file);
        to_eng_error(&e, ENG_EFORMAT, err);
        if (err)
            err->cause = ENG_CAUSE_HEAD_COUNT;
        return -1;
    }
    *out = n;
    return 0;
}

/* The file's tensors, each by its name, into `named` (at most MAX_TENSORS). */
static int file_tensors(const api__st *st, eng_weight *named, size_t *n, hf_error *e)
{
    const char *name;
    const json_t *v;
    *n = 0;
    json_object_foreach(st->header, name, v)
    {
        if (strcmp(name, "__metadata__") == 0)
            continue;
        if (*n == MAX_TENSORS)
            return api__hf_fail(e, name, "%s: more than %d tensors", st->file, MAX_TENSORS);
        if (api__st_tensor(st, name, &named[*n], NULL, e) != 1)
            return -1;
        (*n)++;
    }
    return 0;
}

eng_layer *api__st_layer(const char *name, const char *file, const unsigned char *bytes,
                         size_t size, int64_t num_heads, int64_t num_kv_heads, eng_error *err)
{
    api__st st;
    hf_error e;
    eng_weight *named = calloc(MAX_TENSORS, sizeof *named);
    eng_layer_weights roles;
    eng_layer *layer = NULL;
    int64_t meta_heads = 0, meta_kv = 0;
    size_t n = 0;
    memset(&e, 0, sizeof e);
    memset(&st, 0, sizeof st);
    if (!named) {
        api__hf_fail(&e, "", "%s: out of memory", file);
        to_eng_error(&e, ENG_ENOMEM, err);
        return NULL;
    }
    if (api__st_parse(&st, bytes, size, file, &e) != 0 || file_tensors(&st, named, &n, &e) != 0) {
        to_eng_error(&e, ENG_EFORMAT, err);
        goto done;
    }
    if (metadata_count(&st, "num_heads", &meta_heads, err) != 0 ||
        metadata_count(&st, "num_kv_heads", &meta_kv, err) != 0)
        goto done;
    eng_error inner;
    memset(&inner, 0, sizeof inner);
    if (api__weights_by_name(named, n, &roles, &inner) == ENG_OK) {
        if (num_heads <= 0 && meta_heads == 0) {
            inner.status = ENG_EINVAL;
            snprintf(inner.field, sizeof inner.field, "num_heads");
        } else {
            layer = eng_layer_new(name, &roles, num_heads > 0 ? num_heads : meta_heads,
                                  num_kv_heads > 0 ? num_kv_heads : meta_kv, true, &inner);
        }
    }
    if (!layer && err) {
        *err = inner;
        if (inner.status == ENG_EINVAL && num_heads <= 0 && meta_heads == 0)
            snprintf(err->message, sizeof err->message,
                     "%.160s: no num_heads in __metadata__ and none given", file);
        else
            snprintf(err->message, sizeof err->message, "%.80s: %.150s", file, inner.message);
        err->status = inner.status == ENG_ENOMEM ? ENG_ENOMEM : ENG_EFORMAT;
    }
done:
    api__st_release(&st);
    free(named);
    return layer;
}

eng_layer *api__st_layer_load(const char *name, const char *path, int64_t num_heads,
                              int64_t num_kv_heads, eng_error *err)
{
    unsigned char *map;
    size_t size;
    hf_error e;
    memset(&e, 0, sizeof e);
    if (api__st_map(path, &map, &size, &e) != 0) {
        to_eng_error(&e, ENG_EIO, err);
        return NULL;
    }
    eng_layer *layer = api__st_layer(name, path, map, size, num_heads, num_kv_heads, err);
    api__st_unmap(map, size);
    return layer;
}
