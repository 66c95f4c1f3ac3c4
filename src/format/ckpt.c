/* ckpt: the checkpoint writer behind `moeserve synth` and `moeserve quantize` (ckpt.h). A plan
 * of source tensors is split into shards; each shard is opened with its full header
 * (safetensors' streaming writer) and filled entry by entry from the caller's fetch callback.
 * NVFP4 entries are quantized with ModelOpt's recipe (NVFP4QTensor.quantize, quant.h) by
 * ckpt_nvfp4_quantize, the fast twin of quant.c's nvfp4_quantize, in parallel over row blocks:
 * each block is quantized the same way whatever the thread count, so the bytes do not depend
 * on it. One I/O thread writes an entry while the next is computed. Tested by
 * tests/unit/test_synth.c (`make test FILTER=synth`). */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../base/progress.h"
#include "../base/util.h"

#define CKPT_CHUNK_BYTES (64u << 20)   /* plain tensors are fetched and written in row blocks of this size */
#define CKPT_BLOCK_FLOATS 65536        /* NVFP4: floats per thread-local row block (256 KB) */
#define CKPT_FP4_GLOBAL 2688.0f        /* 6 * 448: weight_scale_2 = amax / 2688 */

/* ---- types ---- */

/* One write handed to the I/O thread: up to four pieces appended to sw. */
typedef struct {
    StWriter *sw;            /* borrowed */
    const void *ptr[4];      /* borrowed */
    size_t len[4];
    int n;
    int borrowed;            /* ptr[0] is fetched data, alive for one more fetch only */
} IoJob;

/* The I/O thread writes one job while the caller computes the next: at most one in flight. */
typedef struct {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    IoJob job;               /* the caller leaves it alone while busy */
    int busy, quit, failed;
    char err[512];
    double t_busy;           /* seconds spent writing */
} Io;

/* Writer state: the plan, the caller's data, the I/O thread and the buffers reused across
   entries. NVFP4 output alternates between two sets: one being written, one being filled. */
typedef struct {
    const CkptPlan *p;
    CkptFetch fetch;
    void *ctx;
    float *amax;               /* [n] per entry, NAN until computed (NVFP4 entries only) */
    uint8_t *codes[2], *scales[2];
    size_t codes_cap[2], scales_cap[2];
    float scalar[2][2];        /* weight_scale_2, input_scale of each set */
    int set;
    Io io;
    int fetches_since_post;
    double t_fetch, t_amax, t_quant, t_stall; /* seconds in each step; stall: waiting for the disk */
} Writer;

/* ---- helpers ---- */

static int64_t entry_numel(const CkptEntry *e)
{
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    return n;
}

static uint64_t entry_src_bytes(const CkptEntry *e)
{
    return ((uint64_t)entry_numel(e) * (uint64_t)dtype_bits(e->dtype) + 7) / 8;
}

/* Bytes the entry takes in the output: as is, or codes + scales + two F32 scalars. */
static uint64_t entry_out_bytes(const CkptEntry *e)
{
    if (!e->nvfp4) return entry_src_bytes(e);
    uint64_t N = (uint64_t)e->shape[0], K = (uint64_t)e->shape[1];
    return N * (K / 2) + N * (K / 16) + 8;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Layer index of "model.layers.N.<...>", else -1. */
static int layer_of(const char *name)
{
    if (strncmp(name, "model.layers.", 13) != 0) return -1;
    char *end;
    long v = strtol(name + 13, &end, 10);
    return end != name + 13 && *end == '.' && v >= 0 && v < (1 << 20) ? (int)v : -1;
}

static void exclude_push(QuantConfig *q, const char *pattern)
{
    for (int i = 0; i < q->n_exclude; i++)
        if (!strcmp(q->exclude[i], pattern)) return;
    q->exclude = xrealloc(q->exclude, (size_t)(q->n_exclude + 1) * sizeof *q->exclude);
    q->exclude[q->n_exclude++] = xstrdup(pattern);
}

static inline uint16_t u16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* src row of n elements of dtype t -> float. */
static void row_to_f32(DType t, const uint8_t *src, int64_t n, float *dst)
{
    switch (t) {
    case DT_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)u16_at(src + 2 * i) << 16;
            memcpy(&dst[i], &u, 4);
        }
        break;
    case DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(u16_at(src + 2 * i));
        break;
    default: die("ckpt: row_to_f32: dtype %s is not a float format", dtype_name(t));
    }
}

/* max |x| over [N, K] of dtype t, or +inf where any value is NaN or infinite (write_nvfp4 then
 * refuses the tensor: its weight_scale_2 would not be finite). Rows in parallel; max is exact, so
 * the result does not depend on the split. */
static float tensor_amax(DType t, const uint8_t *src, int64_t N, int64_t K)
{
    const size_t es = (size_t)dtype_bits(t) / 8;
    float m = 0.0f;
    if (t == DT_BF16) {
        /* |bf16| orders like its low 15 bits; 0x7f80 is inf, above it NaN: both order above every
         * finite value, so the max is 0x7f80 or more iff one is there */
        uint32_t mb = 0;
#pragma omp parallel for reduction(max : mb) schedule(static)
        for (int64_t r = 0; r < N; r++) {
            const uint8_t *row = src + (size_t)r * K * es;
            uint32_t rm = 0;
#pragma omp simd reduction(max : rm)
            for (int64_t k = 0; k < K; k++) {
                uint32_t a = u16_at(row + 2 * k) & 0x7fffu;
                rm = a > rm ? a : rm;
            }
            if (rm > mb) mb = rm;
        }
        return mb >= 0x7f80u ? INFINITY : bf16_to_f32((uint16_t)mb);
    }
    int bad = 0;
#pragma omp parallel reduction(max : m) reduction(| : bad)
    {
        float *buf = xmalloc((size_t)K * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            row_to_f32(t, src + (size_t)r * K * es, K, buf);
            for (int64_t k = 0; k < K; k++) {
                float a = fabsf(buf[k]);
                bad |= !isfinite(a);
                if (a > m) m = a;
            }
        }
        free(buf);
    }
    return bad ? INFINITY : m;
}

/* ---- helpers: the I/O thread ---- */

static void *io_main(void *arg)
{
    Io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->busy && !io->quit) pthread_cond_wait(&io->cv, &io->mu);
        if (!io->busy) break;
        pthread_mutex_unlock(&io->mu);
        double t0 = clock_now();
        char err[512];
        int rc = 0;
        for (int k = 0; k < io->job.n && rc == 0; k++)
            rc = stw_write(io->job.sw, io->job.ptr[k], io->job.len[k], err, sizeof err);
        double dt = clock_now() - t0;
        pthread_mutex_lock(&io->mu);
        io->t_busy += dt;
        if (rc && !io->failed) {
            io->failed = 1;
            snprintf(io->err, sizeof io->err, "%s", err);
        }
        io->busy = 0;
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Wait until the job in flight is written. -1 with err set if any write failed. */
static int io_wait(Writer *w, char *err, size_t errlen)
{
    Io *io = &w->io;
    double t0 = clock_now();
    pthread_mutex_lock(&io->mu);
    while (io->busy) pthread_cond_wait(&io->cv, &io->mu);
    int failed = io->failed;
    pthread_mutex_unlock(&io->mu);
    w->t_stall += clock_now() - t0;
    if (failed) errbuf_set(err, errlen, "%s", io->err);
    return failed ? -1 : 0;
}

static int io_post(Writer *w, const IoJob *job, char *err, size_t errlen)
{
    if (io_wait(w, err, errlen)) return -1;
    pthread_mutex_lock(&w->io.mu);
    w->io.job = *job;
    w->io.busy = 1;
    pthread_cond_broadcast(&w->io.cv);
    pthread_mutex_unlock(&w->io.mu);
    w->fetches_since_post = 0;
    return 0;
}

/* The caller's data for rows [r0, r1) of entry i. The job in flight may point at the previous
   fetch, which the callback keeps alive for one more call only. */
static const void *fetch_rows(Writer *w, int i, int64_t r0, int64_t r1)
{
    if (w->io.job.borrowed && w->fetches_since_post >= 1) {
        char err[8];
        io_wait(w, err, sizeof err); /* a failed write is reported by the next post */
        w->io.job.borrowed = 0;
    }
    double t0 = clock_now();
    const void *d = w->fetch(w->ctx, i, r0, r1);
    w->t_fetch += clock_now() - t0;
    w->fetches_since_post++;
    CHECK(d, "ckpt: no data for tensor '%s'", w->p->e[i].name);
    return d;
}

static const void *fetch_all(Writer *w, int i)
{
    return fetch_rows(w, i, 0, ckpt_entry_rows(&w->p->e[i]));
}

static float entry_amax(Writer *w, int i, const void *data)
{
    if (isnan(w->amax[i])) {
        const CkptEntry *e = &w->p->e[i];
        if (!data) data = fetch_all(w, i);
        double t0 = clock_now();
        w->amax[i] = tensor_amax(e->dtype, data, e->shape[0], e->shape[1]);
        w->t_amax += clock_now() - t0;
    }
    return w->amax[i];
}

static void grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return;
    free(*buf);
    *buf = xmalloc(need);
    *cap = need;
}

/* ---- core: NVFP4 ---- */

void ckpt_nvfp4_quantize(const float *w, int64_t N, int64_t K, float g, uint8_t *codes, uint8_t *scales)
{
    CHECK(K % 16 == 0 && g > 0.0f, "ckpt_nvfp4_quantize: K = %lld, g = %g", (long long)K, (double)g);
    const float g6 = 6.0f * g;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < K / 16; b++) {
            const float *x = w + n * K + b * 16;
            float amax = 0.0f;
#pragma omp simd reduction(max : amax)
            for (int j = 0; j < 16; j++) {
                float a = fabsf(x[j]);
                amax = a > amax ? a : amax; /* NaN never wins, as in quant.c */
            }
            /* the block scale exactly as nvfp4_quantize computes it */
            float s = amax / g6;
            if (s == 0.0f) s = 1.0f;
            s = s < 0x1p-9f ? 0x1p-9f : s > 448.0f ? 448.0f : s;
            const uint8_t sc = f32_to_e4m3(s);
            scales[n * (K / 16) + b] = sc;
            const float d = e4m3_to_f32(sc) * g;
            /* f32_to_e2m1 without branches: 7 minus the boundaries at or above |y| (<= at the
               ties that round down, < at those that round up); NaN passes none and gives 7 */
            uint8_t q[16];
#pragma omp simd
            for (int j = 0; j < 16; j++) {
                const float y = x[j] / d, a = fabsf(y);
                int m = 7 - (a <= 0.25f) - (a < 0.75f) - (a <= 1.25f) - (a < 1.75f) - (a <= 2.5f) - (a < 3.5f) -
                        (a <= 5.0f);
                q[j] = (uint8_t)((y < 0.0f ? 8 : 0) | m);
            }
            uint8_t *c = codes + n * (K / 2) + b * 8;
            for (int j = 0; j < 8; j++) c[j] = (uint8_t)(q[2 * j] | q[2 * j + 1] << 4);
        }
    }
}

/* ---- core: one entry ---- */

static int write_nvfp4(Writer *w, StWriter *sw, int i, char *err, size_t errlen)
{
    const CkptEntry *e = &w->p->e[i];
    const int64_t N = e->shape[0], K = e->shape[1];
    /* gate and up share weight_scale_2 = max(amax_gate, amax_up) / 2688: engines fuse the two into one
       GEMM and need one global scale (ModelOpt's sync_moe_gate_up_amax) */
    float amax = e->partner >= 0 ? entry_amax(w, e->partner, NULL) : 0.0f;
    const uint8_t *src = fetch_all(w, i);
    float a = entry_amax(w, i, src);
    if (isinf(a) || isinf(amax)) { /* NaN or infinity in the weight (or in the partner it shares weight_scale_2 with) */
        errbuf_set(err, errlen, "tensor '%s': NaN or infinite values: it cannot be quantized to NVFP4 (its weight_scale_2 would "
                   "not be finite)", isinf(a) ? e->name : w->p->e[e->partner].name);
        return -1;
    }
    if (a > amax) amax = a;
    float g = amax / CKPT_FP4_GLOBAL;
    if (!(g > 0.0f)) g = 1.0f; /* all zeros: nvfp4_global_scale's choice */

    /* the other set may still be on its way to the disk */
    const int set = w->set ^= 1;
    grow(&w->codes[set], &w->codes_cap[set], (size_t)(N * (K / 2)));
    grow(&w->scales[set], &w->scales_cap[set], (size_t)(N * (K / 16)));
    const size_t es = (size_t)dtype_bits(e->dtype) / 8;
    const int64_t rows = K >= CKPT_BLOCK_FLOATS ? 1 : CKPT_BLOCK_FLOATS / K;
    const int64_t nblk = (N + rows - 1) / rows;
    uint8_t *codes = w->codes[set], *scales = w->scales[set];
    double t0 = clock_now();
#pragma omp parallel
    {
        float *buf = xmalloc((size_t)(rows * K) * sizeof(float));
#pragma omp for schedule(dynamic, 4)
        for (int64_t b = 0; b < nblk; b++) {
            int64_t r0 = b * rows, nr = r0 + rows <= N ? rows : N - r0;
            for (int64_t r = 0; r < nr; r++) row_to_f32(e->dtype, src + (size_t)((r0 + r) * K) * es, K, buf + r * K);
            ckpt_nvfp4_quantize(buf, nr, K, g, codes + r0 * (K / 2), scales + r0 * (K / 16));
        }
        free(buf);
    }
    w->t_quant += clock_now() - t0;
    w->scalar[set][0] = g;
    w->scalar[set][1] = CKPT_INPUT_SCALE;
    IoJob job = {.sw = sw, .n = 4, .ptr = {codes, scales, &w->scalar[set][0], &w->scalar[set][1]},
                 .len = {(size_t)(N * (K / 2)), (size_t)(N * (K / 16)), 4, 4}};
    return io_post(w, &job, err, errlen);
}

static int write_plain(Writer *w, StWriter *sw, int i, char *err, size_t errlen)
{
    const CkptEntry *e = &w->p->e[i];
    const uint64_t bytes = entry_src_bytes(e);
    int64_t rows = ckpt_entry_rows(e);
    if (rows < 1 || bytes % (uint64_t)rows) rows = 1; /* sub-byte rows: one piece */
    const uint64_t row_bytes = bytes / (uint64_t)rows;
    int64_t chunk = row_bytes >= CKPT_CHUNK_BYTES ? 1 : (int64_t)(CKPT_CHUNK_BYTES / (row_bytes ? row_bytes : 1));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
        IoJob job = {.sw = sw, .n = 1, .borrowed = 1, .ptr = {fetch_rows(w, i, r0, r1)},
                     .len = {(size_t)((uint64_t)(r1 - r0) * row_bytes)}};
        if (io_post(w, &job, err, errlen)) return -1;
    }
    return 0;
}

/* Output tensor specs of entry e into out (1 or 4), with owned names. */
static int entry_specs(const CkptEntry *e, StSpec *out)
{
    if (!e->nvfp4) {
        out[0] = (StSpec){.name = xstrdup(e->name), .dtype = e->dtype, .ndim = e->ndim};
        memcpy(out[0].shape, e->shape, sizeof e->shape);
        return 1;
    }
    static const char *const sfx[4] = {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"};
    size_t base = strlen(e->name) - strlen(".weight");
    char *nm[4];
    for (int k = 0; k < 4; k++) {
        nm[k] = xmalloc(base + strlen(sfx[k]) + 1);
        memcpy(nm[k], e->name, base);
        strcpy(nm[k] + base, sfx[k]);
    }
    int64_t N = e->shape[0], K = e->shape[1];
    out[0] = (StSpec){.name = nm[0], .dtype = DT_U8, .ndim = 2, .shape = {N, K / 2}};
    out[1] = (StSpec){.name = nm[1], .dtype = DT_F8_E4M3, .ndim = 2, .shape = {N, K / 16}};
    out[2] = (StSpec){.name = nm[2], .dtype = DT_F32, .ndim = 0};
    out[3] = (StSpec){.name = nm[3], .dtype = DT_F32, .ndim = 0};
    return 4;
}

/* Remove model.safetensors, the index and model-NNNNN-of-NNNNN.safetensors from dir. */
static void remove_old_weights(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, "model.safetensors") || !strcmp(n, "model.safetensors.index.json") ||
            !fnmatch("model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors", n, 0))
            unlink(path_join(path, sizeof path, dir, n));
    }
    closedir(d);
}

/* ---- public API ---- */

int ckpt_plan_add(CkptPlan *p, const char *name, DType dtype, int ndim, const int64_t *shape)
{
    CHECK(ndim >= 0 && ndim <= ST_MAX_DIMS, "ckpt_plan_add %s: %d dims", name, ndim);
    if (p->n == p->cap) p->e = xrealloc(p->e, (size_t)(p->cap = p->cap ? 2 * p->cap : 256) * sizeof *p->e);
    CkptEntry *e = &p->e[p->n];
    *e = (CkptEntry){.name = xstrdup(name), .dtype = dtype, .ndim = ndim, .partner = -1};
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    return p->n++;
}

void ckpt_plan_free(CkptPlan *p)
{
    for (int i = 0; i < p->n; i++) free(p->e[i].name);
    free(p->e);
    *p = (CkptPlan){0};
}

int64_t ckpt_entry_rows(const CkptEntry *e)
{
    return e->ndim >= 2 ? e->shape[0] : 1;
}

uint64_t ckpt_plan_bytes(const CkptPlan *p)
{
    uint64_t b = 0;
    for (int i = 0; i < p->n; i++) b += entry_out_bytes(&p->e[i]);
    return b;
}

double ckpt_plan_params(const CkptPlan *p)
{
    double n = 0;
    for (int i = 0; i < p->n; i++) n += (double)entry_numel(&p->e[i]);
    return n;
}

void ckpt_add_excludes(QuantConfig *q, const char *list)
{
    const char *s = list;
    while (s && *s) {
        const char *c = strchr(s, ',');
        size_t n = c ? (size_t)(c - s) : strlen(s);
        if (n) {
            char *pat = xmalloc(n + 1);
            memcpy(pat, s, n);
            pat[n] = 0;
            exclude_push(q, pat);
            free(pat);
        }
        s = c ? c + 1 : NULL;
    }
}

void ckpt_default_excludes(QuantConfig *q, const ModelConfig *c, const CkptPlan *p)
{
    exclude_push(q, "lm_head");
    exclude_push(q, "model.embed_tokens");
    exclude_push(q, "model.layers.*.mlp.gate");
    /* MTP layers: "model.layers.78*" matches the layer's modules ("path*" = path and path.*) */
    int hi = c->n_layers + c->n_mtp_layers - 1;
    for (int i = 0; i < p->n; i++) {
        int l = layer_of(p->e[i].name);
        if (l > hi) hi = l;
    }
    for (int l = c->n_layers; l <= hi; l++) {
        int present = l < c->n_layers + c->n_mtp_layers;
        for (int i = 0; i < p->n && !present; i++) present = layer_of(p->e[i].name) == l;
        if (!present) continue;
        char pat[64];
        snprintf(pat, sizeof pat, "model.layers.%d*", l);
        exclude_push(q, pat);
    }
}

static int cmp_idx_name(const void *a, const void *b, void *plan)
{
    const CkptPlan *p = plan;
    return strcmp(p->e[*(const int *)a].name, p->e[*(const int *)b].name);
}

int ckpt_plan_nvfp4(CkptPlan *p, QuantConfig *q)
{
    int n_q = 0;
    char module[1024];
    for (int i = 0; i < p->n; i++) {
        CkptEntry *e = &p->e[i];
        e->nvfp4 = 0;
        e->partner = -1;
        if (e->ndim != 2 || !ends_with(e->name, ".weight") || strlen(e->name) >= sizeof module) continue;
        if (e->dtype != DT_BF16 && e->dtype != DT_F16 && e->dtype != DT_F32) continue;
        snprintf(module, sizeof module, "%.*s", (int)(strlen(e->name) - 7), e->name);
        if (quant_config_excluded(q, module)) continue;
        if (e->shape[1] % 16 || e->shape[1] == 0) {
            log_warn("'%s' [%lld, %lld]: in-features not a multiple of 16, kept %s", e->name,
                     (long long)e->shape[0], (long long)e->shape[1], dtype_name(e->dtype));
            exclude_push(q, module);
            continue;
        }
        e->nvfp4 = 1;
        n_q++;
    }
    /* gate_proj <-> up_proj of the same MLP: sorted index of names, binary search */
    int *idx = xmalloc((size_t)(p->n ? p->n : 1) * sizeof(int));
    for (int i = 0; i < p->n; i++) idx[i] = i;
    qsort_r(idx, (size_t)p->n, sizeof(int), cmp_idx_name, p);
    for (int i = 0; i < p->n; i++) {
        CkptEntry *e = &p->e[i];
        if (!e->nvfp4 || !ends_with(e->name, ".gate_proj.weight")) continue;
        snprintf(module, sizeof module, "%.*s.up_proj.weight", (int)(strlen(e->name) - 17), e->name);
        int lo = 0, hi = p->n - 1, found = -1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2, c = strcmp(p->e[idx[mid]].name, module);
            if (!c) { found = idx[mid]; break; }
            if (c < 0) lo = mid + 1; else hi = mid - 1;
        }
        if (found >= 0 && p->e[found].nvfp4 && p->e[found].shape[1] == e->shape[1]) {
            e->partner = found;
            p->e[found].partner = i;
        }
    }
    free(idx);
    return n_q;
}

int ckpt_write(const CkptPlan *p, const char *dir, uint64_t shard_bytes, CkptFetch fetch, void *ctx,
               const char *label, char *err, size_t errlen)
{
    /* shards: consecutive entries while the data fit (an NVFP4 linear's four tensors stay together) */
    const int n = p->n;
    int *shard = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int n_shards = 0, n_out = 0;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = entry_out_bytes(&p->e[i]);
        if (n_shards == 0 || (cur > 0 && cur + b > shard_bytes)) { n_shards++; cur = 0; }
        cur += b;
        total += b;
        shard[i] = n_shards - 1;
        n_out += p->e[i].nvfp4 ? 4 : 1;
    }
    if (n_shards == 0) n_shards = 1;
    StSpec *specs = xmalloc((size_t)(n_out ? n_out : 1) * sizeof(StSpec));
    int *first = xmalloc((size_t)(n + 1) * sizeof(int)); /* entry i -> its first output spec */
    for (int i = 0, o = 0; i <= n; i++) {
        first[i] = o;
        if (i < n) o += entry_specs(&p->e[i], specs + o);
    }
    char (*fname)[64] = xcalloc((size_t)n_shards, sizeof *fname);
    const char **out_name = xmalloc((size_t)(n_out ? n_out : 1) * sizeof(char *));
    const char **out_shard = xmalloc((size_t)(n_out ? n_out : 1) * sizeof(char *));
    remove_old_weights(dir);

    Writer w = {.p = p, .fetch = fetch, .ctx = ctx, .amax = xmalloc((size_t)(n ? n : 1) * sizeof(float))};
    for (int i = 0; i < n; i++) w.amax[i] = NAN;
    pthread_mutex_init(&w.io.mu, NULL);
    pthread_cond_init(&w.io.cv, NULL);
    CHECK(pthread_create(&w.io.th, NULL, io_main, &w.io) == 0, "ckpt: cannot start the I/O thread");
    int rc = 0;
    double t0 = clock_now(), done = 0;
    Progress pg;
    progress_start(&pg, label, total, PROGRESS_BYTES);
    for (int s = 0, i0 = 0; s < n_shards && rc == 0; s++) {
        if (n_shards == 1) snprintf(fname[s], sizeof fname[s], "model.safetensors");
        else snprintf(fname[s], sizeof fname[s], "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        int i1 = i0;
        while (i1 < n && shard[i1] == s) i1++;
        for (int o = first[i0]; o < first[i1]; o++) {
            out_name[o] = specs[o].name;
            out_shard[o] = fname[s];
        }
        char path[4096], e2[512];
        StWriter sw;
        path_join(path, sizeof path, dir, fname[s]);
        if (stw_open(&sw, path, specs + first[i0], first[i1] - first[i0], "pt", err, errlen)) { rc = -1; break; }
        for (int i = i0; i < i1 && rc == 0; i++) {
            rc = p->e[i].nvfp4 ? write_nvfp4(&w, &sw, i, err, errlen) : write_plain(&w, &sw, i, err, errlen);
            done += (double)entry_out_bytes(&p->e[i]);
            progress_add(&pg, entry_out_bytes(&p->e[i]));
        }
        if (io_wait(&w, rc ? e2 : err, rc ? sizeof e2 : errlen)) rc = -1;
        if (stw_close(&sw, rc ? e2 : err, rc ? sizeof e2 : errlen)) rc = -1;
        if (rc == 0 && n_shards > 1) {
            char b1[32], b2[32];
            double t = clock_now() - t0;
            log_debug("%s: %s written (%s of %s, %.0f s, %.2f GB/s)", label, fname[s], /* progress says it */
                     ckpt_fmt_bytes(done, b1, sizeof b1), ckpt_fmt_bytes((double)total, b2, sizeof b2), t,
                     t > 0 ? done / t / 1e9 : 0.0);
        }
        i0 = i1;
    }
    if (rc == 0 && n_shards > 1)
        rc = st_index_write(dir, out_name, out_shard, n_out, total, err, errlen);
    pthread_mutex_lock(&w.io.mu);
    w.io.quit = 1;
    pthread_cond_broadcast(&w.io.cv);
    pthread_mutex_unlock(&w.io.mu);
    pthread_join(w.io.th, NULL);
    pthread_mutex_destroy(&w.io.mu);
    pthread_cond_destroy(&w.io.cv);
    if (rc != 0) remove_old_weights(dir); /* a failed write leaves no partial checkpoint behind */
    if (rc == 0) progress_end(&pg);
    if (rc == 0)
        log_info("%s: %.1f s: data %.1f s, amax %.1f s, quantize %.1f s; writing %.1f s, %.1f s of it not "
                 "overlapped (%d threads)", label, clock_now() - t0, w.t_fetch, w.t_amax, w.t_quant, w.io.t_busy,
                 w.t_stall, omp_get_max_threads());
    for (int o = 0; o < n_out; o++) free((char *)specs[o].name);
    free(specs);
    free(first);
    free(fname);
    free(out_name);
    free(out_shard);
    free(shard);
    free(w.amax);
    for (int k = 0; k < 2; k++) {
        free(w.codes[k]);
        free(w.scales[k]);
    }
    return rc;
}

char *ckpt_json_text(const json_t *root)
{
    /* 15 significant digits print 1e-05, 0.02, 2.5 and 1000000.0 the way Python does */
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    CHECK(s, "json_dumps failed");
    size_t n = strlen(s);
    s = xrealloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = 0;
    return s;
}

int ckpt_write_text(const char *dir, const char *name, const char *text, char *err, size_t errlen)
{
    char path[4096];
    path_join(path, sizeof path, dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) { errbuf_set(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    bad |= fclose(f) != 0;
    if (bad) { errbuf_set(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    return 0;
}

int ckpt_write_nvfp4_configs(const char *dir, const char *config_text, const QuantConfig *q, char *err,
                             size_t errlen)
{
    json_error_t je;
    json_t *cfg = json_loadb_clamped(config_text, strlen(config_text), 0, &je);
    if (!json_is_object(cfg)) {
        errbuf_set(err, errlen, "%s/config.json: invalid JSON at line %d: %s", dir, je.line, je.text);
        json_decref(cfg);
        return -1;
    }
    json_t *ex = json_array();
    for (int i = 0; i < q->n_exclude; i++) json_array_append_new(ex, json_string(q->exclude[i]));
    json_t *producer = json_pack("{s:s, s:s}", "name", "modelopt", "version", CKPT_PRODUCER_VERSION);
    /* config.json quantization_config: ModelOpt's convert_hf_quant_config_format */
    json_t *grp = json_pack("{s:b, s:i, s:i, s:s}", "dynamic", 0, "group_size", 16, "num_bits", 4, "type", "float");
    json_t *qc = json_pack("{s:{s:{s:O, s:O, s:[s]}}, s:O, s:O, s:s, s:s}",
                           "config_groups", "group_0", "input_activations", grp, "weights", grp, "targets", "Linear",
                           "ignore", ex, "producer", producer, "quant_algo", "NVFP4", "quant_method", "modelopt");
    CHECK(qc, "json_pack of quantization_config failed");
    json_object_set_new(cfg, "quantization_config", qc);
    /* hf_quant_config.json: the form TensorRT-LLM and SGLang read */
    json_t *hf = json_pack("{s:O, s:{s:s, s:i, s:n, s:O}}", "producer", producer, "quantization", "quant_algo",
                           "NVFP4", "group_size", 16, "kv_cache_quant_algo", "exclude_modules", ex);
    CHECK(hf, "json_pack of hf_quant_config failed");
    char *t1 = ckpt_json_text(cfg), *t2 = ckpt_json_text(hf);
    int rc = ckpt_write_text(dir, "config.json", t1, err, errlen) ||
             ckpt_write_text(dir, "hf_quant_config.json", t2, err, errlen) ? -1 : 0;
    free(t1);
    free(t2);
    json_decref(grp);
    json_decref(ex);
    json_decref(producer);
    json_decref(cfg);
    json_decref(hf);
    return rc;
}

int ckpt_mkdir(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        errbuf_set(err, errlen, "%s: path too long", dir);
        return -1;
    }
    for (char *q = path + 1;; q++) {
        if (*q != '/' && *q) continue;
        char c = *q;
        *q = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            errbuf_set(err, errlen, "cannot create %s: %s", path, strerror(errno));
            return -1;
        }
        *q = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        errbuf_set(err, errlen, "%s is not a directory", dir);
        return -1;
    }
    return 0;
}

int64_t ckpt_free_bytes(const char *dir)
{
    /* the directory may not exist yet: ask its nearest existing ancestor */
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    struct statvfs s;
    while (statvfs(path, &s) != 0) {
        char *slash = strrchr(path, '/');
        if (!slash) return statvfs(".", &s) == 0 ? (int64_t)s.f_bavail * (int64_t)s.f_frsize : -1;
        if (slash == path) slash[1] = 0;
        else *slash = 0;
        if (!strcmp(path, "/") && statvfs(path, &s) != 0) return -1;
    }
    return (int64_t)s.f_bavail * (int64_t)s.f_frsize;
}

const char *ckpt_fmt_bytes(double b, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (b >= 1000.0 && u < 5) { b /= 1000.0; u++; }
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
    return buf;
}
