/* w4_moe.cuh: what the MoE's kernel files share (w4_moe.cu routes the call and runs the mma.sync
 * tiles; w4_moe_block.cu and w4_moe_wgmma.cu the other families): a token tile's facts as the
 * routing kernel lists them, and what a family's launch takes. */
#ifndef MOESERVE_W4_MOE_CUH
#define MOESERVE_W4_MOE_CUH

#include "w4_launch.cuh"

/* A token tile's facts as w4_route_kernel stores them: its expert and token count in tile_e, its
 * first pair (in the list sorted by expert) in tile_base */
#define W4_TILE_M_SHIFT 16
__device__ __forceinline__ int w4_tile_expert(const int *tile_e, int tile) { return tile_e[tile] & ((1 << W4_TILE_M_SHIFT) - 1); }
__device__ __forceinline__ void w4_tile_facts(const int *tile_e, const int *tile_base, int tile, int &e, int &m, int &base)
{
    int te = tile_e[tile];
    e = te & ((1 << W4_TILE_M_SHIFT) - 1);
    m = te >> W4_TILE_M_SHIFT;
    base = tile_base[tile];
}

/* A call's gate/up and down on one class's token tiles: h = silu(x W_gate^T) * (x W_up^T) for each
 * pair (BF16, permuted for the wgmma tiles' down), then y[pair] = h W_down^T. */
struct W4MoeCall {
    int max_tiles;             /* token tiles at most (the grids' size) */
    __nv_bfloat16 *h;          /* [P][F] (and the low halves hlo further) */
    const __nv_bfloat16 *xb;   /* the activations [T][D] (and the low halves xlo further) */
    float *y;                  /* [P][D] */
    const QTensor *tb;         /* the experts' gate, up and down (3 E) */
    int E, topk;
    const int *rows, *tile_e, *tile_base, *n_tiles;
    int *ctr;                  /* the wgmma ring kernels' item counters (gate/up, down) */
    int D, F;
    size_t xlo, hlo;           /* split activations: where the low halves start (0: plain BF16) */
};

/* a block GEMM tile's launches (w4_moe_block.cu) */
void w4_moe_block(cudaStream_t st, int tile, const W4MoeCall &c);
/* a wgmma tile's launches (w4_moe_wgmma.cu) */
void w4_moe_wgmma(cudaStream_t st, int tile, const W4MoeCall &c);

#endif
