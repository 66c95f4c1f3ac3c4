/* forward: the top-level forward pass (SPEC §1.4): embedding, L decoder layers of pre-norm
 * residual blocks, the final norm on the rows that produce logits, lm_head. */
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#include "../base/util.h"

static int imax(int a, int b) { return a > b ? a : b; }

void forward_init(Forward *f, const Model *m, Backend *be, int max_tokens, int max_out, int max_seqs,
                  int max_blocks)
{
    const ModelConfig *c = &m->cfg;
    *f = (Forward){.m = m, .be = be, .max_tokens = max_tokens, .max_out = max_out, .max_seqs = max_seqs,
                   .max_blocks = max_blocks};
    if (!be->host_memory) {
        Batch *d = &f->dbuf;
        size_t ti = (size_t)max_tokens * sizeof(int), si = (size_t)max_seqs * sizeof(int);
        d->tokens = be_alloc(be, ti);
        d->pos = be_alloc(be, ti);
        d->seq = be_alloc(be, ti);
        d->slot = be_alloc(be, ti);
        d->seq_start = be_alloc(be, si);
        d->seq_ntok = be_alloc(be, si);
        d->ctx_len = be_alloc(be, si);
        d->block_table = be_alloc(be, si * max_blocks);
        d->out_idx = be_alloc(be, (size_t)max_out * sizeof(int));
    }
    size_t T = max_tokens, F4 = sizeof(float);
    int D = c->hidden, H = c->n_heads;
    int qdim = H * imax(c->head_dim, c->qk_nope_dim + c->qk_rope_dim);
    int kdim = imax(c->n_kv_heads * c->head_dim, c->kv_lora_rank + c->qk_rope_dim);
    int odim = H * imax(c->head_dim, c->v_head_dim);
    int fdim = imax(c->intermediate, c->moe_intermediate * imax(c->n_shared_experts, 1));
    int half = c->rotary_dim / 2;
    float *inv = xmalloc(half * sizeof(float));
    rope_init(c, inv, &f->rope_scale);
    f->inv_freq = be_alloc(be, half * F4);
    be_to_device(be, f->inv_freq, inv, half * F4);
    free(inv);
    f->h = be_alloc(be, T * D * F4);
    f->a = be_alloc(be, T * D * F4);
    f->qa = be_alloc(be, T * imax(c->q_lora_rank, 1) * F4);
    f->q = be_alloc(be, T * qdim * F4);
    f->k = be_alloc(be, T * kdim * F4);
    f->v = be_alloc(be, T * imax(c->n_kv_heads * c->head_dim, 1) * F4);
    f->attn = be_alloc(be, T * odim * F4);
    if (c->index_n_heads > 0) {
        f->iq = be_alloc(be, T * c->index_n_heads * c->index_head_dim * F4);
        f->ik = be_alloc(be, T * c->index_head_dim * F4);
        f->iw = be_alloc(be, T * c->index_n_heads * F4);
        f->topk = be_alloc(be, T * c->index_topk * sizeof(int));
    }
    f->g = be_alloc(be, T * fdim * F4);
    f->u = be_alloc(be, T * fdim * F4);
    f->ffn = be_alloc(be, T * D * F4);
    f->ffn2 = be_alloc(be, T * D * F4);
    if (c->n_experts > 0) {
        f->rlogits = be_alloc(be, T * c->n_experts * F4);
        f->ridx = be_alloc(be, T * c->n_experts_per_tok * sizeof(int));
        f->rwts = be_alloc(be, T * c->n_experts_per_tok * F4);
    }
    f->out_h = be_alloc(be, (size_t)max_out * D * F4);
    f->logits = be_alloc(be, (size_t)max_out * c->vocab * F4);
}

void forward_free(Forward *f)
{
    if (!f->be) return;
    for (int g = 0; g < f->n_graphs; g++) f->be->ops->graph_free(f->be, f->graph[g]);
    Batch *p = &f->pad;
    void *pads[] = {p->tokens, p->pos, p->seq, p->slot, p->seq_start, p->seq_ntok, p->ctx_len, p->out_idx};
    for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) free(pads[i]);
    Batch *d = &f->dbuf;
    void *dev[] = {d->tokens, d->pos, d->seq, d->slot, d->seq_start, d->seq_ntok, d->ctx_len, d->block_table, d->out_idx};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be_free(f->be, dev[i]);
    void *bufs[] = {f->inv_freq, f->h, f->a, f->qa, f->q, f->k, f->v, f->attn, f->iq, f->ik, f->iw, f->topk,
                    f->g, f->u, f->ffn, f->ffn2, f->rlogits, f->ridx, f->rwts, f->out_h, f->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(f->be, bufs[i]);
    *f = (Forward){0};
}

/* The batch with its arrays in backend memory: the host batch itself on the cpu backend, else
 * copies in the fixed device buffers (so that a captured graph reads the same addresses). */
static const Batch *forward_upload(Forward *f, const Batch *b)
{
    Backend *be = f->be;
    if (be->host_memory) return b;
    CHECK(b->n_seqs <= f->max_seqs && b->bt_stride <= f->max_blocks, "forward: %d sequences x %d blocks, limit %d x %d",
          b->n_seqs, b->bt_stride, f->max_seqs, f->max_blocks);
    Batch *d = &f->dbuf;
    size_t ti = (size_t)b->n_tokens * sizeof(int), si = (size_t)b->n_seqs * sizeof(int);
    be_to_device(be, d->tokens, b->tokens, ti);
    be_to_device(be, d->pos, b->pos, ti);
    be_to_device(be, d->seq, b->seq, ti);
    be_to_device(be, d->slot, b->slot, ti);
    be_to_device(be, d->seq_start, b->seq_start, si);
    be_to_device(be, d->seq_ntok, b->seq_ntok, si);
    be_to_device(be, d->ctx_len, b->ctx_len, si);
    be_to_device(be, d->block_table, b->block_table, si * b->bt_stride);
    if (b->n_out) be_to_device(be, d->out_idx, b->out_idx, (size_t)b->n_out * sizeof(int));
    d->n_tokens = b->n_tokens;
    d->n_seqs = b->n_seqs;
    d->n_out = b->n_out;
    d->bt_stride = b->bt_stride;
    d->max_ctx = 0;
    for (int s = 0; s < b->n_seqs; s++) d->max_ctx = b->ctx_len[s] > d->max_ctx ? b->ctx_len[s] : d->max_ctx;
    return d;
}

/* embedding, the layers, the final norm and lm_head on the logits rows of f->hb / f->db */
static void forward_body(Forward *f, KVCache *kv)
{
    const Model *m = f->m;
    const ModelConfig *c = &m->cfg;
    Backend *be = f->be;
    const Batch *b = f->hb;
    be_embed(be, f->h, f->db->tokens, b->n_tokens, &m->embed);
    for (int l = 0; l < c->n_layers; l++) {
        if (model_is_mla(c))
            glm5_attention(f, l, kv);
        else
            glm4_moe_attention(f, l, kv);
        moe_ffn(f, l);
    }
    if (b->n_out == 0) return;
    be_get_rows(be, f->out_h, f->h, c->hidden, f->db->out_idx, b->n_out, c->hidden);
    be_rmsnorm(be, f->out_h, c->hidden, f->out_h, c->hidden, m->final_norm, b->n_out, c->hidden, c->rms_eps);
    be_matmul(be, OP_GEMM_LM_HEAD, f->logits, c->vocab, f->out_h, c->hidden, b->n_out, &m->lm_head, NULL);
}

void forward_enable_graphs(Forward *f, int max_ctx)
{
    Backend *be = f->be;
    if (!be->ops->graph_begin || be->host_memory) return;
    f->graph_ctx = max_ctx;
    if (be->ops->reserve) be->ops->reserve(be, &f->m->cfg, f->max_tokens, f->max_out, max_ctx);
    int n = f->max_tokens;
    Batch *p = &f->pad;
    int **arr[] = {&p->tokens, &p->pos, &p->seq, &p->slot, &p->seq_start, &p->seq_ntok, &p->ctx_len, &p->out_idx};
    for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) *arr[i] = xcalloc(n, sizeof(int));
}

/* a decode step: one token per sequence, each token a logits row, in order */
static int is_decode(const Forward *f, const Batch *b)
{
    if (b->n_seqs != b->n_tokens || b->n_out != b->n_tokens || b->n_tokens > f->max_out || b->n_tokens > f->max_seqs)
        return 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->seq[i] != i || b->out_idx[i] != i || b->seq_ntok[i] != 1 || b->ctx_len[i] > f->graph_ctx) return 0;
    return 1;
}

static void forward_decode_graph(Forward *f, const Batch *b, KVCache *kv)
{
    Backend *be = f->be;
    int T = b->n_tokens, P = 1;
    while (P < T) P *= 2;
    if (P > f->max_tokens || P > f->max_out || P > f->max_seqs) P = T;
    /* pad to P: padding tokens read sequence 0's first position and write no cache slot */
    Batch *p = &f->pad;
    for (int i = 0; i < P; i++) {
        int real = i < T;
        p->tokens[i] = real ? b->tokens[i] : 0;
        p->pos[i] = real ? b->pos[i] : 0;
        p->seq[i] = i;
        p->slot[i] = real ? b->slot[i] : -1;
        p->seq_start[i] = i;
        p->seq_ntok[i] = 1;
        p->ctx_len[i] = real ? b->ctx_len[i] : 1;
        p->out_idx[i] = i;
    }
    p->n_tokens = p->n_seqs = p->n_out = P;
    p->bt_stride = f->max_blocks;
    p->max_ctx = f->graph_ctx;
    /* block-table rows: the real ones; padding rows copy row 0 */
    Batch hb = *p;
    int *table = xcalloc((size_t)P * f->max_blocks, sizeof(int));
    for (int i = 0; i < P; i++)
        memcpy(table + (size_t)i * f->max_blocks, b->block_table + (size_t)(i < T ? i : 0) * b->bt_stride,
               (size_t)(b->bt_stride < f->max_blocks ? b->bt_stride : f->max_blocks) * sizeof(int));
    hb.block_table = table;
    f->hb = &hb;
    f->db = forward_upload(f, &hb);
    f->dbuf.max_ctx = f->graph_ctx; /* baked into the graph: the indexer's score rows */
    int g = 0;
    while (g < f->n_graphs && f->graph_T[g] != P) g++;
    for (;;) {
        if (g == f->n_graphs) {
            CHECK(g < 16, "forward: more than 16 decode graphs");
            OpStat before[OP_COUNT];
            memcpy(before, be->stats, sizeof before);
            be->ops->graph_begin(be);
            forward_body(f, kv);
            f->graph[g] = be->ops->graph_end(be);
            f->graph_T[g] = P;
            for (int i = 0; i < OP_COUNT; i++) {
                f->graph_stats[g][i].flops = be->stats[i].flops - before[i].flops;
                f->graph_stats[g][i].bytes = be->stats[i].bytes - before[i].bytes;
                f->graph_stats[g][i].calls = be->stats[i].calls - before[i].calls;
            }
            memcpy(be->stats, before, sizeof before);
            f->n_graphs++;
        }
        if (be->ops->graph_launch(be, f->graph[g]) == 0) break;
        /* a scratch buffer was replaced since the capture (an eager step needed more): every
         * graph holds the old address; capture again */
        log_info("forward: scratch grew; recapturing the decode graphs");
        for (int k = 0; k < f->n_graphs; k++) be->ops->graph_free(be, f->graph[k]);
        f->n_graphs = g = 0;
    }
    for (int i = 0; i < OP_COUNT; i++) {
        be->stats[i].flops += f->graph_stats[g][i].flops;
        be->stats[i].bytes += f->graph_stats[g][i].bytes;
        be->stats[i].calls += f->graph_stats[g][i].calls;
    }
    free(table);
}

void forward_run(Forward *f, const Batch *b, KVCache *kv, float *logits_out)
{
    const ModelConfig *c = &f->m->cfg;
    Backend *be = f->be;
    CHECK(b->n_tokens > 0 && b->n_tokens <= f->max_tokens, "forward: %d tokens, limit %d", b->n_tokens, f->max_tokens);
    CHECK(b->n_out >= 0 && b->n_out <= f->max_out, "forward: %d logits rows, limit %d", b->n_out, f->max_out);
    if (f->graph_ctx && is_decode(f, b)) {
        forward_decode_graph(f, b, kv);
    } else {
        f->hb = b;
        f->db = forward_upload(f, b);
        forward_body(f, kv);
    }
    if (logits_out && b->n_out)
        be_to_host(be, logits_out, f->logits, (size_t)b->n_out * c->vocab * sizeof(float));
}
