/* runner: a single sequence through Forward and the paged KV cache (runner.h). */
#include "runner.h"

#include <stdlib.h>

#include "../base/util.h"

void runner_init(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size)
{
    *r = (Runner){.m = m, .be = be, .chunk = chunk, .max_ctx = max_ctx};
    int nb = (max_ctx + block_size - 1) / block_size;
    kv_cache_init(&r->kv, &m->cfg, be, block_size, nb);
    if (block_table_reserve(&r->bt, &r->kv, max_ctx) < 0) die("runner: a cache of %d blocks holds no %d tokens", nb, max_ctx);
    forward_init(&r->f, m, be, chunk, chunk, 1, r->bt.n_blocks);
    forward_share(&r->f, &r->kv);
    r->pos = xmalloc(chunk * sizeof(int));
    r->seq = xcalloc(chunk, sizeof(int));
    r->slot = xmalloc(chunk * sizeof(int));
    r->out_idx = xmalloc(chunk * sizeof(int));
}

void runner_free(Runner *r)
{
    if (!r->be) return;
    forward_free(&r->f);
    block_table_release(&r->bt, &r->kv);
    kv_cache_free(&r->kv);
    free(r->pos);
    free(r->seq);
    free(r->slot);
    free(r->out_idx);
    *r = (Runner){0};
}

void runner_reset(Runner *r) { r->n_ctx = 0; }

void runner_enable_graphs(Runner *r) { forward_enable_graphs(&r->f, r->bt.n_blocks * r->kv.block_size); }

void runner_feed(Runner *r, const int *ids, int n, int all, float *logits)
{
    CHECK(r->n_ctx + n <= r->max_ctx, "runner: %d + %d tokens exceed the cache's %d", r->n_ctx, n, r->max_ctx);
    int V = r->m->cfg.vocab, bs = r->kv.block_size;
    for (int s0 = 0; s0 < n; s0 += r->chunk) {
        int k = n - s0 < r->chunk ? n - s0 : r->chunk, base = r->n_ctx;
        for (int i = 0; i < k; i++) {
            r->pos[i] = base + i;
            r->slot[i] = block_table_slot(&r->bt, bs, base + i);
            r->out_idx[i] = i;
        }
        int last = s0 + k == n;
        int n_out = all ? k : (last && logits ? 1 : 0);
        if (!all && n_out) r->out_idx[0] = k - 1;
        int start = 0, ntok = k, ctx = base + k;
        Batch b = {.n_tokens = k, .tokens = (int *)ids + s0, .pos = r->pos, .seq = r->seq, .slot = r->slot,
                   .n_seqs = 1, .seq_start = &start, .seq_ntok = &ntok, .ctx_len = &ctx,
                   .block_table = r->bt.blocks, .bt_stride = r->bt.n_blocks, .max_ctx = ctx,
                   .n_out = n_out, .out_idx = r->out_idx};
        forward_run(&r->f, &b, &r->kv, !logits ? NULL : all ? logits + (size_t)s0 * V : logits);
        r->n_ctx += k;
    }
}
