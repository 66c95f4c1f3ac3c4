/* w4_launch.cuh: what the W4A16 kernel files (w4_*.cu) share on the host: the choice in force
 * (w4_device.cu), the launches with programmatic dependent launch and clusters, the mma.sync
 * tiles' dispatch from a tile to its template instance, and the entry points one family file
 * calls in another. The calls go one way: w4_dense.cu -> w4_streamk.cu, w4_dense_wg.cu (and
 * gemm_lt.cu); w4_moe.cu -> w4_moe_block.cu, w4_moe_wgmma.cu; all -> w4_device.cu. */
#ifndef MOESERVE_W4_LAUNCH_CUH
#define MOESERVE_W4_LAUNCH_CUH

#include "w4_common.cuh"

#define W4_WARPS 4      /* warps of a mma.sync tile's block: 4 row tiles of 16 */

/* ---- w4_device.cu: the device and the choice ---- */

/* The tile for an op with `tokens` rows (dense) or tokens (MoE, rows_per_weight pairs per
 * expert): forced (w4_set_config), tuned (the table `moeserve tune` cached), else built in
 * (w4_default_tile); never one over the shared memory budget or that does not run here. */
int w4_pick(Backend *be, W4Kind kind, int tokens, double rows_per_weight);
/* the K splits w4_set_config forces (0: the rule's, w4_mma_splits) */
int w4_forced_splits(void);
int w4_sm_count(Backend *be);
/* activations as two BF16 halves (MOESERVE_W4_ACT=split, the default) or one */
static inline int w4_split_act(void) { return knob_get(KNOB_W4_ACT) == 0; }

/* ---- launches ---- */

/* the launch attribute that groups blocks x .. x + cl - 1 into a cluster (they run together and
 * share their shared memory) */
static inline cudaLaunchAttribute w4_cluster_attr(int cl)
{
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = cl;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
    return a;
}

/* kernel<<<grid, block, smem, st>>>(args) with programmatic dependent launch where w4_sk_pdl()
 * says so (the kernel may begin while the one before it ends, and waits for it and its memory at
 * its pdl_wait), in clusters of `cluster` blocks where that is over 1 */
template <typename... KArgs, typename... Args>
static void w4_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, int cluster,
                              Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    int na = 0;
    if (w4_sk_pdl()) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) attr[na++] = w4_cluster_attr(cluster);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = na;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename... KArgs, typename... Args>
static void w4_launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args... args)
{
    w4_launch_cluster(kernel, grid, block, smem, st, 1, args...);
}

/* A mma.sync kernel template instance's dynamic shared memory limit raised the first time it
 * needs more than 48 KB. */
#define W4_SET_SMEM(KER, NTV, STV, KSV, SPV)                                                                           \
    do {                                                                                                               \
        static int done_ = 0;                                                                                          \
        if (!done_ && W4_SMEM(NTV, STV) > 48 * 1024) {                                                                 \
            CUDA_CHECK(cudaFuncSetAttribute(KER<NTV, STV, KSV, SPV>, cudaFuncAttributeMaxDynamicSharedMemorySize,       \
                                            W4_SMEM(NTV, STV)));                                                       \
            done_ = 1;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define W4_SET_SMEM2(KER, NTV, STV, KSV, XFV, SPV)                                                                     \
    do {                                                                                                               \
        static int done_ = 0;                                                                                          \
        if (!done_ && W4_SMEM(NTV, STV) > 48 * 1024) {                                                                 \
            CUDA_CHECK(cudaFuncSetAttribute(KER<NTV, STV, KSV, XFV, SPV>, cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                            W4_SMEM(NTV, STV)));                                                       \
            done_ = 1;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* The mma.sync tiles without a weight ring (w4_select.h W4_FAM_MMA): LAUNCH(n8, stages, kwarps,
 * gu_warps) for `tile`, its fields checked against the table */
#define W4_MMA_CASE(ID, NTV, STV, KSV, SSV, LAUNCH)                                                                    \
    case ID:                                                                                                           \
        CHECK(w4_tiles[ID].fam == W4_FAM_MMA && w4_tiles[ID].n8 == NTV && w4_tiles[ID].stages == STV &&               \
                  w4_tiles[ID].kwarps == KSV && w4_tiles[ID].gu_warps == (int)SSV && !w4_tiles[ID].ring,               \
              "w4: tile %s is not <%d, %d, %d, %d>", w4_tiles[ID].name, NTV, STV, KSV, (int)SSV);                      \
        LAUNCH(NTV, STV, KSV, SSV);                                                                                    \
        break;
#define W4_MMA_DISPATCH(tile, LAUNCH)                                                                                  \
    switch (tile) {                                                                                                    \
        W4_MMA_CASE(W4T_MMA_8_L1, 1, 0, 1, false, LAUNCH)                                                              \
        W4_MMA_CASE(W4T_MMA_16_L1, 2, 0, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_32_L1, 4, 0, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_16_S2, 2, 2, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_32_S2, 4, 2, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_32_S3, 4, 3, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_32_S4, 4, 4, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_64_S2, 8, 2, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_64_S3, 8, 3, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_64_S4, 8, 4, 1, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MMA_8_K4, 1, 0, 4, false, LAUNCH)                                                              \
        W4_MMA_CASE(W4T_MMA_16_K4, 2, 0, 4, false, LAUNCH)                                                             \
        W4_MMA_CASE(W4T_MOE_MMA_8_GU, 1, 0, 1, true, LAUNCH)                                                           \
        W4_MMA_CASE(W4T_MOE_MMA_16_GU, 2, 0, 1, true, LAUNCH)                                                          \
        W4_MMA_CASE(W4T_MOE_MMA_32_GU, 4, 0, 1, true, LAUNCH)                                                          \
        W4_MMA_CASE(W4T_MOE_MMA_16_S2_GU, 2, 2, 1, true, LAUNCH)                                                       \
        W4_MMA_CASE(W4T_MOE_MMA_32_S2_GU, 4, 2, 1, true, LAUNCH)                                                       \
        W4_MMA_CASE(W4T_MOE_MMA_32_S3_GU, 4, 3, 1, true, LAUNCH)                                                       \
        W4_MMA_CASE(W4T_MOE_MMA_64_S2_GU, 8, 2, 1, true, LAUNCH)                                                       \
    default: die("w4: tile %s is no mma.sync tile", w4_tiles[tile].name);                                            \
    }

/* ---- the dense families (w4_dense.cu calls them) ---- */

/* y = x as BF16 rows (two halves with split, the low ones T K elements further; perm: each row
 * permuted for the wgmma tiles, w4_wg_perm) on the ops' stream (w4_dense.cu) */
void w4_to_bf16(Backend *be, __nv_bfloat16 *y, const float *x, int ldx, int T, int K, int split, int perm);
/* out = the sum of the K splits' partial sums part[s][T][N] (+ bias), in split order; dependent:
 * launched with programmatic dependent launch after the kernel before it (w4_dense.cu) */
void w4_reduce(cudaStream_t st, int dependent, float *out, int ldo, const float *part, const float *bias, int T, int N,
               int splits);
/* Run a stream-K tile if this call suits it: 1 with the GEMM launched, 0 if not (w4_streamk.cu). */
int w4_dense_sk(Backend *be, int tile, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                const float *bias, int split, size_t budget);
/* Run the split-K wgmma tile: 1 with the GEMM launched, 0 where the call does not suit it
 * (w4_dense_wg.cu). */
int w4_dense_wg(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias);

#endif
