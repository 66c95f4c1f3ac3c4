/* w4_moe_block: the MoE's prefill block GEMM on mma.sync (W4_FAM_MMA_BLOCK tiles): many tokens
 * per expert, where what counts is how many MMAs each shared memory load and each decode feed.
 * w4_moe.cu routes the call and runs it here where the choice says (w4_moe_block). */
#include "w4_moe.cuh"

/* ---- the block GEMM (w4_select.h W4_FAM_MMA_BLOCK) ----
 * Many tokens per expert make the GEMM compute-bound: what counts is how many mma each shared
 * memory load and each decode feed. A block of NT warps (nt / 4 along tokens x 4 along rows;
 * NT = 4 or 8) computes W4_BLOCK_RECS = 16 row tiles x 8 NT tokens; warp (wm = warp % 4, wn =
 * warp / 4) owns the records in stage slots 4 wm .. 4 wm + 3 and tokens 32 wn .. 32 wn + 31:
 * acc[q][nt] = record slot 4 wm + q (16 rows) x token n8 tile nt, 64 floats. Each decoded A
 * fragment feeds 4 mma (one per n8 tile), each B fragment 8 (4 records x 2 k16 steps).
 * The weights and the activations of half a record group (128 columns) go into shared memory by
 * cp.async, ST stages in flight, one barrier a stage. Weights through shared memory rather than
 * straight to registers: 4 records in flight a warp cost 72 registers a group (the accumulators
 * already hold 64), and the 2 warps along tokens would each load the same records. A record's
 * half is its 2 chunks' codes (1024 bytes) plus all its 256 scale bytes (the scales are
 * interleaved per lane over the 4 chunks); each lane reads its fragments as w4_tile does, one
 * 16-byte load per chunk from a contiguous 512 bytes (no bank conflicts). B: ldmatrix does not
 * fit here (it hands lane t the natural columns 2t, 2t + 1, the W4P k order needs 16t + 4j + q),
 * so each lane reads its 32 contiguous bytes of a token row with 16-byte loads; rows are 272
 * bytes apart, 16 mod 128, so the 8 lanes of a load phase (2 rows x 4 t) hit 8 distinct 16-byte
 * bank groups.
 * Split activations (the low halves lo_g groups of 256 elements after the high ones; 0: plain
 * BF16) run K twice, the high halves then the low halves (virtual stages 2 ng .. 4 ng - 1 re-read
 * the weights; the same products as w4_tile's, summed in another order).
 * recp (shared, 16): the first record of each slot's row tile, clamped to a valid one; rowp
 * (shared, 8 NT): each token slot's BF16 row, clamped to a valid token; rows from 8 ntv on are
 * neither staged nor computed. Every thread of the block must call (barriers). */
template <int NT, int ST>
__device__ __forceinline__ void w4_block_gemm(float (&acc)[4][4][4], const uint8_t *const *recp,
                                           const __nv_bfloat16 *const *rowp, unsigned lo_g, int ng, int ntv, uint8_t *sm)
{
    constexpr int NTH = NT * 32, STAGE = W4_BLOCK_STAGE(NT), RB = W4_BLOCK_REC_BYTES, XB = W4_BLOCK_ROW_BYTES;
    static_assert(ST >= 2 && (NT == 4 || NT == 8), "block tile: 2+ stages, 32 or 64 tokens");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const int nw = min(max(ntv - 4 * wn, 0), 4); /* the warp's n8 tiles holding valid tokens */
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) acc[q][nt][0] = acc[q][nt][1] = acc[q][nt][2] = acc[q][nt][3] = 0.f;
    const int nv = 2 * ng * (lo_g ? 2 : 1); /* virtual stages: (pass, group, half) */
    auto stage = [&](int v, int slot) { /* the block copies virtual stage v into ring slot v % ST */
        uint8_t *dst = sm + slot * STAGE;
        int G = (v >> 1) % ng, hh = v & 1;
        /* thread q: 16 bytes of record slot q / 80: codes (byte 16 ch of chunks 2 hh, 2 hh + 1)
         * for ch < 64, else scales */
#pragma unroll 1
        for (int q = threadIdx.x; q < W4_BLOCK_RECS * 80; q += NTH) {
            int r = q / 80, ch = q % 80, off = ch < 64 ? hh * 1024 + ch * 16 : 2048 + (ch - 64) * 16;
            cp_async16(dst + r * RB + ch * 16, recp[r] + (size_t)G * W4_REC + off);
        }
        /* thread q: 8 activations (16 bytes) of token slot q / 16 */
        size_t xo = ((size_t)(v >= 2 * ng ? lo_g : 0) + G) * W4_KG + hh * 128;
        uint8_t *xs = dst + W4_BLOCK_RECS * RB;
#pragma unroll 1
        for (int q = threadIdx.x; q < 8 * ntv * 16; q += NTH) {
            int r = q >> 4, ch = q & 15;
            cp_async16(xs + r * XB + ch * 16, rowp[r] + xo + ch * 8);
        }
    };
#pragma unroll
    for (int p = 0; p < ST - 1; p++) {
        if (p < nv) stage(p, p);
        cp_async_commit();
    }
    for (int v = 0, slot = 0; v < nv; v++, slot = slot + 1 < ST ? slot + 1 : 0) { /* slot = v % ST */
        cp_async_wait<ST - 2>(); /* this thread's copies of stage v have landed ... */
        __syncthreads();         /* ... everyone's, and every warp is done with stage v - 1's slot */
        if (v + ST - 1 < nv) stage(v + ST - 1, slot > 0 ? slot - 1 : ST - 1);
        cp_async_commit();
        if (nw == 0) continue; /* warp-uniform: no valid token in the warp's columns */
        const uint8_t *ws = sm + slot * STAGE + 4 * wm * RB;
        /* lane (g, t): token row 32 wn + 8 nt + g, its bytes 32 t .. 32 t + 31 of each 64-column chunk */
        const uint8_t *xs = sm + slot * STAGE + W4_BLOCK_RECS * RB + (32 * wn + g) * XB + t * 32;
#pragma unroll
        for (int cc = 0; cc < 2; cc++) {
            const int c = 2 * (v & 1) + cc; /* the chunk of the record group (its scale bytes) */
            uint4 w[4];
            uint32_t sg[4], sh[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                w[q] = *(const uint4 *)(ws + q * RB + cc * 512 + lane * 16);
                uint32_t sw = *(const uint32_t *)(ws + q * RB + 1024 + lane * 8 + (c >> 1) * 4);
                sg[q] = w4_scale2(sw, (2 * c) & 3);
                sh[q] = w4_scale2(sw, (2 * c + 1) & 3);
            }
#pragma unroll
            for (int jp = 0; jp < 2; jp++) { /* k16 steps 2 jp, 2 jp + 1 */
                uint4 b[4];
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    if (nt < nw) b[nt] = *(const uint4 *)(xs + nt * 8 * XB + cc * 128 + jp * 16);
#pragma unroll
                for (int jj = 0; jj < 2; jj++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        uint32_t a[4];
                        w4_decode(jp ? (jj ? w[q].w : w[q].z) : (jj ? w[q].y : w[q].x), sg[q], sh[q], a);
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
                            if (nt < nw)
                                mma_bf16(acc[q][nt], a[0], a[1], a[2], a[3], jj ? b[nt].z : b[nt].x, jj ? b[nt].w : b[nt].y);
                    }
            }
        }
    }
    cp_async_wait<0>();
}

/* ---- the kernels ----
 * The same ops and outputs as the two kernels above, for tiles of 8 NT tokens; block
 * (blockIdx.x, blockIdx.y) takes row block blockIdx.x of the token tiles blockIdx.y,
 * blockIdx.y + gridDim.y, ... (consecutive blocks share a token tile: its activations and the
 * expert's weights stay in L2 across the row blocks). */
template <int NT, int ST>
static __global__ void __launch_bounds__(NT * 32, 16 / NT) w4_moe_gateup_block_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int F, int K,
    size_t xlo, size_t hlo)
{
    extern __shared__ __align__(16) uint8_t w4_block_sm[];
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ const uint8_t *recp[W4_BLOCK_RECS];
    __shared__ int4 tinfo; /* the token tile's valid tokens, first pair, gate and up scales (float bits) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const int ng = K / W4_KG, nrt = F / 16;
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        {
            int e, m, base;
            w4_tile_facts(tile_e, tile_base, tile, e, m, base);
            const QTensor &wg = table[e], &wu = table[E + e];
            __syncthreads(); /* the previous tile's readers of rowp, recp and tinfo are done */
            if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(rows[base + min((int)threadIdx.x, m - 1)] / topk) * K;
            if (threadIdx.x < W4_BLOCK_RECS) { /* slot 4 w + q: gate (q < 2) or up of row tile 8 blockIdx.x + 2 w + (q & 1) */
                int r = threadIdx.x, q = r & 3, i = 8 * blockIdx.x + 2 * (r >> 2) + (q & 1);
                recp[r] = (q < 2 ? wg : wu).data + (size_t)(i < nrt ? i : 0) * ng * W4_REC;
            }
            if (threadIdx.x == 0) tinfo = make_int4(m, base, __float_as_int(wg.gscale * 512.f), __float_as_int(wu.gscale * 512.f));
            __syncthreads();
        }
        float acc[4][4][4];
        w4_block_gemm<NT, ST>(acc, recp, rowp, (unsigned)(xlo / W4_KG), ng, (tinfo.x + 7) / 8, w4_block_sm);
        /* the tile's facts from shared memory: fewer registers held across the GEMM */
        int m = tinfo.x, base = tinfo.y;
        float sg = __int_as_float(tinfo.z), su = __int_as_float(tinfo.w);
        /* acc[q] (gate) and acc[q + 2] (up): row tile 8 blockIdx.x + 2 wm + q; element d of n8
         * tile nt: token slot 32 wn + 8 nt + 2 t + (d & 1), row g + 8 (d >> 1) of the tile */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int i = 8 * blockIdx.x + 2 * wm + q;
            if (i >= nrt) continue;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int d = 0; d < 4; d++) {
                    int slot = 32 * wn + 8 * nt + 2 * t + (d & 1), f = 16 * i + g + 8 * (d >> 1);
                    if (slot >= m) continue;
                    float gv = acc[q][nt][d] * sg, uv = acc[q + 2][nt][d] * su;
                    size_t at = (size_t)(base + slot) * F + f;
                    float hv = gv / (1.f + __expf(-gv)) * uv;
                    __nv_bfloat16 hh = __float2bfloat16(hv);
                    h[at] = hh;
                    if (hlo) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
                }
        }
    }
}

template <int NT, int ST>
static __global__ void __launch_bounds__(NT * 32, 16 / NT) w4_moe_down_block_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t hlo)
{
    extern __shared__ __align__(16) uint8_t w4_block_sm[];
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ const uint8_t *recp[W4_BLOCK_RECS];
    __shared__ int4 tinfo; /* the token tile's valid tokens, first pair, down scale (float bits) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const int ng = F / W4_KG, nrt = D / 16;
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        {
            int e, m, base;
            w4_tile_facts(tile_e, tile_base, tile, e, m, base);
            const QTensor &wd = table[2 * E + e];
            __syncthreads(); /* the previous tile's readers of rowp, recp and tinfo are done */
            if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = h + (size_t)(base + min((int)threadIdx.x, m - 1)) * F;
            if (threadIdx.x < W4_BLOCK_RECS) { /* slot r: row tile 16 blockIdx.x + r */
                int i = 16 * blockIdx.x + threadIdx.x;
                recp[threadIdx.x] = wd.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC;
            }
            if (threadIdx.x == 0) tinfo = make_int4(m, base, __float_as_int(wd.gscale * 512.f), 0);
            __syncthreads();
        }
        float acc[4][4][4];
        w4_block_gemm<NT, ST>(acc, recp, rowp, (unsigned)(hlo / W4_KG), ng, (tinfo.x + 7) / 8, w4_block_sm);
        int m = tinfo.x, base = tinfo.y;
        float sd = __int_as_float(tinfo.z);
        /* acc[q]: row tile 16 blockIdx.x + 4 wm + q, token slots as in the gate/up kernel */
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int p = 0; p < 2; p++) {
                int slot = 32 * wn + 8 * nt + 2 * t + p;
                if (slot >= m) continue;
                float *yr = y + (size_t)rows[base + slot] * D;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int i = 16 * blockIdx.x + 4 * wm + q;
                    if (i >= nrt) continue;
                    yr[16 * i + g] = acc[q][nt][p] * sd;
                    yr[16 * i + g + 8] = acc[q][nt][p + 2] * sd;
                }
            }
    }
}

/* gate/up then down on block tile <NT, ST>; the grids' y walk the token tiles (at most 65535) */
template <int NT, int ST>
static void w4_moe_block_launch(cudaStream_t st, int max_tiles, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                      const QTensor *tb, int E, int topk, const int *rows,
                      const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t xlo, size_t hlo)
{
    const int smem = (int)(ST * W4_BLOCK_STAGE(NT));
    static int ready = 0;
    if (!ready) { /* over 48 KB: opt in; and the most shared memory an SM can hold, for 2 blocks of 64 tokens */
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_block_kernel<NT, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_block_kernel<NT, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_block_kernel<NT, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_block_kernel<NT, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        ready = 1;
    }
    int ny = max_tiles < 65535 ? max_tiles : 65535;
    dim3 gf(cdiv(F / 16, W4_BLOCK_RECS / 2), ny), gd(cdiv(D / 16, W4_BLOCK_RECS), ny);
    w4_moe_gateup_block_kernel<NT, ST><<<gf, NT * 32, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base,
                                                              n_tiles, F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_block_kernel");
    w4_moe_down_block_kernel<NT, ST><<<gd, NT * 32, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles,
                                                            D, F, hlo);
    LAUNCH_CHECK("w4_moe_down_block_kernel");
}

void w4_moe_block(cudaStream_t st, int tile, const W4MoeCall &c)
{
#define W4_MOE_BLOCK(ID, NTV, STV)                                                                                     \
    case ID:                                                                                                           \
        CHECK(w4_tiles[ID].fam == W4_FAM_MMA_BLOCK && w4_tiles[ID].n8 == NTV && w4_tiles[ID].stages == STV,           \
              "w4: block tile %s is not <%d, %d>", w4_tiles[ID].name, NTV, STV);                                     \
        w4_moe_block_launch<NTV, STV>(st, c.max_tiles, c.h, c.xb, c.y, c.tb, c.E, c.topk, c.rows, c.tile_e, c.tile_base, \
                                      c.n_tiles, c.D, c.F, c.xlo, c.hlo);                                             \
        break;
    switch (tile) {
        W4_MOE_BLOCK(W4T_MOE_BLOCK_64_S3, 8, 3)
        W4_MOE_BLOCK(W4T_MOE_BLOCK_64_S2, 8, 2)
        W4_MOE_BLOCK(W4T_MOE_BLOCK_32_S3, 4, 3)
    default: die("w4: tile %s is no block GEMM tile", w4_tiles[tile].name);
    }
#undef W4_MOE_BLOCK
}
