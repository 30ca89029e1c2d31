/*
 * safetensors.c - reading an attention layer from a safetensors file.
 *
 * The format: an unsigned 64-bit little-endian header length N, N bytes of JSON, then the data.
 * The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the data) plus an optional "__metadata__" object of strings. The engine may not
 * use a JSON library (only api/ does), and this header is a small fixed shape, so a strict
 * reader for exactly that shape lives here; it is fuzzed (tests/fuzz). Everything in the
 * header is checked before any tensor is touched.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/internal.h"

#define MAX_HEADER_BYTES 100000000u /* the format's own limit */
#define MAX_TENSORS      64         /* a layer has at most 12 */
#define MAX_NAME         256
#define MAX_RANK         8

typedef struct {
    char name[MAX_NAME];
    char dtype[16];
    int rank;
    uint64_t shape[MAX_RANK];
    uint64_t begin, end;
} entry;

typedef struct {
    entry entries[MAX_TENSORS];
    size_t count;
    int64_t num_heads, num_kv_heads; /* from __metadata__; 0 when absent */
} header;

typedef struct {
    const char *start, *p, *end;
    const char *file;
    eng_error *err;
    bool failed;
} reader;

static bool fail(reader *r, const char *field, const char *what)
{
    bool tensor = strcmp(field, "header") != 0 && strcmp(field, "__metadata__") != 0;
    if (!r->failed && tensor)
        eng__fail(r->err, ENG_EFORMAT, field, "%.80s: tensor '%.60s': %s", r->file, field, what);
    else if (!r->failed)
        eng__fail(r->err, ENG_EFORMAT, field, "%.80s: %s", r->file, what);
    r->failed = true;
    return false;
}

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static bool expect(reader *r, char c, const char *field)
{
    skip_ws(r);
    if (r->p >= r->end || *r->p != c) {
        char what[64];
        snprintf(what, sizeof what, "malformed header: expected '%c' at byte %ld", c,
                 (long)(r->p - r->start));
        return fail(r, field, what);
    }
    r->p++;
    return true;
}

/* True and consumes `c` when it is next (after white space). */
static bool accept(reader *r, char c)
{
    skip_ws(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return true;
    }
    return false;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Appends code point cp as UTF-8; false when out of room. */
static bool put_utf8(char *out, size_t cap, size_t *n, uint32_t cp)
{
    unsigned char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    if (*n + k >= cap)
        return false;
    memcpy(out + *n, b, k);
    *n += k;
    return true;
}

static bool read_hex4(reader *r, uint32_t *v)
{
    if (r->end - r->p < 4)
        return false;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(r->p[i]);
        if (d < 0)
            return false;
        *v = *v << 4 | (uint32_t)d;
    }
    r->p += 4;
    return true;
}

/* Length of the valid UTF-8 sequence at p (1 to 4), or 0 when it is not valid. */
static size_t utf8_length(const unsigned char *p, const unsigned char *end)
{
    size_t n = p[0] < 0x80             ? 1
               : (p[0] & 0xE0) == 0xC0 ? 2
               : (p[0] & 0xF0) == 0xE0 ? 3
               : (p[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
    if (n == 0 || (size_t)(end - p) < n)
        return 0;
    uint32_t cp = n == 1 ? p[0] : n == 2 ? p[0] & 0x1Fu : n == 3 ? p[0] & 0x0Fu : p[0] & 0x07u;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0; /* overlong, out of range, or a surrogate */
    return n;
}

/* A JSON string into out (NUL-terminated, at most cap - 1 bytes). */
static bool read_string(reader *r, char *out, size_t cap, const char *field)
{
    if (!expect(r, '"', field))
        return false;
    size_t n = 0;
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20)
            return fail(r, field, "malformed header: control character in a string");
        if (c != '\\') {
            size_t k = utf8_length((const unsigned char *)r->p, (const unsigned char *)r->end);
            if (k == 0)
                return fail(r, field, "malformed header: invalid UTF-8");
            if (n + k >= cap)
                return fail(r, field, "a name or value in the header is too long");
            memcpy(out + n, r->p, k);
            n += k;
            r->p += k;
            continue;
        }
        if (++r->p >= r->end)
            break;
        char e = *r->p++;
        static const char simple[] = "\"\\/bfnrt", meaning[] = "\"\\/\b\f\n\r\t";
        const char *at = strchr(simple, e);
        uint32_t cp;
        if (e != '\0' && at) {
            cp = (unsigned char)meaning[at - simple];
        } else if (e == 'u' && read_hex4(r, &cp)) {
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                uint32_t lo;
                if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u')
                    return fail(r, field, "malformed header: unpaired surrogate");
                r->p += 2;
                if (!read_hex4(r, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return fail(r, field, "malformed header: unpaired surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return fail(r, field, "malformed header: unpaired surrogate");
            }
            if (cp == 0)
                return fail(r, field, "malformed header: NUL in a string");
        } else {
            return fail(r, field, "malformed header: bad escape");
        }
        if (!put_utf8(out, cap, &n, cp))
            return fail(r, field, "a name or value in the header is too long");
    }
    if (r->p >= r->end)
        return fail(r, field, "malformed header: unterminated string");
    r->p++;
    out[n] = '\0';
    return true;
}

/* A non-negative JSON integer (no sign, fraction or exponent), below 2^63. */
static bool read_uint(reader *r, uint64_t *v, const char *field)
{
    skip_ws(r);
    const char *start = r->p;
    uint64_t x = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        unsigned d = (unsigned)(*r->p - '0');
        if (x > (UINT64_C(1) << 63) / 10)
            return fail(r, field, "a number in the header is too large");
        x = x * 10 + d;
        r->p++;
    }
    if (r->p == start || (r->p - start > 1 && *start == '0') || x >= (UINT64_C(1) << 63))
        return fail(r, field, "malformed header: expected a non-negative integer");
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E' || *r->p == '-'))
        return fail(r, field, "malformed header: expected an integer");
    *v = x;
    return true;
}

/* [n, n, ...] into v; returns the count through *count. */
static bool read_uint_array(reader *r, uint64_t *v, int max, int *count, const char *field)
{
    *count = 0;
    if (!expect(r, '[', field))
        return false;
    if (accept(r, ']'))
        return true;
    do {
        if (*count == max)
            return fail(r, field, "an array in the header is too long");
        if (!read_uint(r, &v[*count], field))
            return false;
        (*count)++;
    } while (accept(r, ','));
    return expect(r, ']', field);
}

static bool read_entry(reader *r, entry *e)
{
    bool have_dtype = false, have_shape = false, have_offsets = false;
    if (!expect(r, '{', e->name))
        return false;
    do {
        char key[32];
        if (!read_string(r, key, sizeof key, e->name) || !expect(r, ':', e->name))
            return false;
        bool *seen;
        if (strcmp(key, "dtype") == 0) {
            seen = &have_dtype;
            if (!read_string(r, e->dtype, sizeof e->dtype, e->name))
                return false;
        } else if (strcmp(key, "shape") == 0) {
            seen = &have_shape;
            if (!read_uint_array(r, e->shape, MAX_RANK, &e->rank, e->name))
                return false;
        } else if (strcmp(key, "data_offsets") == 0) {
            uint64_t off[2];
            int n;
            seen = &have_offsets;
            if (!read_uint_array(r, off, 2, &n, e->name))
                return false;
            if (n != 2)
                return fail(r, e->name, "data_offsets must be [begin, end]");
            e->begin = off[0];
            e->end = off[1];
        } else {
            return fail(r, e->name, "unknown key in a tensor entry");
        }
        if (*seen)
            return fail(r, e->name, "a key repeats in a tensor entry");
        *seen = true;
    } while (accept(r, ','));
    if (!expect(r, '}', e->name))
        return false;
    if (!have_dtype || !have_shape || !have_offsets)
        return fail(r, e->name, "a tensor entry needs dtype, shape and data_offsets");
    return true;
}

static bool parse_count(reader *r, const char *value, int64_t *out, const char *key)
{
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end || v <= 0 || v > 65536) {
        bool first = !r->failed;
        fail(r, key, "__metadata__ head counts must be integers in [1, 65536]");
        if (first && r->err)
            r->err->cause = ENG_CAUSE_HEAD_COUNT;
        return false;
    }
    *out = v;
    return true;
}

static bool read_metadata(reader *r, header *h)
{
    if (!expect(r, '{', "__metadata__"))
        return false;
    if (accept(r, '}'))
        return true;
    do {
        char key[MAX_NAME], value[MAX_NAME];
        if (!read_string(r, key, sizeof key, "__metadata__") || !expect(r, ':', "__metadata__") ||
            !read_string(r, value, sizeof value, key))
            return false;
        if (strcmp(key, "num_heads") == 0 && !parse_count(r, value, &h->num_heads, key))
            return false;
        if (strcmp(key, "num_kv_heads") == 0 && !parse_count(r, value, &h->num_kv_heads, key))
            return false;
    } while (accept(r, ','));
    return expect(r, '}', "__metadata__");
}

static bool parse_header(reader *r, header *h)
{
    bool have_metadata = false;
    if (!expect(r, '{', "header"))
        return false;
    if (!accept(r, '}')) {
        do {
            char name[MAX_NAME];
            if (!read_string(r, name, sizeof name, "header") || !expect(r, ':', name))
                return false;
            if (strcmp(name, "__metadata__") == 0) {
                if (have_metadata)
                    return fail(r, name, "__metadata__ repeats");
                have_metadata = true;
                if (!read_metadata(r, h))
                    return false;
                continue;
            }
            for (size_t i = 0; i < h->count; i++)
                if (strcmp(h->entries[i].name, name) == 0)
                    return fail(r, name, "a tensor name repeats");
            if (h->count == MAX_TENSORS)
                return fail(r, name, "more than 64 tensors");
            entry *e = &h->entries[h->count++];
            memcpy(e->name, name, sizeof e->name);
            if (!read_entry(r, e))
                return false;
        } while (accept(r, ','));
        if (!expect(r, '}', "header"))
            return false;
    }
    skip_ws(r);
    if (r->p != r->end)
        return fail(r, "header", "malformed header: bytes after the JSON object");
    return true;
}

/* Checks dtypes, sizes and offsets against the data section of `data_len` bytes. */
static bool check_entries(reader *r, header *h, uint64_t data_len, eng_tensor_ref *refs,
                          const unsigned char *data)
{
    for (size_t i = 0; i < h->count; i++) {
        entry *e = &h->entries[i];
        uint64_t size;
        eng_dtype dtype;
        if (strcmp(e->dtype, "F32") == 0) {
            dtype = ENG_DTYPE_F32;
            size = 4;
        } else if (strcmp(e->dtype, "F16") == 0) {
            dtype = ENG_DTYPE_F16;
            size = 2;
        } else if (strcmp(e->dtype, "BF16") == 0) {
            dtype = ENG_DTYPE_BF16;
            size = 2;
        } else {
            return fail(r, e->name, "unsupported dtype (F32, F16 and BF16 are supported)");
        }
        if (e->rank < 1 || e->rank > 4)
            return fail(r, e->name, "tensor rank must be 1 to 4");
        for (int d = 0; d < e->rank; d++)
            if (__builtin_mul_overflow(size, e->shape[d], &size))
                return fail(r, e->name, "tensor size overflows");
        if (e->begin > e->end || e->end > data_len)
            return fail(r, e->name, "data_offsets out of the file's data");
        if (e->end - e->begin != size)
            return fail(r, e->name, "data_offsets do not match dtype and shape");
        for (size_t k = 0; k < i; k++) {
            const entry *o = &h->entries[k];
            if (e->begin < o->end && o->begin < e->end && e->begin != e->end)
                return fail(r, e->name, "data_offsets overlap another tensor");
        }
        refs[i] = (eng_tensor_ref){
            .name = e->name, .dtype = dtype, .data = data + e->begin, .rank = e->rank};
        for (int d = 0; d < e->rank; d++)
            refs[i].shape[d] = (int64_t)e->shape[d];
    }
    return true;
}

eng_layer *eng__layer_from_safetensors(const char *name, const char *file,
                                       const unsigned char *bytes, size_t size, int64_t num_heads,
                                       int64_t num_kv_heads, eng_error *err)
{
    header *h = calloc(1, sizeof *h);
    eng_tensor_ref *refs = calloc(MAX_TENSORS, sizeof *refs);
    reader r = {.file = file, .err = err};
    eng_layer *layer = NULL;
    if (!h || !refs) {
        eng__fail(err, ENG_ENOMEM, "", "%s: out of memory", file);
        goto done;
    }
    uint64_t n = 0;
    if (size < 8) {
        fail(&r, "header", "shorter than the 8-byte header length");
        goto done;
    }
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n > MAX_HEADER_BYTES || n > size - 8) {
        fail(&r, "header", "header length beyond the file or the 100,000,000-byte limit");
        goto done;
    }
    r.start = r.p = (const char *)bytes + 8;
    r.end = r.p + n;
    if (!parse_header(&r, h) || !check_entries(&r, h, size - 8 - n, refs, bytes + 8 + n))
        goto done;
    layer = eng__layer_assemble(name, refs, h->count, num_heads > 0 ? num_heads : h->num_heads,
                                num_kv_heads > 0 ? num_kv_heads : h->num_kv_heads, 0, true, err);
    if (!layer && err) {
        char inner[sizeof err->message];
        memcpy(inner, err->message, sizeof inner);
        if (err->status == ENG_EINVAL && num_heads <= 0 && h->num_heads == 0)
            snprintf(err->message, sizeof err->message,
                     "%.160s: no num_heads in __metadata__ and none given", file);
        else
            snprintf(err->message, sizeof err->message, "%.80s: %.150s", file, inner);
        err->status = err->status == ENG_ENOMEM ? ENG_ENOMEM : ENG_EFORMAT;
    }
done:
    free(h);
    free(refs);
    return layer;
}

eng_layer *eng_layer_load(const char *name, const char *path, int64_t num_heads,
                          int64_t num_kv_heads, eng_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        eng__fail(err, ENG_EIO, "", "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        eng__fail(err, ENG_EIO, "", "%s: not a readable, non-empty regular file", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        eng__fail(err, ENG_EIO, "", "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    eng_layer *layer =
        eng__layer_from_safetensors(name, path, map, size, num_heads, num_kv_heads, err);
    munmap(map, size);
    return layer;
}
