/* test_safetensors: the safetensors reader and writer (src/format/safetensors.c; format in safetensors.h).
 * Round trips through the writer (one file and shards through an index), directory layouts, and
 * hand-crafted malformed files built byte by byte: each must fail with rc -1 and one message
 * naming the file (and the tensor), leave the SafeTensors as it was, and leak nothing. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/safetensors.h"

/* ---- helpers -------------------------------------------------------------------------- */

/* test_tmpdir()/st/<sub> (rotating static buffers); sub may name a folder, created with mkdir. */
static const char *st_path(const char *sub)
{
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/st", test_tmpdir());
    mkdir(p, 0755);
    snprintf(p, 512, "%s/st/%s", test_tmpdir(), sub);
    return p;
}

static const char *st_mkdir(const char *sub)
{
    const char *p = st_path(sub);
    mkdir(p, 0755);
    return p;
}

static int write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(buf, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* A hand-crafted file: 8-byte little-endian hlen (strlen(header) when hlen is UINT64_MAX), the
 * header text, then ndata bytes 0, 1, 2, ... */
static int write_raw(const char *path, uint64_t hlen, const char *header, size_t ndata)
{
    size_t hl = strlen(header), n = 8 + hl + ndata;
    uint8_t *buf = malloc(n);
    if (hlen == UINT64_MAX) hlen = hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < ndata; i++) buf[8 + hl + i] = (uint8_t)i;
    int rc = write_bytes(path, buf, n);
    free(buf);
    return rc;
}

static int st_is_zero(const SafeTensors *st)
{
    return !st->files && !st->n_files && !st->tensors && !st->n_tensors;
}

static const char *base_of(const char *path)
{
    const char *s = path ? strrchr(path, '/') : NULL;
    return s ? s + 1 : path;
}

/* Open path (as a file, or as a directory through safetensors_open_dir) and expect failure:
 * rc -1, err names path and each non-NULL needle, st untouched. */
static void expect_fail_at(int line, const char *path, int dir, const char *needle1, const char *needle2)
{
    SafeTensors st = {0};
    char err[1024] = "";
    int rc = dir ? safetensors_open_dir(&st, path, err, sizeof err) : safetensors_open_file(&st, path, err, sizeof err);
    if (rc != -1) test_fail(__FILE__, line, "%s: rc %d, expected -1", path, rc);
    if (!strstr(err, path)) test_fail(__FILE__, line, "err does not name %s: %s", path, err);
    if (needle1 && !strstr(err, needle1)) test_fail(__FILE__, line, "err lacks '%s': %s", needle1, err);
    if (needle2 && !strstr(err, needle2)) test_fail(__FILE__, line, "err lacks '%s': %s", needle2, err);
    if (strchr(err, '\n')) test_fail(__FILE__, line, "err is not one line: %s", err);
    if (!st_is_zero(&st)) test_fail(__FILE__, line, "failed open left %d files, %d tensors", st.n_files, st.n_tensors);
    safetensors_free(&st);
}
#define EXPECT_FAIL(path, needle1, needle2) expect_fail_at(__LINE__, path, 0, needle1, needle2)
#define EXPECT_FAIL_DIR(path, needle1, needle2) expect_fail_at(__LINE__, path, 1, needle1, needle2)

/* A small valid file written through the writer: "a" F32 [2], "b" U8 [3]. */
static int write_small(const char *path, const char *a, const char *b)
{
    StSpec specs[2] = {{.name = a, .dtype = DT_F32, .ndim = 1, .shape = {2}},
                       {.name = b, .dtype = DT_U8, .ndim = 1, .shape = {3}}};
    StWriter w;
    char err[512];
    uint8_t data[11];
    for (int i = 0; i < 11; i++) data[i] = (uint8_t)(100 + i);
    if (stw_open(&w, path, specs, 2, "pt", err, sizeof err) != 0) return -1;
    if (stw_write(&w, data, sizeof data, err, sizeof err) != 0) { stw_close(&w, err, sizeof err); return -1; }
    return stw_close(&w, err, sizeof err);
}

/* ---- malformed files ------------------------------------------------------------------ */

typedef struct {
    const char *file;    /* under st_path("bad") */
    const char *header;
    size_t ndata;
    const char *needle;  /* besides the path, err must contain this */
    const char *tensor;  /* and this (the tensor name), when non-NULL */
} BadCase;

static const BadCase bad_cases[] = {
    {"json.safetensors", "{\"a\": {\"dtype\": \"F32\"", 0, "not valid JSON", "line 1"},
    {"json2.safetensors", "{\"a\": 1,}", 0, "column", NULL},
    {"nul.safetensors", "{\"a\\u0000b\": {}}", 0, "not valid JSON", NULL},
    {"dupkey.safetensors", "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]}}", 2, "duplicate", "\"a\""},
    {"array.safetensors", "[]", 0, "not a JSON object", NULL},
    {"scalar.safetensors", "3", 0, "not valid JSON", NULL},
    {"entry.safetensors", "{\"w.x\": 3}", 0, "not an object", "w.x"},
    {"nodtype.safetensors", "{\"w.x\": {\"shape\": [], \"data_offsets\": [0, 4]}}", 4, "missing dtype", "w.x"},
    {"dtypenum.safetensors", "{\"w.x\": {\"dtype\": 7, \"shape\": [], \"data_offsets\": [0, 4]}}", 4, "dtype", "w.x"},
    {"dtype.safetensors", "{\"w.x\": {\"dtype\": \"F7\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4,
     "unknown dtype 'F7'", "w.x"},
    {"noshape.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "missing shape", "w.x"},
    {"shapeobj.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": {}, \"data_offsets\": [0, 4]}}", 4,
     "shape is not an array", "w.x"},
    {"shapeneg.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 4]}}", 4,
     "shape[1]", "w.x"},
    {"shapereal.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}}", 4,
     "shape[0]", "w.x"},
    {"shapestr.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", 4,
     "shape[0]", "w.x"},
    {"dims.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4,
     "9 dims", "w.x"},
    {"overflow.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4], "
                             "\"data_offsets\": [0, 4]}}", 4, "overflows", "w.x"},
    {"overflow2.safetensors", "{\"w.x\": {\"dtype\": \"F64\", \"shape\": [2305843009213693952], "
                              "\"data_offsets\": [0, 4]}}", 4, "overflows", "w.x"},
    {"nooffs.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": []}}", 4, "missing data_offsets", "w.x"},
    {"offs1.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0]}}", 4,
     "two non-negative integers", "w.x"},
    {"offs3.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4, 8]}}", 8,
     "two non-negative integers", "w.x"},
    {"offsneg.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [-4, 0]}}", 4,
     "two non-negative integers", "w.x"},
    {"offsreal.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4.0]}}", 4,
     "two non-negative integers", "w.x"},
    {"offsobj.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": {\"a\": 0}}}", 4,
     "two non-negative integers", "w.x"},
    {"offshuge.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [], "
                             "\"data_offsets\": [0, 99999999999999999999]}}", 4, "not valid JSON", NULL},
    {"offsorder.safetensors", "{\"w.x\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 8,
     "begin past end", "w.x"},
    {"past.safetensors", "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [75], \"data_offsets\": [0, 300]}}",
     256, "data_offsets [0, 300] past the end of the data buffer (256 bytes)", "'model.norm.weight'"},
    {"past2.safetensors", "{\"w.x\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [9, 9]}}", 8,
     "past the end", "w.x"},
    {"size.safetensors", "{\"w.x\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 8]}}", 16,
     "needs 12", "w.x"},
    {"sizef4.safetensors", "{\"w.x\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 1]}}", 4,
     "needs 2", "w.x"},
    {"sizescalar.safetensors", "{\"w.x\": {\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [0, 4]}}", 8,
     "needs 8", "w.x"},
    {"overlap.safetensors", "{\"w.first\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
                            " \"w.second\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [4, 12]}}", 12,
     "'w.first'", "'w.second'"},
    {"overlap2.safetensors", "{\"w.inner\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                             " \"w.outer\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
                             " \"w.after\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [8, 9]}}", 9,
     "'w.inner'", "'w.outer'"},
    {"same.safetensors", "{\"w.a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
                         " \"w.b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4, "'w.a'", "'w.b'"},
    {"meta.safetensors", "{\"__metadata__\": [\"pt\"]}", 0, "__metadata__", NULL},
    {"meta2.safetensors", "{\"__metadata__\": {\"format\": 1}}", 0, "__metadata__", NULL},
    {"ctrl.safetensors", "{\"w\\nx\": {\"dtype\": \"F7\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4,
     "tensor 'w?x'", NULL},
};
#define N_BAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

/* Writes every malformed file of bad_cases; paths[i] is the file of case i (static storage).
 * Returns the count written, -1 on a write failure. */
static int write_bad_files(const char **paths)
{
    static char keep[N_BAD][512];
    st_mkdir("bad");
    for (int i = 0; i < N_BAD; i++) {
        snprintf(keep[i], sizeof keep[i], "%s/%s", st_path("bad"), bad_cases[i].file);
        paths[i] = keep[i];
        if (write_raw(paths[i], UINT64_MAX, bad_cases[i].header, bad_cases[i].ndata) != 0) return -1;
    }
    return N_BAD;
}

/* ---- tests: round trips ---------------------------------------------------------------- */

TEST(safetensors_roundtrip)
{
    const char *path = st_path("rt.safetensors");
    StSpec specs[] = {
        {.name = "model.w", .dtype = DT_F32, .ndim = 2, .shape = {2, 3}},
        {.name = "model.scalar", .dtype = DT_BF16, .ndim = 0},
        {.name = "model.empty", .dtype = DT_U8, .ndim = 2, .shape = {4, 0}},
        {.name = "model.fp8", .dtype = DT_F8_E4M3, .ndim = 2, .shape = {3, 5}},
        {.name = "a.codes", .dtype = DT_U8, .ndim = 3, .shape = {2, 2, 3}},
        {.name = "z.f4", .dtype = DT_F4, .ndim = 1, .shape = {3}},
        {.name = "model.i64", .dtype = DT_I64, .ndim = 1, .shape = {2}},
        {.name = "model.f16", .dtype = DT_F16, .ndim = 1, .shape = {1}},
    };
    const int n = (int)(sizeof specs / sizeof specs[0]);
    const size_t want[] = {24, 2, 0, 15, 12, 2, 16, 2};
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        EXPECT_EQ_INT(stspec_nbytes(&specs[i]), want[i]);
        total += want[i];
    }

    uint8_t data[128];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 37 + 11);
    StWriter w;
    char err[512] = "";
    ASSERT(stw_open(&w, path, specs, n, "pt", err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(w.expected, total);
    /* Uneven pieces: the writer does not care where tensors begin. */
    size_t off = 0, piece[] = {1, 7, 20, 0, 13, 100};
    for (int i = 0; off < total; i++) {
        size_t k = piece[i % 6] < total - off ? piece[i % 6] : total - off;
        ASSERT(stw_write(&w, data + off, k, err, sizeof err) == 0, "%s", err);
        off += k;
    }
    EXPECT(stw_write(&w, data, 1, err, sizeof err) == -1, "one byte past the announced size");
    EXPECT(strstr(err, path) != NULL, "%s", err);
    ASSERT(stw_close(&w, err, sizeof err) == 0, "%s", err);

    SafeTensors st = {0};
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    ASSERT(st.n_files == 1 && st.n_tensors == n, "%d files %d tensors", st.n_files, st.n_tensors);
    for (int i = 1; i < st.n_tensors; i++)
        EXPECT(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0, "sorted by name");

    /* Header padded to 8: data starts 8-aligned in the file. */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ((const uint8_t *)st.files[0].map)[i];
    EXPECT_EQ_INT(hlen % 8, 0);
    EXPECT_EQ_INT(st.files[0].size, 8 + hlen + total);

    off = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = safetensors_find(&st, specs[i].name);
        ASSERT(t != NULL, "tensor %s", specs[i].name);
        EXPECT(strcmp(t->name, specs[i].name) == 0, "%s", t->name);
        EXPECT_EQ_INT(t->dtype, specs[i].dtype);
        EXPECT_EQ_INT(t->ndim, specs[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            EXPECT_EQ_INT(t->shape[d], specs[i].shape[d]);
            numel *= specs[i].shape[d];
        }
        EXPECT_EQ_INT(t->numel, numel);
        EXPECT_EQ_INT(t->nbytes, want[i]);
        EXPECT(memcmp(t->data, data + off, want[i]) == 0, "data of %s", t->name);
        EXPECT_EQ_INT(t->data - (const uint8_t *)st.files[0].map, 8 + hlen + off);
        EXPECT(strcmp(safetensors_file_of(&st, t), path) == 0, "file of %s", t->name);
        off += want[i];
    }
    EXPECT(safetensors_find(&st, "model.nope") == NULL, "unknown name");
    EXPECT(safetensors_find(&st, "") == NULL, "empty name");
    EXPECT(safetensors_file_of(&st, NULL) == NULL, "file of NULL");
    safetensors_free(&st);
    EXPECT(st_is_zero(&st), "freed struct is zeroed");
    safetensors_free(&st); /* twice is fine */
}

TEST(safetensors_roundtrip_no_metadata_no_tensors)
{
    const char *path = st_path("none.safetensors");
    StWriter w;
    char err[512] = "";
    ASSERT(stw_open(&w, path, NULL, 0, NULL, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(w.expected, 0);
    ASSERT(stw_close(&w, err, sizeof err) == 0, "%s", err);
    SafeTensors st = {0};
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_files, 1);
    EXPECT_EQ_INT(st.n_tensors, 0);
    EXPECT(safetensors_find(&st, "x") == NULL, "nothing to find");
    safetensors_free(&st);
}

TEST(safetensors_writer_errors)
{
    const char *path = st_path("werr.safetensors");
    char err[512] = "";
    StWriter w;
    StSpec dup[] = {{.name = "x", .dtype = DT_U8, .ndim = 1, .shape = {1}},
                    {.name = "x", .dtype = DT_U8, .ndim = 1, .shape = {1}}};
    EXPECT(stw_open(&w, path, dup, 2, NULL, err, sizeof err) == -1, "duplicate name");
    EXPECT(strstr(err, "duplicate") && strstr(err, path), "%s", err);
    EXPECT(w.f == NULL && w.path == NULL, "failed open leaves nothing open");
    StSpec meta[] = {{.name = "__metadata__", .dtype = DT_U8, .ndim = 1, .shape = {1}}};
    EXPECT(stw_open(&w, path, meta, 1, NULL, err, sizeof err) == -1, "reserved name");
    StSpec neg[] = {{.name = "x", .dtype = DT_U8, .ndim = 1, .shape = {-1}}};
    EXPECT(stw_open(&w, path, neg, 1, NULL, err, sizeof err) == -1, "negative dim");
    EXPECT(strstr(err, "'x'") != NULL, "%s", err);
    StSpec dims[] = {{.name = "x", .dtype = DT_U8, .ndim = ST_MAX_DIMS + 1}};
    EXPECT(stw_open(&w, path, dims, 1, NULL, err, sizeof err) == -1, "too many dims");
    StSpec noname[] = {{.name = NULL, .dtype = DT_U8, .ndim = 0}};
    EXPECT(stw_open(&w, path, noname, 1, NULL, err, sizeof err) == -1, "no name");
    StSpec ovf[] = {{.name = "x", .dtype = DT_F32, .ndim = 2, .shape = {INT64_MAX / 2, 2}}};
    EXPECT(stw_open(&w, path, ovf, 1, NULL, err, sizeof err) == -1, "overflow");
    EXPECT(stspec_nbytes(&ovf[0]) == SIZE_MAX, "overflow nbytes");

    /* Short write: stw_close fails and still releases the writer. */
    StSpec one[] = {{.name = "x", .dtype = DT_F32, .ndim = 1, .shape = {4}}};
    ASSERT(stw_open(&w, path, one, 1, NULL, err, sizeof err) == 0, "%s", err);
    float v[4] = {1, 2, 3, 4};
    ASSERT(stw_write(&w, v, 8, err, sizeof err) == 0, "%s", err);
    EXPECT(stw_write(&w, v, 9, err, sizeof err) == -1, "past the end");
    EXPECT(stw_close(&w, err, sizeof err) == -1, "short file");
    EXPECT(strstr(err, path) && strstr(err, "8 of 16"), "%s", err);
    EXPECT(w.f == NULL && w.path == NULL, "closed");
    EXPECT(stw_close(&w, err, sizeof err) == 0, "close of a closed writer");
    EXPECT_FAIL(path, "past the end of the data buffer", "'x'");

    /* Unwritable path. */
    EXPECT(stw_open(&w, st_path("no/such/dir/x.safetensors"), one, 1, NULL, err, sizeof err) == -1, "no dir");
    EXPECT(strstr(err, "no/such/dir/x.safetensors") != NULL, "%s", err);
}

TEST(safetensors_handcrafted_ok)
{
    char err[512] = "";
    SafeTensors st = {0};
    /* Holes, empty tensors in a hole, inside another tensor's range (zero bytes overlap nothing)
     * and at the very end, padding, metadata, extra keys, a 0-d scalar, tensors out of order. */
    const char *path = st_path("hand.safetensors");
    const char *h = "{\"__metadata__\": {\"format\": \"pt\", \"x\": \"y\"},"
                    " \"b\": {\"dtype\": \"U8\", \"shape\": [2, 2], \"data_offsets\": [8, 12], \"extra\": 1},"
                    " \"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
                    " \"e\": {\"dtype\": \"BF16\", \"shape\": [0, 7], \"data_offsets\": [6, 6]},"
                    " \"f\": {\"dtype\": \"F4\", \"shape\": [1, 3], \"data_offsets\": [14, 16]},"
                    " \"g\": {\"dtype\": \"F8_E4M3\", \"shape\": [0], \"data_offsets\": [16, 16]},"
                    " \"h\": {\"dtype\": \"I32\", \"shape\": [2, 0], \"data_offsets\": [9, 9]}}      ";
    ASSERT(write_raw(path, UINT64_MAX, h, 16) == 0, "write");
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_tensors, 6);
    const StTensor *a = safetensors_find(&st, "a"), *b = safetensors_find(&st, "b");
    const StTensor *e = safetensors_find(&st, "e"), *f = safetensors_find(&st, "f");
    const StTensor *g = safetensors_find(&st, "g");
    ASSERT(a && b && e && f && g, "all found");
    EXPECT(safetensors_find(&st, "__metadata__") == NULL, "metadata is not a tensor");
    EXPECT_EQ_INT(a->ndim, 0);
    EXPECT_EQ_INT(a->numel, 1);
    EXPECT_EQ_INT(a->nbytes, 4);
    EXPECT_EQ_INT(a->data[0], 0);
    EXPECT_EQ_INT(b->data[0], 8);
    EXPECT_EQ_INT(b->numel, 4);
    EXPECT_EQ_INT(e->numel, 0);
    EXPECT_EQ_INT(e->nbytes, 0);
    EXPECT_EQ_INT(f->dtype, DT_F4);
    EXPECT_EQ_INT(f->nbytes, 2);
    EXPECT_EQ_INT(f->data[1], 15);
    EXPECT_EQ_INT(g->dtype, DT_F8_E4M3);
    safetensors_free(&st);

    /* The header length may leave the JSON followed by spaces only. */
    path = st_path("pad.safetensors");
    ASSERT(write_raw(path, UINT64_MAX, "{\"x\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}   \n\t ", 1) == 0, "write");
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_tensors, 1);
    safetensors_free(&st);

    /* An empty header object: a file with no tensors. */
    path = st_path("emptyobj.safetensors");
    ASSERT(write_raw(path, UINT64_MAX, "{}", 0) == 0, "write");
    ASSERT(safetensors_open_file(&st, path, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_tensors, 0);
    safetensors_free(&st);
}

/* ---- tests: malformed files ------------------------------------------------------------- */

TEST(safetensors_bad_length)
{
    const char *path = st_path("short.safetensors");
    ASSERT(write_bytes(path, "\x10\0\0\0\0", 5) == 0, "write");
    EXPECT_FAIL(path, "truncated", NULL);
    path = st_path("zero.safetensors");
    ASSERT(write_bytes(path, "", 0) == 0, "write");
    EXPECT_FAIL(path, "truncated", NULL);
    path = st_path("hlen0.safetensors");
    ASSERT(write_raw(path, 0, "{}", 8) == 0, "write");
    EXPECT_FAIL(path, "header length 0", NULL);
    path = st_path("hlenonly.safetensors");
    ASSERT(write_raw(path, 0, "", 0) == 0, "write");
    EXPECT_FAIL(path, "header length 0", NULL);
    path = st_path("hlenpast.safetensors");
    ASSERT(write_raw(path, 3, "{}", 0) == 0, "write");
    EXPECT_FAIL(path, "header length 3 past end of file (size 10)", NULL);
    path = st_path("hlenhuge.safetensors");
    ASSERT(write_raw(path, UINT64_MAX - 1, "{}", 0) == 0, "write");
    EXPECT_FAIL(path, "past end of file", NULL);

    /* Over the 100 MB cap inside a file that is large enough: a sparse file. */
    path = st_path("hlencap.safetensors");
    ASSERT(write_raw(path, 100000001, "{", 0) == 0, "write");
    ASSERT(truncate(path, 8 + 100000001 + 8) == 0, "truncate");
    EXPECT_FAIL(path, "header length 100000001 over the limit", NULL);
    unlink(path);

    EXPECT_FAIL(st_path("missing.safetensors"), "No such file", NULL);
    EXPECT_FAIL(st_mkdir("adir.safetensors"), "not a regular file", NULL);
}

TEST(safetensors_bad_header)
{
    const char *paths[N_BAD];
    int n = write_bad_files(paths);
    ASSERT(n == N_BAD, "wrote %d", n);
    for (int i = 0; i < N_BAD; i++) {
        int before = test_failed_now();
        expect_fail_at(__LINE__, paths[i], 0, bad_cases[i].needle, bad_cases[i].tensor);
        if (!before && test_failed_now()) fprintf(stderr, "    (case %s)\n", bad_cases[i].file);
    }
}

/* Every malformed file again, each opened into one SafeTensors that already holds a good file
 * and into one reused after each failure: the good file's tensors stay usable and nothing leaks
 * (run under make debug: LeakSanitizer checks the last point). */
TEST(safetensors_bad_no_leaks)
{
    const char *paths[N_BAD];
    int n = write_bad_files(paths);
    ASSERT(n == N_BAD, "wrote %d", n);
    const char *good = st_path("good_for_leaks.safetensors");
    ASSERT(write_small(good, "good.a", "good.b") == 0, "write");

    SafeTensors held = {0}, reused = {0};
    char err[1024];
    ASSERT(safetensors_open_file(&held, good, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < n; i++) {
        EXPECT(safetensors_open_file(&held, paths[i], err, sizeof err) == -1, "%s", paths[i]);
        EXPECT(safetensors_open_dir(&held, paths[i], err, sizeof err) == -1, "%s", paths[i]);
        EXPECT(held.n_files == 1 && held.n_tensors == 2, "%s: %d files %d tensors", paths[i],
               held.n_files, held.n_tensors);
        EXPECT(safetensors_open_file(&reused, paths[i], err, sizeof err) == -1, "%s", paths[i]);
        EXPECT(st_is_zero(&reused), "%s", paths[i]);
    }
    const StTensor *t = safetensors_find(&held, "good.b");
    ASSERT(t != NULL, "good.b still there");
    EXPECT_EQ_INT(t->data[0], 108);
    EXPECT(strcmp(safetensors_file_of(&held, t), good) == 0, "file of good.b");

    /* The reused struct still opens a good file after all the failures. */
    ASSERT(safetensors_open_file(&reused, good, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(reused.n_tensors, 2);
    safetensors_free(&reused);
    safetensors_free(&held);
    SafeTensors zero = {0};
    safetensors_free(&zero);
    EXPECT(st_is_zero(&zero), "free of a zeroed struct");
}

/* ---- tests: directories and shards ---------------------------------------------------- */

TEST(safetensors_shards_index)
{
    const char *dir = st_mkdir("sharded");
    char p1[512], p2[512], err[1024] = "";
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    StSpec s1[] = {{.name = "model.embed", .dtype = DT_BF16, .ndim = 2, .shape = {4, 2}},
                   {.name = "model.layers.0.w", .dtype = DT_F8_E4M3, .ndim = 2, .shape = {2, 2}}};
    StSpec s2[] = {{.name = "lm_head", .dtype = DT_F32, .ndim = 1, .shape = {3}},
                   {.name = "model.layers.0.s", .dtype = DT_U8, .ndim = 0}};
    uint8_t data[64];
    for (int i = 0; i < 64; i++) data[i] = (uint8_t)i;
    StWriter w;
    ASSERT(stw_open(&w, p1, s1, 2, "pt", err, sizeof err) == 0, "%s", err);
    ASSERT(stw_write(&w, data, 20, err, sizeof err) == 0 && stw_close(&w, err, sizeof err) == 0, "%s", err);
    ASSERT(stw_open(&w, p2, s2, 2, "pt", err, sizeof err) == 0, "%s", err);
    ASSERT(stw_write(&w, data, 13, err, sizeof err) == 0 && stw_close(&w, err, sizeof err) == 0, "%s", err);
    const char *names[] = {"model.embed", "model.layers.0.w", "lm_head", "model.layers.0.s"};
    const char *shard[] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    ASSERT(st_index_write(dir, names, shard, 4, 33, err, sizeof err) == 0, "%s", err);
    /* A stray file the index does not list is not opened. */
    char stray[512];
    snprintf(stray, sizeof stray, "%s/stray.safetensors", dir);
    ASSERT(write_raw(stray, UINT64_MAX, "garbage", 0) == 0, "write");

    SafeTensors st = {0};
    ASSERT(safetensors_open_dir(&st, dir, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_files, 2);
    EXPECT_EQ_INT(st.n_tensors, 4);
    for (int i = 0; i < 4; i++) {
        const StTensor *t = safetensors_find(&st, names[i]);
        ASSERT(t != NULL, "%s", names[i]);
        EXPECT(strcmp(base_of(safetensors_file_of(&st, t)), shard[i]) == 0, "%s in %s", names[i],
               safetensors_file_of(&st, t));
    }
    const StTensor *t = safetensors_find(&st, "model.layers.0.s");
    EXPECT_EQ_INT(t->data[0], 12);
    EXPECT_EQ_INT(t->ndim, 0);
    EXPECT_EQ_INT(safetensors_find(&st, "model.layers.0.w")->data[3], 19);
    safetensors_free(&st);

    /* The index as written: total_size and weight_map. */
    char ipath[600];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(ipath, "r");
    ASSERT(f != NULL, "%s", ipath);
    char text[4096];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    EXPECT(strstr(text, "\"total_size\": 33") != NULL, "%s", text);
    EXPECT(strstr(text, "\"lm_head\": \"model-00002-of-00002.safetensors\"") != NULL, "%s", text);
}

/* A directory with shards a.safetensors and b.safetensors and an index given as text. */
static const char *index_dir(const char *sub, const char *index_text)
{
    const char *dir = st_mkdir(sub);
    char p[600];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    if (write_small(p, "a.x", "a.y") != 0) return NULL;
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    if (write_small(p, "b.x", "b.y") != 0) return NULL;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (index_text && write_bytes(p, index_text, strlen(index_text)) != 0) return NULL;
    return dir;
}

TEST(safetensors_bad_index)
{
    const char *dir;
    char idx[600];
#define IDX(d) (snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d), idx)
    dir = index_dir("idx_missing", "{\"metadata\": {\"total_size\": 22}, \"weight_map\": "
                                   "{\"a.x\": \"a.safetensors\", \"a.zz\": \"a.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "missing tensor 'a.zz' (index says it is in a.safetensors)", IDX(dir));

    dir = index_dir("idx_wrong", "{\"weight_map\": {\"a.x\": \"a.safetensors\", \"b.x\": \"a.safetensors\","
                                 " \"b.y\": \"b.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "tensor 'b.x' is in b.safetensors", "says a.safetensors");

    dir = index_dir("idx_dotdot", "{\"weight_map\": {\"a.x\": \"../a.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "bad file name '../a.safetensors'", "'a.x'");
    dir = index_dir("idx_slash", "{\"weight_map\": {\"a.x\": \"sub/a.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "bad file name 'sub/a.safetensors'", "'a.x'");
    dir = index_dir("idx_abs", "{\"weight_map\": {\"a.x\": \"/etc/passwd\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "bad file name", NULL);
    dir = index_dir("idx_empty_name", "{\"weight_map\": {\"a.x\": \"\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "bad file name", NULL);

    dir = index_dir("idx_absent", "{\"weight_map\": {\"a.x\": \"a.safetensors\", \"c.x\": \"c.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "c.safetensors", "No such file");

    dir = index_dir("idx_json", "{\"weight_map\": {\"a.x\": \"a.safetensors\",}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "not valid JSON", "line 1");
    dir = index_dir("idx_dup", "{\"weight_map\": {\"a.x\": \"a.safetensors\", \"a.x\": \"b.safetensors\"}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "duplicate", NULL);
    dir = index_dir("idx_nomap", "{\"metadata\": {}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "weight_map", NULL);
    dir = index_dir("idx_notstr", "{\"weight_map\": {\"a.x\": 1}}");
    ASSERT(dir, "setup");
    EXPECT_FAIL_DIR(dir, "'a.x' is not a string", NULL);

    /* A shard that is itself malformed: its error comes through, naming the shard. */
    dir = index_dir("idx_badshard", "{\"weight_map\": {\"a.x\": \"a.safetensors\", \"c.y\": \"c.safetensors\"}}");
    ASSERT(dir, "setup");
    char c[600];
    snprintf(c, sizeof c, "%s/c.safetensors", dir);
    ASSERT(write_raw(c, UINT64_MAX, "{\"c.y\": {\"dtype\": \"U8\", \"shape\": [9], \"data_offsets\": [0, 9]}}", 4) == 0, "w");
    EXPECT_FAIL_DIR(dir, c, "'c.y'");

    /* The good index over the same shards opens. */
    dir = index_dir("idx_good", "{\"metadata\": {\"total_size\": 22}, \"weight_map\": "
                                "{\"a.x\": \"a.safetensors\", \"b.y\": \"b.safetensors\"}}");
    ASSERT(dir, "setup");
    SafeTensors st = {0};
    char err[1024];
    ASSERT(safetensors_open_dir(&st, dir, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_files, 2);
    EXPECT_EQ_INT(st.n_tensors, 4);
    safetensors_free(&st);
#undef IDX
}

/* A FIFO where a file or the index should be: refused at once as not a regular file, never
 * waited on (the open of a FIFO blocks until a writer comes). */
TEST(safetensors_fifo_refused)
{
    const char *fifo = st_path("fifo.safetensors");
    unlink(fifo);
    ASSERT(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    test_alarm(2);
    EXPECT_FAIL(fifo, "not a regular file", NULL);
    test_alarm(0);

    const char *dir = index_dir("idx_fifo", NULL);
    ASSERT(dir, "setup");
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    unlink(idx);
    ASSERT(mkfifo(idx, 0644) == 0, "mkfifo %s", idx);
    test_alarm(2);
    EXPECT_FAIL_DIR(dir, idx, "not a regular file");
    test_alarm(0);
}

TEST(safetensors_dir_layouts)
{
    char err[1024] = "", p[600];
    SafeTensors st = {0};

    /* model.safetensors wins over other *.safetensors. */
    const char *dir = st_mkdir("single");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ASSERT(write_small(p, "m.a", "m.b") == 0, "write");
    snprintf(p, sizeof p, "%s/other.safetensors", dir);
    ASSERT(write_raw(p, UINT64_MAX, "not json", 0) == 0, "write");
    ASSERT(safetensors_open_dir(&st, dir, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_files, 1);
    EXPECT(safetensors_find(&st, "m.a") != NULL, "m.a");
    EXPECT(strcmp(base_of(st.files[0].path), "model.safetensors") == 0, "%s", st.files[0].path);
    safetensors_free(&st);

    /* The path of one file. */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ASSERT(safetensors_open_dir(&st, p, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_tensors, 2);
    safetensors_free(&st);

    /* No index, no model.safetensors: every *.safetensors in sorted order. */
    dir = st_mkdir("many");
    const char *files[] = {"c.safetensors", "a.safetensors", "b.safetensors"};
    for (int i = 0; i < 3; i++) {
        char a[8], b[8];
        snprintf(a, sizeof a, "%c.a", files[i][0]);
        snprintf(b, sizeof b, "%c.b", files[i][0]);
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        ASSERT(write_small(p, a, b) == 0, "write");
    }
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    ASSERT(write_bytes(p, "x", 1) == 0, "write");
    ASSERT(safetensors_open_dir(&st, dir, err, sizeof err) == 0, "%s", err);
    EXPECT_EQ_INT(st.n_files, 3);
    EXPECT_EQ_INT(st.n_tensors, 6);
    for (int i = 0; i < st.n_files && i < 3; i++)
        EXPECT(base_of(st.files[i].path)[0] == "abc"[i], "file %d is %s", i, st.files[i].path);
    EXPECT_EQ_INT(safetensors_find(&st, "c.b")->file, 2);
    safetensors_free(&st);

    /* A name in two files: the error names both. */
    dir = st_mkdir("dupname");
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/a.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/b.safetensors", dir);
    ASSERT(write_small(pa, "x.a", "shared") == 0 && write_small(pb, "shared", "x.b") == 0, "write");
    EXPECT_FAIL_DIR(dir, pa, "'shared'");
    EXPECT_FAIL_DIR(dir, pb, NULL);
    ASSERT(safetensors_open_file(&st, pa, err, sizeof err) == 0, "%s", err);
    EXPECT(safetensors_open_file(&st, pb, err, sizeof err) == -1, "duplicate across files");
    EXPECT(strstr(err, pa) && strstr(err, pb) && strstr(err, "'shared'"), "%s", err);
    EXPECT(st.n_files == 1 && st.n_tensors == 2, "first file kept");
    safetensors_free(&st);

    /* A malformed file among several: the whole open fails and leaves nothing. */
    dir = st_mkdir("onebad");
    snprintf(pa, sizeof pa, "%s/a.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/b.safetensors", dir);
    ASSERT(write_small(pa, "a.a", "a.b") == 0, "write");
    ASSERT(write_raw(pb, UINT64_MAX, "{\"b.a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 0) == 0, "w");
    EXPECT_FAIL_DIR(dir, pb, "'b.a'");

    /* Nothing to open. */
    dir = st_mkdir("empty");
    snprintf(p, sizeof p, "%s/readme.md", dir);
    ASSERT(write_bytes(p, "x", 1) == 0, "write");
    EXPECT_FAIL_DIR(dir, "no .safetensors files in", NULL);
    EXPECT_FAIL_DIR(st_path("does-not-exist"), "No such file", NULL);
}
