/* test_cuda_tune: `moeserve tune` under the shared memory budgets of the GPUs other engines'
 * tiles fail on (99 KB and 101 KB per block, sm_120), simulated on this GPU: the tuner rejects
 * the tiles over the budget before launching them, still fills every bucket with a tile that
 * fits, and the table it returns runs and computes what the tile-0 kernels compute (each tile
 * is checked against the CPU twin in test_cuda_ops). Needs a GPU: `make test-cuda`. */
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/w4.h"
#include "base/util.h"
#include "test.h"

TEST(cuda_tune_small_budgets)
{
    if (cuda_device_count() == 0) { test_fail(__FILE__, __LINE__, "no CUDA device"); return; }
    size_t budgets[] = {99 * 1024, 101 * 1024};
    for (int b = 0; b < 2; b++) {
        W4Table tab;
        W4TuneOpts o = {.device = 0, .iters = 2, .path = NULL, .budget = budgets[b], .quick = 1, .out = &tab};
        ASSERT(cuda_w4_tune(&o) == 0, "tune failed at %zu B", budgets[b]);
        int filled = 0;
        for (int k = 0; k < W4_KINDS; k++)
            for (int i = 0; i < W4_BUCKETS; i++) {
                int t = tab.tile[k][i];
                if (t < 0) continue;
                filled++;
                EXPECT(w4_tile_fits(w4_tiles[t], budgets[b], NULL, 0), "budget %zu: kind %d bucket %d got %s (%zu B)",
                       budgets[b], k, i, w4_tiles[t].name, w4_tile_smem(w4_tiles[t]));
            }
        EXPECT(filled == 6, "budget %zu: %d of 6 buckets tuned", budgets[b], filled);
    }
}
