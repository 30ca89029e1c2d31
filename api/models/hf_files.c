/*
 * hf_files.c - a checkpoint's safetensors files: model.safetensors, or the shards that
 * model.safetensors.index.json maps tensor names to.
 *
 * A shard is mapped (never read whole) when one of its tensors is first asked for; its JSON
 * header is then checked in full (dtypes, shapes against byte counts, offsets inside the data,
 * no two tensors overlapping) before any tensor of it is used. Only the pages of the tensors
 * the layer copies are touched, so serving one layer of a large checkpoint reads little more
 * than that layer. Every shard the index names must exist when the index is opened.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/models/hf.h"

#define MAX_INDEX_BYTES  ((size_t)256 << 20)
#define MAX_HEADER_BYTES ((uint64_t)100000000) /* the safetensors format's own limit */
#define MAX_SHARDS       4096

typedef struct {
    char *name; /* the file name inside the directory */
    unsigned char *map;
    size_t size;
    json_t *header; /* parsed and checked on first use */
    size_t data_start;
} shard;

struct hf_files {
    char *dir;
    json_t *weight_map; /* tensor name -> file name, or NULL for the single file */
    shard shards[MAX_SHARDS];
    size_t n_shards;
    size_t bytes_read;
};

/* ---- Shard headers ------------------------------------------------------------------------ */

typedef struct {
    uint64_t begin, end;
    const char *name;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int dtype_size(const char *dtype, eng_dtype *out)
{
    static const struct {
        const char *name;
        eng_dtype dtype;
        int size;
    } known[] = {{"F32", ENG_DTYPE_F32, 4}, {"F16", ENG_DTYPE_F16, 2}, {"BF16", ENG_DTYPE_BF16, 2}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
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
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
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
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(off) ||
        json_array_size(off) != 2 || json_array_size(shape) > 8)
        return api__hf_fail(e, name, "%s: tensor '%.100s' needs dtype, shape and data_offsets",
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
            continue;
        if ((rc = check_entry(file, name, v, data_len, &spans[k], e)) != 0)
            break;
        k++;
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

/* Parses and checks the header of a shard's bytes; the header object in *out. */
static int parse_shard(const unsigned char *bytes, size_t size, const char *file, json_t **out,
                       size_t *data_start, hf_error *e)
{
    uint64_t n = 0;
    if (size < 8)
        return api__hf_fail(e, file, "%s: shorter than the 8-byte header length", file);
    for (int i = 7; i >= 0; i--)
        n = n << 8 | bytes[i];
    if (n > MAX_HEADER_BYTES || n > size - 8)
        return api__hf_fail(
            e, file, "%s: header length beyond the file or the 100,000,000-byte limit", file);
    json_error_t je;
    json_t *h = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!h || !json_is_object(h)) {
        json_decref(h);
        return api__hf_fail(e, file, "%s: the header is not a JSON object: %.120s", file, je.text);
    }
    if (check_header(file, h, size - 8 - n, e) != 0) {
        json_decref(h);
        return -1;
    }
    *out = h;
    *data_start = 8 + (size_t)n;
    return 0;
}

int api__hf_shard_check(const unsigned char *bytes, size_t size, const char *file, hf_error *e)
{
    json_t *h = NULL;
    size_t start;
    int rc = parse_shard(bytes, size, file, &h, &start, e);
    json_decref(h);
    return rc;
}

/* ---- Files -------------------------------------------------------------------------------- */

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A shard file name from the index: a plain name inside the directory. */
static bool shard_name_ok(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int add_shard(hf_files *f, const char *file, hf_error *e)
{
    for (size_t i = 0; i < f->n_shards; i++)
        if (strcmp(f->shards[i].name, file) == 0)
            return 0;
    if (!shard_name_ok(file))
        return api__hf_fail(e, "weight_map",
                            "model.safetensors.index.json names shard \"%.80s\", "
                            "which is not a file name inside the directory",
                            file);
    if (f->n_shards == MAX_SHARDS)
        return api__hf_fail(e, "weight_map", "the index names over %d shards", MAX_SHARDS);
    char *path = path_join(f->dir, file);
    struct stat st;
    bool ok = path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
    free(path);
    if (!ok)
        return api__hf_fail(e, file,
                            "shard %.100s, which model.safetensors.index.json names, is "
                            "missing from %.200s",
                            file, f->dir);
    f->shards[f->n_shards].name = strdup(file);
    if (!f->shards[f->n_shards].name)
        return api__hf_fail(e, file, "out of memory");
    f->n_shards++;
    return 0;
}

/* Reads a whole small file (the index) into a NUL-terminated buffer. */
static char *read_small(const char *path, size_t max, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    if (!fp)
        return NULL;
    if (fseek(fp, 0, SEEK_END) == 0) {
        long n = ftell(fp);
        if (n >= 0 && (size_t)n <= max && fseek(fp, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)n + 1)) != NULL) {
            *len = fread(buf, 1, (size_t)n, fp);
            buf[*len] = '\0';
        }
    }
    fclose(fp);
    return buf;
}

/* The index's text: its weight map kept, every shard it names checked to exist. */
static int parse_index(hf_files *f, const char *text, size_t len, const char *path, hf_error *e)
{
    json_error_t je;
    json_t *idx = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    const json_t *map = idx ? json_object_get(idx, "weight_map") : NULL;
    if (!idx || !json_is_object(map)) {
        json_decref(idx);
        return api__hf_fail(e, "model.safetensors.index.json",
                            "%.200s: not a JSON object with a weight_map object%s%.120s", path,
                            idx ? "" : ": ", idx ? "" : je.text);
    }
    f->weight_map = json_incref((json_t *)map);
    json_decref(idx);
    const char *name;
    const json_t *v;
    json_object_foreach(f->weight_map, name, v)
    {
        if (!json_is_string(v))
            return api__hf_fail(e, "weight_map", "%.200s: weight_map[\"%.80s\"] is not a file name",
                                path, name);
        if (add_shard(f, json_string_value(v), e) != 0)
            return -1;
    }
    return 0;
}

static int open_index(hf_files *f, const char *path, hf_error *e)
{
    size_t len = 0;
    char *text = read_small(path, MAX_INDEX_BYTES, &len);
    if (!text)
        return api__hf_fail(e, "model.safetensors.index.json",
                            "%.200s: cannot read it (or it is over 256 MiB)", path);
    int rc = parse_index(f, text, len, path, e);
    free(text);
    return rc;
}

static hf_files *files_new(const char *dir, hf_error *e)
{
    hf_files *f = calloc(1, sizeof *f);
    if (!f || !(f->dir = strdup(dir))) {
        free(f);
        api__hf_fail(e, "", "out of memory");
        return NULL;
    }
    return f;
}

int api__hf_index_check(const char *dir, const char *text, size_t len, hf_error *e)
{
    hf_files *f = files_new(dir, e);
    int rc = f ? parse_index(f, text, len, "model.safetensors.index.json", e) : -1;
    api__hf_files_close(f);
    return rc;
}

hf_files *api__hf_files_open(const char *dir, hf_error *e)
{
    hf_files *f = files_new(dir, e);
    if (!f)
        return NULL;
    char *index = path_join(dir, "model.safetensors.index.json");
    struct stat st;
    int rc;
    char *single = path_join(dir, "model.safetensors");
    if (index && stat(index, &st) == 0)
        rc = open_index(f, index, e);
    else if (single && stat(single, &st) == 0)
        rc = add_shard(f, "model.safetensors", e);
    else
        rc = api__hf_fail(e, "model.safetensors",
                          "%.200s has neither model.safetensors nor model.safetensors.index.json",
                          dir);
    free(index);
    free(single);
    if (rc != 0) {
        api__hf_files_close(f);
        return NULL;
    }
    return f;
}

void api__hf_files_close(hf_files *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_shards; i++) {
        if (f->shards[i].map)
            munmap(f->shards[i].map, f->shards[i].size);
        json_decref(f->shards[i].header);
        free(f->shards[i].name);
    }
    json_decref(f->weight_map);
    free(f->dir);
    free(f);
}

static int map_shard(hf_files *f, shard *s, hf_error *e)
{
    if (s->header)
        return 0;
    char *path = path_join(f->dir, s->name);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat st;
    int rc = 0;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        rc = api__hf_fail(e, s->name, "%.200s: not a readable, non-empty file",
                          path ? path : s->name);
    } else {
        s->size = (size_t)st.st_size;
        void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            rc = api__hf_fail(e, s->name, "%.200s: cannot map: %s", path, strerror(errno));
        else
            s->map = m;
    }
    if (fd >= 0)
        close(fd);
    if (rc == 0)
        rc = parse_shard(s->map, s->size, s->name, &s->header, &s->data_start, e);
    free(path);
    return rc;
}

int api__hf_files_tensor(hf_files *f, const char *name, eng_tensor_ref *out, hf_error *e)
{
    const char *file = "model.safetensors";
    if (f->weight_map) {
        const json_t *v = json_object_get(f->weight_map, name);
        if (!v)
            return 0;
        file = json_string_value(v);
    }
    shard *s = NULL;
    for (size_t i = 0; i < f->n_shards && !s; i++)
        if (strcmp(f->shards[i].name, file) == 0)
            s = &f->shards[i];
    if (!s || map_shard(f, s, e) != 0)
        return s ? -1 : api__hf_fail(e, name, "no shard for tensor '%.100s'", name);
    const json_t *t = json_object_get(s->header, name);
    if (!t)
        return f->weight_map ? api__hf_fail(e, name,
                                            "the index puts tensor '%.100s' in %.100s, which does "
                                            "not have it",
                                            name, s->name)
                             : 0;
    eng_dtype dt;
    const json_t *shape = json_object_get(t, "shape");
    if (dtype_size(json_string_value(json_object_get(t, "dtype")), &dt) <= 0)
        return api__hf_fail(e, name, "%s: tensor '%.100s' is %s; attnd reads F32, F16 and BF16",
                            s->name, name, json_string_value(json_object_get(t, "dtype")));
    if (json_array_size(shape) < 1 || json_array_size(shape) > 4)
        return api__hf_fail(e, name, "%s: tensor '%.100s' has rank %zu", s->name, name,
                            json_array_size(shape));
    const json_t *offsets = json_object_get(t, "data_offsets");
    uint64_t begin = (uint64_t)json_integer_value(json_array_get(offsets, 0));
    uint64_t end = (uint64_t)json_integer_value(json_array_get(offsets, 1));
    if (!out)
        return 1;
    memset(out, 0, sizeof *out);
    out->name = name;
    out->dtype = dt;
    out->data = s->map + s->data_start + begin;
    out->rank = (int)json_array_size(shape);
    for (int d = 0; d < out->rank; d++)
        out->shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
    f->bytes_read += (size_t)(end - begin);
    return 1;
}

size_t api__hf_files_bytes_read(const hf_files *f)
{
    return f->bytes_read;
}
