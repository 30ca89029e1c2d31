/*
 * test_safetensors.c - the specification of the safetensors reader and of a --model FILE's
 * layer (api__st_layer_load, api/models/safetensors.h; docs/layers.md): reading a layer from a
 * safetensors file, and refusing every malformed file cleanly.
 *
 * Fixtures are written at test time by tests/support/safetensors_writer.c into a fresh
 * temporary folder (removed at the end). Well-formed files must load to exactly the tensors
 * written: F32 is copied, and F16/BF16 values are chosen on a grid both formats hold, so the
 * loaded floats equal the originals bit for bit. Malformed files must give NULL, ENG_EFORMAT
 * (or ENG_EIO where the file itself cannot be read), a message naming the file, and, where one
 * tensor is at fault, that tensor's name in err.field or the message. Nothing may crash or
 * leak: the sanitizer run (ATTND_TEST_QUICK=1) checks that.
 */
#include "api/models/safetensors.h"
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static char created[512][320];
static int ncreated;

/* ---- Helpers ------------------------------------------------------------------------------ */

/* Multiples of 1/256 in (-1, 1): exact in F32, F16 and BF16 (at most 8 significant bits). */
static float *grid_array(int64_t n, uint64_t *rng)
{
    float *p = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((double)((int64_t)(rng_next(rng) % 511) - 255) / 256.0);
    return p;
}

/* A path in the temporary folder, remembered for removal. */
static const char *path_for(const char *name)
{
    if (ncreated == (int)(sizeof created / sizeof created[0])) {
        fprintf(stderr, "test_safetensors: too many fixtures\n");
        abort();
    }
    char *p = created[ncreated++];
    snprintf(p, sizeof created[0], "%s/%s", dir, name);
    return p;
}

static void remove_fixtures(void)
{
    for (int i = 0; i < ncreated; i++) {
        struct stat st;
        if (stat(created[i], &st) == 0 && S_ISDIR(st.st_mode))
            rmdir(created[i]);
        else
            unlink(created[i]);
    }
    rmdir(dir);
}

/* Whether the error names `tensor` (in err.field or the message). */
static bool names_tensor(const eng_error *err, const char *tensor)
{
    return strcmp(err->field, tensor) == 0 || strstr(err->message, tensor) != NULL;
}

/* ---- The reference layer of the malformed cases --------------------------------------------- */

/* E = 2, one head: in_proj_weight F32 [6, 2] at [0, 48), out_proj.weight F32 [2, 2] at
 * [48, 64). Each malformed case changes one thing in this header. */
#define GOOD_IN     "\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[6,2],\"data_offsets\":[0,48]}"
#define GOOD_OUT    "\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[48,64]}"
#define GOOD_META   "\"__metadata__\":{\"num_heads\":\"1\"}"
#define GOOD_HEADER "{" GOOD_IN "," GOOD_OUT "," GOOD_META "}"

static unsigned char good_data[128];

static void init_good_data(void)
{
    for (int i = 0; i < 32; i++) {
        float f = (float)(i % 7) / 8.0f - 0.25f;
        memcpy(good_data + 4 * i, &f, sizeof f);
    }
}

/* Writes `header` (declared length = its length unless `declared` is given) followed by
 * data_len bytes of good_data; returns the path. */
static const char *write_raw(const char *name, const char *header, size_t header_len,
                             uint64_t declared, size_t data_len)
{
    const char *path = path_for(name);
    stw_bytes b;
    if (!stw_build_raw(declared, header, header_len, good_data, data_len, &b) ||
        !stw_write_file(path, b.data, b.len)) {
        fprintf(stderr, "test_safetensors: cannot write %s\n", path);
        abort();
    }
    stw_bytes_free(&b);
    return path;
}

/* Loads `path` and expects a refusal: NULL, `status` (EFORMAT or EIO; 0 accepts either), the
 * path in the message and, when `tensor` is given, the tensor named. */
static void expect_refused(const char *path, eng_status status, const char *tensor,
                           const char *what)
{
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = api__st_layer_load("bad", path, 0, 0, &err);
    CHECKF(l == NULL, "%s: the file loaded", what);
    eng_layer_free(l);
    if (l)
        return;
    if (status == ENG_OK)
        CHECKF(err.status == ENG_EFORMAT || err.status == ENG_EIO,
               "%s: status %s, expected malformed file or I/O error (%s)", what,
               eng_status_str(err.status), err.message);
    else
        CHECKF(err.status == status, "%s: status %s, expected %s (%s)", what,
               eng_status_str(err.status), eng_status_str(status), err.message);
    CHECKF(strstr(err.message, path) != NULL, "%s: the message does not name the file: '%s'", what,
           err.message);
    if (tensor)
        CHECKF(names_tensor(&err, tensor), "%s: neither field '%s' nor message '%s' names '%s'",
               what, err.field, err.message, tensor);
}

/* A malformed header over the good data (64 bytes, or `data_len`). */
static void expect_bad_header(const char *name, const char *header, const char *tensor,
                              const char *what)
{
    const char *path = write_raw(name, header, strlen(header), strlen(header), 64);
    expect_refused(path, ENG_EFORMAT, tensor, what);
}

/* ---- Well-formed files --------------------------------------------------------------------- */

static bool same_floats(const float *a, const float *b, int64_t n)
{
    if (!a || !b)
        return a == b;
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Projection matrix `which` (0 q, 1 k, 2 v, 3 o) of l holds exactly `want`: as fp32, or as
 * the 16 bits a layer from an F16/BF16 file keeps, widened. */
static bool same_matrix(const eng_layer *l, int which, const float *want, int64_t n)
{
    const float *w32[4] = {l->w_q, l->w_k, l->w_v, l->w_o};
    const uint16_t *w16[4] = {l->w16_q, l->w16_k, l->w16_v, l->w16_o};
    if (w32[which])
        return same_floats(w32[which], want, n);
    if (!w16[which])
        return false;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = w16[which][i];
        float f = l->w16_dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(h) : eng_bf16_to_f32(h);
        if (memcmp(&f, &want[i], sizeof f) != 0)
            return false;
    }
    return true;
}

/* A torch state dict (packed in_proj, biases, add_bias_kv as [1, 1, E]) in each dtype; the
 * 16-bit files' matrices stay 16-bit (half their bytes), the vectors fp32. */
static void test_loads_f32_f16_and_bf16_files_exactly(void)
{
    enum { E = 16, H = 4 };
    uint64_t rng = 500;
    float *in_w = grid_array(3 * E * E, &rng), *in_b = grid_array(3 * E, &rng);
    float *out_w = grid_array(E * E, &rng), *out_b = grid_array(E, &rng);
    float *bk = grid_array(E, &rng), *bv = grid_array(E, &rng);
    const stw_dtype dtypes[] = {STW_F32, STW_F16, STW_BF16};
    const char *const names[] = {"F32", "F16", "BF16"};
    for (int d = 0; d < 3; d++) {
        stw_tensor t[] = {
            {"in_proj_weight", dtypes[d], 2, {3 * E, E}, in_w},
            {"in_proj_bias", dtypes[d], 1, {3 * E}, in_b},
            {"out_proj.weight", dtypes[d], 2, {E, E}, out_w},
            {"out_proj.bias", dtypes[d], 1, {E}, out_b},
            {"bias_k", dtypes[d], 3, {1, 1, E}, bk},
            {"bias_v", dtypes[d], 3, {1, 1, E}, bv},
        };
        stw_meta meta[] = {{"format", "pt"}, {"num_heads", "4"}};
        char file[64];
        snprintf(file, sizeof file, "torch_%s.safetensors", names[d]);
        const char *path = path_for(file);
        CHECK(stw_save(path, t, 6, meta, 2));
        eng_error err;
        memset(&err, 0, sizeof err);
        eng_layer *l = api__st_layer_load("model", path, 0, 0, &err);
        CHECKF(l != NULL, "%s file refused: %s (%s)", names[d], err.message, err.field);
        if (!l)
            continue;
        CHECKF(strcmp(l->name, "model") == 0, "name '%s'", l->name);
        CHECKF(strcmp(l->dtype, names[d]) == 0, "dtype '%s', expected %s", l->dtype, names[d]);
        CHECK_EQ_INT(l->embed_dim, E);
        CHECK_EQ_INT(l->num_heads, H);
        CHECK_EQ_INT(l->num_kv_heads, H);
        CHECK_EQ_INT(l->kdim, E);
        CHECK_EQ_INT(l->vdim, E);
        CHECKF(same_matrix(l, 0, in_w, E * E), "%s: w_q", names[d]);
        CHECKF(same_matrix(l, 1, in_w + E * E, E * E), "%s: w_k", names[d]);
        CHECKF(same_matrix(l, 2, in_w + 2 * E * E, E * E), "%s: w_v", names[d]);
        CHECKF(same_matrix(l, 3, out_w, E * E), "%s: w_o", names[d]);
        bool half = dtypes[d] != STW_F32;
        CHECKF(half == (l->params16 != NULL) && half == (l->w_q == NULL) &&
                   l->w16_dtype == (d == 0   ? ENG_DTYPE_F32
                                    : d == 1 ? ENG_DTYPE_F16
                                             : ENG_DTYPE_BF16),
               "%s: the matrices are %s", names[d], l->params16 ? "16-bit" : "fp32");
        CHECK_EQ_INT(eng_layer_bytes(l), (half ? 2 : 4) * 4 * E * E + 4 * (4 * E + 2 * E) +
                                             (int64_t)l->panels_floats * 4); /* + panels */
        CHECKF(same_floats(l->b_q, in_b, E), "%s: b_q", names[d]);
        CHECKF(same_floats(l->b_k, in_b + E, E), "%s: b_k", names[d]);
        CHECKF(same_floats(l->b_v, in_b + 2 * E, E), "%s: b_v", names[d]);
        CHECKF(same_floats(l->b_o, out_b, E), "%s: b_o", names[d]);
        CHECKF(same_floats(l->bias_k, bk, E), "%s: bias_k", names[d]);
        CHECKF(same_floats(l->bias_v, bv, E), "%s: bias_v", names[d]);
        CHECK_EQ_INT(eng_layer_params(l), 4 * E * E + 4 * E + 2 * E);
        eng_layer_free(l);
    }
    free(in_w), free(in_b), free(out_w), free(out_b), free(bk), free(bv);
}

/* Hugging Face names with grouped-query heads; num_kv_heads from __metadata__. */
static void test_loads_grouped_query_layer_with_kv_heads_from_metadata(void)
{
    enum { E = 32, H = 8, HKV = 2, W = HKV * E / H };
    uint64_t rng = 501;
    float *q = grid_array(E * E, &rng), *k = grid_array(W * E, &rng), *v = grid_array(W * E, &rng);
    float *o = grid_array(E * E, &rng);
    stw_tensor t[] = {{"q_proj.weight", STW_BF16, 2, {E, E}, q},
                      {"k_proj.weight", STW_BF16, 2, {W, E}, k},
                      {"v_proj.weight", STW_BF16, 2, {W, E}, v},
                      {"o_proj.weight", STW_BF16, 2, {E, E}, o}};
    stw_meta meta[] = {{"num_heads", "8"}, {"num_kv_heads", "2"}};
    const char *path = path_for("hf_gqa.safetensors");
    CHECK(stw_save(path, t, 4, meta, 2));
    eng_error err;
    eng_layer *l = api__st_layer_load("gqa", path, 0, 0, &err);
    CHECKF(l != NULL, "refused: %s", l ? "" : err.message);
    if (l) {
        CHECK_EQ_INT(l->num_heads, H);
        CHECK_EQ_INT(l->num_kv_heads, HKV);
        CHECK(same_matrix(l, 0, q, E * E) && same_matrix(l, 3, o, E * E));
        CHECK(same_matrix(l, 1, k, W * E) && same_matrix(l, 2, v, W * E));
        CHECK(l->w16_dtype == ENG_DTYPE_BF16 && !l->w_q);
        CHECK(!l->b_q && !l->b_o);
    }
    eng_layer_free(l);
    /* The arguments win over __metadata__ for num_kv_heads too. */
    stw_meta wrong[] = {{"num_heads", "8"}, {"num_kv_heads", "4"}};
    const char *p2 = path_for("hf_gqa_wrong_meta.safetensors");
    CHECK(stw_save(p2, t, 4, wrong, 2));
    l = api__st_layer_load("gqa", p2, 0, 2, &err);
    CHECKF(l && l->num_kv_heads == HKV, "num_kv_heads argument 2 over metadata 4: %s",
           l ? "metadata won" : err.message);
    eng_layer_free(l);
    l = api__st_layer_load("gqa", p2, 0, 0, &err);
    CHECKF(l == NULL && names_tensor(&err, "k_proj.weight"),
           "metadata num_kv_heads 4 with k_proj.weight [8, 32]: %s", l ? "accepted" : err.message);
    eng_layer_free(l);
    free(q), free(k), free(v), free(o);
}

/* The header length need not be a multiple of 8: data at any alignment loads the same. */
static void test_loads_unpadded_header_with_unaligned_data(void)
{
    const char *header = strlen(GOOD_HEADER) % 8 ? GOOD_HEADER : GOOD_HEADER " ";
    const char *path =
        write_raw("unaligned.safetensors", header, strlen(header), strlen(header), 64);
    eng_error err;
    eng_layer *l = api__st_layer_load("u", path, 0, 0, &err);
    CHECKF(l != NULL, "refused: %s", l ? "" : err.message);
    if (l) {
        CHECK(memcmp(l->w_q, good_data, 2 * 2 * sizeof(float)) == 0);
        CHECK(memcmp(l->w_o, good_data + 48, 2 * 2 * sizeof(float)) == 0);
    }
    eng_layer_free(l);
    CHECKF(strlen(header) % 8 != 0, "the header should be unaligned for this test");
}

static void test_num_heads_from_metadata_or_argument(void)
{
    enum { E = 16 };
    uint64_t rng = 502;
    float *in_w = grid_array(3 * E * E, &rng), *out_w = grid_array(E * E, &rng);
    stw_tensor t[] = {{"in_proj_weight", STW_F32, 2, {3 * E, E}, in_w},
                      {"out_proj.weight", STW_F32, 2, {E, E}, out_w}};
    stw_meta meta[] = {{"num_heads", "4"}};
    const char *with = path_for("heads_meta.safetensors");
    const char *without = path_for("heads_none.safetensors");
    CHECK(stw_save(with, t, 2, meta, 1));
    CHECK(stw_save(without, t, 2, NULL, 0));
    eng_error err;

    eng_layer *l = api__st_layer_load("m", with, 0, 0, &err);
    CHECKF(l && l->num_heads == 4, "num_heads from __metadata__: %s",
           l ? "wrong count" : err.message);
    eng_layer_free(l);
    l = api__st_layer_load("m", with, 2, 0, &err); /* the argument wins */
    CHECKF(l && l->num_heads == 2, "num_heads argument 2 over metadata 4: %s",
           l ? "metadata won" : err.message);
    eng_layer_free(l);
    l = api__st_layer_load("m", without, 8, 0, &err);
    CHECKF(l && l->num_heads == 8, "num_heads from the argument alone: %s",
           l ? "wrong count" : err.message);
    eng_layer_free(l);

    memset(&err, 0, sizeof err);
    l = api__st_layer_load("m", without, 0, 0, &err);
    CHECK(l == NULL);
    eng_layer_free(l);
    CHECKF(err.status == ENG_EFORMAT || err.status == ENG_EINVAL, "missing num_heads: %s",
           eng_status_str(err.status));
    CHECKF(strstr(err.message, "num_heads") || strcmp(err.field, "num_heads") == 0,
           "missing num_heads is not named: field '%s', message '%s'", err.field, err.message);
    CHECKF(strstr(err.message, without) != NULL, "the file is not named: '%s'", err.message);
    free(in_w), free(out_w);
}

static void test_rejects_bad_head_counts_in_metadata(void)
{
    const char *const values[] = {"abc", "0", "-1", "1.5", "", "99999999999999999999"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        char header[512], name[64], what[96];
        snprintf(header, sizeof header,
                 "{" GOOD_IN "," GOOD_OUT ",\"__metadata__\":{\"num_heads\":\"%s\"}}", values[i]);
        snprintf(name, sizeof name, "meta_heads_%zu.safetensors", i);
        snprintf(what, sizeof what, "__metadata__ num_heads \"%s\"", values[i]);
        const char *path = write_raw(name, header, strlen(header), strlen(header), 64);
        expect_refused(path, ENG_EFORMAT, "num_heads", what);
        eng_error err = {0};
        CHECK(api__st_layer_load("bad", path, 0, 0, &err) == NULL);
        CHECKF(err.cause == ENG_CAUSE_HEAD_COUNT, "%s: cause %d", what, (int)err.cause);
    }
    /* The format's metadata values are strings. */
    expect_bad_header("meta_number.safetensors",
                      "{" GOOD_IN "," GOOD_OUT ",\"__metadata__\":{\"num_heads\":1}}", NULL,
                      "__metadata__ value not a string");
    expect_bad_header("meta_twice.safetensors",
                      "{" GOOD_IN "," GOOD_META "," GOOD_OUT "," GOOD_META "}", NULL,
                      "__metadata__ twice");
    expect_bad_header("meta_array.safetensors", "{" GOOD_IN "," GOOD_OUT ",\"__metadata__\":[]}",
                      NULL, "__metadata__ an array");
}

/* The writer used for every fixture: conversions round-trip through the engine's readers. */
static void test_fixture_writer_conversions_round_trip(void)
{
    int wrong = 0;
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        uint16_t bits = (uint16_t)h;
        float f = eng_f16_to_f32(bits), g = eng_bf16_to_f32(bits);
        if (!isnan(f) && stw_f32_to_f16(f) != bits)
            wrong++;
        if (!isnan(g) && stw_f32_to_bf16(g) != bits)
            wrong++;
        if (isnan(f) && !isnan(eng_f16_to_f32(stw_f32_to_f16(f))))
            wrong++;
    }
    CHECKF(wrong == 0, "%d patterns do not round-trip through the writer", wrong);
    /* Round to nearest, ties to even; overflow to infinity. */
    CHECK_EQ_INT(stw_f32_to_f16(1.0f + 0x1.0p-11f), 0x3C00);
    CHECK_EQ_INT(stw_f32_to_f16(1.0f + 0x1.8p-10f), 0x3C02);
    CHECK_EQ_INT(stw_f32_to_f16(65520.0f), 0x7C00);
    CHECK_EQ_INT(stw_f32_to_f16(0x1.0p-25f), 0x0000);
    CHECK_EQ_INT(stw_f32_to_f16(0x1.8p-25f), 0x0001);
    CHECK_EQ_INT(stw_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);
    CHECK_EQ_INT(stw_f32_to_bf16(1.0f + 0x1.8p-7f), 0x3F82);
}

/* ---- Malformed files: the framing ---------------------------------------------------------- */

/* Every malformed case changes one thing in GOOD_HEADER, which itself loads. */
static void test_base_of_the_malformed_cases_loads(void)
{
    const char *path =
        write_raw("good.safetensors", GOOD_HEADER, strlen(GOOD_HEADER), strlen(GOOD_HEADER), 64);
    eng_error err;
    eng_layer *l = api__st_layer_load("good", path, 0, 0, &err);
    CHECKF(l != NULL, "the base fixture does not load: %s", l ? "" : err.message);
    if (l) {
        CHECK_EQ_INT(l->embed_dim, 2);
        CHECK_EQ_INT(l->num_heads, 1);
        CHECK(memcmp(l->w_q, good_data, 16) == 0 && memcmp(l->w_o, good_data + 48, 16) == 0);
    }
    eng_layer_free(l);
}

static void test_rejects_empty_and_short_files(void)
{
    const char *p = path_for("empty.safetensors");
    CHECK(stw_write_file(p, "", 0));
    expect_refused(p, ENG_OK, NULL, "an empty file");
    p = path_for("five.safetensors");
    CHECK(stw_write_file(p, "\x10\0\0\0\0", 5));
    expect_refused(p, ENG_EFORMAT, NULL, "a 5-byte file");
    p = path_for("seven.safetensors");
    CHECK(stw_write_file(p, "\x02\0\0\0\0\0\0", 7));
    expect_refused(p, ENG_EFORMAT, NULL, "a 7-byte file");
    /* Exactly the length word, declaring an empty header: not a JSON object. */
    expect_refused(write_raw("eight.safetensors", "", 0, 0, 0), ENG_OK, NULL,
                   "8 bytes, header length 0");
}

static void test_rejects_header_length_beyond_the_file(void)
{
    size_t n = strlen(GOOD_HEADER);
    expect_refused(write_raw("beyond1.safetensors", GOOD_HEADER, n, n + 64 + 1, 64), ENG_EFORMAT,
                   NULL, "header length one byte beyond the file");
    expect_refused(write_raw("beyond2.safetensors", GOOD_HEADER, n, n + 1, 0), ENG_EFORMAT, NULL,
                   "header length beyond a file with no data");
    expect_refused(write_raw("beyond3.safetensors", GOOD_HEADER, n, UINT64_MAX, 64), ENG_EFORMAT,
                   NULL, "header length 2^64 - 1");
    expect_refused(write_raw("beyond4.safetensors", GOOD_HEADER, n, UINT64_C(1) << 63, 64),
                   ENG_EFORMAT, NULL, "header length 2^63");
    expect_refused(write_raw("beyond5.safetensors", GOOD_HEADER, n, UINT64_MAX - 7, 64),
                   ENG_EFORMAT, NULL, "header length 2^64 - 8 (8 + N wraps)");
}

/* Writes a file of `header_len` declared header bytes: `header`, then spaces up to
 * header_len (or a sparse hole when `sparse`), then 64 data bytes. */
static const char *write_big_header(const char *name, const char *header, uint64_t header_len,
                                    bool sparse)
{
    const char *path = path_for(name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(header_len >> (8 * i));
    size_t hl = strlen(header);
    ok = ok && write(fd, len, 8) == 8 && write(fd, header, hl) == (ssize_t)hl;
    if (ok && sparse) {
        ok = lseek(fd, (off_t)(8 + header_len), SEEK_SET) == (off_t)(8 + header_len);
    } else if (ok) {
        enum { CHUNK = 1 << 20 };
        char *spaces = xcalloc(CHUNK, 1);
        memset(spaces, ' ', CHUNK);
        for (uint64_t left = header_len - hl; ok && left > 0;) {
            size_t k = left < CHUNK ? (size_t)left : CHUNK;
            ok = write(fd, spaces, k) == (ssize_t)k;
            left -= k;
        }
        free(spaces);
    }
    ok = ok && write(fd, good_data, 64) == 64;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    if (!ok) {
        fprintf(stderr, "test_safetensors: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    return path;
}

/* Far past any limit: a 300 MiB header (a sparse file), and a valid header padded with spaces
 * to 100 MiB + 8 bytes, past both 100,000,000 and 100 MiB. */
static void test_rejects_header_length_over_100_mib(void)
{
    const char *far = write_big_header("huge_sparse.safetensors", "{", UINT64_C(300) << 20, true);
    expect_refused(far, ENG_EFORMAT, NULL, "a 300 MiB header (sparse file)");
    const char *mib =
        write_big_header("huge_mib.safetensors", GOOD_HEADER, (UINT64_C(100) << 20) + 8, false);
    expect_refused(mib, ENG_EFORMAT, NULL, "a valid header padded to 100 MiB + 8 bytes");
    unlink(mib); /* 100 MB: do not keep it until the end */
}

/* The format caps the header at 100,000,000 bytes (huggingface/safetensors: MAX_HEADER_SIZE =
 * 100_000_000, "header too large"): a valid header padded just past that is refused. */
static void test_rejects_header_length_over_100_000_000_bytes(void)
{
    const char *edge =
        write_big_header("huge_edge.safetensors", GOOD_HEADER, UINT64_C(100000008), false);
    expect_refused(edge, ENG_EFORMAT, NULL, "a valid header padded to 100,000,008 bytes");
    unlink(edge);
}

/* ---- Malformed files: the JSON ------------------------------------------------------------- */

static void test_rejects_invalid_json(void)
{
    /* Truncated: the declared length cuts the header short. */
    size_t n = strlen(GOOD_HEADER);
    const size_t cuts[] = {1, 20, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char name[64], what[64];
        snprintf(name, sizeof name, "truncated_%zu.safetensors", i);
        snprintf(what, sizeof what, "header truncated to %zu bytes", cuts[i]);
        expect_refused(write_raw(name, GOOD_HEADER, cuts[i], cuts[i], 0), ENG_EFORMAT, NULL, what);
    }
    const struct {
        const char *name, *header, *what;
    } cases[] = {
        {"garbage1", GOOD_HEADER "x", "trailing garbage"},
        {"garbage2", GOOD_HEADER "}", "a trailing brace"},
        {"garbage3", GOOD_HEADER "{}", "two objects"},
        {"garbage4", GOOD_HEADER "\0", "a trailing NUL"},
        {"not_object", "[" GOOD_IN "]", "an array at the top"},
        {"no_colon", "{\"in_proj_weight\" {\"dtype\":\"F32\"}}", "a missing colon"},
        {"no_comma", "{" GOOD_IN " " GOOD_OUT "}", "a missing comma"},
        {"trailing_comma", "{" GOOD_IN "," GOOD_OUT ",}", "a trailing comma"},
        {"bare_name", "{in_proj_weight:{}}", "an unquoted name"},
        {"single_quotes", "{'in_proj_weight':{}}", "single quotes"},
        {"bad_escape", "{\"in_proj\\qweight\":{}}", "a bad escape \\q"},
        {"bad_escape_u", "{\"in_proj\\u00zzweight\":{}}", "a bad \\u escape"},
        {"utf8_invalid", "{\"in_proj\xC3\x28weight\":{}}", "invalid UTF-8 (C3 28)"},
        {"utf8_overlong", "{\"in_proj\xC0\xAFweight\":{}}", "overlong UTF-8 (C0 AF)"},
        {"utf8_continuation", "{\"\x80\":{}}", "a lone UTF-8 continuation byte"},
        {"utf8_surrogate", "{\"\xED\xA0\x80\":{}}", "a UTF-8 encoded surrogate"},
        {"utf8_truncated", "{\"abc\xE2\x82\":{}}", "a truncated UTF-8 sequence"},
        {"control_char", "{\"in_proj\x01weight\":{}}", "a raw control character"},
        {"raw_newline", "{\"in_proj\nweight\":{}}", "a raw newline in a string"},
        {"surrogate_high", "{\"\\uD800\":{}}", "an unpaired high surrogate"},
        {"surrogate_low", "{\"\\uDC00\":{}}", "an unpaired low surrogate"},
        {"surrogate_then_char", "{\"\\uD800\\u0041\":{}}", "a high surrogate then a letter"},
        {"unterminated", "{\"in_proj_weight", "an unterminated string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].name);
        size_t len = strlen(cases[i].header);
        if (strcmp(cases[i].name, "garbage4") == 0)
            len = strlen(GOOD_HEADER) + 1;
        expect_refused(write_raw(name, cases[i].header, len, len, 64), ENG_EFORMAT, NULL,
                       cases[i].what);
    }

    /* The same string faults in a __metadata__ value the loader otherwise ignores, so that
     * only the JSON checks can refuse them (a bad tensor name would also fail as unknown). */
    const struct {
        const char *value, *what;
    } strings[] = {
        {"ok\\q", "a bad escape \\q"},
        {"ok\\x41", "a bad escape \\x"},
        {"ok\\u12", "a short \\u escape"},
        {"\\u00zz", "a \\u escape with non-hex digits"},
        {"a\\", "a backslash before the closing quote"},
        {"\xC3\x28", "invalid UTF-8 (C3 28)"},
        {"\xC0\xAF", "overlong UTF-8 (C0 AF)"},
        {"\xE0\x80\xAF", "overlong 3-byte UTF-8"},
        {"\x80", "a lone continuation byte"},
        {"\xED\xA0\x80", "a UTF-8 encoded surrogate"},
        {"\xF4\x90\x80\x80", "a code point above U+10FFFF"},
        {"\xFF", "the byte FF"},
        {"ab\xE2\x82", "a truncated UTF-8 sequence"},
        {"a\x01z", "a raw control character 01"},
        {"a\x1Fz", "a raw control character 1F"},
        {"a\nz", "a raw newline"},
        {"a\tz", "a raw tab"},
        {"\\uD800", "an unpaired high surrogate"},
        {"\\uDBFF", "an unpaired high surrogate (DBFF)"},
        {"\\uDC00", "an unpaired low surrogate"},
        {"\\uD800\\u0041", "a high surrogate then a letter"},
        {"\\uD800x", "a high surrogate then a character"},
        {"\\uDC00\\uD800", "a reversed surrogate pair"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        char header[512], name[64], what[96];
        snprintf(header, sizeof header,
                 "{" GOOD_IN "," GOOD_OUT
                 ",\"__metadata__\":{\"num_heads\":\"1\",\"note\":\"%s\"}}",
                 strings[i].value);
        snprintf(name, sizeof name, "meta_string_%zu.safetensors", i);
        snprintf(what, sizeof what, "%s in a __metadata__ value", strings[i].what);
        expect_refused(write_raw(name, header, strlen(header), strlen(header), 64), ENG_EFORMAT,
                       NULL, what);
    }
}

/* Escapes that are valid JSON decode: a name spelt with \u escapes is the same name, and
 * metadata may hold any valid string (the counterparts of the refusals above). */
static void test_accepts_escaped_names(void)
{
    const char *meta =
        "{" GOOD_IN "," GOOD_OUT ",\"__metadata__\":{\"num_heads\":\"1\","
        "\"note\":\"\\\" \\/ \\b\\f\\n\\r\\t \\u00e9 \\uD83D\\uDE00 \xC3\xA9 \xE2\x82\xAC "
        "\xF0\x9F\x98\x80 \x7F\"}}";
    const char *mpath = write_raw("meta_ok.safetensors", meta, strlen(meta), strlen(meta), 64);
    eng_error merr;
    eng_layer *ml = api__st_layer_load("m", mpath, 0, 0, &merr);
    CHECKF(ml != NULL, "valid escapes and UTF-8 in __metadata__ refused: %s",
           ml ? "" : merr.message);
    eng_layer_free(ml);

    const char *header = "{\"in_proj\\u005fweight\":{\"dtype\":\"F32\",\"shape\":[6,2],"
                         "\"data_offsets\":[0,48]}," GOOD_OUT "," GOOD_META "}";
    const char *path = write_raw("escaped.safetensors", header, strlen(header), strlen(header), 64);
    eng_error err;
    eng_layer *l = api__st_layer_load("e", path, 0, 0, &err);
    CHECKF(l != NULL, "in_proj\\u005fweight refused: %s", l ? "" : err.message);
    eng_layer_free(l);
}

/* ---- Malformed files: the entries ---------------------------------------------------------- */

static void test_rejects_duplicate_names_and_keys(void)
{
    expect_bad_header("dup_tensor.safetensors", "{" GOOD_IN "," GOOD_IN "," GOOD_OUT "}",
                      "in_proj_weight", "a tensor name twice");
    expect_bad_header("dup_key.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[6,2],"
                      "\"data_offsets\":[0,48]}," GOOD_OUT "}",
                      "in_proj_weight", "dtype twice in an entry");
    expect_bad_header("dup_offsets.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[6,2],"
                      "\"data_offsets\":[0,48],\"data_offsets\":[0,48]}," GOOD_OUT "}",
                      "in_proj_weight", "data_offsets twice in an entry");
    expect_bad_header("unknown_key.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[6,2],"
                      "\"data_offsets\":[0,48],\"offsets\":[0,48]}," GOOD_OUT "}",
                      "in_proj_weight", "an unknown key in an entry");
    expect_bad_header("entry_not_object.safetensors", "{\"in_proj_weight\":[6,2]," GOOD_OUT "}",
                      "in_proj_weight", "an entry that is not an object");
    expect_bad_header("empty_entry.safetensors", "{\"in_proj_weight\":{}," GOOD_OUT "}",
                      "in_proj_weight", "an empty entry");
}

static void test_rejects_missing_entry_fields(void)
{
    expect_bad_header("no_dtype.safetensors",
                      "{\"in_proj_weight\":{\"shape\":[6,2],\"data_offsets\":[0,48]}," GOOD_OUT "}",
                      "in_proj_weight", "no dtype");
    expect_bad_header("no_shape.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"data_offsets\":[0,48]}," GOOD_OUT
                      "}",
                      "in_proj_weight", "no shape");
    expect_bad_header("no_offsets.safetensors",
                      "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2]}}",
                      "out_proj.weight", "no data_offsets");
    expect_bad_header("offsets_one.safetensors",
                      "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                      "\"data_offsets\":[48]}}",
                      "out_proj.weight", "data_offsets with one number");
    expect_bad_header("offsets_three.safetensors",
                      "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                      "\"data_offsets\":[48,64,64]}}",
                      "out_proj.weight", "data_offsets with three numbers");
    expect_bad_header(
        "dtype_number.safetensors",
        "{\"in_proj_weight\":{\"dtype\":32,\"shape\":[6,2],\"data_offsets\":[0,48]}," GOOD_OUT "}",
        "in_proj_weight", "dtype a number");
}

static void test_rejects_unsupported_dtypes(void)
{
    const struct {
        const char *dtype;
        int size;
    } cases[] = {{"F64", 8},     {"I32", 4}, {"I64", 8},     {"U8", 1}, {"BOOL", 1},
                 {"F8_E4M3", 1}, {"f32", 4}, {"float32", 4}, {"", 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char header[512], name[64], what[64];
        int end = 12 * cases[i].size;
        snprintf(header, sizeof header,
                 "{\"in_proj_weight\":{\"dtype\":\"%s\",\"shape\":[6,2],\"data_offsets\":[0,%d]},"
                 "\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[%d,%d]}"
                 "," GOOD_META "}",
                 cases[i].dtype, end, end, end + 16);
        snprintf(name, sizeof name, "dtype_%zu.safetensors", i);
        snprintf(what, sizeof what, "dtype \"%s\"", cases[i].dtype);
        const char *path =
            write_raw(name, header, strlen(header), strlen(header), (size_t)end + 16);
        expect_refused(path, ENG_EFORMAT, "in_proj_weight", what);
    }
}

static void test_rejects_negative_fractional_and_huge_numbers(void)
{
    const struct {
        const char *shape, *offsets, *what;
    } cases[] = {
        {"[-6,2]", "[0,48]", "a negative dimension"},
        {"[6,-2]", "[0,48]", "a negative second dimension"},
        {"[6.5,2]", "[0,48]", "a fractional dimension"},
        {"[6.0,2]", "[0,48]", "a dimension written 6.0"},
        {"[6e0,2]", "[0,48]", "a dimension with an exponent"},
        {"[+6,2]", "[0,48]", "a dimension with a plus sign"},
        {"[06,2]", "[0,48]", "a dimension with a leading zero"},
        {"[\"6\",2]", "[0,48]", "a dimension as a string"},
        {"[6,2]", "[-1,48]", "a negative offset"},
        {"[6,2]", "[0,48.0]", "a fractional offset"},
        {"[6,2]", "[0,4.8e1]", "an offset with an exponent"},
        {"[6,2]", "[0,99999999999999999999]", "an offset beyond 2^64"},
        {"[6,2]", "[0,18446744073709551616]", "an offset of 2^64"},
        {"[4294967296,4294967296,4]", "[0,48]", "a shape whose byte size overflows 2^64"},
        {"[99999999999999999999,2]", "[0,48]", "a dimension beyond 2^64"},
        {"[null,2]", "[0,48]", "a null dimension"},
        {"[true,2]", "[0,48]", "a boolean dimension"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char header[512], name[64];
        snprintf(
            header, sizeof header,
            "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":%s}," GOOD_OUT
            "," GOOD_META "}",
            cases[i].shape, cases[i].offsets);
        snprintf(name, sizeof name, "number_%zu.safetensors", i);
        expect_bad_header(name, header, "in_proj_weight", cases[i].what);
    }
}

static void test_rejects_bad_ranks(void)
{
    expect_bad_header(
        "rank0.safetensors",
        "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}," GOOD_OUT
        "," GOOD_META "}",
        "in_proj_weight", "rank 0 (a scalar)");
    expect_bad_header("rank5.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,6,2],"
                      "\"data_offsets\":[0,48]}," GOOD_OUT "," GOOD_META "}",
                      "in_proj_weight", "rank 5");
    expect_bad_header("rank9.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,6,2],"
                      "\"data_offsets\":[0,48]}," GOOD_OUT "," GOOD_META "}",
                      "in_proj_weight", "rank 9");
    expect_bad_header("rank40.safetensors",
                      "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,"
                      "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,6,2],"
                      "\"data_offsets\":[0,48]}," GOOD_OUT "," GOOD_META "}",
                      "in_proj_weight", "rank 40");
}

static void test_rejects_offsets_that_do_not_fit(void)
{
    const struct {
        const char *name, *header, *tensor, *what;
    } cases[] = {
        {"size_mismatch",
         "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[6,3],\"data_offsets\":[0,48]}," GOOD_OUT
         "," GOOD_META "}",
         "in_proj_weight", "shape [6,3] in 48 bytes"},
        {"size_mismatch_half",
         "{\"in_proj_weight\":{\"dtype\":\"F16\",\"shape\":[6,2],\"data_offsets\":[0,48]}," GOOD_OUT
         "," GOOD_META "}",
         "in_proj_weight", "F16 [6,2] in 48 bytes"},
        {"out_of_range",
         "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
         "\"data_offsets\":[56,72]}," GOOD_META "}",
         "out_proj.weight", "offsets past the end of the data"},
        {"far_out_of_range",
         "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
         "\"data_offsets\":[9223372036854775800,9223372036854775807]}," GOOD_META "}",
         "out_proj.weight", "offsets near 2^63"},
        {"begin_after_end",
         "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
         "\"data_offsets\":[64,48]}," GOOD_META "}",
         "out_proj.weight", "begin > end"},
        {"overlap",
         "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
         "\"data_offsets\":[40,56]}," GOOD_META "}",
         "out_proj.weight", "overlapping tensors"},
        {"overlap_same",
         "{\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
         "\"bias_k\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}," GOOD_META "}",
         "bias_k", "two tensors on the same bytes"},
        {"overlap_inside",
         "{" GOOD_IN ",\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
         "\"data_offsets\":[8,24]}," GOOD_META "}",
         "out_proj.weight", "a tensor inside another"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].name);
        expect_bad_header(name, cases[i].header, cases[i].tensor, cases[i].what);
    }
}

/* More tensors than any layer has: refused while parsing, with no overflow of fixed tables. */
static void test_rejects_more_than_64_tensors(void)
{
    const int counts[] = {65, 1000};
    for (size_t c = 0; c < 2; c++) {
        size_t cap = (size_t)counts[c] * 96 + 64;
        char *header = xcalloc(cap, 1);
        size_t len = 0;
        header[len++] = '{';
        for (int i = 0; i < counts[c]; i++) {
            int k = snprintf(header + len, cap - len,
                             "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", i, 4 * i, 4 * i + 4);
            len += (size_t)k;
        }
        header[len++] = '}';
        char name[64], what[64];
        snprintf(name, sizeof name, "tensors_%d.safetensors", counts[c]);
        snprintf(what, sizeof what, "%d tensors", counts[c]);
        const char *path = path_for(name);
        unsigned char *data = xcalloc((size_t)counts[c] * 4, 1);
        stw_bytes b;
        CHECK(stw_build_raw(len, header, len, data, (size_t)counts[c] * 4, &b));
        CHECK(stw_write_file(path, b.data, b.len));
        stw_bytes_free(&b);
        expect_refused(path, ENG_EFORMAT, NULL, what);
        free(data);
        free(header);
    }
}

/* A well-formed file whose tensors do not make a layer: the tensor is named. */
static void test_rejects_tensors_that_make_no_layer(void)
{
    const char *unknown = "{" GOOD_IN "," GOOD_OUT ",\"rotary.inv_freq\":{\"dtype\":\"F32\","
                          "\"shape\":[4],\"data_offsets\":[64,80]}," GOOD_META "}";
    expect_refused(
        write_raw("unknown_tensor.safetensors", unknown, strlen(unknown), strlen(unknown), 80),
        ENG_EFORMAT, "rotary.inv_freq", "an unknown tensor");
    const char *wrong_shape = "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[4,3],"
                              "\"data_offsets\":[0,48]}," GOOD_OUT "," GOOD_META "}";
    expect_bad_header("wrong_shape.safetensors", wrong_shape, "in_proj_weight",
                      "in_proj_weight [4,3] for E = 2");
    expect_bad_header("no_out.safetensors", "{" GOOD_IN "," GOOD_META "}", NULL,
                      "no output projection");
    expect_bad_header("no_tensors.safetensors", "{}", NULL, "no tensors at all");
}

static void test_rejects_missing_file_and_directory(void)
{
    expect_refused(path_for("does_not_exist.safetensors"), ENG_EIO, NULL, "a missing file");
    const char *d = path_for("a_directory.safetensors");
    CHECK(mkdir(d, 0755) == 0);
    expect_refused(d, ENG_EIO, NULL, "a directory");
    const char *fifo = path_for("a_fifo.safetensors");
    if (mkfifo(fifo, 0644) == 0) {
        /* Opening a FIFO for reading would block; the loader must refuse before reading. */
        int keep = open(fifo, O_RDWR | O_NONBLOCK); /* a writer, so open cannot block */
        expect_refused(fifo, ENG_EIO, NULL, "a FIFO");
        if (keep >= 0)
            close(keep);
    }
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/attnd_test_safetensors.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        printf("FAIL mkdtemp %s: %s\n0 passed, 1 failed\n", dir, strerror(errno));
        return 1;
    }
    init_good_data();
    RUN(test_base_of_the_malformed_cases_loads);
    RUN(test_loads_f32_f16_and_bf16_files_exactly);
    RUN(test_loads_grouped_query_layer_with_kv_heads_from_metadata);
    RUN(test_loads_unpadded_header_with_unaligned_data);
    RUN(test_num_heads_from_metadata_or_argument);
    RUN(test_rejects_bad_head_counts_in_metadata);
    RUN(test_fixture_writer_conversions_round_trip);
    RUN(test_rejects_empty_and_short_files);
    RUN(test_rejects_header_length_beyond_the_file);
    RUN(test_rejects_header_length_over_100_mib);
    RUN(test_rejects_header_length_over_100_000_000_bytes);
    RUN(test_rejects_invalid_json);
    RUN(test_accepts_escaped_names);
    RUN(test_rejects_duplicate_names_and_keys);
    RUN(test_rejects_missing_entry_fields);
    RUN(test_rejects_unsupported_dtypes);
    RUN(test_rejects_negative_fractional_and_huge_numbers);
    RUN(test_rejects_bad_ranks);
    RUN(test_rejects_offsets_that_do_not_fit);
    RUN(test_rejects_more_than_64_tensors);
    RUN(test_rejects_tensors_that_make_no_layer);
    RUN(test_rejects_missing_file_and_directory);
    remove_fixtures();
    return check_report();
}
