/* test_kv_dtype: the KV cache in float32, BF16 and FP8 (E4M3, per-tensor scale) on the CPU, the
 * reference the CUDA twins are compared with (tests/cuda/test_cuda_ops.c). Storage: kv_write
 * rounds exactly as the codecs of format/quant.h (float32 exact; BF16 round to nearest even; FP8
 * e4m3(x / scale) saturating, read back as code * scale). Reading: the attention ops and the
 * indexer over a BF16/FP8 cache give bit for bit what they give over a float32 cache holding
 * the decoded values (the conversion is the only difference). Model: logits and held-out
 * perplexity of the built-in model with each dtype against float32. Option: --kv-cache-dtype
 * and the checkpoint's kv_cache_quant_algo / k_scale / v_scale. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "base/util.h"
#include "model/kv_cache.h"
#include "format/safetensors.h"
#include "test.h"

static const KVDtype dtypes[3] = {KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_FP8};

/* what element x becomes in a cache of dt (the codecs of quant.h) */
static float rounded(KVDtype dt, float x, float scale)
{
    if (dt == KV_DTYPE_BF16) return bf16_to_f32(f32_to_bf16(x));
    if (dt == KV_DTYPE_FP8) return e4m3_to_f32(f32_to_e4m3(x / scale)) * scale;
    return x;
}

static int same_float(float a, float b) { return a == b || (a != a && b != b); }

TEST(kv_dtype_codec_device_twin)
{
    /* codec.h (what the CUDA kernels run) and the cpu's table against quant.c's decode, every code */
    Backend be;
    backend_cpu_init(&be, 1);
    for (int b = 0; b < 256; b++) {
        EXPECT(same_float(codec_e4m3_to_f32((uint8_t)b), e4m3_to_f32((uint8_t)b)), "code 0x%02x", b);
        EXPECT(same_float(cpu_e4m3[b], e4m3_to_f32((uint8_t)b)), "cpu table 0x%02x", b);
    }
    backend_free(&be);
    /* encode: round trip of every finite code, and the rounding of midpoints */
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        EXPECT_EQ_INT(codec_f32_to_e4m3(e4m3_to_f32((uint8_t)b)), b);
    }
    EXPECT_EQ_INT(codec_f32_to_e4m3(1.0625f), 0x38);  /* 1 + 1/16: halfway, to even (1.0) */
    EXPECT_EQ_INT(codec_f32_to_e4m3(1.1875f), 0x3a);  /* 1 + 3/16: halfway, to even (1.25) */
    EXPECT_EQ_INT(codec_f32_to_e4m3(1e9f), 0x7e);     /* saturates at 448 */
    EXPECT_EQ_INT(codec_f32_to_e4m3(-INFINITY), 0xfe);
    EXPECT_EQ_INT(codec_f32_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: halfway, to even */
}

TEST(kv_dtype_write_read_round_trip)
{
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    rng_seed(&r, 41);
    fprintf(stderr, "    seed 41\n");
    enum { T = 7, W = 40, OFF = 5, N = 29, LD = 33, SLOTS = 16 };
    int slot[T] = {3, 0, 15, -1, 8, 9, 1}; /* -1: padding, writes nothing */
    float src[T * LD];
    for (int i = 0; i < T * LD; i++) {
        /* magnitudes from 2^-14 (FP8 subnormals and underflow) to 2^10 (past 448: saturation) */
        float mag = ldexpf(1.0f + rng_uniform(&r), (int)(rng_u64(&r) % 25) - 14);
        src[i] = rng_u64(&r) & 1 ? -mag : mag;
    }
    src[0] = 0.0f;
    src[1] = -0.0f;
    const float scales[2] = {1.0f, 0.37f};
    for (int d = 0; d < 3; d++)
        for (int si = 0; si < 2; si++) {
            KVDtype dt = dtypes[d];
            float scale = scales[si];
            void *cache = be_alloc(&be, (size_t)SLOTS * W * kv_elem_size(dt));
            be_kv_write(&be, cache, dt, scale, W, OFF, src, LD, N, slot, T);
            int bad = 0, touched = 0;
            for (int s = 0; s < SLOTS; s++) {
                int t = -1;
                for (int k = 0; k < T; k++) t = slot[k] == s ? k : t;
                float buf[W];
                const float *row = cpu_kv_row(cache, dt, scale, s, W, 0, W, buf);
                for (int i = 0; i < W; i++) {
                    float want = t >= 0 && i >= OFF && i < OFF + N ? rounded(dt, src[t * LD + i - OFF], scale) : 0.0f;
                    float got = kv_elem_load(cache, dt, (int64_t)s * W + i, scale);
                    if (!same_float(got, want) || !same_float(row[i], want)) {
                        if (bad++ < 3)
                            test_fail(__FILE__, __LINE__, "%s scale %g slot %d col %d: %.9g (row %.9g), want %.9g",
                                      model_kv_dtype_name(dt), scale, s, i, got, row[i], want);
                    }
                    touched += t >= 0 && i >= OFF && i < OFF + N;
                }
            }
            EXPECT_EQ_INT(touched, 6 * N);
            /* the rounding error is at most the unit roundoff: 2^-8 BF16 (8 significant bits), 2^-4 E4M3 normals (4) */
            double rel = dt == KV_DTYPE_BF16 ? 0x1p-8 : dt == KV_DTYPE_FP8 ? 0x1p-4 : 0;
            for (int t = 0; t < T; t++) {
                if (slot[t] < 0) continue;
                for (int i = 0; i < N; i++) {
                    float x = src[t * LD + i], q = kv_elem_load(cache, dt, (int64_t)slot[t] * W + OFF + i, scale);
                    double ax = fabs(x) / scale;
                    if (dt == KV_DTYPE_FP8 && (ax < 0x1p-6 || ax > 448)) continue; /* subnormal / saturated */
                    EXPECT(fabs(q - x) <= rel * fabs(x), "%s: %.9g -> %.9g", model_kv_dtype_name(dt), x, q);
                }
            }
            if (dt == KV_DTYPE_FP8) { /* saturation at +-448 * scale */
                float big[1] = {-1e6f};
                int s0[1] = {2};
                be_kv_write(&be, cache, dt, scale, W, 0, big, 1, 1, s0, 1);
                EXPECT(kv_elem_load(cache, dt, 2 * W, scale) == -448.0f * scale);
            }
            be_free(&be, cache);
        }
    backend_free(&be);
}

/* A cache of dt with random rows, columns [0, split) stored with scale ks and the rest with vs
 * (GQA k | v), and the float32 cache of its decoded values. */
static void caches(Rng *r, KVDtype dt, float ks, float vs, int split, int slots, int W, void **q, float **f)
{
    float *x = malloc((size_t)slots * W * sizeof(float));
    int *all = malloc(slots * sizeof(int));
    for (int i = 0; i < slots * W; i++) x[i] = rng_normal(r) * 2;
    for (int s = 0; s < slots; s++) all[s] = s;
    Backend be;
    backend_cpu_init(&be, 1);
    *q = malloc((size_t)slots * W * kv_elem_size(dt));
    kv_write_cpu(&be, *q, dt, ks, W, 0, x, W, split, all, slots);
    if (split < W) kv_write_cpu(&be, *q, dt, vs, W, split, x + split, W, W - split, all, slots);
    *f = malloc((size_t)slots * W * sizeof(float));
    for (int i = 0; i < slots * W; i++) (*f)[i] = kv_elem_load(*q, dt, i, i % W < split ? ks : vs);
    free(x);
    free(all);
}

/* one sequence of n cached positions, its last T in the batch, blocks in reverse order */
static Batch one_seq(int n, int T, int bs, int *pos, int *seq, int *table)
{
    int nb = (n + bs - 1) / bs;
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;
    for (int t = 0; t < T; t++) {
        pos[t] = n - T + t;
        seq[t] = 0;
    }
    static int start = 0, ntok, ctx;
    ntok = T;
    ctx = n;
    return (Batch){.n_tokens = T, .pos = pos, .seq = seq, .n_seqs = 1, .seq_start = &start, .seq_ntok = &ntok,
                   .ctx_len = &ctx, .block_table = table, .bt_stride = nb, .max_ctx = n};
}

TEST(kv_dtype_attention_reads_decoded_values)
{
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    rng_seed(&r, 42);
    fprintf(stderr, "    seed 42\n");
    enum { BS = 16, N = 70, T = 5, SLOTS = 80 };
    int pos[T], seq[T], table[8];
    Batch b = one_seq(N, T, BS, pos, seq, table);
    for (int d = 1; d < 3; d++) {
        KVDtype dt = dtypes[d];
        /* GQA: H 4, Hkv 2, Dh 16; k and v with different scales */
        ModelConfig c = {0};
        c.n_heads = 4; c.n_kv_heads = 2; c.head_dim = 16; c.attn_scale = 0.25f;
        int W = 2 * 2 * 16;
        float *q = malloc(T * 4 * 16 * sizeof(float)), *o1 = malloc(T * 4 * 16 * 4), *o2 = malloc(T * 4 * 16 * 4);
        for (int i = 0; i < T * 4 * 16; i++) q[i] = rng_normal(&r);
        void *qc;
        float *fc;
        caches(&r, dt, 0.05f, 0.02f, W / 2, SLOTS, W, &qc, &fc);
        KVLayer Lq = {.kv = qc, .block_size = BS, .kv_width = W, .dtype = dt, .k_scale = 0.05f, .v_scale = 0.02f};
        KVLayer Lf = {.kv = fc, .block_size = BS, .kv_width = W, .dtype = KV_DTYPE_F32, .k_scale = 1, .v_scale = 1};
        attention_gqa_cpu(&be, o1, q, &Lq, &b, &c);
        attention_gqa_cpu(&be, o2, q, &Lf, &b, &c);
        EXPECT(!memcmp(o1, o2, T * 4 * 16 * 4), "gqa %s", model_kv_dtype_name(dt));
        free(q); free(o1); free(o2); free(qc); free(fc);

        /* MLA (C 32, Dr 8) with the indexer (Di 16, Ki 12) */
        ModelConfig m = {0};
        m.n_heads = 2; m.kv_lora_rank = 32; m.qk_nope_dim = 8; m.qk_rope_dim = 8; m.v_head_dim = 8;
        m.index_n_heads = 4; m.index_head_dim = 16; m.index_topk = 12; m.attn_scale = 0.25f;
        int Wm = 40, Di = 16;
        float *wb = malloc(2 * 16 * 32 * sizeof(float));
        for (int i = 0; i < 2 * 16 * 32; i++) wb[i] = rng_normal(&r) * 0.2f;
        QTensor wkv_b = {.fmt = QF_F32, .rows = 2 * 16, .cols = 32, .data = (const uint8_t *)wb, .gscale = 1};
        float *qm = malloc(T * 2 * 16 * 4), *iq = malloc(T * 4 * Di * 4), *iw = malloc(T * 4 * 4);
        for (int i = 0; i < T * 2 * 16; i++) qm[i] = rng_normal(&r);
        for (int i = 0; i < T * 4 * Di; i++) iq[i] = rng_normal(&r);
        for (int i = 0; i < T * 4; i++) iw[i] = rng_normal(&r);
        void *qk, *qi;
        float *fk, *fi;
        caches(&r, dt, 0.03f, 0, Wm, SLOTS, Wm, &qk, &fk);
        caches(&r, dt, 1.0f, 0, Di, SLOTS, Di, &qi, &fi);
        KVLayer Mq = {.kv = qk, .idx = qi, .block_size = BS, .kv_width = Wm, .idx_width = Di, .dtype = dt,
                      .k_scale = 0.03f, .v_scale = 1};
        KVLayer Mf = {.kv = fk, .idx = fi, .block_size = BS, .kv_width = Wm, .idx_width = Di, .dtype = KV_DTYPE_F32,
                      .k_scale = 1, .v_scale = 1};
        int k1[T * 12], k2[T * 12];
        indexer_cpu(&be, k1, iq, iw, &Mq, &b, &m);
        indexer_cpu(&be, k2, iq, iw, &Mf, &b, &m);
        EXPECT(!memcmp(k1, k2, sizeof k1), "indexer %s", model_kv_dtype_name(dt));
        float *m1 = malloc(T * 2 * 8 * 4), *m2 = malloc(T * 2 * 8 * 4);
        attention_mla_cpu(&be, m1, qm, &Mq, &wkv_b, k1, 12, &b, &m);
        attention_mla_cpu(&be, m2, qm, &Mf, &wkv_b, k1, 12, &b, &m);
        EXPECT(!memcmp(m1, m2, T * 2 * 8 * 4), "mla %s", model_kv_dtype_name(dt));
        free(wb); free(qm); free(iq); free(iw); free(qk); free(qi); free(fk); free(fi); free(m1); free(m2);
    }
    backend_free(&be);
}

TEST(kv_dtype_pool_sizing_and_choice)
{
    Model m;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
    model_load(&m, dir);
    ModelConfig *c = &m.cfg;
    size_t per_tok = (size_t)(model_kv_width(c) + model_index_width(c)) * c->n_layers;
    EXPECT_EQ_INT(c->kv_cache_fp8, 0);
    EXPECT_EQ_INT(model_kv_dtype(c, 1), KV_DTYPE_F32); /* auto: the cpu stays the float32 reference */
    EXPECT_EQ_INT(model_kv_dtype(c, 0), KV_DTYPE_BF16); /* auto on a GPU */
    EXPECT_EQ_INT(kv_cache_block_bytes(c, 16), 16 * per_tok * 4);
    const size_t es[3] = {4, 2, 1};
    Backend be;
    backend_cpu_init(&be, 1);
    for (int d = 0; d < 3; d++) {
        c->kv_dtype = dtypes[d];
        EXPECT_EQ_INT(kv_cache_block_bytes(c, 16), 16 * per_tok * es[d]);
        KVCache kv;
        kv_cache_init(&kv, c, &be, 16, 3);
        EXPECT_EQ_INT(kv.dtype, dtypes[d]);
        EXPECT_EQ_INT(kv.layers[0].dtype, dtypes[d]);
        EXPECT(kv.layers[1].k_scale == 1.0f && kv.layers[1].v_scale == 1.0f);
        kv_cache_free(&kv);
    }
    c->kv_dtype = KV_DTYPE_AUTO;
    c->kv_cache_fp8 = 1; /* the checkpoint asks for FP8: auto follows on both backends */
    EXPECT_EQ_INT(model_kv_dtype(c, 1), KV_DTYPE_FP8);
    EXPECT_EQ_INT(model_kv_dtype(c, 0), KV_DTYPE_FP8);
    c->kv_dtype = KV_DTYPE_BF16; /* ... unless overridden */
    EXPECT_EQ_INT(model_kv_dtype(c, 1), KV_DTYPE_BF16);
    KVDtype t;
    const char *ok[] = {"auto", "float32", "bf16", "bfloat16", "fp8", "fp8_e4m3"};
    const KVDtype want[] = {KV_DTYPE_AUTO, KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_BF16, KV_DTYPE_FP8, KV_DTYPE_FP8};
    for (int i = 0; i < 6; i++) {
        EXPECT(model_kv_dtype_parse(ok[i], &t) == 0 && t == want[i], "%s", ok[i]);
    }
    EXPECT(model_kv_dtype_parse("fp16", &t) < 0);
    EXPECT(model_kv_dtype_parse("fp8_e5m2", &t) < 0);
    EXPECT(model_kv_dtype_parse("", &t) < 0);
    backend_free(&be);
    model_free(&m);
}

TEST(kv_dtype_option_errors)
{
    const char *cmds[] = {"perplexity --model models/builtin-nvfp4 --text-file tests/data/heldout.txt",
                          "logits --model models/builtin-nvfp4 --tokens 1,2 --out /dev/null",
                          "generate --model models/builtin-nvfp4 --prompt hi",
                          "serve --model models/builtin-nvfp4", "bench model --model models/builtin-nvfp4"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s --kv-cache-dtype fp16", test_bin(), cmds[i]);
        int rc = test_run(cmd, &out);
        EXPECT(rc != 0, "%s: exit 0", cmd);
        EXPECT(out && strstr(out, "--kv-cache-dtype: 'fp16' is not one of auto, float32, bf16"), "%s: %s", cmd, out);
        EXPECT(out && strchr(out, '\n') == out + strlen(out) - 1, "one line: %s", out);
        free(out);
    }
}

/* ---- the model with each cache dtype ---- */

static float *run_logits(const char *model, const char *tokens, const char *dtype, size_t *n)
{
    char outf[600], *out = NULL;
    snprintf(outf, sizeof outf, "%s/kv-%s.f32", test_tmpdir(), dtype);
    size_t len = strlen(tokens) + 2048;
    char *cmd = malloc(len);
    snprintf(cmd, len, "%s logits --model %s --tokens %s --chunk 64 --device cpu --kv-cache-dtype %s --out %s",
             test_bin(), model, tokens, dtype, outf);
    int rc = test_run(cmd, &out);
    if (rc != 0) test_fail(__FILE__, __LINE__, "logits --kv-cache-dtype %s: exit %d: %s", dtype, rc, out);
    free(out);
    free(cmd);
    return rc ? NULL : test_read_f32(outf, n);
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median over rows of RMS(got - ref) / std(ref), ref's std taken over all rows x V */
static double logits_median_rms(const float *got, const float *ref, int rows, int V)
{
    size_t n = (size_t)rows * V;
    double mean = 0, var = 0, *e = malloc(rows * sizeof(double));
    for (size_t i = 0; i < n; i++) mean += ref[i];
    mean /= n;
    for (size_t i = 0; i < n; i++) var += (ref[i] - mean) * (ref[i] - mean);
    double sd = sqrt(var / n);
    for (int t = 0; t < rows; t++) {
        double d2 = 0;
        for (int v = 0; v < V; v++) {
            double d = (double)got[(size_t)t * V + v] - ref[(size_t)t * V + v];
            d2 += d * d;
        }
        e[t] = sqrt(d2 / V) / sd;
        if (e[t] != e[t]) e[t] = INFINITY;
    }
    qsort(e, rows, sizeof(double), dbl_cmp);
    double med = e[rows / 2];
    free(e);
    return med;
}

/* Logits with a BF16 / FP8 cache against the float32 cache, the first `rows` of T positions fed
 * in chunks of 64. Bound: on the median position, RMS(diff) / std(logits) <= 4 x the dtype's
 * unit roundoff (BF16 2^-8, E4M3 2^-4). The cache's rounding is a relative perturbation of at
 * most u per element, which the layers carry through roughly in proportion (measured below:
 * under 1u for both on the held-out text), while a wrong scale, k read with v's scale or a
 * wrong element size is off by orders of magnitude. The median, not the worst position: an MoE
 * router's (or the DSA indexer's) top-k can flip on a near tie and move that one position's
 * logits by a large step, a property of the model rather than of the cache (the perplexity
 * test below bounds their aggregate effect). */
#define LOGITS_TOL_BF16 (4 * 0x1p-8)
#define LOGITS_TOL_FP8 (4 * 0x1p-4)

static void check_model_logits(const char *model, const char *tokens, int T, int vocab, int rows)
{
    size_t n0, n1, n2;
    float *f = run_logits(model, tokens, "float32", &n0), *b = run_logits(model, tokens, "bf16", &n1);
    float *q = run_logits(model, tokens, "fp8", &n2);
    if (f && b && q) {
        EXPECT_EQ_INT(n0, (size_t)T * vocab);
        EXPECT_EQ_INT(n1, n0);
        EXPECT_EQ_INT(n2, n0);
        double eb = logits_median_rms(b, f, rows, vocab), eq = logits_median_rms(q, f, rows, vocab);
        fprintf(stderr, "    %s, %d positions: median RMS(logit diff) / std: bf16 %.2e (bound %.2e), fp8 %.2e "
                "(bound %.2e)\n", model, rows, eb, LOGITS_TOL_BF16, eq, LOGITS_TOL_FP8);
        EXPECT(eb <= LOGITS_TOL_BF16, "%s bf16: %.3g", model, eb);
        EXPECT(eq <= LOGITS_TOL_FP8, "%s fp8: %.3g", model, eq);
        EXPECT(eb > 0 && eq > eb, "the caches must differ from float32, FP8 the more (bf16 %.3g, fp8 %.3g)", eb, eq);
    }
    free(f); free(b); free(q);
}

/* the built-in model on 256 tokens of the held-out text (positions 1000..1255 of its encoding) */
TEST(kv_dtype_logits_builtin)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer models/builtin-nvfp4 --text-file %s 2>/dev/null", test_bin(),
             test_data("heldout.txt"));
    int rc = test_run(cmd, &out);
    ASSERT(rc == 0, "%s: %s", cmd, out);
    char *tokens = malloc(256 * 12), *p = out;
    size_t o = 0;
    int k = 0;
    for (int i = 0; i < 1256; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        if (i >= 1000) o += snprintf(tokens + o, 256 * 12 - o, "%s%ld", k++ ? "," : "", v);
    }
    free(out);
    ASSERT(k == 256, "the held-out text encodes to fewer than 1256 tokens");
    check_model_logits("models/builtin-nvfp4", tokens, 256, 8192, 256);
    free(tokens);
}

/* GLM-5 layout (MLA latent cache, DSA indexer keys) on the tiny random-weight fixture: only the
 * positions where the indexer takes every key (pos < index_topk = 8), since random weights make
 * its selection among more keys a matter of near ties */
TEST(kv_dtype_logits_mla_indexer)
{
    char tokens[4096];
    size_t o = 0;
    Rng r;
    rng_seed(&r, 43);
    fprintf(stderr, "    seed 43\n");
    for (int i = 0; i < 64; i++) o += snprintf(tokens + o, sizeof tokens - o, "%s%d", i ? "," : "", (int)(rng_u64(&r) % 512));
    check_model_logits(test_data("golden/glm5-bf16"), tokens, 64, 512, 8);
}

/* Held-out perplexity, the measure the cache dtype is judged by (docs/PERFORMANCE.md): BF16
 * within 0.5% of float32, FP8 within 3% (vLLM and SGLang report FP8 KV caches within about 1%
 * on large models; this 6-layer model with unscaled E4M3 is the harder case). */
#define PPL_TOL_BF16 0.005
#define PPL_TOL_FP8 0.03

static double ppl(const char *model, const char *dtype)
{
    char cmd[9000], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s perplexity --model %s --text-file %s --ctx 1025 --device cpu --kv-cache-dtype %s "
             "--json 2>/dev/null", test_bin(), model, test_data("heldout.txt"), dtype);
    int rc = test_run(cmd, &out);
    double v = NAN;
    json_t *j = rc == 0 ? json_loads(out, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    if (!j) {
        test_fail(__FILE__, __LINE__, "%s: exit %d: %s", cmd, rc, out);
    } else {
        v = json_number_value(json_object_get(j, "perplexity"));
        EXPECT_EQ_INT(json_integer_value(json_object_get(j, "tokens")), 22544);
        const char *got = json_string_value(json_object_get(j, "kv_cache_dtype"));
        KVDtype want, had;
        model_kv_dtype_parse(dtype, &want);
        EXPECT(got && model_kv_dtype_parse(got, &had) == 0 && had == want, "%s: kv_cache_dtype %s", dtype, got);
    }
    json_decref(j);
    free(out);
    return v;
}

TEST(kv_dtype_perplexity)
{
    const char *model = "models/builtin-nvfp4";
    double f = ppl(model, "float32"), b = ppl(model, "bf16"), q = ppl(model, "fp8");
    fprintf(stderr, "    %s --ctx 1025: perplexity float32 %.4f, bf16 %.4f (%+.3f%%), fp8 %.4f (%+.3f%%)\n", model, f, b,
            100 * (b / f - 1), q, 100 * (q / f - 1));
    EXPECT(fabs(b / f - 1) <= PPL_TOL_BF16, "bf16 %.6f vs float32 %.6f", b, f);
    EXPECT(fabs(q / f - 1) <= PPL_TOL_FP8, "fp8 %.6f vs float32 %.6f", q, f);
}

/* ---- the checkpoint asks for FP8 ---- */

static void link_into(const char *dir, const char *src_dir, const char *name)
{
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/%s/%s", test_root(), src_dir, name);
    snprintf(b, sizeof b, "%s/%s", dir, name);
    if (symlink(a, b) != 0) test_fail(__FILE__, __LINE__, "symlink %s -> %s failed", b, a);
}

/* models/builtin-nvfp4 with kv_cache_quant_algo "FP8" and, when scales, k_scale / v_scale for
 * every layer (a second shard listed by model.safetensors.index.json) */
static const char *fp8_checkpoint(const char *name, int scales, float ks, float vs)
{
    static char dir[1024];
    char err[512], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    const char *src = "models/builtin-nvfp4";
    const char *files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "model.safetensors"};
    for (int i = 0; i < 5; i++) link_into(dir, src, files[i]);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.0\"}, \"quantization\": {\"quant_algo\": \"NVFP4\", "
               "\"group_size\": 16, \"kv_cache_quant_algo\": \"FP8\", \"exclude_modules\": [\"lm_head\", "
               "\"model.embed_tokens\", \"model.layers.*.mlp.gate\"]}}\n");
    fclose(f);
    if (!scales) return dir;
    SafeTensors st = {0};
    snprintf(path, sizeof path, "%s/%s/model.safetensors", test_root(), src);
    if (safetensors_open_file(&st, path, err, sizeof err) < 0) { test_fail(__FILE__, __LINE__, "%s", err); return dir; }
    enum { L = 6 };
    int n = st.n_tensors + 2 * L;
    const char **names = calloc(n, sizeof *names), **shard = calloc(n, sizeof *shard);
    char sn[2 * L][96];
    StSpec specs[2 * L];
    float vals[2 * L];
    for (int i = 0; i < st.n_tensors; i++) { names[i] = st.tensors[i].name; shard[i] = "model.safetensors"; }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 2; k++) {
            int j = 2 * l + k;
            snprintf(sn[j], sizeof sn[j], "model.layers.%d.self_attn.%s", l, k ? "v_proj.v_scale" : "k_proj.k_scale");
            specs[j] = (StSpec){.name = sn[j], .dtype = DT_F32, .ndim = 0};
            vals[j] = k ? vs : ks;
            names[st.n_tensors + j] = sn[j];
            shard[st.n_tensors + j] = "kv_scales.safetensors";
        }
    StWriter w;
    snprintf(path, sizeof path, "%s/kv_scales.safetensors", dir);
    if (stw_open(&w, path, specs, 2 * L, "pt", err, sizeof err) < 0 || stw_write(&w, vals, sizeof vals, err, sizeof err) < 0 ||
        stw_close(&w, err, sizeof err) < 0 || st_index_write(dir, names, shard, n, 0, err, sizeof err) < 0)
        test_fail(__FILE__, __LINE__, "%s", err);
    free(names);
    free(shard);
    safetensors_free(&st);
    return dir;
}

TEST(kv_dtype_checkpoint_fp8)
{
    char dir[1024], noscale[1024]; /* fp8_checkpoint returns a static buffer */
    snprintf(dir, sizeof dir, "%s", fp8_checkpoint("kv-fp8", 1, 0.05f, 0.03f));
    Model m;
    model_load(&m, dir);
    EXPECT_EQ_INT(m.cfg.kv_cache_fp8, 1);
    EXPECT(m.cfg.kv_scale[5][0] == 0.05f && m.cfg.kv_scale[5][1] == 0.03f, "%g %g", m.cfg.kv_scale[5][0],
           m.cfg.kv_scale[5][1]);
    Backend be;
    backend_cpu_init(&be, 1);
    KVCache kv;
    kv_cache_init(&kv, &m.cfg, &be, 16, 2); /* auto: FP8 with the checkpoint's scales */
    EXPECT_EQ_INT(kv.dtype, KV_DTYPE_FP8);
    EXPECT(kv.layers[3].k_scale == 0.05f && kv.layers[3].v_scale == 0.03f);
    kv_cache_free(&kv);
    m.cfg.kv_dtype = KV_DTYPE_BF16; /* an override: no scales */
    kv_cache_init(&kv, &m.cfg, &be, 16, 2);
    EXPECT_EQ_INT(kv.dtype, KV_DTYPE_BF16);
    EXPECT(kv.layers[3].k_scale == 1.0f && kv.layers[3].v_scale == 1.0f);
    kv_cache_free(&kv);
    backend_free(&be);
    model_free(&m);

    /* end to end: auto picks FP8 and the scales are used (the figure differs from scale 1) */
    snprintf(noscale, sizeof noscale, "%s", fp8_checkpoint("kv-fp8-noscale", 0, 0, 0));
    char cmd[4096], *out = NULL;
    double v[3];
    const char *dirs[3] = {dir, noscale, dir}, *opt[3] = {"", "", "--kv-cache-dtype float32"};
    const char *want[3] = {"fp8_e4m3", "fp8_e4m3", "float32"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s perplexity --model %s --text-file %s --ctx 257 --max-windows 2 --device cpu %s --json",
                 test_bin(), dirs[i], test_data("heldout.txt"), opt[i]);
        int rc = test_run(cmd, &out);
        json_t *j = rc == 0 ? json_loads(out, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
        EXPECT(j, "%s: exit %d: %s", cmd, rc, out);
        const char *got = j ? json_string_value(json_object_get(j, "kv_cache_dtype")) : NULL;
        EXPECT(got && !strcmp(got, want[i]), "%s: kv_cache_dtype %s", cmd, got ? got : "?");
        v[i] = j ? json_number_value(json_object_get(j, "perplexity")) : NAN;
        json_decref(j);
        free(out);
    }
    fprintf(stderr, "    FP8 checkpoint, 2 windows of 257: k/v scales %.4f, scale 1 %.4f, float32 %.4f\n", v[0], v[1], v[2]);
    EXPECT(v[0] != v[1], "the checkpoint's scales were not used");
    EXPECT(fabs(v[0] / v[2] - 1) <= PPL_TOL_FP8 && fabs(v[1] / v[2] - 1) <= PPL_TOL_FP8);
}
