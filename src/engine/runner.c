/* runner: a single sequence through Forward and the paged KV cache (runner.h). */
#include "runner.h"

#include <stdlib.h>
#include <string.h>

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
    mtp_free(&r->mtp);
    free(r->last);
    free(r->mtok);
    free(r->mpos);
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

void runner_enable_mtp(Runner *r, int draft_vocab)
{
    mtp_init(&r->mtp, &r->f, draft_vocab);
    r->last = xmalloc(r->chunk * sizeof(int));
    r->mtok = xmalloc(r->chunk * sizeof(int));
    r->mpos = xmalloc(r->chunk * sizeof(int));
}

/* The MTP layer over positions base..base+n of the sequence, paired with tokens next[0..n) and
 * hidden states already in r->mtp.hin (or the previous pass's output: chain); logits of the last
 * when draft != NULL, its greedy draft there. */
static void runner_mtp_pass(Runner *r, int base, int n, const int *next, int *draft)
{
    int bs = r->kv.block_size;
    for (int i = 0; i < n; i++) {
        r->mpos[i] = base + i;
        r->slot[i] = block_table_slot(&r->bt, bs, base + i);
        r->out_idx[i] = i;
    }
    if (draft) r->out_idx[0] = n - 1;
    int start = 0, ntok = n, ctx = base + n;
    Batch b = {.n_tokens = n, .tokens = (int *)next, .pos = r->mpos, .seq = r->seq, .slot = r->slot, .n_seqs = 1,
               .seq_start = &start, .seq_ntok = &ntok, .ctx_len = &ctx, .block_table = r->bt.blocks,
               .bt_stride = r->bt.n_blocks, .max_ctx = ctx, .n_out = draft ? 1 : 0, .out_idx = r->out_idx};
    mtp_run(&r->mtp, &b, &r->kv, NULL, draft);
}

void runner_draft(Runner *r, int n_keep, int next, int nd, int *drafts)
{
    CHECK(r->mtp.f && n_keep >= 1 && n_keep <= r->n_last, "runner: a draft needs runner_enable_mtp and %d <= %d rows",
          n_keep, r->n_last);
    for (int i = 0; i < n_keep; i++) r->out_idx[i] = i;
    mtp_take_main(&r->mtp, r->out_idx, n_keep);
    for (int i = 0; i + 1 < n_keep; i++) r->mtok[i] = r->last[i + 1];
    r->mtok[n_keep - 1] = next;
    int tmp;
    runner_mtp_pass(r, r->last_base, n_keep, r->mtok, nd > 0 ? &drafts[0] : &tmp);
    for (int j = 1; j < nd; j++) /* the chain: the previous draft at the next position */
        runner_mtp_pass(r, r->last_base + n_keep + j - 1, 1, &drafts[j - 1], &drafts[j]);
}

void runner_rewind(Runner *r, int n_ctx)
{
    CHECK(n_ctx >= 0 && n_ctx <= r->n_ctx, "runner: rewind to %d of %d", n_ctx, r->n_ctx);
    r->n_ctx = n_ctx;
}

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
        if (r->mtp.f) { /* the MTP layer's catch-up: now where the next token is known, else at runner_draft */
            memcpy(r->last, ids + s0, k * sizeof(int));
            r->n_last = k;
            r->last_base = base;
            if (!last) {
                for (int i = 0; i < k; i++) r->out_idx[i] = i;
                mtp_take_main(&r->mtp, r->out_idx, k);
                runner_mtp_pass(r, base, k, ids + s0 + 1, NULL);
            }
        }
    }
}
