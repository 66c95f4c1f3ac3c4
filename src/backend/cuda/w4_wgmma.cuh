/* w4_wgmma.cuh: the W4A16 GEMM on Hopper's warpgroup MMA (wgmma, sm_90a) for MoE prefill (many
 * tokens per expert, where mma.sync with the decode on its critical path stays far from the
 * tensor roof: the block GEMM tiles reached 28% of the BF16 peak) and the dense split-K tile
 * (w4_moe_wgmma.cu, w4_dense_wg.cu).
 *
 * A block is 2 warpgroups (256 threads). Each warp decodes its own W4P row tile (16 rows) into
 * registers exactly as w4_tile does; the 4 warps of a warpgroup hold one 64-row A operand in the
 * register layout wgmma takes (the mma.sync m16n8k16 A fragment, warp w holding rows 16 w ..),
 * and one wgmma m64nNk16 multiplies it by N = 32, 64, 80 or 128 tokens staged in shared memory
 * (or fewer, wg_nn): a decoded weight fragment now feeds up to 128 tokens (32 in the block tiles)
 * and the MMA runs asynchronously while the warp decodes the next chunk.
 *
 * B (the tokens) is read by the hardware through a shared-memory descriptor: K-major rows of 64
 * BF16 (128 bytes) in the 128-byte swizzle (16-byte unit u of row r at u ^ (r % 8)), 8-row groups
 * 1024 bytes apart; a k16 step is the descriptor's start address + 32 bytes. The hardware reads
 * the 16 k of a step in order, while W4P hands lane t of step j the physical columns 16 t + 4 j +
 * q (w4_common.cuh): so the activations these kernels read are stored permuted inside each 64-column
 * chunk, position 16 j + kk holding column 16 t + 4 j + q for kk = 2 t + (q & 1) + 8 (q >> 1)
 * (w4_wg_perm; the routing launch writes x so, the gate/up epilogue writes h so).
 *
 * Stages: one 64-column chunk of the token tile (its high and, with split activations, low
 * BF16 halves), copied by cp.async from all 256 threads ST - 2 steps ahead; weights stream to
 * registers one record group ahead, or (WR > 0) through a ring of WR records per warp in shared
 * memory filled by bulk copies, WR - 1 groups ahead (w4_wg_gemm_n says how a step runs). */
#ifndef MOESERVE_W4_WGMMA_CUH
#define MOESERVE_W4_WGMMA_CUH

#include <type_traits>

#include "w4_common.cuh"

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

/* The shapes of the ring GEMM's loop, fixed per tile size (bit NT / 4 - 1 of a mask: the tiles
 * of 8 NT tokens, 32, 64 or 128): */
constexpr bool W4_WG_ONE_HALF = true;  /* plain BF16 stage slots hold one half (w4_wg_gemm_r) */
constexpr int W4_WG_N16 = 0xF;         /* a token tile of at most 16 tokens (8 packed) as N = 16 MMAs */
constexpr int W4_WG_NFINE = 0x3;       /* MMAs of the N of a token tile's valid tokens (wg_nn) */
constexpr int W4_WG_NFINE_SPLIT = 0x2; /* the same with split activations */
constexpr bool W4_WG_N80 = true;       /* the 128-token tile has an N = 80 instantiation beside 32, 64 and 128 */
constexpr bool W4_WG_EARLY_CODES = true; /* the 128-token tile reads a chunk's codes from the ring one MMA wait
                                          * before their decode */

/* shared memory of a wg block: ST stages x 2 halves x 8 NT token rows x 128 bytes, 1024-aligned;
 * then, with a weight ring (WR > 0), each of the 8 warps' WR record slots and their WR mbarriers */
#define W4_WG_SMEM(NT, ST, WR) ((ST) * 2 * 8 * (NT) * W4_WG_ROW_BYTES + 1024 + 8 * (WR) * (W4_REC + 8))

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

/* wgmma m64nNk16 (BF16 in, FP32 accumulators d[0 .. N/2), A from registers, B by descriptor), at
 * the N a token tile's valid tokens need (wg_nn, w4_wg_gemm_s) */
__device__ __forceinline__ void wg_mma_n16(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

__device__ __forceinline__ void wg_mma_n24(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12, %13, %14, %15}, %16, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
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

__device__ __forceinline__ void wg_mma_n40(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, {%20, %21, %22, %23}, %24, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

__device__ __forceinline__ void wg_mma_n48(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#endif
}

__device__ __forceinline__ void wg_mma_n56(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27}, {%28, %29, %30, %31}, %32, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
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

__device__ __forceinline__ void wg_mma_n80(float *d, const uint32_t *a, uint64_t desc)
{
#if W4_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, {%40, %41, %42, %43}, %44, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
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
    static_assert(NN == 16 || NN == 24 || NN == 32 || NN == 40 || NN == 48 || NN == 56 || NN == 64 || NN == 80 || NN == 128,
                  "an N the wgmma wrappers cover");
    if constexpr (NN == 128) wg_mma_n128(d, a, desc);
    else if constexpr (NN == 80) wg_mma_n80(d, a, desc);
    else if constexpr (NN == 64) wg_mma_n64(d, a, desc);
    else if constexpr (NN == 56) wg_mma_n56(d, a, desc);
    else if constexpr (NN == 48) wg_mma_n48(d, a, desc);
    else if constexpr (NN == 40) wg_mma_n40(d, a, desc);
    else if constexpr (NN == 32) wg_mma_n32(d, a, desc);
    else if constexpr (NN == 24) wg_mma_n24(d, a, desc);
    else wg_mma_n16(d, a, desc);
}

__device__ __forceinline__ void cp_async16_s(uint32_t saddr, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gmem));
}

/* Whether a call of the ring GEMM (w4_wg_gemm_r, the N = 32 instantiation) with nv tokens runs N = 16
 * MMAs: tiles of 8 NT tokens whose bit of W4_WG_N16 is set, at most 16 tokens, or 8 packed (high and
 * low halves as rows 0..7 and 8..15). w4_wg_gemm_s folds the packed halves by the same answer. */
template <int NT, bool PK>
__device__ __forceinline__ bool wg_n16(int nv)
{
    return ((W4_WG_N16 >> (NT / 4 - 1)) & 1) && nv <= (PK ? 8 : 16);
}

/* Whether the ring tiles of 8 NT tokens run the MMAs of their N = NN (32 or 64) instantiation at
 * finer N (W4_WG_NFINE, W4_WG_NFINE_SPLIT: bit NT / 4 - 1) */
template <int NT, int NN, bool SPLIT>
__device__ __forceinline__ constexpr bool wg_fine()
{
    return (((SPLIT ? W4_WG_NFINE_SPLIT : W4_WG_NFINE) >> (NT / 4 - 1)) & 1) && (NN == 32 || NN == 64);
}

/* The N a call of the ring GEMM's N = NN instantiation runs its MMAs at, for nv valid tokens: the
 * smallest multiple of 8 that holds them, down to NN / 2 + 8 (the next smaller instantiation takes
 * fewer tokens), or to 16 where wg_n16 allows: the tensor work of an expert's last token tile
 * follows its tokens. Packed halves (PK) take 16 or 32 (their low halves start at row N / 2). */
template <int NT, int NN, bool PK, bool SPLIT>
__device__ __forceinline__ int wg_nn(int nv)
{
    if (NN == 32 && wg_n16<NT, PK>(nv)) return 16;
    if (PK || !wg_fine<NT, NN, SPLIT>()) return NN;
    const int n = (nv + 7) / 8 * 8;
    return n < NN ? n : NN;
}

/* The 4 MMAs of a chunk (k16 steps j, B at descriptor dd + 2 j) at N = nn (wg_nn): a run-time
 * choice among MMA sets in the loop (N = 32: 16, 24, 32; N = 64: 40 to 64). It costs the 128-token
 * tile (1 block an SM) more than the MMA work it saves (the sets' blocks are scheduled apart), and
 * gains on the 32- and 64-token ones; the 128-token tile takes one more instantiation instead, N =
 * 80 (w4_wg_gemm_s; one more, or another N, makes ptxas spill). */
template <int NT, int NN, bool SPLIT>
__device__ __forceinline__ void wg_mma_chunk(float *acc, const uint32_t (&av)[4][4], uint64_t dd, int nn)
{
    auto four = [&](auto m) {
#pragma unroll
        for (int j = 0; j < 4; j++) wg_mma<decltype(m)::value>(acc, av[j], dd + 2 * j);
    };
    using std::integral_constant;
    constexpr bool F = wg_fine<NT, NN, SPLIT>();
    if constexpr (NN == 32) {
        if (nn == 16) four(integral_constant<int, 16>());
        else if (F && nn == 24) four(integral_constant<int, 24>());
        else four(integral_constant<int, 32>());
    } else if constexpr (NN == 64 && F) {
        if (nn <= 40) four(integral_constant<int, 40>());
        else if (nn == 48) four(integral_constant<int, 48>());
        else if (nn == 56) four(integral_constant<int, 56>());
        else four(integral_constant<int, 64>());
    } else {
        four(integral_constant<int, NN>());
    }
}

/* The weight ring (WR > 0): each warp streams its records through WR slots of its own in shared
 * memory, one bulk copy (the TMA engine, cp.async.bulk) of a whole 2304-byte record a slot,
 * completing on the slot's mbarrier; WR - 1 records are in flight while the warp decodes, and
 * none of them holds a register (a second record in registers cost more occupancy than it
 * gained). A slot's n-th fill completes phase n of its barrier: the warp keeps the
 * parity of each slot's next wait in a bit of ph. */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
#if W4_WG_ARCH
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence()
{
#if W4_WG_ARCH
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* lane 0 of the warp: record src (W4_REC bytes) into the slot at dst, completing on bar */
__device__ __forceinline__ void wg_ring_fill(uint32_t dst, const void *src, uint32_t bar)
{
#if W4_WG_ARCH
    asm volatile("fence.proxy.async.shared::cta;\n"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%2], %3;\n"
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %3, [%2];"
                 ::"r"(dst), "l"(src), "r"(bar), "n"(W4_REC) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
#if W4_WG_ARCH
    uint32_t ok;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    } while (!ok);
#endif
}

/* What a warp's weight ring needs: slot 0's shared address (slot s at + s W4_REC), its first
 * mbarrier's (barrier s at + 8 s), the parity bits of the next waits; and, for a block that runs
 * several token tiles, the slot the next call's group 0 lands in (s0) and whether the previous
 * call already asked for its first WR - 1 groups (pre: see w4_wg_gemm_r's nrec). */
struct WgRing {
    uint32_t slots, bars, ph;
    int s0, pre;
};

/* The kernels' start: warp w's ring in the dynamic shared memory after the ST stages (sm: the
 * 1024-aligned base), its barriers initialised by its lane 0. The caller's next __syncthreads
 * publishes them. */
template <int NT, int ST, int WR>
__device__ __forceinline__ WgRing wg_ring_init(uint8_t *sm)
{
    WgRing r = {0, 0, 0, 0, 0};
    if constexpr (WR > 0) {
        const int warp = threadIdx.x >> 5;
        uint32_t base = (uint32_t)__cvta_generic_to_shared(sm) + ST * 2 * 8 * NT * W4_WG_ROW_BYTES;
        r.slots = base + warp * WR * W4_REC;
        r.bars = base + 8 * WR * W4_REC + warp * WR * 8;
        if ((threadIdx.x & 31) == 0) {
            for (int s = 0; s < WR; s++) mbar_init(r.bars + 8 * s, 1);
            mbar_init_fence();
        }
    }
    return r;
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

/* w4_wg_gemm_n with the weights through the ring (WR > 0): the same steps, but the loop runs a
 * record group (4 steps) an iteration so that the chunk is a constant, and every address,
 * descriptor and source pointer moves by an add (in the SASS of w4_wg_gemm_n about half of a
 * step's ~160 instructions recompute them, against ~85 for the decode); token rows
 * from nv on are not staged (their columns are never stored).
 * nrec: the warp's records in the block's next token tile (the same ng), or null: the last
 * WR - 1 refills then ask for that tile's first groups, so that its call starts with its weights
 * in flight instead of waiting a full HBM latency (ignored where ng < WR - 1). */
template <int NT, int ST, int WR, int CPS, int NN, bool SPLIT, bool PK = false, bool XN = false>
__device__ __forceinline__ void w4_wg_gemm_r(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                             size_t lo, int ng, int nv, uint8_t *sm, WgRing &ring, const uint8_t *nrec)
{
    static_assert(ST >= 3 && NN <= 8 * NT && W4_KG == 256, "wg tile: 3+ stages; a record group is 4 chunks of 64");
    static_assert((CPS == 1 || CPS == 2) && ST % CPS == 0 && ST / CPS >= 3, "a stage of 1 or 2 chunks, 3+ stages");
    static_assert(WR >= 2, "a weight ring holds the group being decoded and at least one in flight");
    static_assert(!PK || ((NN == 32 || (XN && NN == 16)) && !SPLIT), "packed halves: one N = 32 MMA set (16 + 16, or 8 + 8 as N = 16)");
    if (ng < WR - 1) nrec = nullptr; /* the next tile's first WR - 1 groups would not all be asked for */
    /* A chunk's slot holds its high and low halves (SPLIT), or one half (plain BF16, and the packed
     * halves, which share a half's rows): then the same shared memory holds twice the slots, and a
     * stage twice the chunks: one barrier, one proxy fence and one commit group per 2 CPS chunks
     * (W4_WG_ONE_HALF false: the split layout for every form). */
    constexpr bool ONE = !SPLIT && W4_WG_ONE_HALF;
    /* CH: copy passes of 32 rows (rows from nv on are never copied) */
    constexpr int NR = 8 * NT, HALF = NR * W4_WG_ROW_BYTES, STAGE = ONE ? HALF : 2 * HALF, CH = (NN + 31) / 32;
    constexpr int NSL = ONE ? 2 * ST : ST, CP = ONE ? 2 * CPS : CPS; /* chunk slots; chunks a stage */
    /* the MMAs' N for this call's tokens (wg_nn): the same loop, less MMA work; or (XN) NN, chosen
     * by the caller (w4_wg_gemm_s); ph: the rows of each packed half */
    const int nn = XN ? NN : wg_nn<NT, NN, PK, SPLIT>(nv);
    const int ph = nn / 2;
    constexpr int SP = NSL / CP; /* stages of CP chunks: one barrier and one commit group a stage */
    static_assert(4 % CP == 0, "a record group's 4 chunks in whole stages");
    const int lane = threadIdx.x & 31, u = threadIdx.x & 7, r0 = threadIdx.x >> 3;
    const int nvs = 4 * ng; /* steps: (group, chunk) */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(sm);
    /* the copies: this thread's rows, the next stage to issue and the slot it goes to */
    const __nv_bfloat16 *src[CH];
    bool live[CH];
#pragma unroll
    for (int i = 0; i < CH; i++) {
        if constexpr (PK) { /* rows 0..PH - 1 the high halves, PH..NN - 1 the low halves of the same tokens */
            live[i] = r0 < 2 * ph && (r0 & (ph - 1)) < nv;
            src[i] = rowp[min(r0 & (ph - 1), nv - 1)] + (r0 >= ph ? lo : 0) + u * 8;
        } else {
            live[i] = r0 + 32 * i < nv;
            src[i] = rowp[min(r0 + 32 * i, nv - 1)] + u * 8;
        }
    }
    const uint32_t dst0 = sbase + r0 * W4_WG_ROW_BYTES + ((u ^ (r0 & 7)) << 4);
    uint32_t dst = dst0;
    int vn = 0;
    auto stage = [&]() { /* chunks vn .. vn + CP - 1 into their slots, then move on */
        if (vn < nvs) {
#pragma unroll
            for (int cc = 0; cc < CP; cc++)
#pragma unroll
                for (int i = 0; i < CH; i++)
                    if (live[i]) {
                        cp_async16_s(dst + cc * STAGE + i * 32 * W4_WG_ROW_BYTES, src[i] + cc * 64);
                        if (SPLIT) cp_async16_s(dst + cc * STAGE + HALF + i * 32 * W4_WG_ROW_BYTES, src[i] + cc * 64 + lo);
                    }
        }
#pragma unroll
        for (int i = 0; i < CH; i++) src[i] += 64 * CP;
        dst = dst == dst0 + (NSL - CP) * STAGE ? dst0 : dst + CP * STAGE;
        vn += CP;
    };
#pragma unroll
    for (int p = 0; p < SP - 2; p++) {
        stage();
        cp_async_commit();
    }
    /* the MMAs' B descriptor of the slot of the step being issued (start address in 16-byte units
     * in the low 14 bits: moving it is an add). Where a group's 4 chunks fill whole runs of slots
     * (NSL % 4 == 0), a chunk's slot is the group's first plus the chunk (a constant): the wrap is
     * tested once a group, not a chunk (the descriptor arithmetic and its per-chunk wrap were 11
     * uniform instructions of a chunk's ~110) */
    constexpr bool G4 = NSL % 4 == 0;
    const uint64_t d0 = wg_desc(sbase);
    uint64_t dc = d0; /* G4: the group's first chunk's slot; else the chunk's */
    /* the weights: the ring slot of the group being decoded (this lane's 16 bytes of its chunk 0)
     * and its scale words */
    const uint32_t rsl = ring.slots + lane * 16;
    uint32_t rs = rsl + ring.s0 * W4_REC;
    int s = ring.s0; /* the slot of the group being decoded: group G in slot (s0 + G) % WR */
    uint2 sw2;
    if (lane == 0 && !ring.pre)
        for (int G = 0; G < WR - 1 && G < ng; G++) {
            int sg = (ring.s0 + G) % WR;
            wg_ring_fill(ring.slots + sg * W4_REC, rec + (size_t)G * W4_REC, ring.bars + 8 * sg);
        }
    /* the first chunk of group G: wait for its slot, then refill the slot group G - 1 used (every
     * lane's reads of it are done: __syncwarp) with group G + WR - 1, or past the last group with
     * the next tile's first */
    /* the record the next refill copies (group G + WR - 1 at group G's start): this tile's until
     * fl of them are done, then the next tile's (nrec), or none */
    const uint8_t *fp = ng > WR - 1 ? rec + (size_t)(WR - 1) * W4_REC : nrec;
    int fl = ng - (WR - 1);
    auto group = [&](int G) {
        {
            if (G > 0) {
                rs = rs == rsl + (WR - 1) * W4_REC ? rsl : rs + W4_REC;
                s = s == WR - 1 ? 0 : s + 1;
            }
            mbar_wait(ring.bars + 8 * s, (ring.ph >> s) & 1);
            ring.ph ^= 1u << s;
            __syncwarp();
            int sn = s == 0 ? WR - 1 : s - 1;
            if (fp) {
                if (lane == 0) wg_ring_fill(ring.slots + sn * W4_REC, fp, ring.bars + 8 * sn);
                fp = --fl == 0 ? nrec : fp + W4_REC;
            }
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sw2.x), "=r"(sw2.y) : "r"(rs - lane * 8 + 2048) : "memory");
        }
    };
    uint32_t a0[4][4], a1[4][4]; /* A of this chunk and of the next (two names: registers, not an indexed array) */
    /* the codes of the chunk decoded next; with EARLY read from the ring before the MMA wait that
     * precedes their decode, so that the shared-memory latency hides behind it (a gain on the
     * 128-token tile only) */
    constexpr bool EARLY = W4_WG_EARLY_CODES && NT == 16;
    uint4 wc;
    auto codes = [&](auto cc) {
        constexpr int c = decltype(cc)::value;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(wc.x), "=r"(wc.y), "=r"(wc.z), "=r"(wc.w) : "r"(rs + c * 512)
                     : "memory");
    };
    auto decode = [&](auto cc, uint32_t (&out)[4][4]) { /* chunk cc of the group being decoded, its codes in wc */
        constexpr int c = decltype(cc)::value;
        if constexpr (!EARLY) codes(cc);
        uint32_t sw = c < 2 ? sw2.x : sw2.y;
        uint32_t sg = w4_scale2(sw, (2 * c) & 3), sh = w4_scale2(sw, (2 * c + 1) & 3);
        w4_decode(wc.x, sg, sh, out[0]);
        w4_decode(wc.y, sg, sh, out[1]);
        w4_decode(wc.z, sg, sh, out[2]);
        w4_decode(wc.w, sg, sh, out[3]);
    };
    /* step v = 4 G + c */
    auto step = [&](int G, auto cc, uint32_t (&av)[4][4], uint32_t (&an)[4][4]) {
        constexpr int c = decltype(cc)::value;
        if constexpr (c % CP == 0) { /* a stage's first chunk */
            cp_async_wait<SP - 3>(); /* this thread's copies of this stage have landed ... */
            fence_proxy_async();     /* ... visible to the tensor cores ... */
            __syncthreads();         /* ... everyone's; and the MMAs two stages back are done everywhere */
            stage();                 /* the stage SP - 2 ahead */
            cp_async_commit();
        }
        wg_fence();
        constexpr int co = G4 ? c * (STAGE / 16) : 0;
        if constexpr (XN) { /* no choice in the loop */
#pragma unroll
            for (int j = 0; j < 4; j++) wg_mma<NN>(acc, av[j], dc + co + 2 * j);
            if constexpr (SPLIT) {
#pragma unroll
                for (int j = 0; j < 4; j++) wg_mma<NN>(acc, av[j], dc + (co + HALF / 16) + 2 * j);
            }
        } else {
            wg_mma_chunk<NT, NN, SPLIT>(acc, av, dc + co, nn);
            if constexpr (SPLIT) wg_mma_chunk<NT, NN, SPLIT>(acc, av, dc + (co + HALF / 16), nn); /* the same commit group */
        }
        wg_commit();
        if constexpr (!G4) dc = dc == d0 + (NSL - 1) * (STAGE / 16) ? d0 : dc + STAGE / 16;
        else if constexpr (c == 3) dc = dc == d0 + (NSL - 4) * (STAGE / 16) ? d0 : dc + 4 * (STAGE / 16);
        if constexpr (EARLY && c < 3) codes(std::integral_constant<int, c + 1>());
        wg_wait<1>(); /* MMAs v - 1 are done: an is free */
        if constexpr (c < 3) {
            decode(std::integral_constant<int, c + 1>(), an);
        } else if (G + 1 < ng) {
            group(G + 1);
            if constexpr (EARLY) codes(std::integral_constant<int, 0>());
            decode(std::integral_constant<int, 0>(), an);
        }
    };
    group(0);
    if constexpr (EARLY) codes(std::integral_constant<int, 0>());
    decode(std::integral_constant<int, 0>(), a0);
    for (int G = 0; G < ng; G++) {
        step(G, std::integral_constant<int, 0>(), a0, a1);
        step(G, std::integral_constant<int, 1>(), a1, a0);
        step(G, std::integral_constant<int, 2>(), a0, a1);
        step(G, std::integral_constant<int, 3>(), a1, a0);
    }
    ring.s0 = s == WR - 1 ? 0 : s + 1;
    ring.pre = nrec != nullptr;
    wg_wait<0>();
    cp_async_wait<0>();
}

/* one N of the tile: the weights through registers (WR == 0) or the ring */
template <int NT, int ST, int WR, int CPS, int NN, bool SPLIT>
__device__ __forceinline__ void w4_wg_gemm_nr(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                              size_t lo, int ng, int nv, uint8_t *sm, WgRing &ring, const uint8_t *nrec)
{
    static_assert(WR > 0 || CPS == 1, "the register path stages one chunk at a time");
    if constexpr (WR == 0) w4_wg_gemm_n<NT, ST, NN, SPLIT>(acc, rec, rowp, lo, ng, nv, sm);
    else w4_wg_gemm_r<NT, ST, WR, CPS, NN, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
}

/* The 32-token ring tiles (moe_wgmma_32_*_r*, dense_wg_splitk): the N of a call's MMAs chosen once
 * a call, each its own instantiation of the loop (XN), on accumulators of its own then copied into
 * acc: BF16 16 (wg_n16), 24 (wg_fine), 32; split activations 32, and the packed halves (up to 16
 * tokens) 16 or 32. With the choice a branch in the loop between the MMA sets (wg_nn,
 * wg_mma_chunk; the tiles of 64 and 128 tokens keep it), ptxas ends each chunk's
 * MMAs with an empty wgmma group of its own (C7519, "warpgroup.arrive is injected"), so that the
 * loop's wait for the chunk before (wait_group 1) waited for this chunk's too: the next chunk's
 * decode no longer overlapped them. With one accumulator for several instantiations, or both
 * activation forms' in one kernel (w4_wg_gemm's AF), ptxas serializes their wgmma (C7512). */
template <int NT, int ST, int WR, int CPS, int NN, bool SPLIT, bool PK = false>
__device__ __forceinline__ void w4_wg_gemm_x(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                             size_t lo, int ng, int nv, uint8_t *sm, WgRing &ring, const uint8_t *nrec)
{
    float a[4 * NT];
#pragma unroll
    for (int i = 0; i < 4 * NT; i++) a[i] = 0.f;
    w4_wg_gemm_r<NT, ST, WR, CPS, NN, SPLIT, PK, true>(a, rec, rowp, lo, ng, nv, sm, ring, nrec);
    if constexpr (PK) { /* token j's halves: accumulator columns j and j + NN / 2 */
#pragma unroll
        for (int i = 0; i < NN / 4; i++) acc[i] = a[i] + a[i + NN / 4];
    } else {
#pragma unroll
        for (int i = 0; i < 4 * NT; i++) acc[i] = a[i];
    }
}

template <int NT, int ST, int WR, int CPS, bool SPLIT>
__device__ __forceinline__ void w4_wg_gemm_s(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                             size_t lo, int ng, int nv, uint8_t *sm, WgRing &ring, const uint8_t *nrec)
{
    if constexpr (NT == 4 && WR > 0) { /* w4_wg_gemm_x */
        if constexpr (SPLIT) {
            if (wg_n16<NT, true>(nv)) w4_wg_gemm_x<NT, ST, WR, CPS, 16, false, true>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else if (nv <= 16) w4_wg_gemm_x<NT, ST, WR, CPS, 32, false, true>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else w4_wg_gemm_x<NT, ST, WR, CPS, 32, true>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
        } else {
            if (wg_n16<NT, false>(nv)) w4_wg_gemm_x<NT, ST, WR, CPS, 16, false>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else if (wg_fine<NT, 32, false>() && nv <= 24) w4_wg_gemm_x<NT, ST, WR, CPS, 24, false>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else w4_wg_gemm_x<NT, ST, WR, CPS, 32, false>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
        }
        return;
    }
    if constexpr (SPLIT && WR > 0) {
        /* split activations, at most 16 tokens: their high halves as B rows 0..15 and their low
         * halves as rows 16..31 of one N = 32 MMA set instead of two (the MMA work of the tile
         * halves), then token j's two sums added (accumulator column j + 16: acc[4 (b + 2) + d]) */
        if (nv <= 16) {
            float pa[4 * NT]; /* its own registers: ptxas serializes the wgmma of a function whose
                               * pipelines share an accumulator that other code modifies */
#pragma unroll
            for (int i = 0; i < 4 * NT; i++) pa[i] = 0.f;
            w4_wg_gemm_r<NT, ST, WR, CPS, 32, false, true>(pa, rec, rowp, lo, ng, nv, sm, ring, nrec);
            if (wg_n16<NT, true>(nv)) { /* the halves were rows 0..7 and 8..15 of an N = 16 set */
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] = pa[i] + pa[i + 4];
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] = pa[i] + pa[i + 8];
            }
            return;
        }
    }
    if constexpr (NT == 16) {
        if constexpr (W4_WG_N80 && WR > 0) { /* the 128-token ring tile: N = 80 too (wg_mma_chunk says why) */
            if (nv > 80) w4_wg_gemm_nr<NT, ST, WR, CPS, 128, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else if (nv > 64) w4_wg_gemm_nr<NT, ST, WR, CPS, 80, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else if (nv > 32) w4_wg_gemm_nr<NT, ST, WR, CPS, 64, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            else w4_wg_gemm_nr<NT, ST, WR, CPS, 32, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            return;
        }
        if (nv > 64) {
            w4_wg_gemm_nr<NT, ST, WR, CPS, 128, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            return;
        }
    }
    if constexpr (NT >= 8) {
        if (nv > 32) {
            w4_wg_gemm_nr<NT, ST, WR, CPS, 64, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
            return;
        }
    }
    w4_wg_gemm_nr<NT, ST, WR, CPS, 32, SPLIT>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
}

/* acc (4 NT floats: rows 16 w + g (+8) x tokens, the wgmma m64nNk16 accumulator layout:
 * acc[4 b + d] is token 8 b + 2 t + (d & 1), row g + 8 (d >> 1) of the warp's 16) =
 * the warp's row tile (W4P records from rec, ng groups) x the nv token rows rowp[0..nv) (BF16,
 * permuted, lo elements further for the low halves with split activations). sm: the stage ring,
 * 1024-byte aligned. Every thread of the block calls (barriers); nv is block-uniform. The
 * instruction's N is the smallest of 32, 64, 128 (up to the tile's) that holds the valid tokens
 * (finer: w4_wg_gemm_s). AF, the activation form the kernel is built for: 0 plain BF16, 1 split
 * (lo != 0), 2 either (lo says): the 32-token tiles have a kernel a form (w4_wg_gemm_x says why). */
template <int NT, int ST, int WR, int CPS, int AF>
__device__ __forceinline__ void w4_wg_gemm(float (&acc)[4 * NT], const uint8_t *rec, const __nv_bfloat16 *const *rowp,
                                           size_t lo, int ng, int nv, uint8_t *sm, WgRing &ring, const uint8_t *nrec)
{
    static_assert(NT == 4 || NT == 8 || NT == 16, "wg tile: 32, 64 or 128 tokens");
#pragma unroll
    for (int i = 0; i < 4 * NT; i++) acc[i] = 0.f;
    if constexpr (AF == 1) {
        w4_wg_gemm_s<NT, ST, WR, CPS, true>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
    } else if constexpr (AF == 0) {
        w4_wg_gemm_s<NT, ST, WR, CPS, false>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
    } else {
        if (lo) w4_wg_gemm_s<NT, ST, WR, CPS, true>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
        else w4_wg_gemm_s<NT, ST, WR, CPS, false>(acc, rec, rowp, lo, ng, nv, sm, ring, nrec);
    }
}

#endif
