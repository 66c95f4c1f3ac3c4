/* moe: routed experts on the GPU from the device-side routing table, with no host round trip
 * between router and experts (the twin of moe_cpu). Dispatch: count the (token, k) pairs per
 * expert, scan into offsets and a tile schedule, list each expert's pairs. Experts: grouped
 * GEMMs over the schedule (gate and up, SwiGLU, down), each pair's output landing in its own
 * row. Combine: each token adds its K rows weighted, in k order, so the result does not depend
 * on the order the atomics listed the pairs in. */
#include <type_traits>

#include "qgemm.cuh"
#include "w4.h"

static __global__ void moe_count_kernel(int *count, const int *idx, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (idx[i] >= 0) atomicAdd(&count[idx[i]], 1); /* -1: another rank's expert (EP) */
}

/* one thread: offsets and the tile list (tile i = expert tile_e[i], rows tile_m0[i] ..) */
static __global__ void moe_schedule_kernel(const int *count, int *offset, int *tile_e, int *tile_m0, int *n_tiles, int E)
{
    if (threadIdx.x != 0) return;
    int off = 0, nt = 0;
    for (int e = 0; e < E; e++) {
        offset[e] = off;
        for (int m0 = 0; m0 < count[e]; m0 += QM) {
            tile_e[nt] = e;
            tile_m0[nt] = m0;
            nt++;
        }
        off += count[e];
    }
    *n_tiles = nt;
}

static __global__ void moe_fill_kernel(int *rows, int *fill, const int *offset, const int *idx, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int e = idx[i];
        if (e >= 0) rows[offset[e] + atomicAdd(&fill[e], 1)] = i;
    }
}

/* mode 0 (gate/up): input x[pair / K], output row = position in the sorted list;
 * mode 1 (down): input h[position], output row = the pair index. */
static __global__ void moe_gemm_kernel(float *out, int ldo, const float *x, int ldx, const QTensor *table, int which,
                                       const int *count, const int *offset, const int *rows, const int *tile_e,
                                       const int *tile_m0, const int *n_tiles, int K, int E, int mode)
{
    __shared__ int xrow[QM], orow[QM];
    int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    int e = tile_e[tile], m0 = tile_m0[tile], m = min(QM, count[e] - m0), base = offset[e] + m0;
    if (threadIdx.x < QM && threadIdx.x < m) {
        int pos = base + threadIdx.x, pair = rows[pos];
        xrow[threadIdx.x] = mode == 0 ? pair / K : pos;
        orow[threadIdx.x] = mode == 0 ? pos : pair;
    }
    __syncthreads();
    qgemm_tile(out, ldo, orow, x, ldx, xrow, m, blockIdx.y * QN, table[which * E + e], NULL);
}

/* out[t, d] = sum_k wts[t, k] * y[t*K + k, d] over the pairs with an expert here (idx >= 0; -1
 * is another rank's expert under EP, its y row never written), added in k order. Block (x, y):
 * columns [V blockDim.x * blockIdx.x, ..) of tokens blockIdx.y, + gridDim.y, ...; a thread takes
 * V = 4 columns (float4; 1 where D or the pointers do not allow it) and has the loads of up to 8
 * pairs in flight at once (one column a thread with a 64-bit division and one load in flight ran
 * at ~45% of the DRAM roof). */
template <int V>
static __global__ void moe_combine_kernel(float *out, const float *y, const float *wts, const int *idx, int T, int K, int D)
{
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const int c = blockIdx.x * blockDim.x + threadIdx.x, DV = D / V;
    if (c >= DV) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        const int *it = idx + (size_t)t * K;
        const float *wt = wts + (size_t)t * K;
        const vec *yt = (const vec *)(y + (size_t)t * K * D) + c;
        float acc[V];
#pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.f;
        for (int k0 = 0; k0 < K; k0 += 8) {
            vec v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) /* past K: row K - 1 again, its sum masked off */
                v[u] = __ldg(yt + (size_t)min(k0 + u, K - 1) * DV);
            /* no branch on the pairs (ptxas sank each load into its pair's branch, one load in
             * flight at a time): a pair off here (past K, or another rank's expert, whose y row
             * may hold anything) has its values masked to +0 bit by bit and adds 0 */
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const bool on = k0 + u < K && it[min(k0 + u, K - 1)] >= 0;
                const float w = on ? wt[min(k0 + u, K - 1)] : 0.f;
                const unsigned m = on ? ~0u : 0u;
                const float *f = (const float *)&v[u];
#pragma unroll
                for (int j = 0; j < V; j++) acc[j] += w * __uint_as_float(__float_as_uint(f[j]) & m);
            }
        }
        if constexpr (V == 4) ((float4 *)(out + (size_t)t * D))[c] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else out[(size_t)t * D + c] = acc[0];
    }
}

void moe_combine_cuda(Backend *be, float *out, const float *y, const float *wts, const int *idx, int T, int K, int D)
{
    if (T <= 0) return;
    const bool v4 = D % 4 == 0 && ((uintptr_t)out & 15) == 0 && ((uintptr_t)y & 15) == 0;
    const int DV = v4 ? D / 4 : D;
    dim3 grid(cdiv(DV, 256), T < 65535 ? T : 65535);
    if (v4) moe_combine_kernel<4><<<grid, 256, 0, cuda_stream(be)>>>(out, y, wts, idx, T, K, D);
    else moe_combine_kernel<1><<<grid, 256, 0, cuda_stream(be)>>>(out, y, wts, idx, T, K, D);
    LAUNCH_CHECK("moe_combine_kernel");
}

int moe_cuda(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T, const MoeExperts *ex,
             const ModelConfig *c)
{
    int E = c->n_experts, K = c->n_experts_per_tok, D = c->hidden, F = c->moe_intermediate, P = T * K;
    if (!T) return 0;
    CHECK(ex->table, "moe_cuda: the layer's expert table is not on the device");
    if (w4_moe_ready(ex, c)) return w4_moe_cuda(be, out, x, idx, wts, T, ex, c);
    cudaStream_t st = cuda_stream(be);
    int max_tiles = P / QM + E;
    int *ibuf = (int *)cuda_scratch(be, SCR_MOE_COUNT, (size_t)(4 * E + 1 + 2 * max_tiles) * sizeof(int));
    int *count = ibuf, *fill = count + E, *offset = fill + E, *n_tiles = offset + E, *tile_e = n_tiles + 1,
        *tile_m0 = tile_e + max_tiles;
    int *rows = (int *)cuda_scratch(be, SCR_MOE_ROWS, (size_t)P * sizeof(int));
    float *g = (float *)cuda_scratch(be, SCR_MOE_H, (size_t)P * F * sizeof(float));
    float *u = (float *)cuda_scratch(be, SCR_MOE_U, (size_t)P * F * sizeof(float));
    float *y = (float *)cuda_scratch(be, SCR_MOE_Y, (size_t)P * D * sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(count, 0, 2 * E * sizeof(int), st));
    int nb = cdiv(P, 256) < 1024 ? cdiv(P, 256) : 1024;
    moe_count_kernel<<<nb, 256, 0, st>>>(count, idx, P);
    LAUNCH_CHECK("moe_count_kernel");
    moe_schedule_kernel<<<1, 32, 0, st>>>(count, offset, tile_e, tile_m0, n_tiles, E);
    LAUNCH_CHECK("moe_schedule_kernel");
    moe_fill_kernel<<<nb, 256, 0, st>>>(rows, fill, offset, idx, P);
    LAUNCH_CHECK("moe_fill_kernel");
    dim3 gf(max_tiles, cdiv(F, QN)), gd(max_tiles, cdiv(D, QN));
    moe_gemm_kernel<<<gf, QTHREADS, 0, st>>>(g, F, x, D, ex->table, 0, count, offset, rows, tile_e, tile_m0, n_tiles, K, E, 0);
    LAUNCH_CHECK("moe_gemm_kernel(gate)");
    moe_gemm_kernel<<<gf, QTHREADS, 0, st>>>(u, F, x, D, ex->table, 1, count, offset, rows, tile_e, tile_m0, n_tiles, K, E, 0);
    LAUNCH_CHECK("moe_gemm_kernel(up)");
    swiglu_cuda(be, g, g, u, F, P, F);
    moe_gemm_kernel<<<gd, QTHREADS, 0, st>>>(y, D, g, F, ex->table, 2, count, offset, rows, tile_e, tile_m0, n_tiles, K, E, 1);
    LAUNCH_CHECK("moe_gemm_kernel(down)");
    moe_combine_cuda(be, out, y, wts, idx, T, K, D);
    return -1;
}
