/* test_cuda_ops: every CUDA op against its CPU twin on seeded random inputs over several
 * shapes (ragged batches, odd sizes, contexts from 1 to 32k for attention, 1 to 4096 tokens for
 * GEMM and MoE). Pass iff ||cuda - cpu|| / ||cpu|| <= tol, tol named per op with its reason:
 * float32 ops 1e-5 (re-association only); GEMMs on BF16 weights 1e-4 (activations split into
 * two BF16 halves for the tensor cores); top-k selections must be identical. The KV cache ops
 * run for every cache dtype (float32, BF16, FP8 with a per-tensor scale): kv_write must store
 * the same bytes as kv_write_cpu, and attention / the indexer read the same decoded values, so
 * they keep the float32 tolerances. MLA's expanded form (model/mla.c) runs against the CPU's and
 * against the absorbed form. Needs a GPU: `make test-cuda`. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/util.h"
#include "backend/cuda/cuda.h"
#include "backend/cuda/w4.h"
#include "base/knobs.h"
#include "model/forward.h"
#include "batch_fixture.h"
#include "test.h"

#define TOL_F32 1e-5   /* float32 on both sides, different summation order */
#define TOL_SPLIT 1e-4 /* BF16 weights: activations split into two BF16 halves (2^-17 each) */
#define TOL_W4 TOL_SPLIT /* W4A16 (NVFP4 weights): the activations, and the MoE's SwiGLU output,
                            enter the tensor cores as two BF16 halves, like TOL_SPLIT */

static Backend cpu, gpu;
static int ready;

/* the backends given back at exit (before the CUDA runtime's own exit handler, registered when
 * backend_cuda_init first touched the GPU): memcheck's leak check (scripts/memcheck.sh) then sees
 * only what a test itself left allocated, not the backend's scratch and cuBLASLt workspace */
static void teardown(void)
{
    if (gpu.ops && gpu.ops->destroy) gpu.ops->destroy(&gpu);
    if (cpu.ops && cpu.ops->destroy) cpu.ops->destroy(&cpu);
}

static int setup(void)
{
    if (!ready) {
        if (cuda_device_count() == 0) return 0;
        backend_cpu_init(&cpu, 2);
        backend_cuda_init(&gpu, 0);
        atexit(teardown);
        ready = 1;
    }
    return 1;
}

#define NEED_GPU() do { if (!setup()) { test_fail(__FILE__, __LINE__, "no CUDA device"); return; } } while (0)

/* the KV cache dtypes, and the FP8 scales the tests use (k | v differ, neither a power of 2) */
static const KVDtype kv_dtypes[3] = {KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_FP8};

/* MOESERVE_W4_ACT's choices (split|bf16) */
enum { W4_ACT_SPLIT, W4_ACT_BF16 };
/* MOESERVE_W4_SK_CLUSTER's and _KSPLIT's choice for v blocks (auto|1|2|4; 0: auto) */
static long sk_choice(int v) { return v == 4 ? 3 : v; }
/* a tile's name, or "the choice" (-1) */
static const char *tile_name(int tile) { return tile >= 0 ? w4_tiles[tile].name : "the choice"; }
#define KV_KSCALE 0.05f
#define KV_VSCALE 0.03f

static float *rnd(Rng *r, size_t n, float scale)
{
    float *v = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) v[i] = rng_normal(r) * scale;
    return v;
}

static void *up(const void *h, size_t bytes)
{
    void *d = be_alloc(&gpu, bytes);
    be_to_device(&gpu, d, h, bytes);
    return d;
}

static float *down(const void *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 1);
    be_to_host(&gpu, h, d, n * sizeof(float));
    return h;
}


#define EXPECT_CLOSE(got, ref, n, tol, ...) do { double e_ = test_rel_l2(got, ref, n); \
    if (!(e_ <= (tol))) { test_fail(__FILE__, __LINE__, "rel err %.3g > %.3g", e_, (double)(tol)); \
        fprintf(stderr, "      case: " __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* ---- elementwise and norms ---- */

TEST(cuda_rmsnorm_layernorm)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 11);
    int shapes[][2] = {{1, 64}, {7, 128}, {33, 576}, {130, 6144}, {3, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], dim = shapes[s][1], ld = dim + 3;
        float *x = rnd(&r, (size_t)rows * ld, 2), *w = rnd(&r, dim, 1), *b = rnd(&r, dim, 1);
        float *ref = calloc((size_t)rows * dim, 4), *ref2 = calloc((size_t)rows * dim, 4);
        rmsnorm_cpu(&cpu, ref, dim, x, ld, w, rows, dim, 1e-5f);
        layernorm_cpu(&cpu, ref2, dim, x, ld, w, b, rows, dim, 1e-6f);
        float *dx = up(x, (size_t)rows * ld * 4), *dw = up(w, dim * 4), *db = up(b, dim * 4);
        float *dout = be_alloc(&gpu, (size_t)rows * dim * 4);
        be_rmsnorm(&gpu, dout, dim, dx, ld, dw, rows, dim, 1e-5f);
        float *got = down(dout, (size_t)rows * dim);
        EXPECT_CLOSE(got, ref, (size_t)rows * dim, TOL_F32, "rmsnorm %d x %d", rows, dim);
        free(got);
        be_layernorm(&gpu, dout, dim, dx, ld, dw, db, rows, dim, 1e-6f);
        got = down(dout, (size_t)rows * dim);
        EXPECT_CLOSE(got, ref2, (size_t)rows * dim, TOL_F32, "layernorm %d x %d", rows, dim);
        free(got);
        be_free(&gpu, dx); be_free(&gpu, dw); be_free(&gpu, db); be_free(&gpu, dout);
        free(x); free(w); free(b); free(ref); free(ref2);
    }
}

TEST(cuda_rope_both_layouts)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 12);
    int cases[][5] = {/* T, heads, head_stride, rot_off, rot_dim */
                      {1, 1, 64, 0, 64}, {9, 4, 48, 32, 16}, {37, 96, 128, 0, 64}, {5, 64, 256, 192, 64}, {3, 32, 128, 0, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int inter = 0; inter < 2; inter++) {
            int T = cases[c][0], H = cases[c][1], hs = cases[c][2], off = cases[c][3], rd = cases[c][4], ld = H * hs;
            float *x = rnd(&r, (size_t)T * ld, 1), *x2 = malloc((size_t)T * ld * 4);
            memcpy(x2, x, (size_t)T * ld * 4);
            int *pos = malloc(T * sizeof(int));
            for (int t = 0; t < T; t++) pos[t] = (int)(rng_u64(&r) % 40000);
            float inv[128];
            for (int i = 0; i < rd / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / rd);
            rope_cpu(&cpu, x, ld, T, H, hs, off, rd, pos, inv, 1.0f, inter);
            float *dx = up(x2, (size_t)T * ld * 4), *dinv = up(inv, rd / 2 * 4);
            int *dpos = up(pos, T * sizeof(int));
            be_rope(&gpu, dx, ld, T, H, hs, off, rd, dpos, dinv, 1.0f, inter);
            float *got = down(dx, (size_t)T * ld);
            /* angles up to 4e4 rad: cosf/sinf argument reduction differs between libm and CUDA */
            EXPECT_CLOSE(got, x, (size_t)T * ld, 1e-4, "rope T %d H %d rd %d interleave %d", T, H, rd, inter);
            free(got); free(x); free(x2); free(pos);
            be_free(&gpu, dx); be_free(&gpu, dinv); be_free(&gpu, dpos);
        }
}

/* be_argmax on the GPU against argmax_cpu: vocabularies from 1 to 154880 (the float4 path and
 * the scalar tail; an odd n leaves rows after the first unaligned), ties (the lowest index),
 * NaN (never wins, except at index 0 where the CPU starts), -inf rows, several rows */
TEST(cuda_argmax)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 31);
    const int ns[] = {1, 3, 5, 1000, 4097, 154880, 154881};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int rows = 1; rows <= 3; rows += 2) {
            int n = ns[k];
            size_t m = (size_t)rows * n;
            float *x = rnd(&r, m, 1);
            for (int q = 0; q < rows; q++) {
                float *v = x + (size_t)q * n;
                if (q == 1 && n > 4) { /* a tie of the maximum far apart, a NaN before it */
                    v[n - 1] = 100.f;
                    v[n / 3] = 100.f;
                    v[n / 4] = NAN;
                }
                if (q == 2) { /* NaN at 0, and -inf everywhere else */
                    v[0] = NAN;
                    for (int i = 1; i < n; i++) v[i] = -INFINITY;
                }
            }
            int *ref = malloc((size_t)rows * 4), *got = malloc((size_t)rows * 4);
            argmax_cpu(&cpu, ref, x, rows, n);
            float *dx = up(x, m * 4);
            int *dout = be_alloc(&gpu, (size_t)rows * 4);
            be_argmax(&gpu, dout, dx, rows, n);
            be_to_host(&gpu, got, dout, (size_t)rows * 4);
            for (int q = 0; q < rows; q++) EXPECT(got[q] == ref[q], "argmax n %d row %d: %d, cpu %d", n, q, got[q], ref[q]);
            free(x); free(ref); free(got);
            be_free(&gpu, dx); be_free(&gpu, dout);
        }
}

TEST(cuda_elementwise)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 13);
    int T = 19, F = 777, D = 130;
    size_t n = (size_t)T * F;
    float *g = rnd(&r, n, 3), *u = rnd(&r, n, 1), *ref = malloc(n * 4), *ref2 = malloc(n * 4);
    swiglu_cpu(&cpu, ref, g, u, F, T, F);
    add_cpu(&cpu, ref2, g, u, n);
    float *dg = up(g, n * 4), *du = up(u, n * 4), *dout = be_alloc(&gpu, n * 4);
    be_swiglu(&gpu, dout, dg, du, F, T, F);
    float *got = down(dout, n);
    EXPECT_CLOSE(got, ref, n, TOL_F32, "swiglu");
    free(got);
    /* the halves of a fused gate/up GEMM's rows: gate and up F apart in rows of F, 388 wide */
    swiglu_cpu(&cpu, ref, g, g + 388, F, T, 388);
    be_swiglu(&gpu, dout, dg, dg + 388, F, T, 388);
    got = down(dout, (size_t)T * 388);
    EXPECT_CLOSE(got, ref, (size_t)T * 388, TOL_F32, "swiglu, strided halves");
    free(got);
    be_add(&gpu, dout, dg, du, n);
    got = down(dout, n);
    EXPECT_CLOSE(got, ref2, n, TOL_F32, "add");
    free(got);
    /* get_rows and kv_write */
    int rows[5] = {4, 0, 18, 7, 7};
    float *gr = malloc(5 * D * 4);
    get_rows_cpu(&cpu, gr, g, F, rows, 5, D);
    int *drows = up(rows, sizeof rows);
    be_get_rows(&gpu, dout, dg, F, drows, 5, D);
    got = down(dout, 5 * D);
    EXPECT_CLOSE(got, gr, 5 * D, 0, "get_rows");
    free(got);
    /* kv_write in every cache dtype: the same bytes (one codec, kv_elem.h); slot -1 is padding */
    int slots[5] = {9, 2, 31, -1, 0};
    int *dslots = up(slots, sizeof slots);
    for (int d = 0; d < 3; d++)
        for (int si = 0; si < 2; si++) {
            KVDtype dt = kv_dtypes[d];
            float scale = si ? KV_KSCALE : 1.0f;
            size_t bytes = 32 * 50 * kv_elem_size(dt);
            uint8_t *cache = calloc(bytes, 1), *hgot = malloc(bytes);
            kv_write_cpu(&cpu, cache, dt, scale, 50, 7, g, F, 40, slots, 5);
            void *dcache = be_alloc(&gpu, bytes);
            be_kv_write(&gpu, dcache, dt, scale, 50, 7, dg, F, 40, dslots, 5);
            be_to_host(&gpu, hgot, dcache, bytes);
            EXPECT(!memcmp(hgot, cache, bytes), "kv_write %s scale %g: bytes differ", model_kv_dtype_name(dt), scale);
            free(cache); free(hgot);
            be_free(&gpu, dcache);
        }
    free(g); free(u); free(ref); free(ref2); free(gr);
    be_free(&gpu, dg); be_free(&gpu, du); be_free(&gpu, dout); be_free(&gpu, drows); be_free(&gpu, dslots);
}

/* ---- weights in every stored format ---- */

typedef struct {
    QTensor host, dev;
    void *hbuf, *hscale, *dbuf, *dscale;
} TW;

/* A random [N, K] weight in format fmt (host copy + device copy). */
static TW tw_make(Rng *r, QFormat fmt, int N, int K)
{
    TW t = {0};
    float *w = rnd(r, (size_t)N * K, 1.0f / sqrtf((float)K));
    size_t n = (size_t)N * K;
    QTensor q = {.fmt = fmt, .rows = N, .cols = K, .gscale = 1.0f, .scale_dtype = DT_F32};
    size_t bytes = 0, sbytes = 0;
    switch (fmt) {
    case QF_F32: bytes = n * 4; t.hbuf = malloc(bytes); memcpy(t.hbuf, w, bytes); break;
    case QF_BF16: case QF_F16: {
        bytes = n * 2;
        uint16_t *h = malloc(bytes);
        for (size_t i = 0; i < n; i++) h[i] = fmt == QF_BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
        t.hbuf = h;
        break;
    }
    case QF_FP8: bytes = n; t.hbuf = malloc(bytes); q.gscale = fp8_quantize(w, n, t.hbuf); break;
    case QF_FP8_BLOCK: {
        bytes = n;
        t.hbuf = malloc(bytes);
        sbytes = (size_t)((N + 127) / 128) * ((K + 127) / 128) * 4;
        t.hscale = malloc(sbytes);
        fp8_block_quantize(w, N, K, t.hbuf, t.hscale);
        break;
    }
    case QF_NVFP4:
        bytes = n / 2;
        sbytes = n / 16;
        t.hbuf = malloc(bytes);
        t.hscale = malloc(sbytes);
        q.gscale = nvfp4_quantize(w, N, K, 0, t.hbuf, t.hscale);
        break;
    default: break;
    }
    q.data = t.hbuf;
    q.scale = t.hscale;
    t.host = q;
    t.dev = q;
    t.dbuf = up(t.hbuf, bytes);
    t.dev.data = t.dbuf;
    if (sbytes) t.dscale = up(t.hscale, sbytes);
    t.dev.scale = t.dscale;
    free(w);
    return t;
}

static void tw_free(TW *t)
{
    free(t->hbuf);
    free(t->hscale);
    be_free(&gpu, t->dbuf);
    be_free(&gpu, t->dscale);
}

TEST(cuda_matmul_formats)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 14);
    QFormat fmts[] = {QF_F32, QF_BF16, QF_F16, QF_FP8, QF_FP8_BLOCK, QF_NVFP4};
    int shapes[][3] = {/* T, N, K */ {1, 64, 128}, {5, 130, 96}, {16, 576, 6144}, {33, 2048, 512}, {300, 96, 256}, {4096, 64, 64}};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ldx = K + 16, ldo = N + 8;
            TW w = tw_make(&r, fmts[f], N, K);
            float *x = rnd(&r, (size_t)T * ldx, 1), *bias = rnd(&r, N, 1);
            float *ref = calloc((size_t)T * ldo, 4);
            matmul_cpu(&cpu, ref, ldo, x, ldx, T, &w.host, bias);
            float *dx = up(x, (size_t)T * ldx * 4), *db = up(bias, N * 4), *dout = be_alloc(&gpu, (size_t)T * ldo * 4);
            be_matmul(&gpu, OP_GEMM_MLP, dout, ldo, dx, ldx, T, &w.dev, db);
            float *got = down(dout, (size_t)T * ldo);
            double tol = fmts[f] == QF_BF16 ? TOL_SPLIT : fmts[f] == QF_F32 ? 1e-4 : TOL_F32;
            EXPECT_CLOSE(got, ref, (size_t)T * ldo, tol, "matmul %s T %d N %d K %d", qformat_name(fmts[f]), T, N, K);
            free(got); free(x); free(bias); free(ref);
            be_free(&gpu, dx); be_free(&gpu, db); be_free(&gpu, dout);
            tw_free(&w);
        }
}

TEST(cuda_embed)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 15);
    QFormat fmts[] = {QF_BF16, QF_NVFP4, QF_FP8};
    for (size_t f = 0; f < 3; f++) {
        int V = 300, D = 128, T = 41;
        TW w = tw_make(&r, fmts[f], V, D);
        int tok[41];
        for (int t = 0; t < T; t++) tok[t] = (int)(rng_u64(&r) % V);
        float *ref = malloc((size_t)T * D * 4);
        embed_cpu(&cpu, ref, tok, T, &w.host);
        int *dt = up(tok, sizeof tok);
        float *dout = be_alloc(&gpu, (size_t)T * D * 4);
        be_embed(&gpu, dout, dt, T, &w.dev);
        float *got = down(dout, (size_t)T * D);
        EXPECT_CLOSE(got, ref, (size_t)T * D, 0, "embed %s", qformat_name(fmts[f]));
        free(got); free(ref);
        be_free(&gpu, dt); be_free(&gpu, dout);
        tw_free(&w);
    }
}

/* The NVFP4 weight of tw_make repacked on the device into the W4P layout (w4_common.cuh). */
static TW tw_make_w4(Rng *r, int N, int K)
{
    TW t = tw_make(r, QF_NVFP4, N, K);
    void *packed = be_alloc(&gpu, (size_t)N * K / 2 + (size_t)N * K / 16);
    gpu.ops->pack_nvfp4(&gpu, packed, t.dbuf, t.dscale, N, K);
    be_free(&gpu, t.dbuf);
    be_free(&gpu, t.dscale);
    t.dbuf = packed;
    t.dscale = NULL;
    t.dev.data = packed;
    t.dev.scale = NULL;
    t.dev.packed = 1;
    return t;
}

/* Every scale byte (positive, negative, subnormal, zero; NaN excluded) and every code through
 * the repack and the kernel: x = identity gives W^T, exact (one product per output). */
TEST(cuda_w4_pack_exact)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 21);
    int N = 32, K = 256, T = K;
    size_t n = (size_t)N * K;
    uint8_t *codes = malloc(n / 2), *scales = malloc(n / 16);
    for (size_t i = 0; i < n / 2; i++) codes[i] = (uint8_t)rng_u64(&r);
    for (size_t i = 0; i < n / 16; i++) scales[i] = (uint8_t)(i & 0x7f) == 0x7f ? 0x7e : (uint8_t)i;
    QTensor h = {.fmt = QF_NVFP4, .rows = N, .cols = K, .data = codes, .scale = scales, .gscale = 0.75f};
    TW t = {.host = h, .dev = h};
    t.dbuf = up(codes, n / 2);
    t.dscale = up(scales, n / 16);
    void *packed = be_alloc(&gpu, n / 2 + n / 16);
    gpu.ops->pack_nvfp4(&gpu, packed, t.dbuf, t.dscale, N, K);
    t.dev.data = packed;
    t.dev.scale = NULL;
    t.dev.packed = 1;
    float *x = calloc((size_t)T * K, 4), *ref = malloc((size_t)T * N * 4);
    for (int i = 0; i < T; i++) x[(size_t)i * K + i] = 1.0f;
    for (int row = 0; row < N; row++) {
        float wrow[256];
        qtensor_decode(&h, row, 0, K, wrow);
        for (int k = 0; k < K; k++) ref[(size_t)k * N + row] = wrow[k];
    }
    float *dx = up(x, (size_t)T * K * 4), *dout = be_alloc(&gpu, (size_t)T * N * 4);
    be_matmul(&gpu, OP_GEMM_MLP, dout, N, dx, K, T, &t.dev, NULL);
    float *got = down(dout, (size_t)T * N);
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)T * N; i++)
        if (got[i] != ref[i] && bad++ < 5) fprintf(stderr, "      W[%zu, %zu]: got %g, want %g\n", i % N, i / N, got[i], ref[i]);
    EXPECT(bad == 0, "%zu of %zu weights differ after the W4P repack", bad, (size_t)T * N);
    free(got); free(x); free(ref); free(codes); free(scales);
    be_free(&gpu, dx); be_free(&gpu, dout); be_free(&gpu, t.dbuf); be_free(&gpu, t.dscale); be_free(&gpu, packed);
}

/* Three dense GEMMs in a row, each reading the one before's output (x -> y -> z -> u), eagerly
 * and as a replayed graph with new inputs between replays: the stream-K tiles start before the
 * kernel before them ends (programmatic dependent launch on sm_90) and must still read its output,
 * not what was there before. Shapes with 160-256 row tiles, so that dense_streamk_8 takes them on
 * any GPU up to 160 SMs at one block each. */
TEST(cuda_w4_chain_pdl)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 34);
    const int K0 = 512, N1 = 2560, N2 = 4096, N3 = 2560;
    TW w1 = tw_make_w4(&r, N1, K0), w2 = tw_make_w4(&r, N2, N1), w3 = tw_make_w4(&r, N3, N2);
    float *b2 = rnd(&r, N2, 1), *db2 = up(b2, N2 * 4);
    /* 1 row; 6 rows with the rows staged by clusters of 2 (the default), 4 and 1 blocks; K split
     * over clusters of 2 and 4 blocks (K0 = 512 and N1 = 2560 have no 4 parts: clusters of 2 or
     * none there) at 1, 6 and 16 rows (16: two token tiles, or one of dense_streamk_16) */
    const int runs[][3] = {{1, 0, 0}, {6, 0, 0}, {6, 4, 0}, {6, 1, 0}, {1, 0, 2}, {6, 0, 2}, {6, 0, 4}, {16, 0, 2}, {16, 0, 4}};
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        int T = runs[ri][0];
        knob_override(KNOB_W4_SK_CLUSTER, sk_choice(runs[ri][1]));
        knob_override(KNOB_W4_SK_KSPLIT, sk_choice(runs[ri][2]));
        float *dx = be_alloc(&gpu, (size_t)T * K0 * 4), *dy = be_alloc(&gpu, (size_t)T * N1 * 4);
        float *dz = be_alloc(&gpu, (size_t)T * N2 * 4), *du = be_alloc(&gpu, (size_t)T * N3 * 4);
        float *y = malloc((size_t)T * N1 * 4), *z = malloc((size_t)T * N2 * 4), *u = malloc((size_t)T * N3 * 4);
        long calls = w4_sk_calls();
        void *graph = NULL;
        for (int round = 0; round < 4; round++) { /* 0: eager; 1: capture and replay; 2, 3: replays */
            float *x = rnd(&r, (size_t)T * K0, 1);
            be_to_device(&gpu, dx, x, (size_t)T * K0 * 4);
            matmul_cpu(&cpu, y, N1, x, K0, T, &w1.host, NULL);
            matmul_cpu(&cpu, z, N2, y, N1, T, &w2.host, b2);
            matmul_cpu(&cpu, u, N3, z, N2, T, &w3.host, NULL);
            if (round == 1) gpu.ops->graph_begin(&gpu);
            if (round <= 1) {
                be_matmul(&gpu, OP_GEMM_MLP, dy, N1, dx, K0, T, &w1.dev, NULL);
                be_matmul(&gpu, OP_GEMM_MLP, dz, N2, dy, N1, T, &w2.dev, db2);
                be_matmul(&gpu, OP_GEMM_MLP, du, N3, dz, N2, T, &w3.dev, NULL);
            }
            if (round == 1) graph = gpu.ops->graph_end(&gpu);
            if (round >= 1) EXPECT(gpu.ops->graph_launch(&gpu, graph) == 0, "graph replay");
            float *got = down(du, (size_t)T * N3);
            EXPECT_CLOSE(got, u, (size_t)T * N3, TOL_W4, "w4 chain T %d cluster %d K parts %d round %d", T, runs[ri][1], runs[ri][2],
                         round);
            free(got);
            free(x);
        }
        EXPECT(w4_sk_calls() > calls, "T %d cluster %d: the chain took the stream-K tile (%ld launches)", T, runs[ri][1],
               w4_sk_calls() - calls);
        gpu.ops->graph_free(&gpu, graph);
        free(y); free(z); free(u);
        be_free(&gpu, dx); be_free(&gpu, dy); be_free(&gpu, dz); be_free(&gpu, du);
    }
    knob_override(KNOB_W4_SK_CLUSTER, -1);
    knob_override(KNOB_W4_SK_KSPLIT, -1);
    free(b2);
    be_free(&gpu, db2);
    tw_free(&w1); tw_free(&w2); tw_free(&w3);
}

TEST(cuda_w4_matmul)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 22);
    int shapes[][3] = {/* T, N, K */ {1, 64, 256}, {5, 160, 512}, {9, 2048, 512}, {16, 96, 2048},
                       {17, 512, 1024}, {33, 2048, 512}, {300, 96, 256}, {4096, 64, 256}, {1, 6144, 2048},
                       /* the stream-K tiles need 16 row tiles a block of the wave: runs that
                        * share row tiles, warps with no record, two token tiles of 8 */
                       {5, 4096, 768}, {16, 2112, 1024}, {12, 8192, 512},
                       /* split activations' packed halves (one n8 tile: up to 4 rows), at the limit */
                       {4, 4096, 768},
                       /* fewer row tiles than SMs: stream-K with K in 4 parts a cluster (w4_sk_ksplit), packed halves and not */
                       {3, 1024, 4096}, {8, 576, 6144},
                       /* split-K wgmma for dense rows (N % 128 == 0, up to 64 rows: the 32-token ring GEMM to 32,
                        * the 64-token one above): K split 4, 8 and (132 SMs) 11 ways */
                       {32, 1024, 2048}, {20, 384, 4096}, {17, 256, 5632}, {64, 1024, 2048}, {48, 256, 5632},
                       /* token tiles of 64 above 64 rows (the last one ragged), and past the rows
                        * from which the built-in choice is the cuBLASLt route (1536) */
                       {100, 1024, 2048}, {255, 256, 1024}, {384, 256, 1024}, {1600, 256, 512}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int T = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ldx = K + 16, ldo = N + 8;
        TW w = tw_make_w4(&r, N, K);
        float *x = rnd(&r, (size_t)T * ldx, 1), *bias = rnd(&r, N, 1);
        float *ref = calloc((size_t)T * ldo, 4);
        matmul_cpu(&cpu, ref, ldo, x, ldx, T, &w.host, bias);
        float *dx = up(x, (size_t)T * ldx * 4), *db = up(bias, N * 4), *dout = be_alloc(&gpu, (size_t)T * ldo * 4);
        /* the built-in choice (the BF16 + cuBLASLt route from w4_lt_rows(N)), then every tile that
         * fits (dense_wg_splitk_32 runs where N % 128 == 0, else its fallback: counted) */
        const int wg_runs = w4_wg_supported(0) && N % 128 == 0;
        for (int tile = -1; tile < W4_N_TILES; tile++) {
            if (tile >= 0 && (!w4_tile_fits(w4_tiles[tile], w4_smem_budget(0), NULL, 0) || !w4_tile_runs(w4_tiles[tile], w4_wg_supported(0), NULL, 0))) continue;
            w4_set_config((W4Config){tile, 0});
            knob_override(KNOB_W4_LT_ROWS, tile >= 0 ? 0 : -1);
            long wg_calls = w4_dense_wg_calls();
            be_matmul(&gpu, OP_GEMM_MLP, dout, ldo, dx, ldx, T, &w.dev, db);
            if (tile == W4T_DENSE_WG_SPLITK)
                EXPECT(w4_dense_wg_calls() - wg_calls == wg_runs, "T %d N %d: split-K wgmma %s", T, N, wg_runs ? "did not run" : "ran");
            float *got = down(dout, (size_t)T * ldo);
            EXPECT_CLOSE(got, ref, (size_t)T * ldo, TOL_W4, "w4 matmul T %d N %d K %d tile %s", T, N, K, tile_name(tile));
            free(got);
        }
        knob_override(KNOB_W4_LT_ROWS, -1);
        w4_set_config((W4Config){-1, 0});
        /* plain BF16 activations (MOESERVE_W4_ACT=bf16): the twin on BF16-rounded activations */
        float *xr = malloc((size_t)T * ldx * 4 + 1);
        for (size_t q = 0; q < (size_t)T * ldx; q++) xr[q] = bf16_to_f32(f32_to_bf16(x[q]));
        matmul_cpu(&cpu, ref, ldo, xr, ldx, T, &w.host, bias);
        knob_override(KNOB_W4_ACT, W4_ACT_BF16);
        be_matmul(&gpu, OP_GEMM_MLP, dout, ldo, dx, ldx, T, &w.dev, db);
        float *got = down(dout, (size_t)T * ldo);
        EXPECT_CLOSE(got, ref, (size_t)T * ldo, TOL_F32, "w4 matmul, BF16 activations, T %d N %d K %d", T, N, K);
        if (w4_wg_supported(0)) { /* split-K wgmma with plain BF16 activations too */
            w4_set_config((W4Config){W4T_DENSE_WG_SPLITK, 0});
            knob_override(KNOB_W4_LT_ROWS, 0);
            long wg_calls = w4_dense_wg_calls();
            be_matmul(&gpu, OP_GEMM_MLP, dout, ldo, dx, ldx, T, &w.dev, db);
            EXPECT(w4_dense_wg_calls() - wg_calls == wg_runs, "T %d N %d, BF16: split-K wgmma %s", T, N, wg_runs ? "did not run" : "ran");
            knob_override(KNOB_W4_LT_ROWS, -1);
            w4_set_config((W4Config){-1, 0});
            free(got);
            got = down(dout, (size_t)T * ldo);
            EXPECT_CLOSE(got, ref, (size_t)T * ldo, TOL_F32, "w4 matmul on split-K wgmma, BF16 activations, T %d N %d K %d", T, N, K);
        }
        knob_override(KNOB_W4_ACT, -1);
        free(got); free(xr);
        free(x); free(bias); free(ref);
        be_free(&gpu, dx); be_free(&gpu, db); be_free(&gpu, dout);
        tw_free(&w);
    }
}

/* ---- router and MoE ---- */

static ModelConfig moe_cfg(int E, int K, int G, int TG, int D, int F, int softmax)
{
    ModelConfig c = {0};
    c.n_experts = E;
    c.n_experts_per_tok = K;
    c.n_group = G;
    c.topk_group = TG;
    c.hidden = D;
    c.moe_intermediate = F;
    c.norm_topk_prob = 1;
    c.routed_scaling = 2.5f;
    c.scoring = softmax ? SCORE_SOFTMAX : SCORE_SIGMOID;
    return c;
}

TEST(cuda_router)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 16);
    int cases[][5] = {/* T, E, K, G, TG */ {1, 16, 4, 1, 1}, {77, 256, 8, 1, 1}, {33, 160, 8, 8, 4}, {9, 64, 6, 8, 3}, {200, 128, 8, 1, 1}};
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++)
        for (int sm = 0; sm < 2; sm++) {
            int T = cases[cs][0], E = cases[cs][1], K = cases[cs][2];
            ModelConfig c = moe_cfg(E, K, cases[cs][3], cases[cs][4], 0, 0, sm);
            float *l = rnd(&r, (size_t)T * E, 2), *bias = rnd(&r, E, 0.1f);
            /* exact ties: copy a few logits so that ties to the lowest index are exercised */
            for (int t = 0; t < T; t++) l[(size_t)t * E + E - 1] = l[(size_t)t * E + 1];
            int *idx = malloc((size_t)T * K * 4), *gidx;
            float *wts = malloc((size_t)T * K * 4), *gw;
            router_cpu(&cpu, idx, wts, l, bias, T, &c);
            float *dl = up(l, (size_t)T * E * 4), *dbias = up(bias, E * 4), *dw = be_alloc(&gpu, (size_t)T * K * 4);
            int *di = be_alloc(&gpu, (size_t)T * K * 4);
            be_router(&gpu, di, dw, dl, dbias, T, &c);
            gidx = (int *)down(di, (size_t)T * K);
            gw = down(dw, (size_t)T * K);
            int same = !memcmp(gidx, idx, (size_t)T * K * 4);
            EXPECT(same, "router T %d E %d K %d G %d softmax %d: selections differ", T, E, K, cases[cs][3], sm);
            EXPECT_CLOSE(gw, wts, (size_t)T * K, TOL_F32, "router weights");
            free(l); free(bias); free(idx); free(wts); free(gidx); free(gw);
            be_free(&gpu, dl); be_free(&gpu, dbias); be_free(&gpu, dw); be_free(&gpu, di);
        }
}

/* A MoE layer's E experts (gate and up [F, D], down [D, F]) in fmt, or W4P-packed NVFP4 with
 * w4: host tensors in hl, device tensors and their table in dl; experts_free releases them. */
static TW *experts_make(Rng *r, QFormat fmt, int w4, int E, int D, int F, MoeExperts *hl, MoeExperts *dl)
{
    TW *ws = malloc(3 * E * sizeof(TW));
    QTensor *hg = malloc(3 * E * sizeof(QTensor)), *dg = malloc(3 * E * sizeof(QTensor));
    for (int i = 0; i < 3 * E; i++) {
        ws[i] = w4 ? tw_make_w4(r, i < 2 * E ? F : D, i < 2 * E ? D : F) : tw_make(r, fmt, i < 2 * E ? F : D, i < 2 * E ? D : F);
        hg[i] = ws[i].host;
        dg[i] = ws[i].dev;
    }
    *hl = (MoeExperts){.gate = hg, .up = hg + E, .down = hg + 2 * E};
    *dl = (MoeExperts){.gate = dg, .up = dg + E, .down = dg + 2 * E, .table = up(dg, 3 * E * sizeof(QTensor))};
    return ws;
}

static void experts_free(TW *ws, int E, MoeExperts *hl, MoeExperts *dl)
{
    be_free(&gpu, (void *)dl->table);
    for (int i = 0; i < 3 * E; i++) tw_free(&ws[i]);
    free(ws);
    free((void *)hl->gate);
    free((void *)dl->gate);
}

TEST(cuda_moe)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 17);
    int cases[][5] = {/* T, E, K, D, F */ {1, 16, 4, 128, 32}, {7, 8, 2, 96, 48}, {64, 32, 8, 256, 64}, {4096, 16, 4, 64, 32},
                      /* D not a multiple of 4 (the combine's one-column path), a third of the pairs
                       * another rank's experts (idx -1, EP: their y rows never written) */
                      {6, 8, 2, 90, 48},
                      /* W4P shapes (D, F multiples of 256) */
                      {1, 16, 4, 256, 256}, {7, 8, 2, 512, 256}, {64, 32, 8, 256, 512}, {300, 64, 8, 256, 256},
                      {2048, 16, 4, 256, 256}};
    QFormat fmts[] = {QF_BF16, QF_NVFP4, QF_NVFP4};
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++)
        for (int f = 0; f < 3; f++) {
            int w4 = f == 2;
            if (w4 && (cases[cs][3] % 256 || cases[cs][4] % 256)) continue;
            if (fmts[f] == QF_NVFP4 && cases[cs][3] % 16) continue; /* NVFP4 blocks of 16 columns */
            int T = cases[cs][0], E = cases[cs][1], K = cases[cs][2], D = cases[cs][3], F = cases[cs][4];
            ModelConfig c = moe_cfg(E, K, 1, 1, D, F, 0);
            MoeExperts hl, dl;
            TW *ws = experts_make(&r, w4 ? QF_NVFP4 : fmts[f], w4, E, D, F, &hl, &dl);
            float *x = rnd(&r, (size_t)T * D, 1);
            int *idx = malloc((size_t)T * K * 4);
            float *wts = rnd(&r, (size_t)T * K, 0.5f);
            for (int t = 0; t < T; t++) /* K distinct experts per token */
                for (int k = 0; k < K; k++) idx[t * K + k] = (int)((rng_u64(&r) % (E / K)) * K + k);
            if (D % 4)
                for (int p = 1; p < T * K; p += 3) idx[p] = -1;
            float *ref = malloc((size_t)T * D * 4);
            moe_cpu(&cpu, ref, x, idx, wts, T, &hl, &c);
            float *dx = up(x, (size_t)T * D * 4), *dwts = up(wts, (size_t)T * K * 4), *dout = be_alloc(&gpu, (size_t)T * D * 4);
            int *didx = up(idx, (size_t)T * K * 4);
            for (int tile = -1; tile < (w4 ? W4_N_TILES : 0); tile++) { /* W4P: the choice, then every tile */
                if (tile >= 0 && (!w4_tile_fits(w4_tiles[tile], w4_smem_budget(0), NULL, 0) || !w4_tile_runs(w4_tiles[tile], w4_wg_supported(0), NULL, 0))) continue;
                w4_set_config((W4Config){tile, 0});
                be_moe(&gpu, dout, dx, didx, dwts, T, &dl, &c);
                float *got = down(dout, (size_t)T * D);
                EXPECT_CLOSE(got, ref, (size_t)T * D, w4 ? TOL_W4 : TOL_F32, "moe %s%s T %d E %d K %d D %d F %d tile %s",
                             qformat_name(fmts[f]), w4 ? " (W4P)" : "", T, E, K, D, F, tile_name(tile));
                free(got);
            }
            w4_set_config((W4Config){-1, 0});
            free(ref); free(x); free(idx); free(wts);
            be_free(&gpu, dx); be_free(&gpu, dwts); be_free(&gpu, dout); be_free(&gpu, didx);
            experts_free(ws, E, &hl, &dl);
        }
}

/* The grouped W4P MoE with ragged experts (0, 1, 63, 64, 65, 300 pairs...: every token-tile
 * tail of the 32- and 64-token block tiles) in both activation modes: every tile that fits against
 * the CPU twin (two BF16 halves) and against mma_8_l1 in the same mode (plain BF16: h rounds to
 * BF16 in both, the same products summed in another order). */
TEST(cuda_w4_moe_ragged)
{
    NEED_GPU();
    /* the wgmma tiles run (and are checked below) wherever the code loaded for the GPU is sm_90's,
     * which must then be sm_90a's (the Makefile's default), and nowhere else: a build of PTX for
     * sm_80 alone runs the mma.sync tiles on an H100 too, without PDL and clusters */
    int cc = w4_device_cc(0), code = w4_code_arch(0);
    EXPECT(code >= 80 && code <= cc, "sm_%d runs code for sm_%d", cc, code);
    if (code == 90) EXPECT(w4_wg_supported(0), "code for sm_90 without the wgmma tiles: build for sm_90a (CUDA_ARCH)");
    else EXPECT(!w4_wg_supported(0), "code for sm_%d runs no wgmma tile", code);
    Rng r;
    rng_seed(&r, 23);
    const int E = 16, K = 4, T = 300, D = 768, F = 512;
    /* 1200 pairs = T K; the last token tile of an expert takes every MMA N of the ring tiles (wg_nn):
     * on the 128-token ring 1 -> 16, 20 -> 24, 37 -> 40, 43/44 -> 48, 53 -> 56, 63/64 -> 64, 65 -> 80,
     * 90 -> 96, 103/105 -> 112, 128; on the 64- and 32-token rings the residues of 64 and 32 likewise */
    const int counts[16] = {0, 1, 63, 64, 65, 300, 299, 20, 37, 53, 90, 105, 103, 0, 0, 0};
    ModelConfig c = moe_cfg(E, K, 1, 1, D, F, 0);
    MoeExperts hl, dl;
    TW *ws = experts_make(&r, QF_NVFP4, 1, E, D, F, &hl, &dl);
    /* pair p of the list sorted by expert goes to token p % T, choice p / T: no expert has more
     * than T pairs, so a token's K experts are distinct */
    int *idx = malloc((size_t)T * K * 4);
    for (int e = 0, p = 0; e < E; e++)
        for (int n = 0; n < counts[e]; n++, p++) idx[(p % T) * K + p / T] = e;
    float *x = rnd(&r, (size_t)T * D, 1), *wts = rnd(&r, (size_t)T * K, 0.5f), *ref = malloc((size_t)T * D * 4);
    moe_cpu(&cpu, ref, x, idx, wts, T, &hl, &c);
    float *dx = up(x, (size_t)T * D * 4), *dwts = up(wts, (size_t)T * K * 4), *dout = be_alloc(&gpu, (size_t)T * D * 4);
    int *didx = up(idx, (size_t)T * K * 4);
    for (int split = 1; split >= 0; split--) {
        knob_override(KNOB_W4_ACT, split ? W4_ACT_SPLIT : W4_ACT_BF16);
        float *ref0 = NULL;
        for (int tile = 0; tile < W4_N_TILES; tile++) {
            if (!w4_tile_fits(w4_tiles[tile], w4_smem_budget(0), NULL, 0) || !w4_tile_runs(w4_tiles[tile], w4_wg_supported(0), NULL, 0))
                continue;
            /* the call tiles with a hot class (w4_class_rules): the experts of more than its default
             * pairs on W4_HOT_TILE (16 beside moe_mma_8_gu, 32 beside moe_mma_16_gu, 64 beside the 32-
             * and 64-token rings), of more than 63 (64 and 65 change class), and without it; those
             * with a small class: the experts of at most its default pairs on W4_SMALL_TILE (4 to 8:
             * counts 0 and 1), of at most 20 (three token tiles of 8 for the expert of 20), and
             * without it; the classes beside the call's tile on other streams (the default: the small
             * class, and the hot class beside the decode tile; side 2: the hot class beside every
             * tile) and after it on the one stream (side 0) */
            const int hs[][3] = {{-1, -1, -1}, {63, -1, -1}, {0, -1, -1}, {-1, -1, 0}, {-1, 20, -1}, {-1, 0, -1}, {63, 20, -1},
                                 {0, 20, -1}, {63, 20, 0}, {63, 20, 2}};
            const int nh = tile == W4T_MOE_MMA_16_GU || tile == W4T_MOE_WGMMA_64_S3_R3 || tile == W4T_MOE_WGMMA_32_S6_R3_C2 ? 10
                           : tile == W4_HOT_TILE                                                                              ? 6
                           : tile == W4T_MOE_MMA_8_GU                                                                         ? 4
                                                                                                                              : 1;
            for (int hi = 0; hi < nh; hi++) {
                if (tile == W4_HOT_TILE && hs[hi][0] > 0) continue; /* no hot class beside the hot tile */
                knob_override(KNOB_W4_MOE_HOT, hs[hi][0]);
                knob_override(KNOB_W4_MOE_SMALL, hs[hi][1]);
                knob_override(KNOB_W4_MOE_SIDE, hs[hi][2]);
                w4_set_config((W4Config){tile, 0});
                be_moe(&gpu, dout, dx, didx, dwts, T, &dl, &c);
                float *got = down(dout, (size_t)T * D);
                if (split)
                    EXPECT_CLOSE(got, ref, (size_t)T * D, TOL_W4, "ragged moe, split activations, tile %s, hot %d, small %d, side %d",
                                 tile_name(tile), hs[hi][0], hs[hi][1], hs[hi][2]);
                if (!ref0) ref0 = got;
                else {
                    EXPECT_CLOSE(got, ref0, (size_t)T * D, TOL_W4, "ragged moe, split %d, tile %s, hot %d, small %d, side %d against mma_8_l1",
                                 split, tile_name(tile), hs[hi][0], hs[hi][1], hs[hi][2]);
                    free(got);
                }
            }
            knob_override(KNOB_W4_MOE_HOT, -1);
            knob_override(KNOB_W4_MOE_SMALL, -1);
            knob_override(KNOB_W4_MOE_SIDE, -1);
        }
        /* the wgmma ring tiles' persistent blocks: 3 blocks that each run many (token tile, row block)
         * items, asking for the next one's weights while they finish one; and a block an item */
        for (int tile = W4T_MOE_WGMMA_32_S4_R4; tile <= W4T_MOE_WGMMA_32_S6_R3_C2 && w4_wg_supported(0); tile++) {
            if (!w4_tile_fits(w4_tiles[tile], w4_smem_budget(0), NULL, 0)) continue;
            for (int mode = 0; mode < 2; mode++) {
                knob_override(KNOB_W4_WG_PERSIST, mode == 0);
                w4_test_cap_wg_blocks(mode == 0 ? 3 : 0);
                w4_set_config((W4Config){tile, 0});
                be_moe(&gpu, dout, dx, didx, dwts, T, &dl, &c);
                float *got = down(dout, (size_t)T * D);
                EXPECT_CLOSE(got, split ? ref : ref0, (size_t)T * D, TOL_W4, "ragged moe, split %d, tile %s, %s (against %s)", split,
                             tile_name(tile), mode == 0 ? "3 persistent blocks" : "a block an item", split ? "the CPU" : "mma_8_l1");
                free(got);
            }
            knob_override(KNOB_W4_WG_PERSIST, -1);
            w4_test_cap_wg_blocks(0);
        }
        free(ref0);
    }
    knob_override(KNOB_W4_ACT, -1);
    /* the decode tiles' gate/up -> down pair (down launched with programmatic dependent launch
     * on sm_90) captured in a graph and replayed with new activations: the down kernel must read
     * the h its gate/up wrote in the same replay */
    /* the 128-token ring: 5 persistent blocks, each running many items every replay; the 32-token
     * ring, moe_mma_16_gu and moe_mma_8_gu: their hot classes on the 128-token ring (the 16- and
     * 8-token tiles: the permuted copy; the 8-token: on a third stream); the 128- and 32-token rings:
     * their small class on moe_mma_8_gu (the natural-order copy); the 64-token ring: a small class of
     * up to 20 pairs; the second 32-token ring: both classes on streams of their own (side 2) */
    const int gtiles[] = {W4T_MOE_MMA_8_GU,          W4T_MMA_8_L1,      W4T_MOE_WGMMA_128_S4_R3, W4T_MOE_WGMMA_32_S6_R3_C2,
                          W4T_MOE_MMA_16_GU,         W4T_MOE_WGMMA_64_S3_R3, W4T_MOE_WGMMA_32_S6_R3_C2};
    for (int gi = 0; gi < 7; gi++) {
        int tile = gtiles[gi];
        const int wgmma = w4_tiles[tile].fam == W4_FAM_WGMMA;
        if ((wgmma && !w4_wg_supported(0)) || !w4_tile_fits(w4_tiles[tile], w4_smem_budget(0), NULL, 0)) continue;
        if (wgmma || tile == W4T_MOE_MMA_16_GU) {
            knob_override(KNOB_W4_WG_PERSIST, 1);
            w4_test_cap_wg_blocks(5);
        }
        knob_override(KNOB_W4_MOE_SMALL, tile == W4T_MOE_WGMMA_64_S3_R3 ? 20 : -1);
        knob_override(KNOB_W4_MOE_SIDE, gi == 6 ? 2 : -1);
        w4_set_config((W4Config){tile, 0});
        void *graph = NULL;
        for (int round = 0; round < 3; round++) {
            float *x2 = rnd(&r, (size_t)T * D, 1);
            moe_cpu(&cpu, ref, x2, idx, wts, T, &hl, &c);
            be_to_device(&gpu, dx, x2, (size_t)T * D * 4);
            if (round == 0) {
                gpu.ops->graph_begin(&gpu);
                be_moe(&gpu, dout, dx, didx, dwts, T, &dl, &c);
                graph = gpu.ops->graph_end(&gpu);
            }
            EXPECT(gpu.ops->graph_launch(&gpu, graph) == 0, "graph replay");
            float *got = down(dout, (size_t)T * D);
            EXPECT_CLOSE(got, ref, (size_t)T * D, TOL_W4, "ragged moe in a graph, tile %s, replay %d", tile_name(tile), round);
            free(got); free(x2);
        }
        gpu.ops->graph_free(&gpu, graph);
        knob_override(KNOB_W4_WG_PERSIST, -1);
        w4_test_cap_wg_blocks(0);
        knob_override(KNOB_W4_MOE_SMALL, -1);
        knob_override(KNOB_W4_MOE_SIDE, -1);
    }
    w4_set_config((W4Config){-1, 0});
    free(ref); free(x); free(idx); free(wts);
    be_free(&gpu, dx); be_free(&gpu, dwts); be_free(&gpu, dout); be_free(&gpu, didx);
    experts_free(ws, E, &hl, &dl);
}

/* ---- attention and the indexer over a paged cache ---- */

/* x [slots, W] float32 stored as a cache of dt through kv_write_cpu: columns [0, split) with
 * scale ks, the rest with vs (host memory, kv_elem_size(dt) bytes per element) */
static void *kv_store(const float *x, int slots, int W, KVDtype dt, float ks, float vs, int split)
{
    int *all = malloc(slots * sizeof(int));
    for (int s = 0; s < slots; s++) all[s] = s;
    void *c = malloc((size_t)slots * W * kv_elem_size(dt));
    kv_write_cpu(&cpu, c, dt, ks, W, 0, x, W, split, all, slots);
    if (split < W) kv_write_cpu(&cpu, c, dt, vs, W, split, x + split, W, W - split, all, slots);
    free(all);
    return c;
}

/* An MLA cache layer (rows [latent | k_pe] of width W, one scale ks; with ix, indexer keys of
 * width Di at scale 1) on the host and its copy on the GPU; mla_layers_free gives both back */
static void mla_layers(const float *x, const float *ix, int slots, int W, int Di, KVDtype dt, float ks, int bs, KVLayer *hk,
                       KVLayer *dk)
{
    *hk = (KVLayer){.kv = kv_store(x, slots, W, dt, ks, ks, W), .block_size = bs, .kv_width = W, .dtype = dt,
                    .k_scale = ks, .v_scale = 1};
    if (ix) {
        hk->idx = kv_store(ix, slots, Di, dt, 1, 1, Di);
        hk->idx_width = Di;
    }
    *dk = *hk;
    dk->kv = up(hk->kv, (size_t)slots * W * kv_elem_size(dt));
    if (ix) dk->idx = up(hk->idx, (size_t)slots * Di * kv_elem_size(dt));
}

static void mla_layers_free(KVLayer *hk, KVLayer *dk)
{
    free(hk->kv);
    free(hk->idx);
    be_free(&gpu, dk->kv);
    if (dk->idx) be_free(&gpu, dk->idx);
}

/* A batch of S sequences: seq s has ctx[s] tokens in the cache and its last ntok[s] are the
 * batch's tokens; blocks of size bs assigned in a shuffled order. */
typedef struct {
    Batch h, d;
    int n_slots;
} TB;

static TB tb_make(Rng *r, int S, const int *ctx, const int *ntok, int bs)
{
    TB b = {0};
    b.h = test_batch_make(r, S, ctx, ntok, bs, &b.n_slots);
    Batch *h = &b.h;
    int T = h->n_tokens, maxb = h->bt_stride;
    b.d = *h;
    b.d.pos = up(h->pos, T * 4);
    b.d.seq = up(h->seq, T * 4);
    b.d.slot = up(h->slot, T * 4);
    b.d.block_table = up(h->block_table, (size_t)S * maxb * 4);
    return b;
}

static void tb_free(TB *b)
{
    test_batch_free(&b->h);
    be_free(&gpu, b->d.pos); be_free(&gpu, b->d.seq); be_free(&gpu, b->d.slot); be_free(&gpu, b->d.block_table);
}

TEST(cuda_attention_gqa)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 18);
    struct { int S, ctx[3], ntok[3], H, Hkv, Dh; } cases[] = {
        {1, {1}, {1}, 8, 2, 32},              /* first decode token */
        {2, {37, 5}, {37, 1}, 4, 4, 64},      /* a prefill and a decode */
        {3, {300, 17, 1000}, {1, 17, 3}, 96, 8, 128},
        {1, {32768}, {1}, 8, 1, 128},         /* 32k context */
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int bs = 16, H = cases[cs].H, Hkv = cases[cs].Hkv, Dh = cases[cs].Dh;
        TB b = tb_make(&r, cases[cs].S, cases[cs].ctx, cases[cs].ntok, bs);
        ModelConfig c = {0};
        c.n_heads = H; c.n_kv_heads = Hkv; c.head_dim = Dh; c.attn_scale = 1.0f / sqrtf((float)Dh);
        int W = 2 * Hkv * Dh, T = b.h.n_tokens;
        float *x = rnd(&r, (size_t)b.n_slots * W, 1), *q = rnd(&r, (size_t)T * H * Dh, 1);
        float *ref = malloc((size_t)T * H * Dh * 4), *dq = up(q, (size_t)T * H * Dh * 4);
        float *dout = be_alloc(&gpu, (size_t)T * H * Dh * 4);
        for (int d = 0; d < 3; d++) {
            KVDtype dt = kv_dtypes[d];
            float ks = dt == KV_DTYPE_FP8 ? KV_KSCALE : 1, vs = dt == KV_DTYPE_FP8 ? KV_VSCALE : 1;
            void *cache = kv_store(x, b.n_slots, W, dt, ks, vs, Hkv * Dh);
            KVLayer hk = {.kv = cache, .block_size = bs, .kv_width = W, .dtype = dt, .k_scale = ks, .v_scale = vs};
            KVLayer dk = hk;
            dk.kv = up(cache, (size_t)b.n_slots * W * kv_elem_size(dt));
            attention_gqa_cpu(&cpu, ref, q, &hk, &b.h, &c);
            be_attention_gqa(&gpu, dout, dq, &dk, &b.h, &b.d, &c);
            float *got = down(dout, (size_t)T * H * Dh);
            EXPECT_CLOSE(got, ref, (size_t)T * H * Dh, TOL_F32, "gqa case %zu, %s cache", cs, model_kv_dtype_name(dt));
            free(got); free(cache);
            be_free(&gpu, dk.kv);
        }
        free(ref); free(x); free(q);
        be_free(&gpu, dq); be_free(&gpu, dout);
        tb_free(&b);
    }
}

TEST(cuda_attention_mla_and_indexer)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 19);
    struct { int S, ctx[3], ntok[3], H, C, Dn, Dr, Dv, Hi, Di, Ki; int ties; } cases[] = {
        {1, {1}, {1}, 4, 64, 32, 16, 32, 8, 32, 8, 0},
        {2, {28, 9}, {28, 1}, 4, 64, 32, 16, 32, 8, 32, 8, 0},
        {2, {300, 700}, {2, 1}, 16, 512, 128, 64, 128, 32, 128, 256, 0},
        {1, {5000}, {1}, 8, 512, 192, 64, 256, 32, 128, 2048, 0},
        {1, {100}, {20}, 4, 64, 32, 16, 32, 8, 32, 8, 1}, /* exact ties in the indexer keys */
        /* GLM-5's 64 heads, a 2048-token context next to a short prefill (the keys split over blocks) */
        {2, {2048, 37}, {1, 37}, 64, 512, 192, 64, 256, 32, 128, 2048, 0},
        /* more tokens than one pass of the absorbed kernel (512), 20 heads: a partial head group */
        {1, {600}, {600}, 20, 64, 32, 16, 32, 8, 32, 64, 0},
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int bs = 16, H = cases[cs].H, C = cases[cs].C, Dn = cases[cs].Dn, Dr = cases[cs].Dr, Dv = cases[cs].Dv;
        int Hi = cases[cs].Hi, Di = cases[cs].Di, Ki = cases[cs].Ki;
        TB b = tb_make(&r, cases[cs].S, cases[cs].ctx, cases[cs].ntok, bs);
        int T = b.h.n_tokens, W = C + Dr;
        ModelConfig c = test_mla_cfg(H, C, Dn, Dr, Dv, Ki);
        c.index_n_heads = Hi; c.index_head_dim = Di;
        float *cache = rnd(&r, (size_t)b.n_slots * W, 1), *icache = rnd(&r, (size_t)b.n_slots * Di, 1);
        if (cases[cs].ties) /* every key equal to one of four: many exactly tied scores */
            for (int s = 0; s < b.n_slots; s++) memcpy(icache + (size_t)s * Di, icache + (size_t)(s % 4) * Di, Di * 4);
        float *q = rnd(&r, (size_t)T * H * (Dn + Dr), 1), *iq = rnd(&r, (size_t)T * Hi * Di, 1), *iw = rnd(&r, (size_t)T * Hi, 1);
        TW wkvb = tw_make(&r, QF_NVFP4, H * (Dn + Dv), C);
        float *diq = up(iq, (size_t)T * Hi * Di * 4), *diw = up(iw, (size_t)T * Hi * 4);
        int *topk = malloc((size_t)T * Ki * 4), *dtopk = be_alloc(&gpu, (size_t)T * Ki * 4);
        for (int d = 0; d < 3; d++) {
            KVDtype dt = kv_dtypes[d];
            float ks = dt == KV_DTYPE_FP8 ? KV_KSCALE : 1; /* MLA: one scale for the row; indexer keys: 1 */
            KVLayer hk, dk;
            mla_layers(cache, icache, b.n_slots, W, Di, dt, ks, bs, &hk, &dk);
            indexer_cpu(&cpu, topk, iq, iw, &hk, &b.h, &c);
            be_indexer(&gpu, dtopk, diq, diw, &dk, &b.h, &b.d, &c);
            int *gtopk = (int *)down(dtopk, (size_t)T * Ki);
            int same = !memcmp(gtopk, topk, (size_t)T * Ki * 4);
            EXPECT(same, "indexer case %zu, %s cache: selections differ", cs, model_kv_dtype_name(dt));
            for (int use_topk = 0; use_topk < 2; use_topk++) {
                float *ref = malloc((size_t)T * H * Dv * 4), *dq = up(q, (size_t)T * H * (Dn + Dr) * 4);
                float *dout = be_alloc(&gpu, (size_t)T * H * Dv * 4);
                attention_mla_cpu(&cpu, ref, q, &hk, &wkvb.host, use_topk ? topk : NULL, Ki, &b.h, &c);
                be_attention_mla(&gpu, dout, dq, &dk, &wkvb.dev, use_topk ? dtopk : NULL, Ki, &b.h, &b.d, &c);
                float *got = down(dout, (size_t)T * H * Dv);
                EXPECT_CLOSE(got, ref, (size_t)T * H * Dv, TOL_F32, "mla case %zu topk %d, %s cache", cs, use_topk,
                             model_kv_dtype_name(dt));
                free(got); free(ref);
                be_free(&gpu, dq); be_free(&gpu, dout);
            }
            free(gtopk);
            mla_layers_free(&hk, &dk);
        }
        free(cache); free(icache); free(q); free(iq); free(iw); free(topk);
        be_free(&gpu, diq); be_free(&gpu, diw); be_free(&gpu, dtopk);
        tw_free(&wkvb);
        tb_free(&b);
    }
}

/* An indexer-like selection on the host: every causal key when there are at most Ki, else
 * about Ki positions <= pos drawn uniformly (increasing, at most Ki), -1 padded. */
static void topk_random(Rng *r, const Batch *b, int Ki, int *topk)
{
    for (int t = 0; t < b->n_tokens; t++) {
        int n = b->pos[t] + 1, k = 0, *row = topk + (size_t)t * Ki;
        for (int j = 0; j < n && k < Ki; j++)
            if (n <= Ki || rng_uniform(r) * n < Ki) row[k++] = j;
        while (k < Ki) row[k++] = -1;
    }
}

/* The absorbed form's kernels (MOESERVE_MLA_KERNEL auto: tensor cores; grouped: CUDA cores;
 * per-head) each against the CPU twin: contexts 1 to 32k, causal and top-k keys (with -1 holes),
 * ragged batches of prefill and decode tokens, every cache dtype (the tensor-core kernel hands a
 * float32 cache to the grouped one), GLM-5's shapes (C 512, Dr 64) with 64 and 8 heads, a small C,
 * and 20 heads (a partial group of the tensor-core kernel's 32). TOL_F32: the tensor-core kernel
 * feeds q_abs and p to the tensor cores as three BF16 parts (2^-24 |x|) and the BF16 / FP8 keys
 * exactly, so it keeps the float32 tolerance. */
TEST(cuda_attention_mla_kernels)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 27);
    struct { int S, ctx[3], ntok[3], H, C, Dn, Dr, Dv, Ki; } cases[] = {
        {1, {1}, {1}, 64, 512, 192, 64, 256, 2048},                     /* first decode token */
        {1, {17}, {1}, 8, 512, 192, 64, 256, 2048},
        {2, {300, 17}, {1, 17}, 64, 512, 192, 64, 256, 2048},           /* a decode and a prefill */
        {1, {2048}, {1}, 64, 512, 192, 64, 256, 2048},                  /* GLM-5 decode at 2048 */
        {3, {4096, 2048, 300}, {1, 2, 1}, 8, 512, 192, 64, 256, 2048},  /* top-k below the context */
        {1, {32768}, {1}, 8, 512, 192, 64, 256, 2048},                  /* 32k context */
        {3, {1, 17, 300}, {1, 17, 2}, 8, 64, 32, 16, 32, 64},           /* small C (the golden fixtures') */
        {2, {2048, 9}, {3, 9}, 64, 64, 32, 16, 32, 256},
        {1, {600}, {40}, 20, 64, 32, 16, 32, 64},                       /* 20 heads: a partial group */
    };
    const char *kernels[3] = {"auto", "grouped", "per-head"}; /* MOESERVE_MLA_KERNEL's choices, in order */
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int bs = 16, H = cases[cs].H, C = cases[cs].C, Dn = cases[cs].Dn, Dr = cases[cs].Dr, Dv = cases[cs].Dv;
        int Ki = cases[cs].Ki;
        TB b = tb_make(&r, cases[cs].S, cases[cs].ctx, cases[cs].ntok, bs);
        int T = b.h.n_tokens, W = C + Dr;
        ModelConfig c = test_mla_cfg(H, C, Dn, Dr, Dv, Ki);
        float *cache = rnd(&r, (size_t)b.n_slots * W, 1), *q = rnd(&r, (size_t)T * H * (Dn + Dr), 1);
        int *topk = malloc((size_t)T * Ki * 4);
        topk_random(&r, &b.h, Ki, topk);
        for (size_t i = 3; i < (size_t)T * Ki; i += 7) topk[i] = -1; /* holes among the selected */
        int *dtopk = up(topk, (size_t)T * Ki * 4);
        float *dq = up(q, (size_t)T * H * (Dn + Dr) * 4);
        size_t n = (size_t)T * H * Dv;
        float *ref = malloc(n * 4), *dout = be_alloc(&gpu, n * 4);
        TW wkvb = tw_make(&r, QF_NVFP4, H * (Dn + Dv), C);
        for (int d = 0; d < 3; d++) {
            KVDtype dt = kv_dtypes[d];
            float ks = dt == KV_DTYPE_FP8 ? KV_KSCALE : 1;
            KVLayer hk, dk;
            mla_layers(cache, NULL, b.n_slots, W, 0, dt, ks, bs, &hk, &dk);
            for (int use_topk = 0; use_topk < 2; use_topk++) {
                attention_mla_cpu(&cpu, ref, q, &hk, &wkvb.host, use_topk ? topk : NULL, Ki, &b.h, &c);
                for (int k = 0; k < 3; k++) {
                    knob_override(KNOB_MLA_KERNEL, k);
                    be_attention_mla(&gpu, dout, dq, &dk, &wkvb.dev, use_topk ? dtopk : NULL, Ki, &b.h, &b.d, &c);
                    float *got = down(dout, n);
                    EXPECT_CLOSE(got, ref, n, TOL_F32, "mla kernel %s case %zu (T %d H %d C %d) topk %d, %s cache",
                                 kernels[k], cs, T, H, C, use_topk, model_kv_dtype_name(dt));
                    free(got);
                }
                knob_override(KNOB_MLA_KERNEL, -1);
            }
            mla_layers_free(&hk, &dk);
        }
        tw_free(&wkvb);
        free(cache); free(q); free(topk); free(ref);
        be_free(&gpu, dtopk); be_free(&gpu, dq); be_free(&gpu, dout);
        tb_free(&b);
    }
}

/* MLA's expanded form (prefill, model/mla.c: kv_gather, the kv_b_proj GEMM, attention_mla_piece
 * over pieces of the context) on the GPU against the same on the CPU, and against the GPU's
 * absorbed form (be_attention_mla), contexts 1 to 4096, ragged batches, causal and top-k keys,
 * every cache dtype, pieces from 8 positions to be_mla_piece's, every piece kernel (tc also as
 * chosen for 99 KB of shared memory). Tolerances:
 * NVFP4 kv_b_proj (decoded to float32 in the GEMM tile) TOL_F32; BF16 kv_b_proj TOL_SPLIT, its
 * GEMM takes the latents as two BF16 halves (the absorbed form decodes the weight and keeps
 * float32); the tensor-core piece kernels TOL_SPLIT, its operands as two BF16 halves. */
TEST(cuda_attention_mla_expanded)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 24);
    struct { int S, ctx[3], ntok[3], H, C, Dn, Dr, Dv, Ki, piece; } cases[] = {
        {1, {1}, {1}, 4, 64, 32, 16, 32, 8, 0},                               /* one position */
        {2, {28, 9}, {28, 1}, 4, 64, 32, 16, 32, 8, 8},                       /* a prompt and a decode token */
        {3, {300, 17, 700}, {45, 17, 130}, 16, 512, 128, 64, 128, 256, 256}, /* ragged, 3 pieces */
        {1, {4096}, {64}, 8, 512, 192, 64, 256, 2048, 1024},                  /* GLM-5 head shapes, 4 pieces */
        {2, {4096, 1500}, {33, 300}, 8, 512, 192, 64, 256, 2048, 0},          /* be_mla_piece's size */
        {2, {4096, 37}, {1, 3}, 8, 512, 192, 64, 256, 2048, 0},               /* decode tokens */
    };
    /* kv_b_proj: NVFP4 as stored, NVFP4 repacked to W4P as model_upload does (where C % 256 ==
     * 0: the absorbed form's W_UK and W_UV products then run mla_*_w4_kernel, the expanded form's
     * GEMM the W4A16 kernels, TOL_W4), BF16 */
    QFormat fmts[3] = {QF_NVFP4, QF_NVFP4, QF_BF16};
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int bs = 16, H = cases[cs].H, C = cases[cs].C, Dn = cases[cs].Dn, Dr = cases[cs].Dr, Dv = cases[cs].Dv;
        int Ki = cases[cs].Ki;
        TB b = tb_make(&r, cases[cs].S, cases[cs].ctx, cases[cs].ntok, bs);
        int T = b.h.n_tokens, W = C + Dr;
        ModelConfig c = test_mla_cfg(H, C, Dn, Dr, Dv, Ki);
        int piece = cases[cs].piece ? cases[cs].piece : be_mla_piece(&c);
        float *cache = rnd(&r, (size_t)b.n_slots * W, 1), *q = rnd(&r, (size_t)T * H * (Dn + Dr), 1);
        int *topk = malloc((size_t)T * Ki * 4);
        topk_random(&r, &b.h, Ki, topk);
        int *dtopk = up(topk, (size_t)T * Ki * 4);
        float *dq = up(q, (size_t)T * H * (Dn + Dr) * 4);
        size_t n = (size_t)T * H * Dv;
        float *ref = malloc(n * 4), *dout = be_alloc(&gpu, n * 4), *dabs = be_alloc(&gpu, n * 4);
        MlaExpand hx, dx;
        mla_expand_init(&hx, &cpu, &c, T, piece);
        mla_expand_init(&dx, &gpu, &c, T, piece);
        for (int f = 0; f < 3; f++) {
            int w4p = f == 1;
            if (w4p && C % 256) continue;
            TW wkvb = w4p ? tw_make_w4(&r, H * (Dn + Dv), C) : tw_make(&r, fmts[f], H * (Dn + Dv), C);
            double tol = fmts[f] == QF_BF16 ? TOL_SPLIT : w4p ? TOL_W4 : TOL_F32;
            for (int d = 0; d < 3; d++) {
                KVDtype dt = kv_dtypes[d];
                float ks = dt == KV_DTYPE_FP8 ? KV_KSCALE : 1;
                KVLayer hk, dk;
                mla_layers(cache, NULL, b.n_slots, W, 0, dt, ks, bs, &hk, &dk);
                for (int use_topk = 0; use_topk < 2; use_topk++) {
                    mla_attention_expanded(&cpu, &hx, ref, q, &hk, &wkvb.host, use_topk ? topk : NULL, Ki, &b.h, &b.h, &c);
                    be_attention_mla(&gpu, dabs, dq, &dk, &wkvb.dev, use_topk ? dtopk : NULL, Ki, &b.h, &b.d, &c);
                    float *absd = down(dabs, n);
                    /* the absorbed form keeps float32 for every kv_b_proj format */
                    EXPECT_CLOSE(absd, ref, n, TOL_F32, "mla absorbed cuda vs expanded cpu: case %zu kv_b %s%s topk %d, %s cache",
                                 cs, qformat_name(fmts[f]), w4p ? " (W4P)" : "", use_topk, model_kv_dtype_name(dt));
                    /* the piece kernels (pk): f32 (float32, a thread per key: tol); on the tensor cores,
                     * q, k, p and v as two BF16 halves each, ~2^-16 of each operand as the GEMMs' split
                     * activations (TOL_SPLIT; measured on the H200 up to 1.4e-5 at GLM-5's heads): tc
                     * (64 queries a block), tc as chosen with 99 KB of shared memory (48 queries), tc128
                     * staged (tc's maths staged by cp.async, the default where it fits) */
                    static const char *pkn[] = {"f32", "tc", "tc at 99 KB", "tc128 staged"};
                    const size_t budget = w4_smem_budget(0);
                    for (int pk = 0; pk < 4; pk++) {
                        const double tk = pk && tol < TOL_SPLIT ? TOL_SPLIT : tol;
                        if (pk == 2) w4_set_smem_budget(99 * 1024);
                        knob_override(KNOB_MLA_PIECE_KERNEL, pk == 3 ? -1 : pk ? 1 /* tc */ : 2 /* f32 */);
                        const int kind = cuda_mla_piece_kernel(&gpu, &c);
                        /* every GPU of sm_80 on has 99 KB (101376 B); tc of 64 queries needs 101392 B
                         * at GLM-5's heads (over it: 48 queries then), 72.7 KB at (192, 128) and 20.5 KB
                         * at the fixtures' (32 + 16, 32); the staged one 198 KB (the H100, H200 and B200 have 227) */
                        const int glm5 = Dn + Dr == 256 && Dv == 256;
                        const int want = pk == 0 ? MLA_PREFILL_F32 : pk == 3 ? MLA_PREFILL_TC128_STAGED
                                         : (pk == 2 || budget < 99 * 1024 + 16) && glm5 ? MLA_PREFILL_TC48 : MLA_PREFILL_TC64;
                        if (pk < 3 || budget >= 227 * 1024) EXPECT(kind == want, "piece kernel choice %d for %s, case %zu (expected %d)",
                                                                 kind, pkn[pk], cs, want);
                        mla_attention_expanded(&gpu, &dx, dout, dq, &dk, &wkvb.dev, use_topk ? dtopk : NULL, Ki, &b.h, &b.d, &c);
                        float *got = down(dout, n);
                        EXPECT_CLOSE(got, ref, n, tk, "mla expanded cuda (piece %s) vs cpu: case %zu piece %d kv_b %s topk %d, %s cache",
                                     pkn[pk], cs, piece, qformat_name(fmts[f]), use_topk, model_kv_dtype_name(dt));
                        EXPECT_CLOSE(got, absd, n, tk, "mla expanded (piece %s) vs absorbed, cuda: case %zu piece %d kv_b %s%s topk %d, %s cache",
                                     pkn[pk], cs, piece, qformat_name(fmts[f]), w4p ? " (W4P)" : "", use_topk, model_kv_dtype_name(dt));
                        free(got);
                        w4_set_smem_budget(0);
                    }
                    knob_override(KNOB_MLA_PIECE_KERNEL, -1);
                    free(absd);
                }
                mla_layers_free(&hk, &dk);
            }
            tw_free(&wkvb);
        }
        mla_expand_free(&hx, &cpu);
        mla_expand_free(&dx, &gpu);
        free(cache); free(q); free(topk); free(ref);
        be_free(&gpu, dtopk); be_free(&gpu, dq); be_free(&gpu, dout); be_free(&gpu, dabs);
        tb_free(&b);
    }
}

/* The W4P repack of real checkpoint tensors through model_upload: every packed linear of the
 * NVFP4 fixtures against the CPU twin on the same (BF16-rounded) activations. */
#include "model/model.h"

TEST(cuda_w4_checkpoint_weights)
{
    NEED_GPU();
    const char *names[] = {"glm4moe-nvfp4", "glm5-nvfp4"};
    Rng r;
    rng_seed(&r, 23);
    int checked = 0;
    for (size_t f = 0; f < 2; f++) {
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/%s", test_data("golden"), names[f]);
        Model m, dm;
        model_load(&m, dir);
        model_upload(&dm, &m, &gpu);
        for (int l = 0; l < m.cfg.n_layers; l++) {
            const LayerWeights *hl = &m.layers[l], *dl = &dm.layers[l];
            const QTensor *hs[LAYER_LINEARS], *ds[LAYER_LINEARS];
            layer_linears(hl, hs);
            layer_linears(dl, ds);
            for (int i = 0; i < LAYER_LINEARS; i++) {
                if (!ds[i]->packed) continue;
                int T = 5, N = (int)hs[i]->rows, K = (int)hs[i]->cols;
                float *x = rnd(&r, (size_t)T * K, 1), *ref = calloc((size_t)T * N, 4);
                matmul_cpu(&cpu, ref, N, x, K, T, hs[i], NULL);
                float *dx = up(x, (size_t)T * K * 4), *dout = be_alloc(&gpu, (size_t)T * N * 4);
                be_matmul(&gpu, OP_GEMM_MLP, dout, N, dx, K, T, ds[i], NULL);
                float *got = down(dout, (size_t)T * N);
                EXPECT_CLOSE(got, ref, (size_t)T * N, TOL_W4, "%s layer %d tensor %d (%s) %d x %d", names[f], l, i,
                             hs[i]->name ? hs[i]->name : "?", N, K);
                checked++;
                free(x); free(ref); free(got);
                be_free(&gpu, dx); be_free(&gpu, dout);
            }
        }
        model_upload_free(&dm, &gpu);
        model_free(&m);
    }
    EXPECT(checked > 0, "no packed tensor in the fixtures");
    fprintf(stderr, "    %d packed checkpoint tensors checked\n", checked);
}

/* ---- sample: be_sample on the GPU against the cpu twin (sample_row): identical ids ----
 * Every combination of temperature {0, 0.3, 1, 2}, top-k {off, 1, 5, V-1, V}, top-p {off, 0.9,
 * 0.2, 1e-6} and min-p {off, 0.05}, twice with different uniforms, each row its own combination,
 * in batches of 1 to 64 rows. Logits normal * 3, every third row rounded to 1/4 (ties across
 * ids). No tolerance: the GPU's masses (fixed point, exact sums) differ from the cpu's double
 * sums by about 1e-9 of the total, which changes a token only when u * mass falls that close to
 * a boundary between two tokens; the seed is fixed, and none of these rows does. */
static const float SAMPLE_T[4] = {0, 0.3f, 1, 2}, SAMPLE_P[4] = {1, 0.9f, 0.2f, 1e-6f}, SAMPLE_M[2] = {0, 0.05f};
#define SAMPLE_COMBOS (4 * 5 * 4 * 2)

/* row logits of kind: 0 normal * 3; 1 the same rounded to 1/4; 2 with NaN, +-inf and +-0 among
 * them; 3 every logit -inf; 4 every logit NaN; 5 NaN but one */
static void sample_logits(Rng *r, float *x, int V, int kind)
{
    for (int i = 0; i < V; i++) {
        float v = rng_normal(r) * 3;
        x[i] = kind == 1 ? roundf(v * 4) / 4 : kind == 3 ? -INFINITY : kind >= 4 ? NAN : v;
    }
    if (kind == 2) /* a NaN, -inf, -0 and +0 (a tie) every 97 ids; now and then a +inf */
        for (int i = 0; i < V; i += 97) {
            x[i] = NAN;
            if (i + 1 < V) x[i + 1] = -INFINITY;
            if (i + 2 < V) x[i + 2] = -0.0f;
            if (i + 3 < V) x[i + 3] = 0.0f;
            if (i + 5 < V && (i / 97) % 7 == 3 && rng_uniform(r) < 0.5f) x[i + 5] = INFINITY;
        }
    if (kind == 5) x[V / 2] = 1.5f;
}

/* n rows of V logits, the kinds of row i kinds[i % n_kinds]; returns the rows that differ */
static int sample_compare(Rng *r, int V, const int *kinds, int n_kinds)
{
    static const int batch[] = {1, 64, 7, 33, 64, 2, 17, 64};
    int n = 2 * SAMPLE_COMBOS, bad = 0;
    int Ks[5] = {0, 1, 5, V - 1, V};
    SampleRow *p = malloc(n * sizeof *p);
    for (int i = 0; i < n; i++) {
        int c = i % SAMPLE_COMBOS;
        p[i] = (SampleRow){SAMPLE_T[c / 40], Ks[(c / 8) % 5], SAMPLE_P[(c / 2) % 4], SAMPLE_M[c % 2], rng_uniform(r)};
    }
    for (int at = 0, b = 0, rows; at < n; at += rows, b++) {
        rows = batch[b % 8] < n - at ? batch[b % 8] : n - at;
        float *x = malloc((size_t)rows * V * sizeof(float));
        for (int i = 0; i < rows; i++) sample_logits(r, x + (size_t)i * V, V, kinds[(at + i) % n_kinds]);
        int *want = malloc(rows * sizeof(int)), *got = malloc(rows * sizeof(int));
        be_sample(&cpu, want, x, rows, V, p + at);
        float *dx = up(x, (size_t)rows * V * sizeof(float));
        SampleRow *dp = up(p + at, rows * sizeof(SampleRow));
        int *dout = be_alloc(&gpu, rows * sizeof(int));
        be_sample(&gpu, dout, dx, rows, V, dp);
        be_to_host(&gpu, got, dout, rows * sizeof(int));
        for (int i = 0; i < rows; i++) {
            if (got[i] == want[i]) continue;
            const SampleRow *q = &p[at + i];
            if (bad++ < 10)
                fprintf(stderr, "      V %d row %d of %d (kind %d): T %g top_k %d top_p %g min_p %g u %.9g: cuda %d, cpu %d\n",
                        V, i, rows, kinds[(at + i) % n_kinds], q->temperature, q->top_k, q->top_p, q->min_p, q->u,
                        got[i], want[i]);
        }
        free(x); free(want); free(got);
        be_free(&gpu, dx); be_free(&gpu, dp); be_free(&gpu, dout);
    }
    free(p);
    return bad;
}

TEST(cuda_sample)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 31);
    fprintf(stderr, "    seed 31\n");
    static const int kinds[3] = {0, 0, 1};
    static const int Vs[3] = {7, 1000, 154880};
    for (int v = 0; v < 3; v++) {
        int bad = sample_compare(&r, Vs[v], kinds, 3);
        EXPECT(bad == 0, "V %d: %d of %d rows drew another token", Vs[v], bad, 2 * SAMPLE_COMBOS);
    }
}

/* NaN never a candidate, -inf a candidate of weight 0, -0 tied with +0, an infinite largest
 * logit, rows all -inf, all NaN, NaN but one: the GPU follows sample_row in each. */
TEST(cuda_sample_special_values)
{
    NEED_GPU();
    Rng r;
    rng_seed(&r, 37);
    fprintf(stderr, "    seed 37\n");
    static const int kinds[6] = {2, 2, 3, 2, 4, 5};
    static const int Vs[2] = {1000, 154880};
    for (int v = 0; v < 2; v++) {
        int bad = sample_compare(&r, Vs[v], kinds, 6);
        EXPECT(bad == 0, "V %d: %d of %d rows drew another token", Vs[v], bad, 2 * SAMPLE_COMBOS);
    }
}
