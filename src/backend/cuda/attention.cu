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
 * the piece into each (query, head)'s online softmax, kept across pieces in st and out. Twins
 * of kv_gather_cpu and attention_mla_piece_cpu. Correct first versions: the fast kernels come
 * later. */
#include "common.cuh"

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
    if (!b->n_tokens) return;
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

void attention_mla_cuda(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
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

void attention_mla_piece_cuda(Backend *be, float *out, float *st, const float *q, const float *kv, const float *kpe,
                              int ldk, int j0, int n, int t0, int nt, const int *topk, int ktop, int first, int last,
                              const Batch *b, const ModelConfig *c)
{
    if (nt <= 0) return;
    if (c->qk_nope_dim + c->qk_rope_dim > MLA_MAX_DQ || c->v_head_dim > MLA_MAX_DV)
        die("attention_mla_piece_cuda: q head %d / v head %d exceed the kernel's limits %d / %d",
            c->qk_nope_dim + c->qk_rope_dim, c->v_head_dim, MLA_MAX_DQ, MLA_MAX_DV);
    dim3 grid(nt, c->n_heads);
    attention_mla_piece_kernel<<<grid, ATT_THREADS, 0, cuda_stream(be)>>>(
        out, st, q, kv, kpe, ldk, j0, n, t0, topk, ktop, first, last, b->pos, c->n_heads, c->qk_nope_dim,
        c->qk_rope_dim, c->v_head_dim, c->attn_scale);
    LAUNCH_CHECK("attention_mla_piece_kernel");
}
