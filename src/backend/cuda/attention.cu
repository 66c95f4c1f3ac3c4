/* attention: causal attention over the paged KV cache on the GPU, one block per (token, head),
 * keys taken a chunk at a time with an online softmax (running max and sum, the accumulator
 * rescaled), so any context length works. Twins of attention_gqa_cpu and attention_mla_cpu.
 * GQA (GLM-4.5): thread d owns output dim d. MLA (GLM-5), absorbed form (§1.5.3): q_nope is
 * absorbed through W_UK into the latent space, scores against the cached latent and roped
 * k_pe, the output latent expanded through W_UV; the keys are the indexer's selection when
 * given. The cache is read in its dtype and converted per element (kv_elem_load: FP8 GQA k with
 * k_scale, v with v_scale, the MLA row with k_scale), as the CPU twins do.
 * MLA expanded form (prefill, model/mla.c): kv_gather_kernel decodes a piece of a sequence's
 * cache rows to float32, kv_b_proj expands them (matmul_cuda), attention_mla_piece_kernel folds
 * the piece into each (query, head)'s online softmax, kept across pieces in st and out (v0, a
 * thread per key; on the tensor cores attention_mla_piece_tc_kernel, v1, and
 * attention_mla_piece_t3_kernel, v3, the default where its shared memory fits). Twins of
 * kv_gather_cpu and attention_mla_piece_cpu. */
#include "w4.cuh" /* mma_bf16 */

#define ATT_THREADS 256
#define MLA_MAX_C 1024
#define MLA_MAX_DQ 1024  /* Dn + Dr of the expanded form's queries */
#define MLA_MAX_DV 1024  /* Dv: ATT_THREADS threads own MLA_MAX_DV / ATT_THREADS dims each */

/* block (t, h): thread d < Dh owns out[t, h, d]; thread j scores key j0 + j of the chunk */
static __global__ void attention_gqa_kernel(float *out, const float *q, const void *cache, KVDtype dt, float ks,
                                            float vs, int W, int bs, const int *seq, const int *pos,
                                            const int *block_table, int bt_stride, int H, int Hkv, int Dh, float scale)
{
    __shared__ float qs[ATT_THREADS], sc[ATT_THREADS], red[32];
    __shared__ int sl[ATT_THREADS];
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, kh = h / (H / Hkv);
    int s = seq[t], n = pos[t] + 1;
    if (tid < Dh) qs[tid] = q[((int64_t)t * H + h) * Dh + tid];
    float m = -INFINITY, l = 0.f, acc = 0.f;
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
        int j = j0 + tid;
        float z = -INFINITY;
        if (j < n) {
            int slot = batch_slot(block_table, bt_stride, s, j, bs);
            sl[tid] = slot;
            int64_t k0 = (int64_t)slot * W + kh * Dh;
            float d = 0.f;
            for (int i = 0; i < Dh; i++) d += qs[i] * kv_elem_load(cache, dt, k0 + i, ks);
            z = d * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = j < n ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        float psum = block_sum(p, red);
        float corr = expf(m - mnew);
        l = l * corr + psum;
        acc *= corr;
        m = mnew;
        __syncthreads();
        int cnt = min((int)blockDim.x, n - j0);
        if (tid < Dh)
            for (int jj = 0; jj < cnt; jj++)
                acc += sc[jj] * kv_elem_load(cache, dt, (int64_t)sl[jj] * W + (Hkv + kh) * Dh + tid, vs);
        __syncthreads();
    }
    if (tid < Dh) out[((int64_t)t * H + h) * Dh + tid] = acc / l;
}

void attention_gqa_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens || gqa_attention_cuda(be, out, q, kv, b, c)) return;
    if (c->head_dim > ATT_THREADS) die("attention_gqa_cuda: head_dim %d > %d", c->head_dim, ATT_THREADS);
    dim3 grid(b->n_tokens, c->n_heads);
    attention_gqa_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->v_scale, kv->kv_width, kv->block_size, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->n_kv_heads, c->head_dim, c->attn_scale);
    LAUNCH_CHECK("attention_gqa_kernel");
}

/* block (t, h). Phase 1: thread c computes q_abs[c] = sum_d q_nope[d] W_UK[d][c]. Phase 2: keys
 * a chunk at a time, thread j scores one key; thread owns latent dims c = tid + i * blockDim
 * of the output accumulator. Phase 3: thread v computes out[v] = sum_c W_UV[v][c] o_lat[c]. */
static __global__ void attention_mla_kernel(float *out, const float *q, const void *cache, KVDtype dt, float ks, int W,
                                            int bs, QTensor wkv_b,
                                            const int *topk, int ktop, const int *seq, const int *pos,
                                            const int *block_table, int bt_stride, int H, int C, int Dn, int Dr, int Dv,
                                            float scale)
{
    __shared__ float qa[MLA_MAX_C], ol[MLA_MAX_C], qp[64 * 4], sc[ATT_THREADS], red[32];
    __shared__ int sl[ATT_THREADS];
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int s = seq[t];
    const float *qn = q + ((int64_t)t * H + h) * (Dn + Dr);
    int64_t wrow = (int64_t)h * (Dn + Dv);
    for (int c = tid; c < C; c += nt) {
        float a = 0.f;
        for (int d = 0; d < Dn; d++) a += qn[d] * qt_elem(wkv_b, wrow + d, c);
        qa[c] = a;
    }
    for (int i = tid; i < Dr; i += nt) qp[i] = qn[Dn + i];
    int n = topk ? ktop : pos[t] + 1;
    float m = -INFINITY, l = 0.f, acc[MLA_MAX_C / ATT_THREADS];
    for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++) acc[i] = 0.f;
    __syncthreads();
    for (int j0 = 0; j0 < n; j0 += nt) {
        int j = j0 + tid;
        float z = -INFINITY;
        int key = -1;
        if (j < n) key = topk ? topk[(int64_t)t * ktop + j] : j;
        if (key >= 0) {
            int slot = batch_slot(block_table, bt_stride, s, key, bs);
            sl[tid] = slot;
            int64_t r0 = (int64_t)slot * W;
            float d1 = 0.f, d2 = 0.f;
            for (int i = 0; i < C; i++) d1 += qa[i] * kv_elem_load(cache, dt, r0 + i, ks);
            for (int i = 0; i < Dr; i++) d2 += qp[i] * kv_elem_load(cache, dt, r0 + C + i, ks);
            z = (d1 + d2) * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = key >= 0 ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        if (key < 0) sl[tid] = -1;
        float psum = block_sum(p, red);
        float corr = m == -INFINITY ? 0.f : expf(m - mnew);
        l = l * corr + psum;
        for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++) acc[i] *= corr;
        if (mnew != -INFINITY) m = mnew;
        __syncthreads();
        int cnt = min(nt, n - j0);
        for (int jj = 0; jj < cnt; jj++) {
            if (sl[jj] < 0) continue;
            int64_t r0 = (int64_t)sl[jj] * W;
#pragma unroll
            for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++)
                if (tid + i * nt < C) acc[i] += sc[jj] * kv_elem_load(cache, dt, r0 + tid + i * nt, ks);
        }
        __syncthreads();
    }
    for (int i = 0; i < MLA_MAX_C / ATT_THREADS; i++)
        if (tid + i * nt < C) ol[tid + i * nt] = acc[i] / l;
    __syncthreads();
    for (int v = tid; v < Dv; v += nt) {
        float a = 0.f;
        for (int c = 0; c < C; c++) a += qt_elem(wkv_b, wrow + Dn + v, c) * ol[c];
        out[((int64_t)t * H + h) * Dv + v] = a;
    }
}

static void attention_mla_v0(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    if (c->kv_lora_rank > MLA_MAX_C || c->qk_rope_dim > 256)
        die("attention_mla_cuda: kv_lora_rank %d / rope dim %d exceed the kernel's limits", c->kv_lora_rank, c->qk_rope_dim);
    dim3 grid(b->n_tokens, c->n_heads);
    attention_mla_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, q, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, *wkv_b, topk, ktop, b->seq, b->pos,
        b->block_table, b->bt_stride, c->n_heads, c->kv_lora_rank, c->qk_nope_dim, c->qk_rope_dim, c->v_head_dim,
        c->attn_scale);
    LAUNCH_CHECK("attention_mla_kernel");
}

/* ---- MLA absorbed form, v1: every key read once for a group of heads ----
 * In the absorbed form all heads of a token attend to the same cached rows [latent C | k_pe Dr]
 * (multi-query attention with 576-wide keys and 512-wide values for GLM-5), so a block takes
 * one token, MLA_HG heads and one split of the keys: each chunk of MLA_KC rows is read once,
 * coalesced, into shared memory and serves every head of the group. Three steps around it:
 * mla_qabs_kernel (q_nope through W_UK for 16 tokens a block, each weight read once per
 * block), the split-K partials combined by mla_combine_kernel (flash-decoding), and
 * mla_out_kernel (W_UV, 16 tokens a block). Tokens go MLA_TC at a time so that the scratch is
 * bounded; the number of splits depends only on the token count, never on the contexts, so a
 * captured graph replays with any context. MOESERVE_MLA_KERNEL=v0 keeps the first kernel. */
#define MLA_HG 16     /* heads a block */
#define MLA_KC 16     /* keys a chunk (MLA_HG x MLA_KC = ATT_THREADS score threads) */
#define MLA_TC 512    /* tokens a pass */
#define MLA_TT 16     /* tokens a block of the W_UK and W_UV products */
#define MLA_V1_MAX_C 512
#define MLA_V1_MAX_DN 256
/* v2 (below) */
#define MLA_MMA_HB 32      /* heads a block: two m16 tiles */
#define MLA_MMA_KC 32      /* keys a chunk: four n8 tiles, two k16 steps of P V */
#define MLA_MMA_THREADS 256
#define MLA_MMA_MAX_C 512  /* C % 64 == 0: eight warps of n8 tiles */
#define MLA_MMA_MAX_QW 768 /* C + Dr, a multiple of 16 */
#define MLA_MMA_MAX_S 64
#define MLA_MMA_PS (MLA_MMA_KC + 8) /* bf16 stride of a P row (80 bytes: ldmatrix without conflicts) */
#define MLA_MMA_SS (MLA_MMA_KC + 1) /* float stride of a score row */

static size_t mla_v1_smem(int C, int Dr) { return (size_t)(MLA_HG * (C + Dr) + MLA_KC * (C + Dr + 4)) * sizeof(float); }

/* MOESERVE_MLA_KERNEL: "v0", "v1", else the newest (2); read at every call, so that a test can
 * run each kernel in one process */
static int mla_kernel_env(void)
{
    const char *e = getenv("MOESERVE_MLA_KERNEL");
    return e && !strcmp(e, "v0") ? 0 : e && !strcmp(e, "v1") ? 1 : 2;
}

/* a kernel's dynamic shared memory smem beside its static __shared__ arrays within the GPU's
 * opt-in limit (the launch fails past it) */
static int mla_smem_fits(Backend *be, size_t smem, const void *fn)
{
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda_state(be)->device));
    cudaFuncAttributes a;
    CUDA_CHECK(cudaFuncGetAttributes(&a, fn));
    return smem + a.sharedSizeBytes <= (size_t)optin;
}

/* splits of the keys for a pass of T tokens. v1 (two blocks an SM fit): about two blocks per SM
 * in all, at most 32. v2 (one block an SM): at most one wave, at least one split, at most
 * MLA_MMA_MAX_S (2048 keys: chunks of 32 keys each). */
static int mla_splits(Backend *be, int T, int H, int v2)
{
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    if (v2) {
        int blocks = T * ((H + MLA_MMA_HB - 1) / MLA_MMA_HB), S = sms / blocks;
        return S < 1 ? 1 : S > MLA_MMA_MAX_S ? MLA_MMA_MAX_S : S;
    }
    int blocks = T * ((H + MLA_HG - 1) / MLA_HG), S = (2 * sms + blocks - 1) / blocks;
    return S < 1 ? 1 : S > 32 ? 32 : S;
}

/* qa[t, h] = [q_nope . W_UK[h] (C) | q_pe (Dr)]. Block (h, 64 latent columns, MLA_TT tokens):
 * thread owns column c for 4 of the tokens; W_UK[h][d][c] read once per block */
static __global__ void mla_qabs_kernel(float *qa, const float *q, QTensor w, int t0, int T, int H, int C, int Dn, int Dr,
                                       int Dv)
{
    __shared__ float qs[MLA_TT][MLA_V1_MAX_DN];
    int h = blockIdx.x, c = blockIdx.y * 64 + (threadIdx.x & 63), tg = threadIdx.x >> 6;
    int tb = blockIdx.z * MLA_TT, nt = min(MLA_TT, T - tb), Dq = Dn + Dr;
    for (int i = threadIdx.x; i < MLA_TT * Dn; i += blockDim.x) {
        int tt = i / Dn, d = i % Dn;
        qs[tt][d] = tt < nt ? q[((int64_t)(t0 + tb + tt) * H + h) * Dq + d] : 0.f;
    }
    __syncthreads();
    if (c < C) {
        float a[MLA_TT / 4] = {};
        int64_t row = (int64_t)h * (Dn + Dv);
        for (int d = 0; d < Dn; d++) {
            float wv = qt_elem(w, row + d, c);
#pragma unroll
            for (int k = 0; k < MLA_TT / 4; k++) a[k] += qs[tg * (MLA_TT / 4) + k][d] * wv;
        }
#pragma unroll
        for (int k = 0; k < MLA_TT / 4; k++) {
            int tt = tg * (MLA_TT / 4) + k;
            if (tt < nt) qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + c] = a[k];
        }
    }
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < nt * Dr; i += blockDim.x) {
            int tt = i / Dr, e = i % Dr;
            qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + C + e] = q[((int64_t)(t0 + tb + tt) * H + h) * Dq + Dn + e];
        }
}

/* block (token t0 + x, split y, head group z). Score thread (sh, sj) = (tid / MLA_KC, tid %
 * MLA_KC) scores key sj of the chunk for head sh; then thread owns latent dims c = tid + 256 i of
 * every head of the group. One split: ol = the normalised output; several: unnormalised partials
 * and (max, sum) per head into part / ml. */
static __global__ void __launch_bounds__(ATT_THREADS) mla_decode_kernel(
    float *ol, float *part, float *ml, const float *qa, const void *cache, KVDtype dt, float ks, int W, int bs,
    const int *topk, int ktop, const int *seq, const int *pos, const int *block_table, int bt_stride, int t0, int H, int C,
    int Dr, float scale, int S)
{
    extern __shared__ float mla_sm[];
    /* rows of QW floats (QW % 4 == 0: 16-byte loads); the keys' stride QW + 4 puts the 8 keys of a
     * quarter warp's 16-byte loads in different banks */
    const int QW = C + Dr, KW = C + Dr + 4;
    float *qs = mla_sm, *kc = qs + MLA_HG * QW;
    __shared__ float ps[MLA_HG][MLA_KC], mh[MLA_HG], lh[MLA_HG], cr[MLA_HG];
    __shared__ int sl[MLA_KC];
    int i0 = blockIdx.x, t = t0 + i0, sp = blockIdx.y, h0 = blockIdx.z * MLA_HG, nh = min(MLA_HG, H - h0);
    int tid = threadIdx.x, s = seq[t], n = topk ? ktop : pos[t] + 1;
    int jb = (int)((int64_t)n * sp / S), je = (int)((int64_t)n * (sp + 1) / S);
    const float *qsrc = qa + ((int64_t)i0 * H + h0) * QW;
    for (int i = tid; i < nh * QW; i += blockDim.x) qs[i] = qsrc[i];
    if (tid < MLA_HG) {
        mh[tid] = -INFINITY;
        lh[tid] = 0.f;
    }
    float acc[MLA_HG][MLA_V1_MAX_C / ATT_THREADS];
#pragma unroll
    for (int h = 0; h < MLA_HG; h++)
#pragma unroll
        for (int i = 0; i < MLA_V1_MAX_C / ATT_THREADS; i++) acc[h][i] = 0.f;
    const int sh = tid / MLA_KC, sj = tid % MLA_KC;
    __syncthreads();
    for (int j0 = jb; j0 < je; j0 += MLA_KC) {
        if (tid < MLA_KC) {
            int j = j0 + tid, key = -1;
            if (j < je) key = topk ? topk[(int64_t)t * ktop + j] : j;
            sl[tid] = key >= 0 ? batch_slot(block_table, bt_stride, s, key, bs) : -1;
        }
        __syncthreads();
        for (int i = tid; i < MLA_KC * QW; i += blockDim.x) {
            int jj = i / QW, e = i - jj * QW;
            kc[jj * KW + e] = sl[jj] >= 0 ? kv_elem_load(cache, dt, (int64_t)sl[jj] * W + e, ks) : 0.f;
        }
        __syncthreads();
        float z = -INFINITY;
        if (sh < nh && sl[sj] >= 0) {
            const float4 *qh = (const float4 *)(qs + sh * QW), *kj = (const float4 *)(kc + sj * KW);
            float d0 = 0.f, d1 = 0.f;
            for (int e = 0; e < QW / 4; e++) {
                float4 a = qh[e], k = kj[e];
                d0 += a.x * k.x + a.z * k.z;
                d1 += a.y * k.y + a.w * k.w;
            }
            z = (d0 + d1) * scale;
        }
        /* the head's 16 scores sit in 16 neighbouring lanes of one warp */
        float mx = z;
#pragma unroll
        for (int o = MLA_KC / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mold = mh[sh], mnew = fmaxf(mold, mx);
        float p = z == -INFINITY ? 0.f : expf(z - mnew), psum = p;
#pragma unroll
        for (int o = MLA_KC / 2; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        ps[sh][sj] = p;
        __syncthreads(); /* every thread has read mh */
        if (sj == 0) {
            float corr = mold == -INFINITY ? 0.f : expf(mold - mnew);
            cr[sh] = corr;
            lh[sh] = lh[sh] * corr + psum;
            mh[sh] = mnew;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MLA_V1_MAX_C / ATT_THREADS; i++) {
            int c = tid + ATT_THREADS * i;
            if (c < C) {
                float kv[MLA_KC];
#pragma unroll
                for (int jj = 0; jj < MLA_KC; jj++) kv[jj] = kc[jj * KW + c];
#pragma unroll
                for (int h = 0; h < MLA_HG; h++)
                    if (h < nh) {
                        float a = acc[h][i] * cr[h];
#pragma unroll
                        for (int jj = 0; jj < MLA_KC; jj++) a += ps[h][jj] * kv[jj];
                        acc[h][i] = a;
                    }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MLA_V1_MAX_C / ATT_THREADS; i++) {
        int c = tid + ATT_THREADS * i;
        if (c >= C) continue;
#pragma unroll
        for (int h = 0; h < MLA_HG; h++)
            if (h < nh) {
                if (S == 1) ol[((int64_t)i0 * H + h0 + h) * C + c] = lh[h] > 0.f ? acc[h][i] / lh[h] : 0.f;
                else part[(((int64_t)i0 * S + sp) * H + h0 + h) * C + c] = acc[h][i];
            }
    }
    if (S > 1 && tid < nh) {
        float *o = ml + (((int64_t)i0 * S + sp) * H + h0 + tid) * 2;
        o[0] = mh[tid];
        o[1] = lh[tid];
    }
}

/* block (token, head): the splits' partials rescaled to their common max and normalised */
static __global__ void mla_combine_kernel(float *ol, const float *part, const float *ml, int H, int C, int S)
{
    int i0 = blockIdx.x, h = blockIdx.y;
    float M = -INFINITY, L = 0.f;
    for (int sp = 0; sp < S; sp++) M = fmaxf(M, ml[(((int64_t)i0 * S + sp) * H + h) * 2]);
    for (int sp = 0; sp < S; sp++) {
        const float *o = ml + (((int64_t)i0 * S + sp) * H + h) * 2;
        if (o[1] > 0.f) L += o[1] * expf(o[0] - M);
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.f;
        for (int sp = 0; sp < S; sp++) {
            const float *o = ml + (((int64_t)i0 * S + sp) * H + h) * 2;
            if (o[1] > 0.f) a += part[(((int64_t)i0 * S + sp) * H + h) * C + c] * expf(o[0] - M);
        }
        ol[((int64_t)i0 * H + h) * C + c] = L > 0.f ? a / L : 0.f;
    }
}

/* out[t, h, v] = W_UV[h][v] . ol[t, h]. Block (h, 32 values, MLA_TT tokens): warp w takes
 * values 4w..4w+3, its lanes the latent dims; each W_UV row read once per block */
static __global__ void mla_out_kernel(float *out, const float *ol, QTensor w, int t0, int T, int H, int C, int Dn, int Dv)
{
    extern __shared__ float mla_os[]; /* [MLA_TT][C] */
    pdl_trigger();                    /* o_proj after it */
    int h = blockIdx.x, v0 = blockIdx.y * 32, tb = blockIdx.z * MLA_TT, nt = min(MLA_TT, T - tb);
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < MLA_TT * C; i += blockDim.x) {
        int tt = i / C, c = i - tt * C;
        mla_os[i] = tt < nt ? ol[((int64_t)(tb + tt) * H + h) * C + c] : 0.f;
    }
    __syncthreads();
    for (int k = 0; k < 4; k++) {
        int v = v0 + wp * 4 + k;
        if (v >= Dv) break;
        int64_t row = (int64_t)h * (Dn + Dv) + Dn + v;
        float a[MLA_TT] = {};
        for (int c = lane; c < C; c += 32) {
            float wv = qt_elem(w, row, c);
#pragma unroll
            for (int tt = 0; tt < MLA_TT; tt++) a[tt] += wv * mla_os[tt * C + c];
        }
#pragma unroll
        for (int tt = 0; tt < MLA_TT; tt++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a[tt] += __shfl_xor_sync(0xffffffffu, a[tt], o);
            if (lane == 0 && tt < nt) out[((int64_t)(t0 + tb + tt) * H + h) * Dv + v] = a[tt];
        }
    }
}

/* ---- W_UK and W_UV from a packed NVFP4 kv_b_proj (W4P, w4.cuh) on the tensor cores ----
 * The generic products above read the weight one element at a time (qt_elem), which costs a
 * W4P weight ~100x its bytes (issue #5; at batch 1 they were 2.2 of a 6-layer GLM-5 step's 3.8
 * ms). Here a warp streams whole W4P records, decodes them in registers (w4_decode_chunk) and
 * multiplies on mma.sync m16n8k16 with 8 tokens an n8 tile. The activations enter as three BF16
 * parts (x = p0 + p1 + p2, 24 significant bits) and the weights are exact in BF16, so the float32
 * results of the generic kernels hold (TOL_F32). Needs C % 256 == 0 (a record is 256 columns)
 * and Dn, Dv multiples of 16 (a head's W_UK and W_UV rows start on a record row). */
#define MLA_W4_TOK 64   /* tokens a block of mla_out_w4_kernel (8 n8 tiles) */
#define MLA_W4_KS 4     /* warps of mla_qabs_w4_kernel, the head's Dn rows split between them */

static int mla_w4_ok(const QTensor *w, const ModelConfig *c)
{
    return w->fmt == QF_NVFP4 && w->packed && c->kv_lora_rank % W4_KG == 0 && c->qk_nope_dim % 16 == 0 &&
           c->v_head_dim % 16 == 0;
}

/* x (two consecutive floats) as three BF16 pairs whose sum is x to 24 bits */
__device__ __forceinline__ void mla_split3(float x0, float x1, uint32_t (&p)[3])
{
#pragma unroll
    for (int i = 0; i < 3; i++) {
        __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
        p[i] = *(uint32_t *)&v;
        x0 -= __low2float(v);
        x1 -= __high2float(v);
    }
}

/* the 8 x 8 b16 sub-matrix of a fragment register, transposed */
__device__ __forceinline__ uint32_t movtrans(uint32_t a)
{
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

/* out[t0 + tb + n, h, v] = sum_c ol[tb + n, h, c] W[h (Dn + Dv) + Dn + v, c]: block (head h,
 * MLA_W4_TOK tokens from tb); warp w takes the head's row tiles (16 v) w, w + warps, ..; each
 * lane's 16 activations of a chunk are the natural columns 64 c + 16 t.. (w4.cuh), read from
 * float32 and split in registers. */
static __global__ void __launch_bounds__(512) mla_out_w4_kernel(float *out, const float *ol, QTensor w, int t0, int T,
                                                                 int H, int C, int Dn, int Dv)
{
    pdl_trigger(); /* o_proj after it */
    const int h = blockIdx.x, tb = blockIdx.y * MLA_W4_TOK, nt = min(MLA_W4_TOK, T - tb);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = blockDim.x >> 5, KG = C / W4_KG;
    const float sc = w.gscale * 512.f; /* the decode's 2^-9 (w4.cuh) */
    for (int rt = threadIdx.x >> 5; rt < Dv / 16; rt += nw) {
        const uint8_t *rec0 = w.data + (((int64_t)h * (Dn + Dv) + Dn) / 16 + rt) * KG * W4_REC;
        for (int n0 = 0; n0 < nt; n0 += 8) {
            const float *x = ol + ((int64_t)(tb + min(n0 + g, nt - 1)) * H + h) * C + t * 16;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            W4Frag cur, nxt;
            w4_load(cur, rec0, lane);
            for (int G = 0; G < KG; G++) {
                if (G + 1 < KG) w4_load(nxt, rec0 + (size_t)(G + 1) * W4_REC, lane);
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    uint32_t a[4][4];
                    w4_decode_chunk(cur, c, a);
                    const float4 *p = (const float4 *)(x + G * W4_KG + c * 64);
                    float f[16];
                    *(float4 *)&f[0] = p[0];
                    *(float4 *)&f[4] = p[1];
                    *(float4 *)&f[8] = p[2];
                    *(float4 *)&f[12] = p[3];
                    uint32_t b[8][3];
#pragma unroll
                    for (int i = 0; i < 8; i++) mla_split3(f[2 * i], f[2 * i + 1], b[i]);
#pragma unroll
                    for (int s = 0; s < 3; s++)
                        w4_mma_chunk(acc, a, make_uint4(b[0][s], b[1][s], b[2][s], b[3][s]),
                                     make_uint4(b[4][s], b[5][s], b[6][s], b[7][s]));
                }
                cur = nxt;
            }
            /* acc: rows g, g + 8 of the tile (v) x tokens n0 + 2t, + 1 */
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int n = n0 + 2 * t + (r & 1), v = rt * 16 + g + 8 * (r >> 1);
                if (n < nt) out[((int64_t)(t0 + tb + n) * H + h) * Dv + v] = acc[r] * sc;
            }
        }
    }
}

/* qa[tb + n, h, c] = sum_d q[t0 + tb + n, h, d] W[h (Dn + Dv) + d, c] (d < Dn), and the roped part
 * copied: block (head h, record column G: 256 latent columns, 8 tokens from tb). The sum runs over
 * the weight's rows, so each decoded 16 x 16 step is transposed in registers (movmatrix: the
 * fragment's four 8 x 8 parts, the off-diagonal two swapped) to be the A operand with the 16
 * rows as k; B is then the query's 16 values of those rows in natural order, and the output row
 * m of step j of chunk c is the latent column 256 G + 64 c + 16 (m % 8 / 2) + 4 j + (m % 2) + 2 (m
 * / 8) (W4P's order of a step's columns). The MLA_W4_KS warps take the Dn / 16 row tiles in turn;
 * their sums meet in shared memory, added in warp order. */
static __global__ void __launch_bounds__(MLA_W4_KS * 32) mla_qabs_w4_kernel(float *qa, const float *q, QTensor w, int t0,
                                                                            int T, int H, int C, int Dn, int Dr, int Dv)
{
    __shared__ float red[MLA_W4_KS - 1][64][32];
    const int h = blockIdx.x, G = blockIdx.y, tb = blockIdx.z * 8, nt = min(8, T - tb), Dq = Dn + Dr;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3, KG = C / W4_KG;
    const float *x = q + ((int64_t)(t0 + tb + min(g, nt - 1)) * H + h) * Dq + 2 * t;
    float acc[4][4][4] = {};
    for (int i = wp; i < Dn / 16; i += MLA_W4_KS) {
        W4Frag f;
        w4_load(f, w.data + (((int64_t)h * (Dn + Dv)) / 16 + i) * KG * W4_REC + (size_t)G * W4_REC, lane);
        uint32_t b0[3], b1[3]; /* rows 16 i + 2t, + 1 and 16 i + 2t + 8, + 9 of token g */
        mla_split3(x[16 * i], x[16 * i + 1], b0);
        mla_split3(x[16 * i + 8], x[16 * i + 9], b1);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[4][4];
            w4_decode_chunk(f, c, a);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t t0r = movtrans(a[j][0]), t1r = movtrans(a[j][2]), t2r = movtrans(a[j][1]), t3r = movtrans(a[j][3]);
#pragma unroll
                for (int s = 0; s < 3; s++) mma_bf16(acc[c][j], t0r, t1r, t2r, t3r, b0[s], b1[s]);
            }
        }
    }
    if (wp > 0) {
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) red[wp - 1][c * 16 + j * 4 + r][lane] = acc[c][j][r];
    }
    __syncthreads();
    if (wp == 0) {
        const float sc = w.gscale * 512.f;
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    float s = acc[c][j][r];
                    for (int k = 0; k < MLA_W4_KS - 1; k++) s += red[k][c * 16 + j * 4 + r][lane];
                    int m = g + 8 * (r >> 1), n = 2 * t + (r & 1);
                    int col = G * W4_KG + c * 64 + 16 * ((m & 7) >> 1) + 4 * j + (m & 1) + 2 * (m >> 3);
                    if (n < nt) qa[((int64_t)(tb + n) * H + h) * (C + Dr) + col] = s * sc;
                }
    }
    if (G == 0)
        for (int i = threadIdx.x; i < nt * Dr; i += blockDim.x) {
            int tt = i / Dr, e = i % Dr;
            qa[((int64_t)(tb + tt) * H + h) * (C + Dr) + C + e] = q[((int64_t)(t0 + tb + tt) * H + h) * Dq + Dn + e];
        }
}

/* ---- MLA absorbed form, v2: the keys' products on the tensor cores ----
 * Same steps as v1 (mla_qabs_kernel, split-K partials, mla_combine_kernel, mla_out_kernel); the
 * block (token, split, 32 heads) runs the scores S = Q K^T [32 heads x 32 keys, K = C + Dr]
 * and the latent P V [32 heads x C, K = 32 keys] as mma.sync m16n8k16 BF16 with float32
 * accumulators. The keys enter exact: BF16 rows as stored, FP8 codes converted to BF16 (3
 * significant bits) with k_scale applied to the scores and the output in float32. q_abs and p
 * are split into three BF16 parts (x = hi + mid + lo, the residual below 2^-24 |x|, as float32
 * rounding) and every product runs three times, so the op keeps the float32 tolerance of its
 * CPU twin (two parts would leave 2^-16 |x|, about TOL_F32 itself). A float32 cache (a test
 * setting) takes v1. Warps: scores, warp w owns head tile w & 1 and key tile w >> 1; softmax,
 * 8 threads a head; latent output, warp w owns columns w C/8 .. (w + 1) C/8 - 1 of both head
 * tiles (C/64 n-tiles of 8). MOESERVE_MLA_KERNEL=v1 / v0 select the older kernels. */
/* bf16 stride of a q / key row: 16-byte rows whose stride is an odd multiple of 16 bytes mod 128,
 * so the 8 rows of an ldmatrix fall in different banks */
static __host__ __device__ int mla_mma_qs(int QW) { return QW + 8; }

static size_t mla_mma_smem(int C, int Dr)
{
    int QS = mla_mma_qs(C + Dr);
    return (size_t)(3 * MLA_MMA_HB + MLA_MMA_KC) * QS * 2 + (size_t)3 * MLA_MMA_HB * MLA_MMA_PS * 2 +
           (size_t)MLA_MMA_HB * MLA_MMA_SS * 4;
}

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x2(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x2_trans(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

/* x = hi + mid + lo, each BF16 (round to nearest; the differences are exact in float32) */
__device__ __forceinline__ void bf16_split3(float x, __nv_bfloat16 *hi, __nv_bfloat16 *mid, __nv_bfloat16 *lo)
{
    *hi = __float2bfloat16_rn(x);
    float r = x - __bfloat162float(*hi);
    *mid = __float2bfloat16_rn(r);
    *lo = __float2bfloat16_rn(r - __bfloat162float(*mid));
}

/* Block (token t0 + x, split y, head group z of MLA_MMA_HB). Split y takes the chunks
 * [y cps, (y + 1) cps) of the token's n keys (cps = ceil(ceil(n / KC) / S)); a split past the
 * end writes an empty partial (max -inf, sum 0), so the grid depends on the token count only.
 * Output as v1: S == 1 the normalised latent into ol, else partials into part / ml. */
static __global__ void __launch_bounds__(MLA_MMA_THREADS, 1) mla_mma_decode_kernel(
    float *ol, float *part, float *ml, const float *qa, const void *cache, KVDtype dt, float ks, int W, int bs,
    const int *topk, int ktop, const int *seq, const int *pos, const int *block_table, int bt_stride, int t0, int H, int C,
    int Dr, float scale, int S)
{
    extern __shared__ __align__(16) unsigned char mla_mma_sm[];
    const int QW = C + Dr, QS = mla_mma_qs(QW);
    __nv_bfloat16 *qs = (__nv_bfloat16 *)mla_mma_sm;          /* [3][HB][QS] q_abs | q_pe parts */
    __nv_bfloat16 *kc = qs + 3 * MLA_MMA_HB * QS;              /* [KC][QS] the chunk's rows */
    __nv_bfloat16 *ps = kc + MLA_MMA_KC * QS;                  /* [3][HB][PS] p parts */
    float *sc = (float *)(ps + 3 * MLA_MMA_HB * MLA_MMA_PS);   /* [HB][SS] scores */
    __shared__ float mh[MLA_MMA_HB], lh[MLA_MMA_HB], cr[MLA_MMA_HB];
    __shared__ int sl[MLA_MMA_KC];
    int i0 = blockIdx.x, t = t0 + i0, sp = blockIdx.y, h0 = blockIdx.z * MLA_MMA_HB, nh = min(MLA_MMA_HB, H - h0);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, tq = lane & 3;
    int s = seq[t], n = topk ? ktop : pos[t] + 1;
    int cps = ((n + MLA_MMA_KC - 1) / MLA_MMA_KC + S - 1) / S;
    int jb = sp * cps * MLA_MMA_KC, je = min(n, jb + cps * MLA_MMA_KC);
    float zs = scale * (dt == KV_DTYPE_FP8 ? ks : 1.f), vsc = dt == KV_DTYPE_FP8 ? ks : 1.f;

    /* q rows of the group (rows past nh zero), split into parts: thread owns 4 columns a step */
    const float *qsrc = qa + ((int64_t)i0 * H + h0) * QW;
    for (int i = tid; i < MLA_MMA_HB * QW / 4; i += MLA_MMA_THREADS) {
        int h = i / (QW / 4), e = (i - h * (QW / 4)) * 4;
        float4 v = h < nh ? *(const float4 *)(qsrc + (int64_t)h * QW + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        float x[4] = {v.x, v.y, v.z, v.w};
        for (int k = 0; k < 4; k++)
            bf16_split3(x[k], &qs[h * QS + e + k], &qs[(MLA_MMA_HB + h) * QS + e + k], &qs[(2 * MLA_MMA_HB + h) * QS + e + k]);
    }
    if (tid < MLA_MMA_HB) {
        mh[tid] = -INFINITY;
        lh[tid] = 0.f;
    }
    const int NTW = C / 64; /* n8 tiles of the latent a warp owns */
    float acc[2][MLA_MMA_MAX_C / 64][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[m][j][k] = 0.f;
    const int smt = w & 1, snt = w >> 1; /* the warp's score tile: heads 16 smt.., keys 8 snt.. */
    const int sh = tid >> 3, sq = tid & 7; /* softmax: head sh, keys 4 sq .. 4 sq + 3 */
    const int U = QW / 8;                  /* 8-element units of a row */
    __syncthreads(); /* q parts, mh and lh set (the epilogue reads them when no chunk ran) */
    for (int j0 = jb; j0 < je; j0 += MLA_MMA_KC) {
        if (tid < MLA_MMA_KC) {
            int j = j0 + tid, key = -1;
            if (j < je) key = topk ? topk[(int64_t)t * ktop + j] : j;
            sl[tid] = key >= 0 ? batch_slot(block_table, bt_stride, s, key, bs) : -1;
        }
        __syncthreads();
        /* the chunk's rows, 8 elements (16 bytes of BF16) a unit; missing keys are zero rows */
        for (int u = tid; u < MLA_MMA_KC * U; u += MLA_MMA_THREADS) {
            int jj = u / U, e = (u - jj * U) * 8, slot = sl[jj];
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (slot >= 0) {
                if (dt == KV_DTYPE_BF16) v = *(const uint4 *)((const uint16_t *)cache + (int64_t)slot * W + e);
                else {
                    uint2 b = *(const uint2 *)((const uint8_t *)cache + (int64_t)slot * W + e);
                    uint32_t wd[2] = {b.x, b.y}, o[4];
                    for (int k = 0; k < 4; k++) {
                        uint32_t by = wd[k >> 1] >> (16 * (k & 1));
                        __nv_bfloat162 p2 = __floats2bfloat162_rn(codec_e4m3_to_f32((uint8_t)(by & 255)),
                                                                  codec_e4m3_to_f32((uint8_t)((by >> 8) & 255)));
                        o[k] = *(uint32_t *)&p2;
                    }
                    v = make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
            *(uint4 *)(kc + jj * QS + e) = v;
        }
        __syncthreads();
        /* scores: 16 heads x 8 keys a warp, three mma (q parts) per k16 step */
        {
            float z[4] = {0.f, 0.f, 0.f, 0.f};
            /* A: lane supplies row (lane & 15), columns + 8 (lane >> 4); B: key row (lane & 7), dims + 8 ((lane >> 3) & 1) */
            const __nv_bfloat16 *qa0 = qs + (smt * 16 + (lane & 15)) * QS + (lane >> 4) * 8;
            const __nv_bfloat16 *kb0 = kc + (snt * 8 + (lane & 7)) * QS + ((lane >> 3) & 1) * 8;
            for (int k0 = 0; k0 < QW; k0 += 16) {
                uint32_t b[2], a[4];
                ldsm_x2(b, kb0 + k0);
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    ldsm_x4(a, qa0 + p * MLA_MMA_HB * QS + k0);
                    mma_bf16(z, a[0], a[1], a[2], a[3], b[0], b[1]);
                }
            }
            /* C fragment: z[0..1] head g, keys 2 tq, 2 tq + 1; z[2..3] head g + 8 */
            int hr = smt * 16 + g, kj = snt * 8 + 2 * tq;
            sc[hr * MLA_MMA_SS + kj] = sl[kj] >= 0 ? z[0] * zs : -INFINITY;
            sc[hr * MLA_MMA_SS + kj + 1] = sl[kj + 1] >= 0 ? z[1] * zs : -INFINITY;
            sc[(hr + 8) * MLA_MMA_SS + kj] = sl[kj] >= 0 ? z[2] * zs : -INFINITY;
            sc[(hr + 8) * MLA_MMA_SS + kj + 1] = sl[kj + 1] >= 0 ? z[3] * zs : -INFINITY;
        }
        __syncthreads();
        /* online softmax: head sh's 32 scores over 8 neighbouring lanes */
        {
            float zz[4], mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                zz[k] = sc[sh * MLA_MMA_SS + 4 * sq + k];
                mx = fmaxf(mx, zz[k]);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mold = mh[sh], mnew = fmaxf(mold, mx), psum = 0.f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float p = zz[k] == -INFINITY ? 0.f : expf(zz[k] - mnew);
                psum += p;
                int e = sh * MLA_MMA_PS + 4 * sq + k;
                bf16_split3(p, &ps[e], &ps[MLA_MMA_HB * MLA_MMA_PS + e], &ps[2 * MLA_MMA_HB * MLA_MMA_PS + e]);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
            __syncwarp(); /* every lane of the head has read mh before lane sq == 0 writes it */
            if (sq == 0) {
                float corr = mold == -INFINITY ? 0.f : expf(mold - mnew);
                cr[sh] = corr;
                lh[sh] = lh[sh] * corr + psum;
                mh[sh] = mnew;
            }
        }
        __syncthreads();
        /* latent: acc = acc * corr + P V over the chunk's two k16 steps, three mma (p parts) each */
        {
            float c0[2] = {cr[g], cr[16 + g]}, c1[2] = {cr[8 + g], cr[24 + g]};
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < MLA_MMA_MAX_C / 64; j++) {
                    acc[m][j][0] *= c0[m];
                    acc[m][j][1] *= c0[m];
                    acc[m][j][2] *= c1[m];
                    acc[m][j][3] *= c1[m];
                }
#pragma unroll
            for (int kk = 0; kk < MLA_MMA_KC; kk += 16) {
                uint32_t a[3][2][4];
#pragma unroll
                for (int p = 0; p < 3; p++)
#pragma unroll
                    for (int m = 0; m < 2; m++)
                        ldsm_x4(a[p][m], ps + (p * MLA_MMA_HB + m * 16 + (lane & 15)) * MLA_MMA_PS + kk + (lane >> 4) * 8);
                /* B = V [16 keys x 8 columns] stored key-major: transposed ldmatrix, lane supplies
                 * key row kk + (lane & 15) */
                const __nv_bfloat16 *vb = kc + (kk + (lane & 15)) * QS + w * (C / 8);
#pragma unroll
                for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
                    if (j < NTW) {
                        uint32_t b[2];
                        ldsm_x2_trans(b, vb + 8 * j);
#pragma unroll
                        for (int m = 0; m < 2; m++)
#pragma unroll
                            for (int p = 0; p < 3; p++)
                                mma_bf16(acc[m][j], a[p][m][0], a[p][m][1], a[p][m][2], a[p][m][3], b[0], b[1]);
                    }
            }
        }
        __syncthreads();
    }
    /* acc[m][j]: heads 16 m + g (0..1) and 16 m + g + 8 (2..3), columns w C/8 + 8 j + 2 tq, + 1 */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int h = m * 16 + g + 8 * r;
            if (h >= nh) continue;
            float l = lh[h], f = S == 1 ? (l > 0.f ? vsc / l : 0.f) : vsc;
            float *dst = S == 1 ? ol + ((int64_t)i0 * H + h0 + h) * C : part + (((int64_t)i0 * S + sp) * H + h0 + h) * C;
#pragma unroll
            for (int j = 0; j < MLA_MMA_MAX_C / 64; j++)
                if (j < NTW) {
                    int c = w * (C / 8) + 8 * j + 2 * tq;
                    *(float2 *)(dst + c) = make_float2(acc[m][j][2 * r] * f, acc[m][j][2 * r + 1] * f);
                }
        }
    if (S > 1 && tid < nh) {
        float *o = ml + (((int64_t)i0 * S + sp) * H + h0 + tid) * 2;
        o[0] = mh[tid];
        o[1] = lh[tid];
    }
}

/* v2 covers the shape (C % 64, C + Dr % 16, row stride % 8: 16-byte rows) and a BF16 or FP8 cache
 * (kv NULL: any cache, for the reservation) */
static int mla_v1_ok(Backend *be, const ModelConfig *c)
{
    if (c->kv_lora_rank > MLA_V1_MAX_C || c->qk_nope_dim > MLA_V1_MAX_DN || (c->kv_lora_rank + c->qk_rope_dim) % 4)
        return 0;
    return mla_smem_fits(be, mla_v1_smem(c->kv_lora_rank, c->qk_rope_dim), (const void *)mla_decode_kernel);
}

static int mla_v2_ok(Backend *be, const ModelConfig *c, const KVLayer *kv)
{
    int C = c->kv_lora_rank, QW = C + c->qk_rope_dim;
    if (C <= 0 || C > MLA_MMA_MAX_C || C % 64 || QW > MLA_MMA_MAX_QW || QW % 16 || c->qk_nope_dim > MLA_V1_MAX_DN)
        return 0;
    if (kv && (kv->dtype == KV_DTYPE_F32 || kv->kv_width % 8 || kv->kv_width < QW || (uintptr_t)kv->kv % 16))
        return 0;
    return mla_smem_fits(be, mla_mma_smem(C, c->qk_rope_dim), (const void *)mla_mma_decode_kernel);
}

/* scratch of the v1 and v2 paths for a step of T tokens (cuda_reserve): the largest of either */
void mla_v1_reserve(Backend *be, const ModelConfig *c, int T)
{
    if (c->kv_lora_rank <= 0 || mla_kernel_env() == 0) return;
    int ok1 = mla_v1_ok(be, c), ok2 = mla_kernel_env() == 2 && mla_v2_ok(be, c, NULL);
    if (!ok1 && !ok2) return;
    int H = c->n_heads, C = c->kv_lora_rank, Tc = T < MLA_TC ? T : MLA_TC;
    int64_t rows = 0; /* the largest splits x tokens of any pass */
    for (int n = 1; n <= Tc; n++)
        for (int v = 0; v < 2; v++) {
            if (!(v ? ok2 : ok1)) continue;
            int S = mla_splits(be, n, H, v);
            if (S > 1 && (int64_t)S * n > rows) rows = (int64_t)S * n;
        }
    cuda_scratch(be, SCR_MLA_QA, (size_t)Tc * H * (C + c->qk_rope_dim) * 4);
    cuda_scratch(be, SCR_MLA_OL, (size_t)Tc * H * C * 4);
    if (rows) cuda_scratch(be, SCR_MLA_PART, (size_t)rows * H * (C + 2) * 4);
}

void attention_mla_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                        const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    if (!b->n_tokens) return;
    int env = mla_kernel_env();
    int v2 = env == 2 && mla_v2_ok(be, c, kv);
    if (env == 0 || (!v2 && !mla_v1_ok(be, c))) {
        attention_mla_v0(be, out, q, kv, wkv_b, topk, ktop, b, c);
        return;
    }
    cudaStream_t st = cuda_stream(be);
    int H = c->n_heads, C = c->kv_lora_rank, Dr = c->qk_rope_dim, Dn = c->qk_nope_dim, Dv = c->v_head_dim;
    int HG = v2 ? (H + MLA_MMA_HB - 1) / MLA_MMA_HB : (H + MLA_HG - 1) / MLA_HG, w4 = mla_w4_ok(wkv_b, c);
    size_t smem = v2 ? mla_mma_smem(C, Dr) : mla_v1_smem(C, Dr);
    static size_t smem_set[2][64]; /* per kernel and device: the attribute is a device's */
    int dev = cuda_state(be)->device & 63;
    if (smem > 48 * 1024 && smem > smem_set[v2][dev]) {
        if (v2)
            CUDA_CHECK(cudaFuncSetAttribute(mla_mma_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        else
            CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set[v2][dev] = smem;
    }
    for (int t0 = 0; t0 < b->n_tokens; t0 += MLA_TC) {
        int T = b->n_tokens - t0 < MLA_TC ? b->n_tokens - t0 : MLA_TC, S = mla_splits(be, T, H, v2);
        float *qa = (float *)cuda_scratch(be, SCR_MLA_QA, (size_t)T * H * (C + Dr) * 4);
        float *ol = (float *)cuda_scratch(be, SCR_MLA_OL, (size_t)T * H * C * 4);
        float *part = S > 1 ? (float *)cuda_scratch(be, SCR_MLA_PART, (size_t)S * T * H * (C + 2) * 4) : NULL;
        float *ml = part ? part + (size_t)S * T * H * C : NULL;
        int tz = (T + MLA_TT - 1) / MLA_TT;
        if (w4) {
            mla_qabs_w4_kernel<<<dim3(H, C / W4_KG, (T + 7) / 8), MLA_W4_KS * 32, 0, st>>>(qa, q, *wkv_b, t0, T, H, C, Dn,
                                                                                         Dr, Dv);
            LAUNCH_CHECK("mla_qabs_w4_kernel");
        } else {
            mla_qabs_kernel<<<dim3(H, (C + 63) / 64, tz), ATT_THREADS, 0, st>>>(qa, q, *wkv_b, t0, T, H, C, Dn, Dr, Dv);
            LAUNCH_CHECK("mla_qabs_kernel");
        }
        if (v2) {
            mla_mma_decode_kernel<<<dim3(T, S, HG), MLA_MMA_THREADS, smem, st>>>(
                ol, part, ml, qa, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, topk, ktop, b->seq,
                b->pos, b->block_table, b->bt_stride, t0, H, C, Dr, c->attn_scale, S);
            LAUNCH_CHECK("mla_mma_decode_kernel");
        } else {
            mla_decode_kernel<<<dim3(T, S, HG), ATT_THREADS, smem, st>>>(
                ol, part, ml, qa, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, kv->block_size, topk, ktop, b->seq,
                b->pos, b->block_table, b->bt_stride, t0, H, C, Dr, c->attn_scale, S);
            LAUNCH_CHECK("mla_decode_kernel");
        }
        if (S > 1) {
            mla_combine_kernel<<<dim3(T, H), ATT_THREADS, 0, st>>>(ol, part, ml, H, C, S);
            LAUNCH_CHECK("mla_combine_kernel");
        }
        if (w4) {
            int warps = Dv / 16 < 16 ? Dv / 16 : 16;
            mla_out_w4_kernel<<<dim3(H, (T + MLA_W4_TOK - 1) / MLA_W4_TOK), warps * 32, 0, st>>>(out, ol, *wkv_b, t0, T, H, C,
                                                                                                Dn, Dv);
            LAUNCH_CHECK("mla_out_w4_kernel");
        } else {
            mla_out_kernel<<<dim3(H, (Dv + 31) / 32, tz), ATT_THREADS, (size_t)MLA_TT * C * 4, st>>>(out, ol, *wkv_b, t0, T,
                                                                                                  H, C, Dn, Dv);
            LAUNCH_CHECK("mla_out_kernel");
        }
    }
}

/* block i: row j0 + i of the sequence; thread k owns columns k, k + blockDim, ... */
static __global__ void kv_gather_kernel(float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                                        const int *bt, int bs, int j0)
{
    int p = j0 + blockIdx.x;
    int64_t r0 = ((int64_t)bt[p / bs] * bs + p % bs) * width;
    for (int k = threadIdx.x; k < n; k += blockDim.x)
        out[(int64_t)blockIdx.x * n + k] = kv_elem_load(cache, dt, r0 + k, scale);
}

void kv_gather_cuda(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                    const int *bt, int block_size, int j0, int rows)
{
    if (rows <= 0 || n <= 0) return;
    kv_gather_kernel<<<rows, ATT_THREADS, 0, cuda_stream(be)>>>(out, cache, dt, scale, width, n, bt, block_size, j0);
    LAUNCH_CHECK("kv_gather_kernel");
}

/* block (i, h): query t = t0 + i, head h. The piece's keys a chunk of blockDim at a time: thread
 * j scores key j of the chunk (its position from the causal range or from topk[t]); thread owns
 * output dims v = tid + i * blockDim of the accumulator. State (m, l) and accumulator come from
 * st and out (or start empty on the first piece) and go back there (normalised on the last). */
static __global__ void attention_mla_piece_kernel(float *out, float *st, const float *q, const float *kv,
                                                  const float *kpe, int ldk, int j0, int n, int t0, const int *topk,
                                                  int ktop, int first, int last, const int *pos, int H, int Dn, int Dr,
                                                  int Dv, float scale)
{
    __shared__ float qs[MLA_MAX_DQ], sc[ATT_THREADS], red[32];
    __shared__ int rw[ATT_THREADS];
    int t = t0 + blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    int Dq = Dn + Dr, Dkv = Dn + Dv;
    int64_t N = (int64_t)H * Dkv;
    for (int i = tid; i < Dq; i += nt) qs[i] = q[((int64_t)t * H + h) * Dq + i];
    float *o = out + ((int64_t)t * H + h) * Dv, *mls = st + ((int64_t)t * H + h) * 2;
    float m = first ? -INFINITY : mls[0], l = first ? 0.f : mls[1], acc[MLA_MAX_DV / ATT_THREADS];
#pragma unroll
    for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++) acc[i] = !first && tid + i * nt < Dv ? o[tid + i * nt] : 0.f;
    /* candidates: the causal positions j0 .. min(j0 + n, pos + 1) - 1, or the ktop selected */
    int ncand = topk ? ktop : min(n, pos[t] + 1 - j0);
    __syncthreads();
    for (int c0 = 0; c0 < ncand; c0 += nt) {
        int c = c0 + tid, r = -1; /* the piece row this thread scores, -1 none */
        if (c < ncand) {
            if (!topk) r = c;
            else {
                int j = topk[(int64_t)t * ktop + c];
                r = j >= j0 && j < j0 + n ? j - j0 : -1;
            }
        }
        float z = -INFINITY;
        if (r >= 0) {
            const float *k = kv + r * N + (int64_t)h * Dkv, *kp = kpe + (int64_t)r * ldk;
            float d1 = 0.f, d2 = 0.f;
            for (int i = 0; i < Dn; i++) d1 += qs[i] * k[i];
            for (int i = 0; i < Dr; i++) d2 += qs[Dn + i] * kp[i];
            z = (d1 + d2) * scale;
        }
        float mnew = fmaxf(m, block_max(z, red));
        float p = r >= 0 ? expf(z - mnew) : 0.f;
        sc[tid] = p;
        rw[tid] = r;
        float psum = block_sum(p, red);
        float corr = m == -INFINITY ? 0.f : expf(m - mnew);
        l = l * corr + psum;
#pragma unroll
        for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++) acc[i] *= corr;
        if (mnew != -INFINITY) m = mnew;
        __syncthreads();
        int cnt = min(nt, ncand - c0);
        for (int jj = 0; jj < cnt; jj++) {
            if (rw[jj] < 0) continue;
            const float *v = kv + rw[jj] * N + (int64_t)h * Dkv + Dn;
#pragma unroll
            for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++)
                if (tid + i * nt < Dv) acc[i] += sc[jj] * v[tid + i * nt];
        }
        __syncthreads();
    }
    float inv = last ? (l > 0.f ? 1.f / l : 0.f) : 1.f;
#pragma unroll
    for (int i = 0; i < MLA_MAX_DV / ATT_THREADS; i++)
        if (tid + i * nt < Dv) o[tid + i * nt] = acc[i] * inv;
    if (tid == 0) {
        mls[0] = m;
        mls[1] = l;
    }
}

/* ---- the expanded form on the tensor cores (v1: where v3's shared memory does not fit) ----
 * Block (query tile, head h): 64 queries of the chunk (4 warps of 16 rows), the piece's keys 16
 * at a time. The queries, keys, probabilities and values enter the MMAs (m16n8k16, float32
 * accumulation) as two BF16 halves each, hi = bf16(x) and lo = bf16(x - hi), and each product as
 * hi x hi + hi x lo + lo x hi: each operand carries ~2^-16 of its value's error (lo's rounding),
 * as the W4A16 GEMMs' split activations do (test_cuda_ops: TOL_SPLIT; v0 keeps float32).
 * A tile's maths is MlaTcRows's (below, shared with v3): S = Q K^T, masked (causal, or top-k by
 * the piece's mask from mla_piece_mask_kernel), the rows' online softmax, P V with V's fragments
 * by ldmatrix.trans. v1 stages the rows as float4s, several in flight a thread.
 * The rows' state and unnormalised outputs carry across pieces in st and out as in
 * attention_mla_piece_kernel. */
#define MLA_TC_ROWS 64
#define MLA_TC_KT 16

template <int DQ, int DV, int ROWS = MLA_TC_ROWS>
struct MlaTcSmem {
    static constexpr int QS = DQ + 8;        /* BF16 a query or key row: 16 bytes apart mod 128 */
    static constexpr int VS = DV + 8; /* a key's values (ldmatrix.trans: 8 rows in 8 bank groups) */
    /* the block's whole shared memory, its last 16 bytes the rows' end (s_rend): a static
     * __shared__ beside it would be over a 99 KB GPU's limit at GLM-5's heads (101376 + 4 bytes) */
    static constexpr size_t bytes = 2 * sizeof(__nv_bfloat16) * ((size_t)ROWS * QS + (size_t)MLA_TC_KT * QS + (size_t)MLA_TC_KT * VS) + 16;
};

__device__ __forceinline__ uint32_t pack_bf16(float a, float b, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - __low2float(h), b - __high2float(h));
    lo = *(uint32_t *)&l;
    return *(uint32_t *)&h;
}

/* four floats as BF16 halves: hi and lo, four each, into shared memory (8-byte stores) */
__device__ __forceinline__ void split_store4(float4 f, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    uint32_t l0, l1;
    uint32_t h0 = pack_bf16(f.x, f.y, l0), h1 = pack_bf16(f.z, f.w, l1);
    *(uint2 *)hi = make_uint2(h0, h1);
    *(uint2 *)lo = make_uint2(l0, l1);
}

/* rows x cols floats (cols % 4 == 0) of a source row by row (src(r, c): the float4 at row r,
 * column c) into shared memory as halves, hi[r * ld + c] and lo[...]: U float4 loads in flight
 * a thread before any is converted (one at a time waited a trip to L2 or DRAM per 4 values) */
template <int ROWS, int COLS, int U, typename Src>
__device__ __forceinline__ void stage_halves(__nv_bfloat16 *hi, __nv_bfloat16 *lo, int ld, Src src)
{
    constexpr int C4 = COLS / 4, NQ = ROWS * C4;
    for (int e0 = threadIdx.x; e0 < NQ; e0 += U * blockDim.x) {
        float4 f[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * blockDim.x;
            if (e < NQ) f[u] = src(e / C4, 4 * (e % C4));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * blockDim.x, r = e / C4, c = 4 * (e % C4);
            if (e < NQ) split_store4(f[u], hi + r * ld + c, lo + r * ld + c);
        }
    }
}

__device__ __forceinline__ float4 ldg4(const float *p) { return __ldg((const float4 *)p); }

/* One thread's share of a block's queries in the tensor-core piece kernels (v1, v3), and the maths
 * of a tile of 16 keys on it. The thread holds rows ra (C fragment elements 0, 1) and rb = ra + 8
 * (2, 3) of its warp's 16: their maxima m, sums l (a row's on one lane of its quad until finish
 * adds them up) and unnormalised outputs acc (DV / 8 n8 tiles). q, k, v in shared memory as BF16
 * halves, rows QS = DQ + 8 and VS = DV + 8 apart. */
template <int DQ, int DV>
struct MlaTcRows {
    static constexpr int QS = DQ + 8, VS = DV + 8, NV = DV / 8;
    static_assert(DQ % 16 == 0 && DV % 16 == 0, "MMA shapes, pairs of n8 tiles");
    int ra, rb, pa, pb;
    bool va, vb;
    int64_t ha, hb; /* the rows' (token, head) in q, out, st */
    float m[2], l[2], acc[NV][4];

    /* the rows of block i0 (queries i0.. of a chunk of nt from token t0), head h of H; the state
     * from st and out, or a fresh one when first */
    __device__ __forceinline__ void start(int warp, int g, int t4, int i0, int nt, int t0, int h, int H, const int *pos,
                                          int first, const float *st, const float *out)
    {
        ra = warp * 16 + g, rb = ra + 8;
        va = i0 + ra < nt, vb = i0 + rb < nt;
        pa = va ? pos[t0 + i0 + ra] : -1, pb = vb ? pos[t0 + i0 + rb] : -1;
        ha = (int64_t)(t0 + i0 + (va ? ra : 0)) * H + h, hb = (int64_t)(t0 + i0 + (vb ? rb : 0)) * H + h;
        if (first) {
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.f;
#pragma unroll
            for (int j = 0; j < NV; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            return;
        }
        m[0] = va ? st[ha * 2] : -INFINITY;
        m[1] = vb ? st[hb * 2] : -INFINITY;
        l[0] = va && t4 == 0 ? st[ha * 2 + 1] : 0.f;
        l[1] = vb && t4 == 0 ? st[hb * 2 + 1] : 0.f;
        const float *oa = out + ha * DV, *ob = out + hb * DV;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            float2 x = va ? *(const float2 *)(oa + j * 8 + 2 * t4) : make_float2(0.f, 0.f);
            float2 y = vb ? *(const float2 *)(ob + j * 8 + 2 * t4) : make_float2(0.f, 0.f);
            acc[j][0] = x.x, acc[j][1] = x.y, acc[j][2] = y.x, acc[j][3] = y.y;
        }
    }

    /* keys k0..k0+15 of the piece (n keys from position j0): S = Q K^T on the C fragments (three
     * MMAs a product of halves), masked (top-k: the key's bit in the query's row of mask; causal:
     * position <= the query's), folded into the online softmax; P (C fragments, the A fragments of
     * P V) times V, its B fragments by ldmatrix.trans: lanes 0-15 give the 16 keys' rows at n8 tile
     * j's columns, lanes 16-31 at tile j + 1's */
    __device__ __forceinline__ void tile(const __nv_bfloat16 *qh, const __nv_bfloat16 *ql, const __nv_bfloat16 *kh,
                                         const __nv_bfloat16 *kl, const __nv_bfloat16 *vh, const __nv_bfloat16 *vl,
                                         int warp, int lane, int k0, int n, int j0, const uint32_t *mask, int mw, int i0,
                                         float scale)
    {
        const int g = lane >> 2, t4 = lane & 3;
        float s[2][4] = {};
#pragma unroll 4
        for (int kk = 0; kk < DQ; kk += 16) {
            const __nv_bfloat16 *qa = qh + (warp * 16 + g) * QS + kk + 2 * t4, *qb = ql + (warp * 16 + g) * QS + kk + 2 * t4;
            uint32_t ah[4] = {*(const uint32_t *)qa, *(const uint32_t *)(qa + 8 * QS), *(const uint32_t *)(qa + 8),
                              *(const uint32_t *)(qa + 8 * QS + 8)};
            uint32_t al[4] = {*(const uint32_t *)qb, *(const uint32_t *)(qb + 8 * QS), *(const uint32_t *)(qb + 8),
                              *(const uint32_t *)(qb + 8 * QS + 8)};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const __nv_bfloat16 *ka = kh + (j * 8 + g) * QS + kk + 2 * t4, *kb = kl + (j * 8 + g) * QS + kk + 2 * t4;
                uint32_t bh0 = *(const uint32_t *)ka, bh1 = *(const uint32_t *)(ka + 8);
                uint32_t bl0 = *(const uint32_t *)kb, bl1 = *(const uint32_t *)(kb + 8);
                mma_bf16(s[j], ah[0], ah[1], ah[2], ah[3], bh0, bh1);
                mma_bf16(s[j], ah[0], ah[1], ah[2], ah[3], bl0, bl1);
                mma_bf16(s[j], al[0], al[1], al[2], al[3], bh0, bh1);
            }
        }
        /* masked scores; the rows' new maxima over the quad */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + j * 8 + 2 * t4 + (e & 1), row = e < 2 ? ra : rb;
                bool ok = (e < 2 ? va : vb) && key < n;
                if (ok) ok = mask ? (mask[(int64_t)(i0 + row) * mw + (key >> 5)] >> (key & 31)) & 1u : j0 + key <= (e < 2 ? pa : pb);
                s[j][e] = ok ? s[j][e] * scale : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            corr[r] = m[r] == -INFINITY ? 0.f : expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = s[j][e] == -INFINITY ? 0.f : expf(s[j][e] - m[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < NV; j++) acc[j][0] *= corr[0], acc[j][1] *= corr[0], acc[j][2] *= corr[1], acc[j][3] *= corr[1];
        uint32_t pl[4], ph[4] = {pack_bf16(s[0][0], s[0][1], pl[0]), pack_bf16(s[0][2], s[0][3], pl[1]),
                                 pack_bf16(s[1][0], s[1][1], pl[2]), pack_bf16(s[1][2], s[1][3], pl[3])};
        const uint32_t vah = (uint32_t)__cvta_generic_to_shared(vh + (lane & 15) * VS + (lane >> 4) * 8);
        const uint32_t val = (uint32_t)__cvta_generic_to_shared(vl + (lane & 15) * VS + (lane >> 4) * 8);
#pragma unroll
        for (int j = 0; j < NV; j += 2) {
            uint32_t bh[4], bl[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bh[0]), "=r"(bh[1]), "=r"(bh[2]), "=r"(bh[3]) : "r"(vah + j * 16));
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(bl[0]), "=r"(bl[1]), "=r"(bl[2]), "=r"(bl[3]) : "r"(val + j * 16));
#pragma unroll
            for (int u = 0; u < 2; u++) {
                mma_bf16(acc[j + u], ph[0], ph[1], ph[2], ph[3], bh[2 * u], bh[2 * u + 1]);
                mma_bf16(acc[j + u], ph[0], ph[1], ph[2], ph[3], bl[2 * u], bl[2 * u + 1]);
                mma_bf16(acc[j + u], pl[0], pl[1], pl[2], pl[3], bh[2 * u], bh[2 * u + 1]);
            }
        }
    }

    /* the rows' sums over the quad; out (normalised when last) and st */
    __device__ __forceinline__ void finish(int t4, int last, float *out, float *st)
    {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const float ia = last ? (l[0] > 0.f ? 1.f / l[0] : 0.f) : 1.f, ib = last ? (l[1] > 0.f ? 1.f / l[1] : 0.f) : 1.f;
        float *oa = out + ha * DV, *ob = out + hb * DV;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            if (va) *(float2 *)(oa + j * 8 + 2 * t4) = make_float2(acc[j][0] * ia, acc[j][1] * ia);
            if (vb) *(float2 *)(ob + j * 8 + 2 * t4) = make_float2(acc[j][2] * ib, acc[j][3] * ib);
        }
        if (t4 == 0) {
            if (va) st[ha * 2] = m[0], st[ha * 2 + 1] = l[0];
            if (vb) st[hb * 2] = m[1], st[hb * 2 + 1] = l[1];
        }
    }
};

template <int DQ, int DV, int ROWS>
static __global__ void __launch_bounds__(ROWS * 2, 1) attention_mla_piece_tc_kernel(
    float *out, float *st, const float *q, const float *kv, const float *kpe, int ldk, int j0, int n, int t0, int nt,
    const uint32_t *mask, int mw, int first, int last, const int *pos, int H, int Dn, float scale)
{
    using L = MlaTcSmem<DQ, DV, ROWS>;
    constexpr int QS = L::QS, VS = L::VS, KT = MLA_TC_KT;
    static_assert(ROWS % 16 == 0, "16 queries a warp");
    static_assert(QS == MlaTcRows<DQ, DV>::QS && VS == MlaTcRows<DQ, DV>::VS, "one layout");
    extern __shared__ __align__(16) uint8_t mla_tc_raw[];
    __nv_bfloat16 *qh = (__nv_bfloat16 *)mla_tc_raw, *ql = qh + ROWS * QS, *kh = ql + ROWS * QS,
                  *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
    int &s_rend = *(int *)(mla_tc_raw + L::bytes - 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int i0 = blockIdx.x * ROWS, h = blockIdx.y, Dkv = Dn + DV;
    const int64_t N = (int64_t)H * Dkv;
    /* the block's queries, as halves (rows past the chunk repeat its last); the keys and values
     * below with 4 loads in flight, not 8, beside the 128 registers of the accumulators */
    stage_halves<ROWS, DQ, 8>(qh, ql, QS, [&](int r, int k) { return ldg4(q + ((int64_t)(t0 + min(i0 + r, nt - 1)) * H + h) * DQ + k); });
    if (tid == 0) s_rend = 0;
    __syncthreads();
    /* the piece's rows any query of the block may take: causal, up to the latest position */
    if (tid < ROWS && i0 + tid < nt) atomicMax(&s_rend, mask ? n : max(0, min(n, pos[t0 + i0 + tid] + 1 - j0)));
    MlaTcRows<DQ, DV> rw;
    rw.start(warp, g, t4, i0, nt, t0, h, H, pos, first, st, out);
    __syncthreads();
    const int rend = s_rend;
    for (int k0 = 0; k0 < rend; k0 += KT) {
        if (mask) { /* a tile none of the block's queries selected: skipped */
            int any = 0;
            if (tid < ROWS && i0 + tid < nt) any = (mask[(int64_t)(i0 + tid) * mw + (k0 >> 5)] >> (k0 & 31)) & 0xffffu;
            if (!__syncthreads_or(any)) continue;
        }
        __syncthreads(); /* the last tile's keys and values are read */
        stage_halves<KT, DQ, 4>(kh, kl, QS, [&](int r, int k) { /* keys [k_nope | k_pe] (Dn % 4 == 0) */
            const int j = k0 + r;
            return j >= n ? make_float4(0.f, 0.f, 0.f, 0.f)
                   : k < Dn ? ldg4(kv + j * N + (int64_t)h * Dkv + k) : ldg4(kpe + (int64_t)j * ldk + (k - Dn));
        });
        stage_halves<KT, DV, 4>(vh, vl, VS, [&](int r, int d) { /* values */
            const int j = k0 + r;
            return j >= n ? make_float4(0.f, 0.f, 0.f, 0.f) : ldg4(kv + j * N + (int64_t)h * Dkv + Dn + d);
        });
        __syncthreads();
        rw.tile(qh, ql, kh, kl, vh, vl, warp, lane, k0, n, j0, mask, mw, i0, scale);
    }
    rw.finish(t4, last, out, st);
}

/* ---- v3: the keys and values as BF16 halves in global memory, staged by cp.async ----
 * mla_piece_halves_kernel writes the piece's keys [k_nope | k_pe] and values of every head once as
 * BF16 halves (hi row, then lo row; the rows 16-byte aligned), so that the attention kernel stages a
 * tile of keys by 16-byte cp.async copies that need no registers: the next tile's copies are in
 * flight while the MMAs of this one run (two stages, one barrier a tile), where v1 waited for its
 * loads and conversions before every tile. A block takes 128 queries (8 warps) of one head, so each
 * staged tile feeds twice v1's MMAs. The tiles the block runs are listed first: every tile up to the
 * block's latest position (causal), or (top-k) the tiles whose 16 keys hold a bit of any of the
 * block's queries, from the piece's mask. The maths of a tile is v1's. */
#define MLA_T3_ROWS 128

template <int DQ, int DV>
struct MlaT3Smem {
    static constexpr int QS = DQ + 8, VS = DV + 8; /* rows 16 bytes apart mod 128 */
    static constexpr size_t stage = 2 * sizeof(__nv_bfloat16) * (size_t)MLA_TC_KT * (QS + VS);
    /* the queries, two stages, the tile bitmap (64 words) and the rows' end (16 bytes): the whole
     * block's shared memory, nothing static beside it */
    static constexpr size_t bytes = 2 * sizeof(__nv_bfloat16) * (size_t)MLA_T3_ROWS * QS + 2 * stage + 64 * 4 + 16;
};

/* kh2[(j H + h) 2 DQ ..] = the hi then lo halves of key j of head h ([k_nope | k_pe]), vh2 its
 * values' (2 DV); a warp a (key, head) row */
template <int DQ, int DV>
static __global__ void mla_piece_halves_kernel(__nv_bfloat16 *kh2, __nv_bfloat16 *vh2, const float *kv, const float *kpe,
                                               int ldk, int n, int H, int Dn)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (int64_t)n * H) return;
    const int j = (int)(row / H), Dkv = Dn + DV;
    const float *src = kv + row * Dkv;
    __nv_bfloat16 *kd = kh2 + row * 2 * DQ, *vd = vh2 + row * 2 * DV;
    for (int c = 4 * lane; c < DQ; c += 128) {
        float4 f = c < Dn ? ldg4(src + c) : ldg4(kpe + (int64_t)j * ldk + (c - Dn));
        split_store4(f, kd + c, kd + DQ + c);
    }
    for (int c = 4 * lane; c < DV; c += 128) split_store4(ldg4(src + Dn + c), vd + c, vd + DV + c);
}

/* 16 bytes by cp.async, or zeros where !ok (src-size 0) */
__device__ __forceinline__ void cp_async16_z(void *smem, const void *gmem, bool ok)
{
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0));
}

template <int DQ, int DV>
static __global__ void __launch_bounds__(256, 1) attention_mla_piece_t3_kernel(
    float *out, float *st, const float *q, const __nv_bfloat16 *kh2, const __nv_bfloat16 *vh2, int j0, int n, int t0,
    int nt, const uint32_t *mask, int mw, int first, int last, const int *pos, int H, float scale)
{
    using L = MlaT3Smem<DQ, DV>;
    constexpr int QS = L::QS, VS = L::VS, KT = MLA_TC_KT, ROWS = MLA_T3_ROWS;
    static_assert(QS == MlaTcRows<DQ, DV>::QS && VS == MlaTcRows<DQ, DV>::VS, "one layout");
    extern __shared__ __align__(16) uint8_t mla_t3_raw[];
    __nv_bfloat16 *qh = (__nv_bfloat16 *)mla_t3_raw, *ql = qh + ROWS * QS, *stg = ql + ROWS * QS;
    /* the tiles the block runs: a bit a tile of 16 keys (n <= 4096: 256 tiles, 8 words) */
    uint32_t *tiles = (uint32_t *)(mla_t3_raw + L::bytes - 16 - 64 * 4);
    int &s_rend = *(int *)(mla_t3_raw + L::bytes - 16);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int i0 = blockIdx.x * ROWS, h = blockIdx.y;
    const int ntile = (n + KT - 1) / KT;
    if (tid < 64) tiles[tid] = 0;
    if (tid == 0) s_rend = 0;
    stage_halves<ROWS, DQ, 4>(qh, ql, QS, [&](int r, int k) { return ldg4(q + ((int64_t)(t0 + min(i0 + r, nt - 1)) * H + h) * DQ + k); });
    __syncthreads();
    if (mask) { /* each (query, word of 32 keys) of the block: its two tiles' bits */
        const int nq = min(ROWS, nt - i0);
        for (int e = tid; e < nq * mw; e += blockDim.x) {
            const int r = e / mw, w = e - r * mw;
            const uint32_t b = mask[(int64_t)(i0 + r) * mw + w];
            if (b & 0xffffu) atomicOr(&tiles[(2 * w) >> 5], 1u << ((2 * w) & 31));
            if (b >> 16) atomicOr(&tiles[(2 * w + 1) >> 5], 1u << ((2 * w + 1) & 31));
        }
    } else if (tid < ROWS && i0 + tid < nt) {
        atomicMax(&s_rend, max(0, min(n, pos[t0 + i0 + tid] + 1 - j0)));
    }
    __syncthreads();
    const int tend = mask ? ntile : (s_rend + KT - 1) / KT;
    /* the first tile at or after k (of the block's list), tend if none */
    auto next = [&](int k) {
        if (!mask) return k < tend ? k : tend;
        for (; k < tend; k++) {
            const uint32_t w = tiles[k >> 5] >> (k & 31);
            if (w) return k + __ffs(w) - 1 < tend ? k + __ffs(w) - 1 : tend;
            k |= 31;
        }
        return tend;
    };
    /* tile kt's keys and values into stage s: 16 rows of 2 DQ + 2 DV halves, 16 bytes a copy */
    auto issue = [&](int kt, int s) {
        __nv_bfloat16 *kh = stg + (size_t)s * (L::stage / 2), *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
        constexpr int CK = 2 * DQ / 8, CV = 2 * DV / 8; /* copies a key row, a value row */
        for (int c = tid; c < KT * (CK + CV); c += blockDim.x) {
            const int r = c / (CK + CV), w = c - r * (CK + CV), j = kt * KT + r;
            const bool ok = j < n;
            const int64_t jr = (int64_t)(ok ? j : 0) * H + h;
            if (w < CK) {
                const int hf = w / (DQ / 8), col = (w - hf * (DQ / 8)) * 8;
                cp_async16_z((hf ? kl : kh) + r * QS + col, kh2 + jr * 2 * DQ + w * 8, ok);
            } else {
                const int u = w - CK, hf = u / (DV / 8), col = (u - hf * (DV / 8)) * 8;
                cp_async16_z((hf ? vl : vh) + r * VS + col, vh2 + jr * 2 * DV + u * 8, ok);
            }
        }
    };
    MlaTcRows<DQ, DV> rw;
    rw.start(warp, g, t4, i0, nt, t0, h, H, pos, first, st, out);
    int kt = next(0), s = 0;
    if (kt < tend) issue(kt, 0);
    cp_async_commit();
    while (kt < tend) {
        cp_async_wait<0>();
        __syncthreads(); /* tile kt has landed in stage s, and every warp is done with stage s ^ 1 */
        const int kn = next(kt + 1);
        if (kn < tend) issue(kn, s ^ 1);
        cp_async_commit();
        const __nv_bfloat16 *kh = stg + (size_t)s * (L::stage / 2), *kl = kh + KT * QS, *vh = kl + KT * QS, *vl = vh + KT * VS;
        rw.tile(qh, ql, kh, kl, vh, vl, warp, lane, kt * KT, n, j0, mask, mw, i0, scale);
        kt = kn;
        s ^= 1;
    }
    cp_async_wait<0>();
    rw.finish(t4, last, out, st);
}

/* the piece's top-k mask: bit j - j0 of row i (words of 32 keys) for each selected j of query
 * t0 + i inside the piece; block i, the row's selections over the threads */
static __global__ void mla_piece_mask_kernel(uint32_t *mask, int mw, const int *topk, int ktop, int t0, int j0, int n)
{
    const int i = blockIdx.x;
    for (int c = threadIdx.x; c < ktop; c += blockDim.x) {
        int j = topk[(int64_t)(t0 + i) * ktop + c] - j0;
        if (j >= 0 && j < n) atomicOr(&mask[(int64_t)i * mw + (j >> 5)], 1u << (j & 31));
    }
}

/* the expanded form's kernel: v3 (attention_mla_piece_t3_kernel) where the head shapes have an
 * instance and its shared memory fits (GLM-5's heads: 198 KB), else v1 (attention_mla_piece_tc_kernel)
 * with 64 queries a block (101 KB), or 48 (84 KB: the GPUs of 99-101 KB), else v0
 * (attention_mla_piece_kernel); MOESERVE_MLA_PIECE_KERNEL=v1 or v0 starts the list there. Returns
 * 3, 1 (v1, 64 queries), 2 (v1, 48) or 0. Read at every call, so that a test can run them all in
 * one process; the budget is w4_smem_budget's (a test may lower it). */
static int mla_piece_kind(Backend *be, int Dq, int Dv)
{
    const char *e = getenv("MOESERVE_MLA_PIECE_KERNEL");
    if (e && !strcmp(e, "v0")) return 0;
    /* GLM-5's heads (192 + 64, 256), DeepSeek-V3's (128 + 64, 128), the fixtures' (32 + 16, 32) */
    const int known = (Dq == 256 && Dv == 256) || (Dq == 192 && Dv == 128) || (Dq == 48 && Dv == 32);
    if (!known) return 0;
    const size_t budget = w4_smem_budget(cuda_state(be)->device);
    if (!e || strcmp(e, "v1")) {
        size_t smem = Dq == 256 ? MlaT3Smem<256, 256>::bytes : Dq == 192 ? MlaT3Smem<192, 128>::bytes : MlaT3Smem<48, 32>::bytes;
        if (smem <= budget) return 3;
    }
    size_t s64 = Dq == 256 ? MlaTcSmem<256, 256>::bytes : Dq == 192 ? MlaTcSmem<192, 128>::bytes : MlaTcSmem<48, 32>::bytes;
    size_t s48 = Dq == 256 ? MlaTcSmem<256, 256, 48>::bytes : Dq == 192 ? MlaTcSmem<192, 128, 48>::bytes : MlaTcSmem<48, 32, 48>::bytes;
    return s64 <= budget ? 1 : s48 <= budget ? 2 : 0;
}

extern "C" int cuda_mla_piece_kernel(Backend *be, const ModelConfig *c)
{
    return mla_piece_kind(be, c->qk_nope_dim + c->qk_rope_dim, c->v_head_dim);
}

/* v3's halves of a piece of up to `rows` positions (cuda_reserve) */
void mla_piece_reserve(Backend *be, const ModelConfig *c, int rows)
{
    const int Dq = c->qk_nope_dim + c->qk_rope_dim, Dv = c->v_head_dim;
    if (rows > 0 && mla_piece_kind(be, Dq, Dv) == 3)
        cuda_scratch(be, SCR_MLA_HALVES, (size_t)rows * c->n_heads * (Dq + Dv) * 4);
}

template <int DQ, int DV, int ROWS>
static void mla_piece_tc_launch(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                                int ldk, int j0, int n, int t0, int nt, const uint32_t *mask, int mw, int first, int last,
                                const Batch *b, const ModelConfig *c)
{
    const size_t smem = MlaTcSmem<DQ, DV, ROWS>::bytes;
    static int ready;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_mla_piece_tc_kernel<DQ, DV, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        ready = 1;
    }
    dim3 grid(cdiv(nt, ROWS), c->n_heads);
    attention_mla_piece_tc_kernel<DQ, DV, ROWS><<<grid, ROWS * 2, smem, cuda_stream(be)>>>(
        out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b->pos, c->n_heads, c->qk_nope_dim, c->attn_scale);
    LAUNCH_CHECK("attention_mla_piece_tc_kernel");
}

template <int DQ, int DV>
static void mla_piece_t3_launch(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                                int ldk, int j0, int n, int t0, int nt, const uint32_t *mask, int mw, int first, int last,
                                const Batch *b, const ModelConfig *c)
{
    const size_t smem = MlaT3Smem<DQ, DV>::bytes;
    const int H = c->n_heads;
    static int ready;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(attention_mla_piece_t3_kernel<DQ, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = 1;
    }
    __nv_bfloat16 *kh2 = (__nv_bfloat16 *)cuda_scratch(be, SCR_MLA_HALVES, (size_t)n * H * (DQ + DV) * 4);
    __nv_bfloat16 *vh2 = kh2 + (size_t)n * H * 2 * DQ;
    const int64_t rows = (int64_t)n * H;
    mla_piece_halves_kernel<DQ, DV><<<cdiv(rows, 8), 256, 0, cuda_stream(be)>>>(kh2, vh2, kv, kpe, ldk, n, H, c->qk_nope_dim);
    LAUNCH_CHECK("mla_piece_halves_kernel");
    dim3 grid(cdiv(nt, MLA_T3_ROWS), H);
    attention_mla_piece_t3_kernel<DQ, DV><<<grid, 256, smem, cuda_stream(be)>>>(out, st, q, kh2, vh2, j0, n, t0, nt, mask, mw,
                                                                              first, last, b->pos, H, c->attn_scale);
    LAUNCH_CHECK("attention_mla_piece_t3_kernel");
}

void attention_mla_piece_cuda(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                              int ldk, int j0, int n, int t0, int nt, const int *topk, int ktop, int first, int last,
                              const Batch *b, const ModelConfig *c)
{
    if (nt <= 0) return;
    const int Dq = c->qk_nope_dim + c->qk_rope_dim, Dv = c->v_head_dim;
    /* v1 stages float4s: the rows' starts 16 bytes apart (Dn, the cached row and the expanded row
     * multiples of 4 floats) and the buffers 16-byte aligned */
    const int v4 = c->qk_nope_dim % 4 == 0 && ldk % 4 == 0 && (c->qk_nope_dim + Dv) % 4 == 0 &&
                   (((uintptr_t)q | (uintptr_t)kv | (uintptr_t)kpe) & 15) == 0;
    /* v3 lists the block's tiles in 64 words of 32 (n <= 32768; be_mla_piece: at most 4096) */
    const int kind = v4 ? mla_piece_kind(be, Dq, Dv) : 0, t3 = kind == 3 && n <= 64 * 32 * MLA_TC_KT;
    if (kind) {
        uint32_t *mask = NULL;
        const int mw = cdiv(n, 32);
        if (topk) {
            mask = (uint32_t *)cuda_scratch(be, SCR_MLA_MASK, (size_t)nt * mw * 4);
            CUDA_CHECK(cudaMemsetAsync(mask, 0, (size_t)nt * mw * 4, cuda_stream(be)));
            mla_piece_mask_kernel<<<nt, ATT_THREADS, 0, cuda_stream(be)>>>(mask, mw, topk, ktop, t0, j0, n);
            LAUNCH_CHECK("mla_piece_mask_kernel");
        }
        if (t3 && Dq == 256) mla_piece_t3_launch<256, 256>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (t3 && Dq == 192) mla_piece_t3_launch<192, 128>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (t3) mla_piece_t3_launch<48, 32>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != 2 && Dq == 256) mla_piece_tc_launch<256, 256, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != 2 && Dq == 192) mla_piece_tc_launch<192, 128, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (kind != 2) mla_piece_tc_launch<48, 32, 64>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (Dq == 256) mla_piece_tc_launch<256, 256, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else if (Dq == 192) mla_piece_tc_launch<192, 128, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        else mla_piece_tc_launch<48, 32, 48>(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, mask, mw, first, last, b, c);
        return;
    }
    if (Dq > MLA_MAX_DQ || Dv > MLA_MAX_DV)
        die("attention_mla_piece_cuda: q head %d / v head %d exceed the kernel's limits %d / %d", Dq, Dv, MLA_MAX_DQ, MLA_MAX_DV);
    dim3 grid(nt, c->n_heads);
    attention_mla_piece_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, st, q, kv, kpe, ldk, j0, n, t0, topk, ktop, first, last, b->pos, c->n_heads, c->qk_nope_dim,
        c->qk_rope_dim, c->v_head_dim, c->attn_scale);
    LAUNCH_CHECK("attention_mla_piece_kernel");
}
