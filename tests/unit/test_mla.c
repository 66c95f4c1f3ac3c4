/* test_mla: MLA attention's two forms on the CPU (src/model/mla.c). The expanded form
 * (prefill: the cached latents through kv_b_proj a piece at a time, an online softmax across the
 * pieces) against the absorbed form (be_attention_mla, decode) on seeded random data: ragged
 * batches of 1 to 3 sequences (prefill chunks after earlier context, a decode token beside
 * them), causal and indexer top-k key sets, float32, BF16 and FP8 caches, pieces smaller than
 * the contexts. Also kv_gather's decoded rows, the rule that picks the form, and a batch that
 * expands its prompt chunks keeping its decoding sequences in the absorbed form (the engine on
 * the GLM-5 fixture: mixed steps give every request its tokens alone). The golden logits with
 * the expanded form forced on are in test_golden.c. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/knobs.h"
#include "base/util.h"
#include "model/forward.h"
#include "batch_fixture.h"
#include "engine_harness.h"
#include "test.h"

/* Relative L2 error of the expanded output against the absorbed one. Both read the same decoded
 * cache values and the same decoded weights in float32; they differ only in how the products
 * are associated (q . (W_UK c) against (W_UK^T q) . c over C = 64..512 and Dn terms, W_UV (sum p
 * c) against sum p (W_UV c), one softmax against per-piece rescaling), each sum of K float32
 * products carrying about sqrt(K) * 2^-24 relative error: measured below 1e-6, so 1e-5, the
 * float32 re-association bound of tests/cuda/test_cuda_ops.c (TOL_F32), holds with margin. */
#define MLA_FORMS_TOL 1e-5

typedef struct {
    Batch b;
    int n_slots;
} MB;

static MB mb_make(Rng *r, int S, const int *ctx, const int *ntok)
{
    MB m = {0};
    m.b = test_batch_make(r, S, ctx, ntok, 16, &m.n_slots);
    return m;
}

static void mb_free(MB *m) { test_batch_free(&m->b); }

/* An indexer-like selection: all causal keys when there are at most Ki, else Ki distinct
 * positions <= pos in a random order, some rows -1 padded at random places. */
static void topk_make(Rng *r, const Batch *b, int Ki, int *topk)
{
    for (int t = 0; t < b->n_tokens; t++) {
        int n = b->pos[t] + 1, *row = topk + (size_t)t * Ki;
        int *perm = malloc(n * sizeof(int));
        test_shuffle(r, perm, n);
        int take = n < Ki ? n : Ki - (int)(rng_u64(r) % 3); /* a few -1 even when full */
        for (int k = 0; k < Ki; k++) row[k] = -1;
        for (int k = 0; k < take; k++) row[k] = perm[k];
        /* move the padding to random places */
        for (int k = Ki - 1; k > 0; k--) {
            int j = (int)(rng_u64(r) % (k + 1)), x = row[k];
            row[k] = row[j];
            row[j] = x;
        }
        free(perm);
    }
}

/* A random BF16 [N, K] weight (rows of 1/sqrt(K) scale). */
static QTensor bf16_weight(Rng *r, int N, int K)
{
    uint16_t *w = malloc((size_t)N * K * 2);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = f32_to_bf16(rng_normal(r) / sqrtf((float)K));
    return (QTensor){.fmt = QF_BF16, .rows = N, .cols = K, .data = (uint8_t *)w, .gscale = 1.0f};
}


TEST(mla_expanded_matches_absorbed)
{
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    uint64_t seed = 41;
    rng_seed(&r, seed);
    fprintf(stderr, "    seed %llu\n", (unsigned long long)seed);
    struct { int S, ctx[3], ntok[3], H, C, Dn, Dr, Dv, Ki, piece; } cases[] = {
        {1, {1}, {1}, 4, 64, 32, 16, 32, 8, 16},                        /* a one-token prompt */
        {1, {37}, {37}, 4, 64, 32, 16, 32, 8, 16},                      /* a whole prompt, 3 pieces */
        {2, {28, 9}, {28, 1}, 4, 64, 32, 16, 32, 8, 8},                 /* a prompt and a decode token */
        {3, {300, 17, 129}, {45, 17, 3}, 8, 128, 48, 16, 40, 32, 64},   /* later chunks, ragged pieces */
        {2, {260, 200}, {60, 200}, 4, 512, 64, 32, 64, 64, 100},        /* C = 512, pieces of 100 */
        {1, {200}, {200}, 2, 64, 32, 16, 32, 256, 50},                  /* Ki above every context */
    };
    static const KVDtype dts[3] = {KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_FP8};
    double worst = 0;
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int H = cases[cs].H, C = cases[cs].C, Dn = cases[cs].Dn, Dr = cases[cs].Dr, Dv = cases[cs].Dv;
        int Ki = cases[cs].Ki, W = C + Dr;
        MB m = mb_make(&r, cases[cs].S, cases[cs].ctx, cases[cs].ntok);
        int T = m.b.n_tokens;
        ModelConfig c = test_mla_cfg(H, C, Dn, Dr, Dv, Ki);
        float *rows = malloc((size_t)m.n_slots * W * 4), *q = malloc((size_t)T * H * (Dn + Dr) * 4);
        for (size_t i = 0; i < (size_t)m.n_slots * W; i++) rows[i] = rng_normal(&r);
        for (size_t i = 0; i < (size_t)T * H * (Dn + Dr); i++) q[i] = rng_normal(&r);
        QTensor wkvb = bf16_weight(&r, H * (Dn + Dv), C);
        int *topk = malloc((size_t)T * Ki * sizeof(int));
        topk_make(&r, &m.b, Ki, topk);
        float *ref = malloc((size_t)T * H * Dv * 4), *got = malloc((size_t)T * H * Dv * 4);
        MlaExpand x;
        mla_expand_init(&x, &be, &c, T, cases[cs].piece);
        for (int d = 0; d < 3; d++) {
            float ks = dts[d] == KV_DTYPE_FP8 ? 0.05f : 1.0f;
            void *cache = calloc((size_t)m.n_slots * W, kv_elem_size(dts[d]));
            for (size_t i = 0; i < (size_t)m.n_slots * W; i++) kv_elem_store(cache, dts[d], i, rows[i], ks);
            KVLayer L = {.kv = cache, .block_size = 16, .kv_width = W, .dtype = dts[d], .k_scale = ks, .v_scale = 1};
            for (int use_topk = 0; use_topk < 2; use_topk++) {
                const int *tk = use_topk ? topk : NULL;
                be_attention_mla(&be, ref, q, &L, &wkvb, tk, Ki, &m.b, &m.b, &c);
                for (size_t i = 0; i < (size_t)T * H * Dv; i++) got[i] = NAN; /* every element must be written */
                mla_attention_expanded(&be, &x, got, q, &L, &wkvb, tk, Ki, &m.b, &m.b, &c);
                double e = test_rel_l2(got, ref, (size_t)T * H * Dv);
                worst = e > worst ? e : worst;
                EXPECT(e <= MLA_FORMS_TOL, "case %zu (T %d, piece %d), %s cache, topk %d: rel err %.3g > %g", cs, T,
                       cases[cs].piece, model_kv_dtype_name(dts[d]), use_topk, e, MLA_FORMS_TOL);
            }
            free(cache);
        }
        mla_expand_free(&x, &be);
        free(rows); free(q); free(topk); free(ref); free(got); free((void *)wkvb.data);
        mb_free(&m);
    }
    fprintf(stderr, "    worst rel err expanded vs absorbed: %.3g (tolerance %g)\n", worst, MLA_FORMS_TOL);
    backend_free(&be);
}

/* One piece equal to the whole context and many pieces of one position give the same result
 * as pieces of 16: the online softmax carries across any split. */
TEST(mla_expanded_piece_sizes_agree)
{
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    rng_seed(&r, 42);
    int ctx[2] = {70, 33}, ntok[2] = {30, 33}, H = 3, C = 64, Dn = 32, Dr = 16, Dv = 24, W = C + Dr, Ki = 20;
    MB m = mb_make(&r, 2, ctx, ntok);
    int T = m.b.n_tokens;
    ModelConfig c = test_mla_cfg(H, C, Dn, Dr, Dv, Ki);
    float *cache = malloc((size_t)m.n_slots * W * 4), *q = malloc((size_t)T * H * (Dn + Dr) * 4);
    for (size_t i = 0; i < (size_t)m.n_slots * W; i++) cache[i] = rng_normal(&r);
    for (size_t i = 0; i < (size_t)T * H * (Dn + Dr); i++) q[i] = rng_normal(&r);
    QTensor wkvb = bf16_weight(&r, H * (Dn + Dv), C);
    int *topk = malloc((size_t)T * Ki * sizeof(int));
    topk_make(&r, &m.b, Ki, topk);
    KVLayer L = {.kv = cache, .block_size = 16, .kv_width = W, .dtype = KV_DTYPE_F32, .k_scale = 1, .v_scale = 1};
    size_t n = (size_t)T * H * Dv;
    float *out[3];
    int pieces[3] = {16, 70, 1};
    for (int use_topk = 0; use_topk < 2; use_topk++) {
        for (int p = 0; p < 3; p++) {
            MlaExpand x;
            mla_expand_init(&x, &be, &c, T, pieces[p]);
            out[p] = malloc(n * 4);
            mla_attention_expanded(&be, &x, out[p], q, &L, &wkvb, use_topk ? topk : NULL, Ki, &m.b, &m.b, &c);
            mla_expand_free(&x, &be);
        }
        for (int p = 1; p < 3; p++) {
            double e = test_rel_l2(out[p], out[0], n);
            EXPECT(e <= MLA_FORMS_TOL, "pieces of %d against 16, topk %d: rel err %.3g", pieces[p], use_topk, e);
        }
        for (int p = 0; p < 3; p++) free(out[p]);
    }
    free(cache); free(q); free(topk); free((void *)wkvb.data);
    mb_free(&m);
    backend_free(&be);
}

/* kv_gather: the rows of positions j0.. of a sequence, decoded exactly as kv_elem_load. */
TEST(mla_kv_gather_decodes_rows)
{
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    rng_seed(&r, 43);
    int ctx[2] = {50, 90}, ntok[2] = {1, 1}, W = 40, n = 37;
    MB m = mb_make(&r, 2, ctx, ntok);
    static const KVDtype dts[3] = {KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_FP8};
    for (int d = 0; d < 3; d++) {
        float ks = dts[d] == KV_DTYPE_FP8 ? 0.05f : 1.0f;
        void *cache = calloc((size_t)m.n_slots * W, kv_elem_size(dts[d]));
        for (size_t i = 0; i < (size_t)m.n_slots * W; i++) kv_elem_store(cache, dts[d], i, rng_normal(&r), ks);
        int s = 1, j0 = 23, rows = 60;
        float *out = malloc((size_t)rows * n * 4);
        be_kv_gather(&be, out, cache, dts[d], ks, W, n, m.b.block_table + s * m.b.bt_stride, 16, j0, rows);
        int bad = 0;
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < n; k++) {
                int64_t slot = cpu_slot(&m.b, s, j0 + i, 16);
                bad += out[(size_t)i * n + k] != kv_elem_load(cache, dts[d], slot * W + k, ks);
            }
        EXPECT(bad == 0, "%s cache: %d of %d gathered elements differ", model_kv_dtype_name(dts[d]), bad, rows * n);
        free(out);
        free(cache);
    }
    mb_free(&m);
    backend_free(&be);
}

/* The rule: prompt tokens (of sequences with more tokens than decoding brings: one, or a token and
 * its drafts) at least min and at least half of the batch; a decode-only batch never. */
TEST(mla_expand_rule)
{
    int ntok_prefill[1] = {40}, ntok_small[1] = {20}, ntok_decode[64], ntok_mixed[3] = {40, 1, 1};
    for (int i = 0; i < 64; i++) ntok_decode[i] = 1;
    int ntok_mostly_decode[41];
    ntok_mostly_decode[0] = 32;
    for (int i = 1; i < 41; i++) ntok_mostly_decode[i] = 1;
    struct { int S; int *ntok; int min, want; } cases[] = {
        {1, ntok_prefill, 32, 1}, {1, ntok_small, 32, 0}, {1, ntok_small, 1, 1}, {64, ntok_decode, 32, 0},
        {64, ntok_decode, 1, 0}, {3, ntok_mixed, 32, 1}, {41, ntok_mostly_decode, 32, 0},
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        Batch b = {.n_seqs = cases[cs].S, .seq_ntok = cases[cs].ntok};
        for (int s = 0; s < b.n_seqs; s++) b.n_tokens += b.seq_ntok[s];
        EXPECT(mla_expand_use(&b, cases[cs].min) == cases[cs].want, "case %zu: %d sequences, min %d", cs, b.n_seqs,
               cases[cs].min);
    }
    /* speculative decoding: 8 sequences verifying a token and 3 drafts are decoding (verify_len
       4), not 32 prompt tokens; a 40-token chunk beside them still counts as a prompt */
    int ntok_verify[9] = {4, 4, 4, 4, 4, 4, 4, 4, 40};
    Batch v = {.n_seqs = 8, .seq_ntok = ntok_verify, .n_tokens = 32};
    EXPECT(mla_expand_use(&v, 32) == 1, "without verify_len: 32 prompt tokens");
    v.verify_len = 4;
    EXPECT(mla_expand_use(&v, 1) == 0, "verify_len 4: no prompt tokens");
    v.n_seqs = 9;
    v.n_tokens = 72;
    EXPECT(mla_expand_use(&v, 32) == 1, "a 40-token chunk beside the chains");
    EXPECT(mla_expand_min() >= 1);
}

/* The decoding sequences a batch puts first (one token each, or a token and its drafts under
 * verify_len), contiguous from token 0: they keep the absorbed form when the rest expands. */
TEST(mla_decode_prefix_of_a_batch)
{
    int ntok[5] = {1, 1, 4, 20, 1}, start[5] = {0, 1, 2, 6, 26};
    Batch b = {.n_seqs = 5, .seq_ntok = ntok, .seq_start = start, .n_tokens = 27};
    int Td = -1;
    EXPECT(mla_decode_prefix(&b, &Td) == 2 && Td == 2, "no drafts: 2 sequences of 1 token (%d tokens)", Td);
    b.verify_len = 4;
    EXPECT(mla_decode_prefix(&b, &Td) == 3 && Td == 6, "verify_len 4: 3 sequences, 6 tokens (%d)", Td);
    ntok[0] = 20, start[1] = 20;
    EXPECT(mla_decode_prefix(&b, &Td) == 0 && Td == 0, "a prompt chunk first: no prefix");
}

/* greedy tokens of n requests (prompt lengths lens, 10 tokens each) on the engine with options o */
static void mla_engine_run(const Model *m, Backend *be, const EngineOptions *o, int n, const int *lens, Out *out)
{
    static const int eos = 1;
    Engine *e = engine_create(m, be, o, &eos, 1);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    for (int i = 0; i < n; i++) {
        int p[128];
        for (int k = 0; k < lens[i]; k++) p[k] = 2 + (int)((i * 7919u + k * 104729u) % 500u);
        RequestParams r = {.prompt = p, .n_prompt = lens[i], .max_tokens = 10, .ignore_eos = 1};
        sampling_params_default(&r.sampling);
        r.sampling.temperature = 0;
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
        EXPECT(out[i].id > 0);
        if (o->max_running == 1) EXPECT(engine_collect(e, &w, &out[i], 1) == 0, "request %d alone", i);
    }
    if (o->max_running > 1) EXPECT(engine_collect(e, &w, out, n) == 0, "batched requests did not finish");
    engine_stop(e, 1);
    engine_free(e);
}

/* Steps that mix decoding sequences with prompt chunks, the expanded form forced on
 * (MOESERVE_MLA_EXPAND_MIN 1): the chunks expand, the decodes beside them keep the absorbed form
 * (mla_attention_split), and every request gets the tokens it gets alone, on the GLM-5 fixture
 * (MLA and the indexer) */
TEST(mla_engine_mixed_steps_match_alone)
{
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/glm5-bf16", test_data("golden"));
    Model m;
    model_load(&m, dir);
    Backend be;
    backend_cpu_init(&be, 2);
    knob_override(KNOB_MLA_EXPAND_MIN, 1);
    enum { N = 8 };
    int lens[N];
    for (int i = 0; i < N; i++) lens[i] = 9 + (i * 23) % 60;
    Out ref[N], got[N];
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 1;
    o.n_blocks = 64;
    o.max_model_len = 256;
    mla_engine_run(&m, &be, &o, N, lens, ref);
    o.max_running = 4;
    o.max_batch_tokens = 24; /* 4 decodes and a chunk of 16-20: the chunk is most of the step */
    o.chunked_prefill = 16;
    o.n_blocks = 128;
    mla_engine_run(&m, &be, &o, N, lens, got);
    for (int i = 0; i < N; i++)
        EXPECT(got[i].n == ref[i].n && !memcmp(got[i].toks, ref[i].toks, ref[i].n * sizeof(int)),
               "request %d: %d tokens batched, %d alone, or other tokens", i, got[i].n, ref[i].n);
    knob_override(KNOB_MLA_EXPAND_MIN, -1);
    backend_free(&be);
    model_free(&m);
}
