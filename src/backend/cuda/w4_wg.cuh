/* w4_wg.cuh: the W4A16 GEMM on Hopper's warpgroup MMA (wgmma, sm_90a) for MoE prefill: many
 * tokens per expert, where mma.sync with the decode on its critical path stays far from the
 * tensor roof (issue #5; w4.cuh's pf tiles reached 28% of the BF16 peak).
 *
 * A block is 2 warpgroups (256 threads). Each warp decodes its own W4P row tile (16 rows) into
 * registers exactly as w4_tile does; the 4 warps of a warpgroup hold one 64-row A operand in the
 * register layout wgmma takes (the mma.sync m16n8k16 A fragment, warp w holding rows 16 w ..),
 * and one wgmma m64nNk16 multiplies it by N = 32, 64 or 128 tokens staged in shared memory: a
 * decoded weight fragment now feeds up to 128 tokens (32 in the pf tiles) and the MMA runs
 * asynchronously while the warp decodes the next chunk.
 *
 * B (the tokens) is read by the hardware through a shared-memory descriptor: K-major rows of 64
 * BF16 (128 bytes) in the 128-byte swizzle (16-byte unit u of row r at u ^ (r % 8)), 8-row groups
 * 1024 bytes apart; a k16 step is the descriptor's start address + 32 bytes. The hardware reads
 * the 16 k of a step in order, while W4P hands lane t of step j the physical columns 16 t + 4 j +
 * q (w4.cuh): so the activations these kernels read are stored permuted inside each 64-column
 * chunk, position 16 j + kk holding column 16 t + 4 j + q for kk = 2 t + (q & 1) + 8 (q >> 1)
 * (w4_wg_perm; the routing launch writes x so, the gate/up epilogue writes h so).
 *
 * Stages: one 64-column chunk of the token tile (its high and, with split activations, low
 * BF16 halves), copied by cp.async from all 256 threads ST - 2 steps ahead; weights stream to
 * registers one record group ahead (w4_wg_gemm_n says how a step runs). */
#ifndef MOESERVE_W4_WG_CUH
#define MOESERVE_W4_WG_CUH

#include "w4.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W4_WG_ARCH 1
#else
#define W4_WG_ARCH 0
#endif

/* physical column k (of a row of K) -> its stored position in the permuted row */
__host__ __device__ __forceinline__ int w4_wg_perm(int k)
{
    int p = k & 63, t = p >> 4, j = (p >> 2) & 3, q = p & 3;
    return (k & ~63) + 16 * j + 2 * t + (q & 1) + 8 * (q >> 1);
}

#define W4_WG_ROW_BYTES 128 /* a staged token row: 64 BF16 */

/* shared memory of a wg block: ST stages x 2 halves x 8 NT token rows x 128 bytes, 1024-aligned */
#define W4_WG_SMEM(NT, ST) ((ST) * 2 * 8 * (NT) * W4_WG_ROW_BYTES + 1024)

__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence()
{
#if W4_WG_ARCH
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit()
{
#if W4_WG_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wg_wait()
{
#if W4_WG_ARCH
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
/* cp.async's writes (the generic proxy) made visible to wgmma's reads (the async proxy) */
__device__ __forceinline__ void fence_proxy_async()
{
#if W4_WG_ARCH
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_mma_n32(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

__device__ __forceinline__ void wg_mma_n64(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

__device__ __forceinline__ void wg_mma_n128(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

template <int NN>
__device__ __forceinline__ void wg_mma(float *d, const uint32_t *a, uint64_t desc)
{
    if constexpr (NN == 128) wg_mma_n128(d, a, desc);
    else if constexpr (NN == 64) wg_mma_n64(d, a, desc);
    else wg_mma_n32(d, a, desc);
}

__device__ __forceinline__ void cp_async16_s(uint32_t saddr, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gmem));
}

/* One N (32, 64 or 128 tokens) of w4_wg_gemm below.
 * Pipeline of a step v (a 64-column chunk): wait for stage v's copies, one barrier (every thread's
 * copies of v have landed, and every warpgroup's MMAs of v - 2 are done: their slot is free),
 * copy stage v + ST - 2 into that slot, issue v's MMAs, then wait only for v - 1's (wait_group 1)
 * and decode chunk v + 1 into the A registers v - 1 used: the tensor cores always have a step
 * queued while the warps decode. A thread stages the same rows every step (row tid / 8 + 32 i,
 * 16-byte unit tid % 8, at a swizzled offset that does not change with i), so a copy costs an
 * address add. Rows past the valid nv repeat the last one (their results are never stored). */
template <int NT, int ST, int NN, bool SPLIT>
__device__ __forceinline__ void w4_wg_gemm_n(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                             size_t lo, int ng, int nv, uint8_t *sm)
{
    static_assert(ST >= 3 && NN <= 8 * NT && W4_KG == 256, "wg tile: 3+ stages; a record group is 4 chunks of 64");
    constexpr int NR = 8 * NT, HALF = NR * W4_WG_ROW_BYTES, STAGE = 2 * HALF, CH = NN / 32;
    const int lane = threadIdx.x & 31, u = threadIdx.x & 7, r0 = threadIdx.x >> 3;
    const int nvs = 4 * ng; /* steps: (group, chunk) */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t d0 = r0 * W4_WG_ROW_BYTES + ((u ^ (r0 & 7)) << 4);
    const __nv_bfloat16 *src[CH];
#pragma unroll
    for (int i = 0; i < CH; i++) src[i] = rowp[min(r0 + 32 * i, nv - 1)] + u * 8;
    auto stage = [&](int v) {
        uint32_t dst = sbase + (v % ST) * STAGE + d0;
#pragma unroll
        for (int i = 0; i < CH; i++) {
            cp_async16_s(dst + i * 32 * W4_WG_ROW_BYTES, src[i] + (size_t)v * 64);
            if (SPLIT) cp_async16_s(dst + HALF + i * 32 * W4_WG_ROW_BYTES, src[i] + lo + (size_t)v * 64);
        }
    };
#pragma unroll
    for (int p = 0; p < ST - 2; p++) {
        if (p < nvs) stage(p);
        cp_async_commit();
    }
    W4Frag cur, nxt;
    w4_load(cur, rec, lane);
    if (ng > 1) w4_load(nxt, rec + W4_REC, lane);
    uint32_t a0[4][4], a1[4][4]; /* A of this chunk and of the next (two names: registers, not an indexed array) */
    auto decode = [&](int v, uint32_t (&out)[4][4]) { /* chunk v & 3 of the group in cur */
        int c = v & 3;
        uint32_t sw = c < 2 ? cur.s.x : cur.s.y;
        uint32_t sg = w4_scale2(sw, (2 * c) & 3), sh = w4_scale2(sw, (2 * c + 1) & 3);
        uint4 wc = c == 0 ? cur.c[0] : c == 1 ? cur.c[1] : c == 2 ? cur.c[2] : cur.c[3];
        w4_decode(wc.x, sg, sh, out[0]);
        w4_decode(wc.y, sg, sh, out[1]);
        w4_decode(wc.z, sg, sh, out[2]);
        w4_decode(wc.w, sg, sh, out[3]);
    };
    auto step = [&](int v, uint32_t (&av)[4][4], uint32_t (&an)[4][4]) {
        cp_async_wait<ST - 3>(); /* this thread's copies of stage v have landed ... */
        fence_proxy_async();     /* ... visible to the tensor cores ... */
        __syncthreads();         /* ... everyone's; and MMAs v - 2 are done everywhere */
        if (v + ST - 2 < nvs) stage(v + ST - 2);
        cp_async_commit();
        const uint32_t base = sbase + (v % ST) * STAGE;
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; j++) wg_mma<NN>(acc, av[j], wg_desc(base + 32 * j));
        if constexpr (SPLIT) { /* no branch between the MMAs and their commit: one group */
#pragma unroll
            for (int j = 0; j < 4; j++) wg_mma<NN>(acc, av[j], wg_desc(base + HALF + 32 * j));
        }
        wg_commit();
        wg_wait<1>(); /* MMAs v - 1 are done: an is free */
        if (v + 1 < nvs) {
            if (((v + 1) & 3) == 0) {
                cur = nxt;
                int G = (v + 1) >> 2;
                if (G + 1 < ng) w4_load(nxt, rec + (size_t)(G + 1) * W4_REC, lane);
            }
            decode(v + 1, an);
        }
    };
    decode(0, a0);
    for (int v = 0; v < nvs; v += 2) { /* nvs = 4 ng is even */
        step(v, a0, a1);
        step(v + 1, a1, a0);
    }
    wg_wait<0>();
    cp_async_wait<0>();
}

template <int NT, int ST, bool SPLIT>
__device__ __forceinline__ void w4_wg_gemm_s(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                             size_t lo, int ng, int nv, uint8_t *sm)
{
    if constexpr (NT == 16) {
        if (nv > 64) {
            w4_wg_gemm_n<NT, ST, 128, SPLIT>(acc, rec, rowp, lo, ng, nv, sm);
            return;
        }
    }
    if constexpr (NT >= 8) {
        if (nv > 32) {
            w4_wg_gemm_n<NT, ST, 64, SPLIT>(acc, rec, rowp, lo, ng, nv, sm);
            return;
        }
    }
    w4_wg_gemm_n<NT, ST, 32, SPLIT>(acc, rec, rowp, lo, ng, nv, sm);
}

/* acc (4 NT floats: rows 16 w + g (+8) x tokens, the wgmma m64nNk16 accumulator layout:
 * acc[4 b + d] is token 8 b + 2 t + (d & 1), row g + 8 (d >> 1) of the warp's 16) =
 * the warp's row tile (W4P records from rec, ng groups) x the nv token rows rowp[0..nv) (BF16,
 * permuted, lo elements further for the low halves when lo != 0). sm: the stage ring, 1024-byte
 * aligned. Every thread of the block calls (barriers); nv is block-uniform. The instruction's N
 * is the smallest of 32, 64, 128 (up to the tile's) that holds the valid tokens. */
template <int NT, int ST>
__device__ __forceinline__ void w4_wg_gemm(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                           size_t lo, int ng, int nv, uint8_t *sm)
{
    static_assert(NT == 4 || NT == 8 || NT == 16, "wg tile: 32, 64 or 128 tokens");
#pragma unroll
    for (int i = 0; i < 4 * NT; i++) acc[i] = 0.f;
    if (lo)
        w4_wg_gemm_s<NT, ST, true>(acc, rec, rowp, lo, ng, nv, sm);
    else
        w4_wg_gemm_s<NT, ST, false>(acc, rec, rowp, lo, ng, nv, sm);
}

#endif
