/* runner: a single sequence (or several alike) through Forward and the paged KV cache (runner.h). */
#include "runner.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

void runner_init_seqs(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size, int n_seqs)
{
    CHECK(n_seqs >= 1, "runner: %d sequences", n_seqs);
    *r = (Runner){.m = m, .be = be, .chunk = chunk, .max_ctx = max_ctx, .n_seqs = n_seqs};
    int nb = (max_ctx + block_size - 1) / block_size;
    kv_cache_init(&r->kv, &m->cfg, be, block_size, nb * n_seqs);
    r->bts = xcalloc(n_seqs, sizeof(BlockTable));
    for (int s = 0; s < n_seqs; s++)
        if (block_table_reserve(&r->bts[s], &r->kv, max_ctx) < 0)
            die("runner: a cache of %d blocks holds no %d tokens", nb * n_seqs, max_ctx);
    r->bt = r->bts[0];
    Dist *d = dist_get();
    int dp = d ? d->dp : 1, n = n_seqs * chunk;
    r->group = xmalloc(n_seqs * sizeof(int));
    for (int s = 0; s < n_seqs; s++) r->group[s] = s % dp;
    forward_init(&r->f, m, be, n, n, n_seqs, nb);
    forward_share(&r->f, &r->kv);
    r->pos = xmalloc(n * sizeof(int));
    r->seq = xcalloc(n, sizeof(int));
    r->slot = xmalloc(n * sizeof(int));
    r->out_idx = xmalloc(n * sizeof(int));
    r->tok = xmalloc(n * sizeof(int));
    r->start = xmalloc(n_seqs * sizeof(int));
    r->ntok = xmalloc(n_seqs * sizeof(int));
    r->ctx = xmalloc(n_seqs * sizeof(int));
    r->table = xmalloc((size_t)n_seqs * nb * sizeof(int));
    for (int s = 0; s < n_seqs; s++) memcpy(r->table + (size_t)s * nb, r->bts[s].blocks, nb * sizeof(int));
    if (n_seqs > 1) r->rows = xmalloc((size_t)n * m->cfg.vocab * sizeof(float));
}

void runner_init(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size)
{
    runner_init_seqs(r, m, be, max_ctx, chunk, block_size, 1);
}

void runner_free(Runner *r)
{
    if (!r->be) return;
    mtp_free(&r->mtp);
    free(r->last);
    free(r->mtok);
    free(r->mpos);
    free(r->mrow);
    forward_free(&r->f);
    for (int s = 0; s < r->n_seqs; s++) block_table_release(&r->bts[s], &r->kv);
    kv_cache_free(&r->kv);
    void *arrs[] = {r->bts, r->group, r->pos, r->seq, r->slot, r->out_idx,
                    r->tok, r->start, r->ntok, r->ctx, r->table, r->rows};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) free(arrs[i]);
    *r = (Runner){0};
}

void runner_reset(Runner *r) { r->n_ctx = 0; }

void runner_enable_graphs(Runner *r) { forward_enable_graphs(&r->f, r->bt.n_blocks * r->kv.block_size); }

void runner_enable_mtp(Runner *r, int draft_vocab, int max_drafts)
{
    r->verify_len = 1 + max_drafts;
    mtp_init(&r->mtp, &r->f, draft_vocab);
    r->last = xmalloc(r->chunk * sizeof(int));
    r->mtok = xmalloc(r->chunk * sizeof(int));
    r->mpos = xmalloc(r->chunk * sizeof(int));
    r->mrow = xmalloc(r->chunk * sizeof(int));
    for (int i = 0; i < r->chunk; i++) r->mrow[i] = i;
}

/* The MTP layer over positions base..base+n of the sequence, paired with tokens next[0..n) and
 * the hidden states of rows 0..n of the main model's last forward (from_main) or of the previous
 * pass's output (a chain); the greedy draft from the last row's logits into draft when not NULL. */
static void runner_mtp_pass(Runner *r, int base, int n, const int *next, int from_main, int *draft)
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
               .bt_stride = r->bt.n_blocks, .max_ctx = ctx, .n_out = draft ? 1 : 0, .out_idx = r->out_idx,
               .verify_len = r->verify_len};
    mtp_run(&r->mtp, &b, &r->kv, r->mrow, from_main, draft);
}

void runner_draft(Runner *r, int n_keep, int next, int nd, int *drafts)
{
    CHECK(r->mtp.f && n_keep >= 1 && n_keep <= r->n_last, "runner: a draft needs runner_enable_mtp and %d <= %d rows",
          n_keep, r->n_last);
    for (int i = 0; i + 1 < n_keep; i++) r->mtok[i] = r->last[i + 1];
    r->mtok[n_keep - 1] = next;
    int tmp;
    runner_mtp_pass(r, r->last_base, n_keep, r->mtok, 1, nd > 0 ? &drafts[0] : &tmp);
    for (int j = 1; j < nd; j++) /* the chain: the previous draft at the next position */
        runner_mtp_pass(r, r->last_base + n_keep + j - 1, 1, &drafts[j - 1], 0, &drafts[j]);
}

void runner_rewind(Runner *r, int n_ctx)
{
    CHECK(n_ctx >= 0 && n_ctx <= r->n_ctx, "runner: rewind to %d of %d", n_ctx, r->n_ctx);
    r->n_ctx = n_ctx;
}

void runner_feed(Runner *r, const int *ids, int n, int all, float *logits)
{
    CHECK(r->n_ctx + n <= r->max_ctx, "runner: %d + %d tokens exceed the cache's %d", r->n_ctx, n, r->max_ctx);
    CHECK(r->n_seqs == 1 || all || !logits, "runner: %d sequences give every position's logits", r->n_seqs);
    int V = r->m->cfg.vocab, bs = r->kv.block_size, S = r->n_seqs, nb = r->bt.n_blocks;
    for (int s0 = 0; s0 < n; s0 += r->chunk) {
        int k = n - s0 < r->chunk ? n - s0 : r->chunk, base = r->n_ctx;
        int last = s0 + k == n;
        int n_out = all ? k : (last && logits ? 1 : 0);
        for (int s = 0; s < S; s++) { /* sequence s: tokens [s k, (s + 1) k) */
            for (int i = 0; i < k; i++) {
                int t = s * k + i;
                r->tok[t] = ids[s0 + i];
                r->pos[t] = base + i;
                r->seq[t] = s;
                r->slot[t] = block_table_slot(&r->bts[s], bs, base + i);
            }
            for (int i = 0; i < n_out; i++) r->out_idx[s * n_out + i] = s * k + (all ? i : k - 1);
            r->start[s] = s * k;
            r->ntok[s] = k;
            r->ctx[s] = base + k;
        }
        Batch b = {.n_tokens = S * k, .tokens = r->tok, .pos = r->pos, .seq = r->seq, .slot = r->slot,
                   .n_seqs = S, .seq_start = r->start, .seq_ntok = r->ntok, .ctx_len = r->ctx,
                   .block_table = r->table, .bt_stride = nb, .max_ctx = base + k,
                   .n_out = S * n_out, .out_idx = r->out_idx, .seq_group = r->group, .verify_len = r->verify_len};
        if (S == 1) {
            forward_run(&r->f, &b, &r->kv, !logits ? NULL : all ? logits + (size_t)s0 * V : logits);
        } else {
            forward_run(&r->f, &b, &r->kv, logits ? r->rows : NULL);
            for (int s = 0; logits && s < S; s++) /* [S, n, V]: this chunk's rows of each sequence */
                memcpy(logits + ((size_t)s * n + s0) * V, r->rows + (size_t)s * k * V, (size_t)k * V * sizeof(float));
        }
        r->n_ctx += k;
        if (r->mtp.f) { /* the MTP layer's catch-up: now where the next token is known, else at runner_draft */
            memcpy(r->last, ids + s0, k * sizeof(int));
            r->n_last = k;
            r->last_base = base;
            if (!last) runner_mtp_pass(r, base, k, ids + s0 + 1, 1, NULL);
        }
    }
}
