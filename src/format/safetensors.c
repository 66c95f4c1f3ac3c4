/* safetensors: mmap reader and streaming writer for .safetensors files (the format of
 * https://github.com/huggingface/safetensors, README "Format"; layout in safetensors.h).
 * The reader maps each file whole (PROT_READ, MAP_PRIVATE), validates the JSON header against
 * the size of the data buffer, and hands out tensors that point into the mapping; nothing is
 * copied. Every malformed input returns -1 with one line naming the file and the tensor, and a
 * failed open leaves the SafeTensors as it was before the call (no leaks, reusable). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/util.h"

#define ST_MAX_HEADER  100000000ull  /* bytes of JSON header, as [ST] MAX_HEADER_SIZE */
#define ST_MAX_INDEX   (100u << 20)  /* bytes of model.safetensors.index.json */
#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_NAME_SHOWN  200           /* characters of a tensor name quoted in a message */

/* ---- types ---------------------------------------------------------------------------- */

/* One tensor's byte range inside its file's data buffer, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    int idx;                       /* into the file's tensor array */
} StRange;

/* ---- helpers -------------------------------------------------------------------------- */

/* A tensor name fit for a one-line message: control characters become '?', long names are cut. */
static const char *st_shown(char *buf, size_t n, const char *s)
{
    size_t max = n - 4 < ST_NAME_SHOWN ? n - 4 : ST_NAME_SHOWN, i; /* every buffer has n >= 64 */
    for (i = 0; s[i] && i < max; i++)
        buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    strcpy(buf + i, s[i] ? "..." : "");
    return buf;
}

static void st_shape_str(char *buf, size_t n, const int64_t *shape, int ndim)
{
    size_t k = 0;
    k += snprintf(buf + k, n - k, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* numel of a shape and the bytes it takes in dtype t (sub-byte dtypes packed, rounded up).
 * 0 ok, -1 on overflow (each partial product is checked, as [ST] does). */
static int st_sizes(DType t, const int64_t *shape, int ndim, int64_t *numel, uint64_t *nbytes)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        if (shape[d] != 0 && n > INT64_MAX / shape[d]) return -1;
        n *= shape[d];
    }
    int bits = dtype_bits(t);
    if (bits <= 0 || n > (INT64_MAX - 7) / bits) return -1;
    *numel = n;
    *nbytes = ((uint64_t)n * (uint64_t)bits + 7) / 8;
    return 0;
}

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name);
}

static int st_cmp_range(const void *a, const void *b)
{
    const StRange *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int st_has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && strcmp(s + n - m, suf) == 0;
}

/* A shard file name from an index: a plain name in the checkpoint directory. */
static int st_bad_shard_name(const char *s)
{
    return !*s || strchr(s, '/') || strstr(s, "..");
}

static void st_file_free(StFile *f)
{
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static void st_tensors_free(StTensor *t, int n)
{
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

/* Drop every file from index n_files on, and their tensors (order, hence sorting, is kept). */
static void st_truncate(SafeTensors *st, int n_files)
{
    int k = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        if (st->tensors[i].file >= n_files) free(st->tensors[i].name);
        else st->tensors[k++] = st->tensors[i];
    }
    st->n_tensors = k;
    for (int i = n_files; i < st->n_files; i++) st_file_free(&st->files[i]);
    st->n_files = n_files;
    if (!st->n_files) {
        free(st->files);
        free(st->tensors);
        memset(st, 0, sizeof *st);
    }
}

/* ---- core: one file ------------------------------------------------------------------- */

/* Checks one header entry and fills *t (all but name, data and file). Returns 0, or -1 with
 * err set; "path: tensor 'name': " is the caller's prefix. */
static int st_parse_entry(json_t *v, uint64_t data_size, StTensor *t, StRange *r,
                          char *msg, size_t msglen)
{
    if (!json_is_object(v)) { snprintf(msg, msglen, "entry is not an object"); return -1; }

    json_t *jd = json_object_get(v, "dtype");
    if (!jd) { snprintf(msg, msglen, "missing dtype"); return -1; }
    if (!json_is_string(jd)) { snprintf(msg, msglen, "dtype is not a string"); return -1; }
    if (dtype_parse(json_string_value(jd), &t->dtype) != 0) {
        char b[64];
        snprintf(msg, msglen, "unknown dtype '%s'", st_shown(b, sizeof b, json_string_value(jd)));
        return -1;
    }

    json_t *js = json_object_get(v, "shape");
    if (!js) { snprintf(msg, msglen, "missing shape"); return -1; }
    if (!json_is_array(js)) { snprintf(msg, msglen, "shape is not an array"); return -1; }
    if (json_array_size(js) > ST_MAX_DIMS) {
        snprintf(msg, msglen, "shape has %zu dims (at most %d)", json_array_size(js), ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)json_array_size(js);
    for (int d = 0; d < t->ndim; d++) {
        json_t *e = json_array_get(js, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0) {
            snprintf(msg, msglen, "shape[%d] is not a non-negative integer", d);
            return -1;
        }
        t->shape[d] = json_integer_value(e);
    }
    char shp[200]; /* 8 dims of up to 19 digits */
    st_shape_str(shp, sizeof shp, t->shape, t->ndim);
    uint64_t need;
    if (st_sizes(t->dtype, t->shape, t->ndim, &t->numel, &need) != 0) {
        snprintf(msg, msglen, "shape %s overflows", shp);
        return -1;
    }

    json_t *jo = json_object_get(v, "data_offsets");
    if (!jo) { snprintf(msg, msglen, "missing data_offsets"); return -1; }
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(jb) || !json_is_integer(je)
        || json_integer_value(jb) < 0 || json_integer_value(je) < 0) {
        snprintf(msg, msglen, "data_offsets is not two non-negative integers");
        return -1;
    }
    uint64_t b = (uint64_t)json_integer_value(jb), e = (uint64_t)json_integer_value(je);
    if (b > e) {
        snprintf(msg, msglen, "data_offsets [%llu, %llu] begin past end",
                 (unsigned long long)b, (unsigned long long)e);
        return -1;
    }
    if (e > data_size) {
        snprintf(msg, msglen, "data_offsets [%llu, %llu] past the end of the data buffer (%llu bytes)",
                 (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
        return -1;
    }
    if (e - b != need) {
        snprintf(msg, msglen, "data_offsets [%llu, %llu] hold %llu bytes, but %s %s needs %llu",
                 (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b),
                 dtype_name(t->dtype), shp, (unsigned long long)need);
        return -1;
    }
    t->nbytes = (size_t)need;
    r->begin = b;
    r->end = e;
    return 0;
}

/* __metadata__: a string -> string map; accepted and ignored. */
static int st_check_metadata(json_t *v)
{
    if (!json_is_object(v)) return -1;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) if (!json_is_string(x)) return -1;
    return 0;
}

/* Map path and validate its header. On success *out holds the file, *ts and *nt its tensors
 * (file index unset); on failure everything is released. */
static int st_load(const char *path, StFile *out, StTensor **ts, int *nt, char *err, size_t errlen)
{
    StTensor *t = NULL;
    StRange *r = NULL;
    json_t *root = NULL;
    int n = 0, rc = -1;
    char nb[ST_NAME_SHOWN + 8];

    memset(out, 0, sizeof *out);
    *ts = NULL;
    *nt = 0;
    /* O_NONBLOCK: a FIFO in a file's place would block a plain open until some writer came;
     * the S_ISREG check below then refuses it (the flag changes nothing for a regular file) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) { errbuf_set(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        errbuf_set(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        errbuf_set(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        errbuf_set(err, errlen, "%s: truncated: %llu bytes, no header length (8 bytes)", path,
                   (unsigned long long)size);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        errbuf_set(err, errlen, "%s: mmap of %llu bytes: %s", path, (unsigned long long)size,
                   strerror(mmap_errno));
        return -1;
    }
    out->map = map;
    out->size = (size_t)size;
    out->path = xstrdup(path);

    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen == 0) { errbuf_set(err, errlen, "%s: header length 0", path); goto done; }
    if (hlen > size - 8) {
        errbuf_set(err, errlen, "%s: header length %llu past end of file (size %llu)", path,
                   (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
    if (hlen > ST_MAX_HEADER) {
        errbuf_set(err, errlen, "%s: header length %llu over the limit of %llu bytes", path,
                   (unsigned long long)hlen, ST_MAX_HEADER);
        goto done;
    }
    uint64_t data_size = size - 8 - hlen;
    const uint8_t *data = p + 8 + hlen;

    json_error_t je;
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        errbuf_set(err, errlen, "%s: header is not valid JSON: %s (line %d, column %d)", path,
                   je.text, je.line, je.column);
        goto done;
    }
    if (!json_is_object(root)) { errbuf_set(err, errlen, "%s: header is not a JSON object", path); goto done; }

    size_t cap = json_object_size(root);
    t = xcalloc(cap, sizeof *t);
    r = xcalloc(cap, sizeof *r);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (st_check_metadata(v) != 0) {
                errbuf_set(err, errlen, "%s: __metadata__ is not an object of strings", path);
                goto done;
            }
            continue;
        }
        char msg[512];
        if (st_parse_entry(v, data_size, &t[n], &r[n], msg, sizeof msg) != 0) {
            errbuf_set(err, errlen, "%s: tensor '%s': %s", path, st_shown(nb, sizeof nb, key), msg);
            goto done;
        }
        t[n].name = xstrdup(key);
        t[n].data = data + r[n].begin;
        r[n].idx = n;
        n++;
    }

    /* Holes are allowed; shared bytes are not. Empty tensors occupy no bytes and overlap
     * nothing. After sorting by begin, a range overlaps an earlier one iff it begins before
     * the furthest end seen so far. */
    if (n) qsort(r, n, sizeof *r, st_cmp_range);
    int far = -1;
    for (int i = 0; i < n; i++) {
        if (r[i].begin == r[i].end) continue;
        if (far >= 0 && r[i].begin < r[far].end) {
            char nb2[ST_NAME_SHOWN + 8];
            errbuf_set(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                       path, st_shown(nb, sizeof nb, t[r[i].idx].name),
                       (unsigned long long)r[i].begin, (unsigned long long)r[i].end,
                       st_shown(nb2, sizeof nb2, t[r[far].idx].name),
                       (unsigned long long)r[far].begin, (unsigned long long)r[far].end);
            goto done;
        }
        if (far < 0 || r[i].end > r[far].end) far = i;
    }
    rc = 0;

done:
    json_decref(root);
    free(r);
    if (rc == 0) {
        *ts = t;
        *nt = n;
    } else {
        st_tensors_free(t, n);
        st_file_free(out);
    }
    return rc;
}

/* ---- public API: reader --------------------------------------------------------------- */

int safetensors_open_file(SafeTensors *st, const char *path, char *err, size_t errlen)
{
    StFile f;
    StTensor *t;
    int n;
    if (st_load(path, &f, &t, &n, err, errlen) != 0) return -1;

    for (int i = 0; i < n; i++) {
        const StTensor *o = safetensors_find(st, t[i].name);
        if (o) {
            char nb[ST_NAME_SHOWN + 8];
            errbuf_set(err, errlen, "%s: tensor '%s' is also in %s", path,
                       st_shown(nb, sizeof nb, t[i].name), safetensors_file_of(st, o));
            st_tensors_free(t, n);
            st_file_free(&f);
            return -1;
        }
    }

    /* Commit: nothing below can fail (allocation failure stops the process). */
    st->files = xrealloc(st->files, (size_t)(st->n_files + 1) * sizeof *st->files);
    st->files[st->n_files] = f;
    if (n) {
        st->tensors = xrealloc(st->tensors, (size_t)(st->n_tensors + n) * sizeof *st->tensors);
        for (int i = 0; i < n; i++) {
            t[i].file = st->n_files;
            st->tensors[st->n_tensors + i] = t[i];
        }
        st->n_tensors += n;
        qsort(st->tensors, st->n_tensors, sizeof *st->tensors, st_cmp_name);
    }
    st->n_files++;
    free(t);
    return 0;
}

/* The index: open each distinct shard once, in sorted order, then check every weight_map
 * entry against the shard it names. */
static int st_open_index(SafeTensors *st, const char *dir, const char *ipath, char *err, size_t errlen)
{
    struct stat sb;
    int fd = file_open_regular(ipath); /* a FIFO would block the read below, a device never end */
    if (fd < 0) { errbuf_set(err, errlen, "%s: %s", ipath, file_read_error(errno)); return -1; }
    if (fstat(fd, &sb) != 0) sb.st_size = 0;   /* cannot fail: file_open_regular just did it */
    if ((uint64_t)sb.st_size > ST_MAX_INDEX) {
        errbuf_set(err, errlen, "%s: %llu bytes, over the limit of %u", ipath,
                   (unsigned long long)sb.st_size, ST_MAX_INDEX);
        close(fd);
        return -1;
    }
    /* a regular file: the read ends; json_loadb_clamped as for every JSON file of a checkpoint */
    size_t cap = (size_t)sb.st_size, len = 0;
    char *text = xmalloc(cap + 1);
    for (ssize_t got; len < cap && (got = read(fd, text + len, cap - len)) > 0;) len += (size_t)got;
    close(fd);
    json_error_t je;
    json_t *root = json_loadb_clamped(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root) {
        errbuf_set(err, errlen, "%s: not valid JSON: %s (line %d, column %d)", ipath, je.text, je.line, je.column);
        return -1;
    }
    int rc = -1, n_names = 0, base = st->n_files;
    char **names = NULL;
    char nb[ST_NAME_SHOWN + 8], fb[ST_NAME_SHOWN + 8], path[4096];
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        errbuf_set(err, errlen, "%s: no \"weight_map\" object", ipath);
        goto done;
    }

    const char *key;
    json_t *v;
    names = xcalloc(json_object_size(wm), sizeof *names);
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v)) {
            errbuf_set(err, errlen, "%s: weight_map entry '%s' is not a string", ipath, st_shown(nb, sizeof nb, key));
            goto done;
        }
        const char *f = json_string_value(v);
        if (st_bad_shard_name(f)) {
            errbuf_set(err, errlen, "%s: weight_map entry '%s': bad file name '%s'", ipath,
                       st_shown(nb, sizeof nb, key), st_shown(fb, sizeof fb, f));
            goto done;
        }
        names[n_names++] = (char *)f; /* borrowed from root */
    }
    if (n_names) qsort(names, n_names, sizeof *names, st_cmp_str);
    for (int i = 0; i < n_names; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        path_join(path, sizeof path, dir, names[i]);
        if (safetensors_open_file(st, path, err, errlen) != 0) goto done;
    }

    json_object_foreach(wm, key, v) {
        const char *f = json_string_value(v);
        const StTensor *t = safetensors_find(st, key);
        const char *in = t ? safetensors_file_of(st, t) : NULL;
        const char *slash = in ? strrchr(in, '/') : NULL;
        const char *in_base = slash ? slash + 1 : in;
        if (!t || t->file < base) {
            errbuf_set(err, errlen, "%s: missing tensor '%s' (index says it is in %s)", ipath,
                       st_shown(nb, sizeof nb, key), f);
            goto done;
        }
        if (strcmp(in_base, f) != 0) {
            errbuf_set(err, errlen, "%s: tensor '%s' is in %s, but the index says %s", ipath,
                       st_shown(nb, sizeof nb, key), in_base, f);
            goto done;
        }
    }
    rc = 0;

done:
    if (rc != 0) st_truncate(st, base);
    free(names);
    json_decref(root);
    return rc;
}

/* No index, no model.safetensors: every *.safetensors in dir, in sorted order. */
static int st_open_all(SafeTensors *st, const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d) { errbuf_set(err, errlen, "%s: %s", dir, strerror(errno)); return -1; }
    char **names = NULL;
    int n = 0, cap = 0, rc = 0, base = st->n_files;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !st_has_suffix(e->d_name, ".safetensors")) continue;
        if (n == cap) names = xrealloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (!n) { errbuf_set(err, errlen, "no .safetensors files in %s", dir); rc = -1; }
    if (n) qsort(names, n, sizeof *names, st_cmp_str);
    char path[4096];
    for (int i = 0; i < n && rc == 0; i++)
        rc = safetensors_open_file(st, path_join(path, sizeof path, dir, names[i]), err, errlen);
    if (rc != 0) st_truncate(st, base);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int safetensors_open_dir(SafeTensors *st, const char *dir, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) { errbuf_set(err, errlen, "%s: %s", dir, strerror(errno)); return -1; }
    if (!S_ISDIR(sb.st_mode)) return safetensors_open_file(st, dir, err, errlen);
    char path[4096];
    if (file_exists(path_join(path, sizeof path, dir, ST_INDEX_NAME)))
        return st_open_index(st, dir, path, err, errlen);
    if (file_exists(path_join(path, sizeof path, dir, "model.safetensors")))
        return safetensors_open_file(st, path, err, errlen);
    return st_open_all(st, dir, err, errlen);
}

const StTensor *safetensors_find(const SafeTensors *st, const char *name)
{
    if (!st->n_tensors) return NULL;
    StTensor key = {.name = (char *)name};
    return bsearch(&key, st->tensors, st->n_tensors, sizeof *st->tensors, st_cmp_name);
}

const char *safetensors_file_of(const SafeTensors *st, const StTensor *t)
{
    return t && t->file >= 0 && t->file < st->n_files ? st->files[t->file].path : NULL;
}

void safetensors_free(SafeTensors *st)
{
    st_truncate(st, 0);
}

/* ---- public API: writer --------------------------------------------------------------- */

size_t stspec_nbytes(const StSpec *s)
{
    int64_t numel;
    uint64_t nb;
    if (s->ndim < 0 || s->ndim > ST_MAX_DIMS || (unsigned)s->dtype >= DT_COUNT
        || st_sizes(s->dtype, s->shape, s->ndim, &numel, &nb) != 0 || nb > INT64_MAX)
        return SIZE_MAX;
    return (size_t)nb;
}

static int st_put_u64le(FILE *f, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return fwrite(b, 1, 8, f) == 8 ? 0 : -1;
}

/* The header JSON for specs, in their order, offsets consecutive. NULL with err set. */
static char *st_header_json(const char *path, const StSpec *specs, int n, const char *metadata_format,
                            size_t *total, char *err, size_t errlen)
{
    json_t *root = json_object();
    char nb[ST_NAME_SHOWN + 8];
    uint64_t off = 0;
    if (metadata_format) {
        json_t *m = json_object();
        json_object_set_new(root, "__metadata__", m);
        if (json_object_set_new(m, "format", json_string(metadata_format)) != 0) {
            errbuf_set(err, errlen, "%s: metadata format is not UTF-8", path);
            json_decref(root);
            return NULL;
        }
    }
    for (int i = 0; i < n; i++) {
        const StSpec *s = &specs[i];
        const char *name = s->name ? s->name : "";
        size_t nbytes = stspec_nbytes(s);
        const char *why = !*name ? "empty name"
                        : strcmp(name, "__metadata__") == 0 ? "reserved name"
                        : json_object_get(root, name) ? "duplicate name"
                        : nbytes == SIZE_MAX ? "bad dtype or shape"
                        : off + nbytes > INT64_MAX ? "data past 2^63 bytes" : NULL;
        json_t *e = NULL;
        if (!why) {
            json_t *shape = json_array(), *offs = json_array();
            for (int d = 0; d < s->ndim; d++) json_array_append_new(shape, json_integer(s->shape[d]));
            json_array_append_new(offs, json_integer((json_int_t)off));
            json_array_append_new(offs, json_integer((json_int_t)(off + nbytes)));
            e = json_object();
            json_object_set_new(e, "dtype", json_string(dtype_name(s->dtype)));
            json_object_set_new(e, "shape", shape);
            json_object_set_new(e, "data_offsets", offs);
            if (json_object_set_new(root, name, e) != 0) why = "name is not UTF-8";
        }
        if (why) {
            errbuf_set(err, errlen, "%s: tensor %d '%s': %s", path, i, st_shown(nb, sizeof nb, name), why);
            json_decref(root);
            return NULL;
        }
        off += nbytes;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    CHECK(text, "json_dumps of the safetensors header failed");
    *total = (size_t)off;
    return text;
}

int stw_open(StWriter *w, const char *path, const StSpec *specs, int n,
             const char *metadata_format, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    size_t total;
    char *text = st_header_json(path, specs, n, metadata_format, &total, err, errlen);
    if (!text) return -1;
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    FILE *f = fopen(path, "wb");
    if (!f) {
        errbuf_set(err, errlen, "%s: %s", path, strerror(errno));
        free(text);
        return -1;
    }
    int bad = st_put_u64le(f, padded) != 0 || fwrite(text, 1, len, f) != len;
    for (size_t i = len; i < padded && !bad; i++) bad = fputc(' ', f) == EOF;
    free(text);
    if (bad) {
        errbuf_set(err, errlen, "%s: writing the header: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    w->f = f;
    w->path = xstrdup(path);
    w->expected = total;
    w->written = 0;
    return 0;
}

int stw_write(StWriter *w, const void *data, size_t nbytes, char *err, size_t errlen)
{
    if (!w->f) { errbuf_set(err, errlen, "stw_write: writer is not open"); return -1; }
    if (nbytes > w->expected - w->written) {
        errbuf_set(err, errlen, "%s: %zu more bytes would pass the %zu announced (%zu written)",
                   w->path, nbytes, w->expected, w->written);
        return -1;
    }
    if (nbytes && fwrite(data, 1, nbytes, w->f) != nbytes) {
        errbuf_set(err, errlen, "%s: %s", w->path, strerror(errno));
        return -1;
    }
    w->written += nbytes;
    return 0;
}

int stw_close(StWriter *w, char *err, size_t errlen)
{
    if (!w->f) { free(w->path); memset(w, 0, sizeof *w); return 0; }
    int rc = 0;
    if (w->written != w->expected) {
        errbuf_set(err, errlen, "%s: %zu of %zu data bytes written", w->path, w->written, w->expected);
        rc = -1;
    }
    int bad = fflush(w->f) != 0 || ferror(w->f);
    int e = errno;
    if (fclose(w->f) != 0 && !bad) { bad = 1; e = errno; }
    if (bad && rc == 0) {
        errbuf_set(err, errlen, "%s: %s", w->path, strerror(e));
        rc = -1;
    }
    free(w->path);
    memset(w, 0, sizeof *w);
    return rc;
}

int st_index_write(const char *dir, const char *const *names, const char *const *shard_of, int n,
                   uint64_t total_size, char *err, size_t errlen)
{
    char path[4096], nb[ST_NAME_SHOWN + 8];
    path_join(path, sizeof path, dir, ST_INDEX_NAME);
    if (total_size > INT64_MAX) {
        errbuf_set(err, errlen, "%s: total_size %llu too large", path, (unsigned long long)total_size);
        return -1;
    }
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total_size));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", wm);
    for (int i = 0; i < n; i++) {
        json_t *f = shard_of[i] ? json_string(shard_of[i]) : NULL;
        const char *why = !names[i] || !*names[i] ? "empty name"
                        : json_object_get(wm, names[i]) ? "duplicate name"
                        : !f || st_bad_shard_name(shard_of[i]) ? "bad file name" : NULL;
        if (why || json_object_set_new(wm, names[i], f) != 0) {
            if (why) json_decref(f);
            errbuf_set(err, errlen, "%s: tensor '%s': %s", path,
                       st_shown(nb, sizeof nb, names[i] ? names[i] : ""), why ? why : "name is not UTF-8");
            json_decref(root);
            return -1;
        }
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    CHECK(text, "json_dumps of the index failed");
    FILE *f = fopen(path, "w");
    if (!f) {
        errbuf_set(err, errlen, "%s: %s", path, strerror(errno));
        free(text);
        return -1;
    }
    int bad = fputs(text, f) == EOF || fputc('\n', f) == EOF;
    free(text);
    bad |= fclose(f) != 0;
    if (bad) { errbuf_set(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    return 0;
}
