/*
 * hf_files.c - a checkpoint's safetensors files: model.safetensors, or the shards that
 * model.safetensors.index.json maps tensor names to.
 *
 * A shard is mapped (never read whole) when one of its tensors is first asked for; its header
 * is then checked in full by the safetensors reader (safetensors.c) before any tensor of it is
 * used. Only the pages of the tensors
 * the layer copies are touched, so serving one layer of a large checkpoint reads little more
 * than that layer. Every shard the index names must exist when the index is opened.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/models/hf.h"
#include "api/models/safetensors.h"

#define MAX_INDEX_BYTES ((size_t)256 << 20)
#define MAX_SHARDS      4096

typedef struct {
    char *name; /* the file name inside the directory */
    unsigned char *map;
    size_t size;
    api__st st; /* parsed and checked on first use (st.header set) */
} shard;

struct hf_files {
    char *dir;
    json_t *weight_map; /* tensor name -> file name, or NULL for the single file */
    shard shards[MAX_SHARDS];
    size_t n_shards;
    size_t bytes_read;
};

int api__hf_shard_check(const unsigned char *bytes, size_t size, const char *file, hf_error *e)
{
    api__st st;
    int rc = api__st_parse(&st, bytes, size, file, e);
    api__st_release(&st);
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
        api__st_unmap(f->shards[i].map, f->shards[i].size);
        api__st_release(&f->shards[i].st);
        free(f->shards[i].name);
    }
    json_decref(f->weight_map);
    free(f->dir);
    free(f);
}

static int map_shard(hf_files *f, shard *s, hf_error *e)
{
    if (s->st.header)
        return 0;
    char *path = path_join(f->dir, s->name);
    int rc = path ? 0 : api__hf_fail(e, s->name, "out of memory");
    if (rc == 0 && s->map == NULL)
        rc = api__st_map(path, &s->map, &s->size, e);
    if (rc == 0)
        rc = api__st_parse(&s->st, s->map, s->size, s->name, e);
    free(path);
    return rc;
}

int api__hf_files_tensor(hf_files *f, const char *name, eng_weight *out, hf_error *e)
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
    size_t bytes = 0;
    int rc = api__st_tensor(&s->st, name, out, &bytes, e);
    if (rc == 0 && f->weight_map)
        return api__hf_fail(e, name,
                            "the index puts tensor '%.100s' in %.100s, which does not have it",
                            name, s->name);
    if (rc == 1 && out)
        f->bytes_read += bytes;
    return rc;
}

size_t api__hf_files_bytes_read(const hf_files *f)
{
    return f->bytes_read;
}
