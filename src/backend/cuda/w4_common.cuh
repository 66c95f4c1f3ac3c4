/* w4_common.cuh: the W4P layout of NVFP4 weights on the GPU, its decode in registers, and the
 * warp-level W4A16 mma.sync GEMM that streams it (w4_tile: the W4_FAM_MMA tiles of w4_select.h),
 * shared by every W4A16 kernel file (w4_*.cu) and the MLA kernels that read a packed kv_b_proj.
 *
 * Layout. W [N, K] (N % 16 == 0, K % 256 == 0) is cut into records of 16 rows x 256 columns,
 * record (i, G) at ((i * K/256) + G) * 2304 bytes, rows 16i.., columns 256G..; a warp streams the
 * records of one row tile in order. A record is 2048 bytes of E2M1 codes then 256 bytes of block
 * scales, the same bytes as the checkpoint's codes and scales, rearranged so that each lane of a
 * warp reads its mma.sync fragments with one 16-byte load per 64 columns and one 8-byte load of
 * scales per 256 columns:
 *   lane l = 4g + t (g = l / 4 holds rows g and g + 8; t = l % 4 holds columns 16t..16t+15 of
 *   each 64-column chunk c, which is exactly one NVFP4 scale block);
 *   codes: [c 0..3][lane][16 bytes]: word j (0..3) holds columns 64c + 16t + 4j + q, q = 0..3,
 *   for rows g and g + 8: the 8 codes of the step's 4 A registers (register r = 2 (q >> 1) + (row
 *   is g + 8), q & 1 its high BF16), each code's sign and 3 magnitude bits at separate places
 *   (W4_BITS, w4_decode);
 *   scales: [lane][c][2 bytes]: row g's then row g + 8's scale of that block.
 * mma.sync m16n8k16 reads logical k = 2t, 2t+1, 2t+8, 2t+9 in lane t; logical k of step j maps to
 * physical column 16t + 4j + q, the same map for the weights (A) and the activations (B), so B is
 * the activation row read in its natural order, 32 contiguous bytes per lane per chunk.
 *
 * Decoding in registers. A code's 3 magnitude bits shifted to bits 6..8 of a BF16 word (sign to
 * bit 15) give its value times 2^-126 (E2M1's subnormal 0.5 lands on BF16's subnormal). The bits
 * of a word are placed so that a register takes its two magnitudes and two signs with 11 shifts
 * and logic ops a word, not 15: register 0's are where the BF16 pair wants them (one AND),
 * register 1's three places lower (one shift, one AND), registers 2 and 3 take their magnitudes
 * and signs from two shifts each (a 32-bit word has no room for four single-shift registers:
 * their 8-bit patterns do not tile it); one
 * bf16x2 multiply by S = scale * 2^117 makes it value * scale * 2^-9, exact in BF16 (2 + 4
 * significant bits), and the epilogue multiplies by gscale * 2^9. Scales are stored as an
 * unsigned E5M3 byte (exponent bias 10, no subnormals: E4M3's subnormals become normal) so that
 * S's BF16 bits are (byte << 4) + 0x7500. A zero scale stores byte 0 and zeroes its codes; a
 * negative scale flips its codes' signs. */
#ifndef MOESERVE_W4_COMMON_CUH
#define MOESERVE_W4_COMMON_CUH

#include "common.cuh"
#include "w4.h"

/* y[i] = bf16(x) and, with split, y[n + i] = bf16(x - bf16(x)): an activation as two BF16 halves
 * (w4_loadb), the low half n elements after the high one */
__device__ __forceinline__ void w4_split_store(__nv_bfloat16 *y, int64_t i, int64_t n, float v, int split)
{
    __nv_bfloat16 h = __float2bfloat16(v);
    y[i] = h;
    if (split) y[n + i] = __float2bfloat16(v - __bfloat162float(h));
}

/* a * b, two BF16 lanes rounded to nearest: mul.bf16x2 from sm_90; before, the same bits by
 * fma.rn.bf16x2 with an addend of -0.0 (one rounding, and a zero product keeps its sign) */
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
    uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#else
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#endif
    return d;
}

__device__ __forceinline__ void mma_bf16(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* S = scale * 2^117 as a BF16 pair from scale byte p (0..3) of word s */
__device__ __forceinline__ uint32_t w4_scale2(uint32_t s, int p)
{
    uint32_t v = __byte_perm(s, 0, (unsigned)(p | (4 << 4) | (p << 8) | (4 << 12)));
    return (v << 4) + 0x75007500u;
}

/* One k16 step: the four A registers of word w, scaled (rows g: sg, rows g + 8: sh); register 2
 * takes its bits by one integer multiply (w4.h w4_bits2). */
__device__ __forceinline__ void w4_decode(uint32_t w, uint32_t sg, uint32_t sh, uint32_t *a)
{
    a[0] = bf16x2_mul(w & (W4_MAG | W4_SIGN), sg);
    a[1] = bf16x2_mul((w << 3) & (W4_MAG | W4_SIGN), sh);
    a[2] = bf16x2_mul(w4_bits2(w), sg);
    a[3] = bf16x2_mul((__funnelshift_l(w, w, 13) & W4_MAG) | ((w << 1) & W4_SIGN), sh);
}

struct W4Frag {
    uint4 c[4];
    uint2 s;
};

/* Chunk c (64 columns, 4 k16 steps) of a lane's record group: the A registers of each step. */
__device__ __forceinline__ void w4_decode_chunk(const W4Frag &f, int c, uint32_t (&a)[4][4])
{
    uint32_t sw = (c < 2) ? f.s.x : f.s.y;
    uint32_t sg = w4_scale2(sw, (2 * c) & 3), sh = w4_scale2(sw, (2 * c + 1) & 3);
    uint32_t words[4] = {f.c[c].x, f.c[c].y, f.c[c].z, f.c[c].w};
#pragma unroll
    for (int j = 0; j < 4; j++) w4_decode(words[j], sg, sh, a[j]);
}

/* acc += a chunk's 4 steps: A from w4_decode_chunk, B the lane's 16 activations of the chunk (b0:
 * steps 0 and 1, b1: steps 2 and 3) */
__device__ __forceinline__ void w4_mma_chunk(float *acc, const uint32_t (&a)[4][4], uint4 b0, uint4 b1)
{
    mma_bf16(acc, a[0][0], a[0][1], a[0][2], a[0][3], b0.x, b0.y);
    mma_bf16(acc, a[1][0], a[1][1], a[1][2], a[1][3], b0.z, b0.w);
    mma_bf16(acc, a[2][0], a[2][1], a[2][2], a[2][3], b1.x, b1.y);
    mma_bf16(acc, a[3][0], a[3][1], a[3][2], a[3][3], b1.z, b1.w);
}

/* A warp's record group into registers. The weights are read once per call: they bypass L1
 * (no_allocate), which then keeps the activation rows every warp of the SM reads again. */
__device__ __forceinline__ void w4_load(W4Frag &f, const uint8_t *rec, int lane)
{
#pragma unroll
    for (int c = 0; c < 4; c++)
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(f.c[c].x), "=r"(f.c[c].y), "=r"(f.c[c].z), "=r"(f.c[c].w) : "l"(rec + c * 512 + lane * 16));
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(f.s.x), "=r"(f.s.y) : "l"(rec + 2048 + lane * 8));
}

/* A lane's share of a record group into a shared-memory slot by cp.async (each lane later reads
 * back only the bytes it copied: no barrier), and back into registers as w4_load lays them out. */
__device__ __forceinline__ void w4_copy(uint32_t slot, const uint8_t *rec, int lane)
{
#pragma unroll
    for (int c = 0; c < 4; c++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot + c * 512 + lane * 16), "l"(rec + c * 512 + lane * 16));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(slot + 2048 + lane * 8), "l"(rec + 2048 + lane * 8));
}

__device__ __forceinline__ void w4_lds(W4Frag &f, uint32_t slot, int lane)
{
#pragma unroll
    for (int c = 0; c < 4; c++)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(f.c[c].x), "=r"(f.c[c].y), "=r"(f.c[c].z), "=r"(f.c[c].w) : "r"(slot + c * 512 + lane * 16) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(f.s.x), "=r"(f.s.y) : "r"(slot + 2048 + lane * 8) : "memory");
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

#define W4_XS (W4_KG + 8)   /* staged activation row stride in elements (528 bytes: no bank conflicts) */

/* Dynamic shared memory of a block staging ST groups of 8 NT activation rows, each as its high
 * and low BF16 halves (0 when ST == 0). */
#define W4_SMEM(NT, ST) ((ST) * 2 * 8 * (NT) * W4_XS * 2)

/* The B fragments of token slot 8 nt + g for chunk c of group G, as activation x = hi + lo, two
 * BF16 halves (lo = bf16(x - hi): 16 bits of mantissa together, an error of 2^-17 instead of
 * BF16's 2^-9, so that near-tied router and indexer choices downstream do not flip): from the
 * staged ring buffer (ST > 0: hi rows, then lo rows 8 NT further), from float32 rows split here
 * (XF), or from BF16 rows whose lo half is `lo` elements further (lo == 0: no lo, plain BF16). */
template <int ST, bool XF, int NT, bool SPLIT>
__device__ __forceinline__ void w4_loadb(uint4 (&b)[2][2], const __nv_bfloat16 *sx, const void *row, size_t lo, int slot,
                                         int G, int c, int t)
{
    if (ST > 0) {
        const uint4 *p = (const uint4 *)(sx + slot * W4_XS + c * 64 + t * 16);
        b[0][0] = p[0];
        b[0][1] = p[1];
        if (SPLIT) {
            const uint4 *q = (const uint4 *)(sx + (slot + 8 * NT) * W4_XS + c * 64 + t * 16);
            b[1][0] = q[0];
            b[1][1] = q[1];
        }
    } else if (XF) {
        const float4 *p = (const float4 *)((const float *)row + (size_t)G * W4_KG + c * 64 + t * 16);
        float f[16];
        *(float4 *)&f[0] = __ldg(p);
        *(float4 *)&f[4] = __ldg(p + 1);
        *(float4 *)&f[8] = __ldg(p + 2);
        *(float4 *)&f[12] = __ldg(p + 3);
        uint32_t h[8], l[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            __nv_bfloat162 v = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
            h[i] = *(uint32_t *)&v;
            if (SPLIT) {
                __nv_bfloat162 w = __floats2bfloat162_rn(f[2 * i] - __low2float(v), f[2 * i + 1] - __high2float(v));
                l[i] = *(uint32_t *)&w;
            }
        }
        b[0][0] = make_uint4(h[0], h[1], h[2], h[3]);
        b[0][1] = make_uint4(h[4], h[5], h[6], h[7]);
        if (SPLIT) {
            b[1][0] = make_uint4(l[0], l[1], l[2], l[3]);
            b[1][1] = make_uint4(l[4], l[5], l[6], l[7]);
        }
    } else {
        const uint4 *p = (const uint4 *)((const __nv_bfloat16 *)row + (size_t)G * W4_KG + c * 64 + t * 16);
        b[0][0] = __ldg(p);
        b[0][1] = __ldg(p + 1);
        if (SPLIT) {
            b[1][0] = __ldg(p + lo / 8);
            b[1][1] = __ldg(p + lo / 8 + 1);
        }
    }
}

/* One block's GEMM for one token tile: each warp w computes acc[s][nt] = W_s[16 rows] x B^T
 * for its row tile, over record groups [g0, g1), for NS weight streams (1, or 2: gate and up of
 * one expert) sharing the activations. rowp (shared, 8 NT entries): the activation row (bf16, K
 * columns, natural order; float32 with XF) of each token slot, clamped to a valid row; ntv: n8 tiles holding
 * valid tokens. rec[s]: the warp's first record of stream s; active: the warp has a row tile
 * (with ST > 0 every warp of the block must call, active or not: the staging is the block's).
 * ST > 0: the block stages the activation tile of each group into shared memory sx (ST groups
 * in flight, cp.async), else each lane reads its B fragments from global memory (L1). The
 * weights stream through registers, the next group's load issued before this one's math, or
 * (WRD > 0) through a ring in shared memory. */
template <int NT, int NS, int ST, bool XF, bool SPLIT, int WRD = 0>
__device__ __forceinline__ void w4_tile(float (&acc)[NS][NT][4], const uint8_t *const (&rec)[NS], int active,
                                        const void *const *rowp, size_t lo, int ntv, int g0, int g1, __nv_bfloat16 *sx)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int s = 0; s < NS; s++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[s][nt][0] = acc[s][nt][1] = acc[s][nt][2] = acc[s][nt][3] = 0.f;
    if (g0 >= g1) return;
    const void *xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) xr[nt] = rowp[nt * 8 + g];
    constexpr int MT = 8 * NT, STAGE = 2 * MT * W4_XS;
    auto stage = [&](int G) { /* the block copies group G's activation tile into its ring slot */
        __nv_bfloat16 *dst = sx + ((G - g0) % (ST > 0 ? ST : 1)) * STAGE;
        int rows = SPLIT ? 2 * MT : MT;
        for (int q = threadIdx.x; q < rows * (W4_KG / 8); q += blockDim.x) {
            int r = q / (W4_KG / 8), ch = q % (W4_KG / 8);
            const __nv_bfloat16 *src = (const __nv_bfloat16 *)rowp[r % MT] + (r >= MT ? lo : 0);
            cp_async16(dst + r * W4_XS + ch * 8, src + (size_t)G * W4_KG + ch * 8);
        }
    };
    if (ST > 0) {
#pragma unroll
        for (int p = 0; p < (ST > 0 ? ST - 1 : 0); p++) {
            if (g0 + p < g1) stage(g0 + p);
            cp_async_commit();
        }
    }
    /* PF groups of weights in flight per warp beyond the one being used (more cost more occupancy
     * in registers than the depth gains: docs/log) */
    constexpr int PF = 1;
    W4Frag nxt[PF][NS];
    /* WRD > 0 (ST 0 only): instead, each warp's records stream through a ring of WRD slots per
     * stream in shared memory (sx), WRD - 1 groups ahead, by cp.async: depth without registers */
    static_assert(WRD == 0 || (ST == 0 && WRD >= 2), "a weight ring: no staged activations, 2+ slots");
    const uint32_t ring = WRD ? (uint32_t)__cvta_generic_to_shared(sx) + (threadIdx.x >> 5) * NS * WRD * W4_REC : 0;
    if (WRD && active) {
#pragma unroll
        for (int p = 0; p < (WRD ? WRD - 1 : 0); p++) {
            if (g0 + p < g1)
#pragma unroll
                for (int s = 0; s < NS; s++) w4_copy(ring + (s * WRD + p) * W4_REC, rec[s] + (size_t)(g0 + p) * W4_REC, lane);
            cp_async_commit();
        }
    } else if (active) {
#pragma unroll
        for (int p = 0; p < PF; p++)
            if (g0 + p < g1) {
#pragma unroll
                for (int s = 0; s < NS; s++) w4_load(nxt[p][s], rec[s] + (size_t)(g0 + p) * W4_REC, lane);
            }
    }
    for (int G = g0; G < g1; G++) {
        const __nv_bfloat16 *sxg = sx;
        if (ST > 0) {
            cp_async_wait<(ST > 1 ? ST - 2 : 0)>();
            __syncthreads();
            if (G + ST - 1 < g1) stage(G + ST - 1);
            cp_async_commit();
            sxg = sx + ((G - g0) % (ST > 0 ? ST : 1)) * STAGE;
        }
        if (!active) continue;
        W4Frag cur[NS];
        if constexpr (WRD > 0) {
            int q = G - g0, Gn = G + WRD - 1; /* Gn refills the slot group G - 1 used (read back last step) */
            if (Gn < g1)
#pragma unroll
                for (int s = 0; s < NS; s++) w4_copy(ring + (s * WRD + (q + WRD - 1) % WRD) * W4_REC, rec[s] + (size_t)Gn * W4_REC, lane);
            cp_async_commit();
            cp_async_wait<(WRD ? WRD - 1 : 0)>(); /* group G has landed */
#pragma unroll
            for (int s = 0; s < NS; s++) w4_lds(cur[s], ring + (s * WRD + q % WRD) * W4_REC, lane);
        } else {
#pragma unroll
            for (int s = 0; s < NS; s++) cur[s] = nxt[0][s];
#pragma unroll
            for (int p = 0; p + 1 < PF; p++)
#pragma unroll
                for (int s = 0; s < NS; s++) nxt[p][s] = nxt[p + 1][s];
            if (G + PF < g1) {
#pragma unroll
                for (int s = 0; s < NS; s++) w4_load(nxt[PF - 1][s], rec[s] + (size_t)(G + PF) * W4_REC, lane);
            }
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[NS][4][4];
#pragma unroll
            for (int s = 0; s < NS; s++) w4_decode_chunk(cur[s], c, a[s]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (nt < ntv) {
                    uint4 b[2][2];
                    w4_loadb<ST, XF && ST == 0, NT, SPLIT>(b, sxg, xr[nt], lo, nt * 8 + g, G, c, t);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (h == 1 && !SPLIT) break;
#pragma unroll
                        for (int s = 0; s < NS; s++) w4_mma_chunk(acc[s][nt], a[s], b[h][0], b[h][1]);
                    }
                }
        }
    }
    if (ST > 0 || WRD > 0) cp_async_wait<0>();
}

/* Split activations with at most 4 tokens (one n8 tile, activations read through L1): rowp's
 * slots 0..3 hold the tokens' high halves and slots 4..7 their low halves (w4_pk_row), so that an
 * A fragment takes one MMA instead of two (the second was a fifth of the decode tiles' time at 1
 * token); the sum of columns c and c + 4 (lanes t and t + 2 of a quad) is then each token's.
 * Otherwise w4_tile, the halves as two MMAs. pk = w4_packs<NT, ST, SPLIT>(m), block-uniform. */
template <int NT, int ST, bool SPLIT>
__device__ __forceinline__ bool w4_packs(int m)
{
    return SPLIT && NT == 1 && ST == 0 && m <= 4;
}

/* the activation row of token slot s (0 .. 8 NT): its row rowp_of(token), and with pk the low
 * halves (lo elements further) in slots 4..7 */
template <typename RowOf>
__device__ __forceinline__ const __nv_bfloat16 *w4_pk_row(int s, int m, bool pk, size_t lo, RowOf row_of)
{
    if (pk) return row_of(min(s & 3, m - 1)) + (s >= 4 ? lo : 0);
    return row_of(min(s, m - 1));
}

__device__ __forceinline__ void w4_fold4(float (&a)[4])
{
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float v = __shfl_down_sync(0xffffffffu, a[q], 2);
        if ((threadIdx.x & 2) == 0) a[q] += v;
    }
}

template <int NT, int NS, int ST, bool SPLIT>
__device__ __forceinline__ void w4_tile_sp(float (&acc)[NS][NT][4], const uint8_t *const (&rec)[NS], int active,
                                           const void *const *rowp, size_t lo, int m, bool pk, int g0, int g1,
                                           __nv_bfloat16 *sx)
{
    if constexpr (SPLIT && NT == 1 && ST == 0) {
        if (pk) {
            w4_tile<NT, NS, ST, false, false>(acc, rec, active, rowp, 0, 1, g0, g1, sx);
#pragma unroll
            for (int s = 0; s < NS; s++) w4_fold4(acc[s][0]);
            return;
        }
    }
    w4_tile<NT, NS, ST, false, SPLIT>(acc, rec, active, rowp, lo, (m + 7) / 8, g0, g1, sx);
}

/* Intra-block K split: KS (1 or W4_WARPS) warps share a row tile, warp part kp = warp % KS
 * takes groups [g0, g1) * (kp, kp + 1) / KS; w4_kreduce sums the parts into part 0 in kp order
 * (deterministic) through shared memory red[(KS - 1) * NS * NT * 4 * 32] and returns 1 in the
 * warp that holds the sum. Every warp of the block must call it (a barrier). */
template <int KS>
__device__ __forceinline__ void w4_krange(int &g0, int &g1)
{
    int kp = (threadIdx.x >> 5) % KS, a = g0 + (g1 - g0) * kp / KS, b = g0 + (g1 - g0) * (kp + 1) / KS;
    g0 = a;
    g1 = b;
}

template <int NS, int NT, int KS>
__device__ __forceinline__ int w4_kreduce(float (&acc)[NS][NT][4], float *red)
{
    if (KS == 1) return 1;
    const int kp = (threadIdx.x >> 5) % KS, lane = threadIdx.x & 31;
    constexpr int E = NS * NT * 4;
    if (kp > 0)
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) red[((kp - 1) * E + (s * NT + nt) * 4 + q) * 32 + lane] = acc[s][nt][q];
    __syncthreads();
    if (kp > 0) return 0;
#pragma unroll
    for (int p = 1; p < KS; p++)
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[s][nt][q] += red[((p - 1) * E + (s * NT + nt) * 4 + q) * 32 + lane];
    return 1;
}


#endif
