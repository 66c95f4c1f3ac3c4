/* w4_moe: the grouped MoE on W4P experts (w4_moe_cuda, moe.cu calls it): gate and up in one pass
 * with SwiGLU in the epilogue, then down, then the weighted combine (moe.cu). One routing launch
 * lists each expert's pairs in token tiles of the call's tile and, beside some call tiles, of two
 * classes of experts (w4_select.h w4_moe_classes: the hot ones on W4_HOT_TILE, the small ones on
 * W4_SMALL_TILE, each class its own launches, on side streams where MOESERVE_W4_MOE_SIDE says).
 * The mma.sync tiles' kernels (W4_FAM_MMA) are here; the block GEMM and wgmma families in
 * w4_moe_block.cu and w4_moe_wgmma.cu. */
#include "w4_moe.cuh"
#include "w4_wgmma.cuh" /* w4_wg_perm */


/* The dispatch in one launch: block 0 (1024 threads, E <= 1024) counts the pairs per expert in
 * shared memory, scans them into offsets and the tile list (a tile for every MT pairs of expert
 * e, in expert order: w4_tile_facts) and lists each expert's pairs (rows); the other blocks convert x
 * to BF16 meanwhile. The order of the pairs inside an expert's list depends on the atomics, but
 * each pair's result does not (every token column of the MMA is computed alone). */
/* A class of experts beside the call's tile (w4_moe_cuda): its token tiles' lists, its tile count,
 * the wg ring kernels' item counters, its tokens a tile and its threshold (0: no such class) */
struct W4MoeClass {
    int *tile_e, *tile_base, *n_tiles, *ctr;
    int mt, thr;
};

static __global__ void w4_route_kernel(int *rows, int *tile_e, int *tile_base, int *n_tiles, int *ctr, const int *idx, int P,
                                       int E, int MT, __nv_bfloat16 *xb, const float *x, int64_t nx, int split, int perm_d,
                                       W4MoeClass hot, W4MoeClass small, __nv_bfloat16 *xb2, int perm2, int d)
{
    if (blockIdx.x > 0) { /* perm_d: rows of perm_d, each stored permuted for the wg tiles (w4_wg_perm); xb2: the
                           * rows (of d) again, in the other order (perm2: permuted for the hot class beside an
                           * mma.sync tile; 0: natural for the small class beside a wg tile) */
        for (int64_t i = (blockIdx.x - 1) * (int64_t)blockDim.x + threadIdx.x; i < nx; i += (int64_t)(gridDim.x - 1) * blockDim.x) {
            w4_split_store(xb, perm_d ? i - i % perm_d + w4_wg_perm((int)(i % perm_d)) : i, nx, x[i], split);
            if (xb2) w4_split_store(xb2, perm2 ? i - i % d + w4_wg_perm((int)(i % d)) : i, nx, x[i], split);
        }
        return;
    }
    __shared__ int cnt[1024], sc[1024], st[1024], sb[1024], ss[1024], fill[1024];
    int e = threadIdx.x;
    cnt[e] = 0;
    fill[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x)
        if (idx[i] >= 0) atomicAdd(&cnt[idx[i]], 1); /* -1: another rank's expert (EP) */
    __syncthreads();
    /* an expert of more than hot.thr pairs is listed in the hot class (tiles of hot.mt), one of at
     * most small.thr in the small class (tiles of small.mt), the rest in the call's (MT) */
    int c = e < E ? cnt[e] : 0, hb = hot.thr > 0 && c > hot.thr, sm = small.thr > 0 && c <= small.thr;
    int nt = hb || sm ? 0 : (c + MT - 1) / MT, ntb = hb ? (c + hot.mt - 1) / hot.mt : 0, nts = sm ? (c + small.mt - 1) / small.mt : 0;
    sc[e] = c;
    st[e] = nt;
    sb[e] = ntb;
    ss[e] = nts;
    __syncthreads();
    for (int d = 1; d < 1024; d <<= 1) {
        int a = e >= d ? sc[e - d] : 0, b = e >= d ? st[e - d] : 0, bb = e >= d ? sb[e - d] : 0, bs = e >= d ? ss[e - d] : 0;
        __syncthreads();
        sc[e] += a;
        st[e] += b;
        sb[e] += bb;
        ss[e] += bs;
        __syncthreads();
    }
    int off = sc[e] - c;
    /* expert e's n tiles of mt pairs from list entry t0: the kernels read a tile's facts in one round of loads */
    auto list = [&](int *te, int *tb, int t0, int n, int mt) {
        for (int k = 0; k < n; k++) {
            te[t0 + k] = e | min(mt, c - k * mt) << W4_TILE_M_SHIFT; /* the expert, and the tile's tokens above it */
            tb[t0 + k] = off + k * mt;                               /* the tile's first pair in the sorted list */
        }
    };
    if (e < E) {
        list(tile_e, tile_base, st[e] - nt, nt, MT);
        if (hot.thr > 0) list(hot.tile_e, hot.tile_base, sb[e] - ntb, ntb, hot.mt);
        if (small.thr > 0) list(small.tile_e, small.tile_base, ss[e] - nts, nts, small.mt);
    }
    if (e == 1023) {
        *n_tiles = st[1023];
        if (hot.thr > 0) *hot.n_tiles = sb[1023];
        if (small.thr > 0) *small.n_tiles = ss[1023];
    }
    if (e == 0) ctr[0] = ctr[1] = 0; /* the wg ring kernels' item counters (gate/up, down) */
    if (e == 0 && hot.thr > 0) hot.ctr[0] = hot.ctr[1] = 0;
    sc[e] = off; /* exclusive offsets, for the listing */
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        int x_e = idx[i];
        if (x_e >= 0) rows[sc[x_e] + atomicAdd(&fill[x_e], 1)] = i;
    }
}

/* The gate/up epilogue of one warp's row tile: h[pos, f] = silu(gate) * up as BF16 (and its low
 * half with SP) for the tile's valid token slots; up(nt, q) gives the up sum of accumulator q. */
template <int NT, bool SP, typename Up>
__device__ __forceinline__ void w4_swiglu_store(__nv_bfloat16 *h, size_t hlo, const float (&gate)[NT][4], Up up, float sg,
                                                float su, int m, int base, int F, int i)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int slot = nt * 8 + 2 * t + (q & 1), f = 16 * i + g + 8 * (q >> 1);
            if (slot >= m) continue;
            float gv = gate[nt][q] * sg, uv = up(nt, q) * su;
            size_t at = (size_t)(base + slot) * F + f;
            float hv = gv / (1.f + __expf(-gv)) * uv;
            __nv_bfloat16 hh = __float2bfloat16(hv);
            h[at] = hh;
            if (SP) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
        }
}

/* gate and up of expert e for one tile of its pairs: h[pos, f] = silu(gate) * up (BF16), pos the
 * pair's place in the sorted list. Row tiles of F along blockIdx.y. SS: warps 2r and 2r + 1
 * stream gate and up of the block's row tile r (one weight stream a warp: half the registers);
 * the up warp hands its sums to the gate warp through shared memory. */
template <int NT, int ST, int KS, bool SP, bool SS>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_moe_gateup_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int F, int K,
    size_t xlo, size_t hlo)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31;
    pdl_trigger(); /* the down kernel may take SMs as they free */
    int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    static_assert(!SS || KS == 1, "stream split and K split do not combine");
    __shared__ float red[SS ? (W4_WARPS / 2) * NT * 4 * 32 : KS > 1 ? (KS - 1) * 2 * NT * 4 * 32 : 1];
    const int warp = threadIdx.x >> 5;
    int i = SS ? blockIdx.y * (W4_WARPS / 2) + warp / 2 : blockIdx.y * (W4_WARPS / KS) + warp / KS, active = i < F / 16;
    if (ST == 0 && !SS && !active) return; /* SS: every warp meets the exchange barrier */
    int e, m, base;
    w4_tile_facts(tile_e, tile_base, tile, e, m, base);
    const QTensor &wg = table[e], &wu = table[E + e];
    int ng = K / W4_KG;
    const bool pk = w4_packs<NT, ST, SP>(m);
    if (threadIdx.x < 8 * NT)
        rowp[threadIdx.x] = w4_pk_row(threadIdx.x, m, pk, xlo, [&](int s) { return xb + (size_t)(rows[base + s] / topk) * K; });
    __syncthreads();
    int ia = active ? i : 0;
    float sg = wg.gscale * 512.f, su = wu.gscale * 512.f;
    if (SS) {
        int up = warp & 1;
        const uint8_t *rec[1] = {(up ? wu : wg).data + (size_t)ia * ng * W4_REC};
        float acc[1][NT][4];
        w4_tile_sp<NT, 1, ST, SP>(acc, rec, active, rowp, xlo, m, pk, 0, ng, w4_sx);
        float *xu = red + (warp / 2) * NT * 4 * 32;
        if (up)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) xu[(nt * 4 + q) * 32 + lane] = acc[0][nt][q];
        __syncthreads();
        if (up || !active) return;
        w4_swiglu_store<NT, SP>(h, hlo, acc[0], [&](int nt, int q) { return xu[(nt * 4 + q) * 32 + lane]; }, sg, su, m, base, F, i);
        return;
    }
    const uint8_t *rec[2] = {wg.data + (size_t)ia * ng * W4_REC, wu.data + (size_t)ia * ng * W4_REC};
    float acc[2][NT][4];
    int g0 = 0, g1 = ng;
    w4_krange<KS>(g0, g1);
    w4_tile_sp<NT, 2, ST, SP>(acc, rec, active, rowp, xlo, m, pk, g0, g1, w4_sx);
    if (!w4_kreduce<2, NT, KS>(acc, red) || !active) return;
    w4_swiglu_store<NT, SP>(h, hlo, acc[0], [&](int nt, int q) { return acc[1][nt][q]; }, sg, su, m, base, F, i);
}

/* down of expert e: y[pair, d] = h[pos] . W_down[d]. Launched with programmatic dependent launch
 * after the gate/up kernel (w4_launch_dependent): before griddepcontrol.wait it reads only
 * what the routing wrote (done before gate/up began) and asks L2 for its first two weight records
 * (constant), so that they arrive while gate/up ends; h only after the wait. */
template <int NT, int ST, int KS, bool SP>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_moe_down_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t hlo)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    __shared__ float red[KS > 1 ? (KS - 1) * NT * 4 * 32 : 1];
    int i = blockIdx.y * (W4_WARPS / KS) + (threadIdx.x >> 5) / KS, active = i < D / 16;
    if (ST == 0 && !active) return;
    int e, m, base;
    w4_tile_facts(tile_e, tile_base, tile, e, m, base);
    const QTensor &wd = table[2 * E + e];
    int ng = F / W4_KG;
    const uint8_t *rec[1] = {wd.data + (size_t)(active ? i : 0) * ng * W4_REC};
    int g0 = 0, g1 = ng;
    w4_krange<KS>(g0, g1);
#if __CUDA_ARCH__ >= 900
    if (active)
        for (int b = lane * 128; b < min(2, g1 - g0) * W4_REC; b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(rec[0] + (size_t)g0 * W4_REC + b));
    pdl_wait(); /* gate/up: done, h visible */
#endif
    const bool pk = w4_packs<NT, ST, SP>(m);
    if (threadIdx.x < 8 * NT)
        rowp[threadIdx.x] = w4_pk_row(threadIdx.x, m, pk, hlo, [&](int s) { return h + (size_t)(base + s) * F; });
    __syncthreads();
    float acc[1][NT][4];
    w4_tile_sp<NT, 1, ST, SP>(acc, rec, active, rowp, hlo, m, pk, g0, g1, w4_sx);
    if (!w4_kreduce<1, NT, KS>(acc, red) || !active) return;
    float sd = wd.gscale * 512.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int slot = nt * 8 + 2 * t + (q & 1), d = 16 * i + g + 8 * (q >> 1);
            if (slot >= m) continue;
            y[(size_t)rows[base + slot] * D + d] = acc[0][nt][q] * sd;
        }
}

/* the small class's gate/up and down on W4_SMALL_TILE (moe_mma_8_gu) */
template <bool SP>
static void w4_moe_small_launch(cudaStream_t st, dim3 gf, dim3 gd, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                                const QTensor *tb, int E, int K, const int *rows, const W4MoeClass &sc, int D, int F, size_t xlo,
                                size_t hlo)
{
    w4_moe_gateup_kernel<1, 0, 1, SP, true><<<gf, W4_WARPS * 32, W4_SMEM(1, 0), st>>>(h, xb, tb, E, K, rows, sc.tile_e, sc.tile_base,
                                                                                  sc.n_tiles, F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_kernel (small experts)");
    w4_launch_dependent(w4_moe_down_kernel<1, 0, 1, SP>, gd, W4_WARPS * 32, W4_SMEM(1, 0), st, y, (const __nv_bfloat16 *)h, tb, E,
                        rows, (const int *)sc.tile_e, (const int *)sc.tile_base, (const int *)sc.n_tiles, D, F, hlo);
    LAUNCH_CHECK("w4_moe_down_kernel (small experts)");
}

int w4_moe_cuda(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T, const MoeExperts *ex,
                const ModelConfig *c)
{
    int E = c->n_experts, K = c->n_experts_per_tok, D = c->hidden, F = c->moe_intermediate, P = T * K;
    cudaStream_t st = cuda_stream(be);
    CHECK(E <= 1024, "w4_moe_cuda: %d experts (at most 1024)", E);
    int tile = w4_pick(be, W4_MOE, T, (double)T * K / E);
    /* the dense-only tiles (a tuned table or a forced tile may name them): their MoE twins */
    if (w4_tiles[tile].fam == W4_FAM_MMA && w4_tiles[tile].ring) tile = W4_DENSE_RING_MOE_TWIN;
    if (w4_tiles[tile].fam == W4_FAM_STREAMK) tile = W4_STREAMK_MOE_TWIN;
    if (w4_tiles[tile].fam == W4_FAM_DENSE_WG) tile = W4_DENSE_WG_MOE_TWIN;
    const W4Tile tl = w4_tiles[tile];
    int NT = tl.n8, MT = 8 * NT;
    int max_tiles = P / MT + (E < P ? E : P);
    /* the hot class: W4_HOT_TILE for the experts of more than `hot` pairs, where it runs and fits;
     * the small class: W4_SMALL_TILE for those of at most `small` (w4_moe_classes) */
    int hot = 0, small = 0, dev = cuda_state(be)->device, split = w4_split_act();
    w4_moe_classes(tile, T, split, w4_wg_supported(dev) && w4_tile_fits(w4_tiles[W4_HOT_TILE], w4_smem_budget(dev), NULL, 0),
                   (int)knob_get(KNOB_W4_MOE_HOT), (int)knob_get(KNOB_W4_MOE_SMALL), &hot, &small);
    const int wg = tl.fam == W4_FAM_WGMMA;
    /* a second copy of the activations in the other order, where a class beside the call's tile reads
     * them so: the hot class beside a mma.sync tile the wgmma order, the small class beside a wgmma
     * tile the natural order; in scratch that a graph being captured cannot grow (cuda_reserve sizes
     * it up to 2048 tokens): past that the class is off */
    __nv_bfloat16 *xb2 = NULL;
    if ((hot > 0 && !wg) || (small > 0 && wg)) {
        size_t need = (size_t)2 * T * D * sizeof(__nv_bfloat16);
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
        if (cs == cudaStreamCaptureStatusNone || need <= cuda_scratch_cap(be, SCR_W4_XP))
            xb2 = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_XP, need);
        else if (!wg)
            hot = 0;
        else
            small = 0;
    }
    const int MTB = 8 * w4_tiles[W4_HOT_TILE].n8, max_tiles_b = P / MTB + P / (hot + 1) + 1;
    const int MTS = 8 * w4_tiles[W4_SMALL_TILE].n8, nsmall = E < P ? E : P;
    const long ms1 = (long)nsmall * cdiv(small > 0 ? small : 1, MTS), ms2 = (long)P / MTS + nsmall;
    const int max_tiles_s = (int)(ms1 < ms2 ? ms1 : ms2);
    const size_t nlist = (size_t)3 + 2 * (P + E); /* a class's ints: its tile count, its lists, its counters */
    int *ibuf = (int *)cuda_scratch(be, SCR_MOE_COUNT, 3 * nlist * sizeof(int));
    int *n_tiles = ibuf, *tile_e = n_tiles + 1,
        *tile_base = tile_e + (P + E), *ctr = tile_base + (P + E);
    auto klass = [&](int k, int mt, int thr) {
        int *b = ibuf + k * nlist;
        return W4MoeClass{b + 1, b + 1 + (P + E), b, b + 1 + 2 * (P + E), mt, thr};
    };
    const W4MoeClass hc = klass(1, MTB, hot), sc = klass(2, MTS, small);
    int *rows = (int *)cuda_scratch(be, SCR_MOE_ROWS, (size_t)P * sizeof(int));
    size_t xlo = split ? (size_t)T * D : 0, hlo = split ? (size_t)P * F : 0;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * D * sizeof(__nv_bfloat16));
    __nv_bfloat16 *h = (__nv_bfloat16 *)cuda_scratch(be, SCR_MOE_H, (size_t)2 * P * F * sizeof(__nv_bfloat16));
    float *y = (float *)cuda_scratch(be, SCR_MOE_Y, (size_t)P * D * sizeof(float));
    int64_t nx = (int64_t)T * D;
    int nb = 1 + (int)(nx / 4096 < 512 ? (nx + 4095) / 4096 : 512);
    w4_route_kernel<<<nb, 1024, 0, st>>>(rows, tile_e, tile_base, n_tiles, ctr, idx, P, E, MT, xb, x, nx, split,
                                         wg ? D : 0, hc, sc, xb2, !wg, D);
    LAUNCH_CHECK("w4_route_kernel");
    int rpb = W4_WARPS / tl.kwarps; /* row tiles per block */
    int rpb_gu = tl.gu_warps ? W4_WARPS / 2 : rpb; /* gate and up on two warps a row tile */
    dim3 gf(max_tiles, cdiv(F / 16, rpb_gu)), gd(max_tiles, cdiv(D / 16, rpb));
    const QTensor *tb = ex->table;
    /* the small class's launches on stream s */
    auto small_launch = [&](cudaStream_t s) {
        const __nv_bfloat16 *xs = wg ? xb2 : xb;
        dim3 sf(max_tiles_s, cdiv(F / 16, W4_WARPS / 2)), sd(max_tiles_s, cdiv(D / 16, W4_WARPS));
        if (split) w4_moe_small_launch<true>(s, sf, sd, h, xs, y, tb, E, K, rows, sc, D, F, xlo, hlo);
        else w4_moe_small_launch<false>(s, sf, sd, h, xs, y, tb, E, K, rows, sc, D, F, xlo, hlo);
    };
    /* the small class runs beside the call's tile, on the side stream (MOESERVE_W4_MOE_SIDE): a class of a few
     * experts is a chain of dependent record loads a warp (~70 us on the H200 for 2-5 experts),
     * which the call's kernels hide; its blocks take SMs as the call's leave them room */
    CudaState *cs = cuda_state(be);
    auto hot_launch = [&](cudaStream_t s) {
        w4_moe_wgmma(s, W4_HOT_TILE, W4MoeCall{max_tiles_b, h, wg ? xb : xb2, y, tb, E, K, rows, hc.tile_e, hc.tile_base, hc.n_tiles,
                                               hc.ctr, D, F, xlo, hlo});
    };
    /* the hot class on a third stream, beside the call's tile and the small class: beside the call
     * tiles whose class rule says so (MOESERVE_W4_MOE_SIDE 1, the default: w4_moe_hot_beside), and
     * beside every call's tile (2) */
    const int sm = (int)knob_get(KNOB_W4_MOE_SIDE), side = small > 0 && sm,
              side2 = hot > 0 && (sm == 2 || (sm == 1 && w4_moe_hot_beside(tile)));
    if (side || side2) CUDA_CHECK(cudaEventRecord(cs->fork, st));
    if (side) {
        CUDA_CHECK(cudaStreamWaitEvent(cs->side, cs->fork, 0));
        small_launch(cs->side);
        CUDA_CHECK(cudaEventRecord(cs->join, cs->side));
    }
    if (side2) {
        CUDA_CHECK(cudaStreamWaitEvent(cs->side2, cs->fork, 0));
        hot_launch(cs->side2);
        CUDA_CHECK(cudaEventRecord(cs->join2, cs->side2));
    }
    /* after the call's tile: the small experts' tiles (W4_SMALL_TILE, on the activations in their
     * natural order: the copy beside a wgmma tile), the hot experts' tiles (on the activations in the
     * wgmma order: xb beside a wgmma tile, the permuted copy beside a mma.sync tile), then the
     * weighted combine */
    auto finish = [&]() {
        if (small > 0 && !side) small_launch(st);
        if (hot > 0 && !side2) hot_launch(st);
        if (side) CUDA_CHECK(cudaStreamWaitEvent(st, cs->join, 0)); /* the small class, beside: done */
        if (side2) CUDA_CHECK(cudaStreamWaitEvent(st, cs->join2, 0)); /* the hot class, beside: done */
        moe_combine_cuda(be, out, y, wts, idx, T, K, D);
        return -1;
    };
    const W4MoeCall call = {max_tiles, h, xb, y, tb, E, K, rows, tile_e, tile_base, n_tiles, ctr, D, F, xlo, hlo};
    if (wg) {
        w4_moe_wgmma(st, tile, call);
        return finish();
    }
    if (tl.fam == W4_FAM_MMA_BLOCK) {
        w4_moe_block(st, tile, call);
        return finish();
    }
#define W4_MOE_SP(NTV, STV, KSV, SPV, SSV)                                                                               \
    W4_SET_SMEM2(w4_moe_gateup_kernel, NTV, STV, KSV, SPV, SSV);                                                            \
    W4_SET_SMEM(w4_moe_down_kernel, NTV, STV, KSV, SPV);                                                                    \
    w4_moe_gateup_kernel<NTV, STV, KSV, SPV, SSV><<<gf, W4_WARPS * 32, W4_SMEM(NTV, STV), st>>>(h, xb, tb, E, K, rows,  \
                                                                                 tile_e, tile_base, n_tiles, F, D, xlo, hlo); \
    LAUNCH_CHECK("w4_moe_gateup_kernel");                                                                              \
    w4_launch_dependent(w4_moe_down_kernel<NTV, STV, KSV, SPV>, gd, W4_WARPS * 32, W4_SMEM(NTV, STV), st, y,              \
                        (const __nv_bfloat16 *)h, (const QTensor *)tb, E,       \
                        (const int *)rows, (const int *)tile_e, (const int *)tile_base, (const int *)n_tiles, D, F, hlo); \
    LAUNCH_CHECK("w4_moe_down_kernel");
#define W4_MOE_T(NTV, STV, KSV, SSV) W4_MOE_SP(NTV, STV, KSV, true, SSV)
#define W4_MOE_F(NTV, STV, KSV, SSV) W4_MOE_SP(NTV, STV, KSV, false, SSV)
    if (split) {
        W4_MMA_DISPATCH(tile, W4_MOE_T)
    } else {
        W4_MMA_DISPATCH(tile, W4_MOE_F)
    }
#undef W4_MOE_T
#undef W4_MOE_F
#undef W4_MOE_SP
    return finish();
}

extern "C" int w4_moe_ready(const MoeExperts *ex, const ModelConfig *c)
{
    if (!ex->gate || c->hidden % W4_KG || c->moe_intermediate % W4_KG || c->n_experts > 1024) return 0;
    for (int e = 0; e < c->n_experts; e++)
        if (!ex->gate[e].packed || !ex->up[e].packed || !ex->down[e].packed) return 0;
    return 1;
}
