/* mla: MLA attention in the expanded form, composed from backend ops, and the
 * rule that picks it over the absorbed form (be_attention_mla).
 *
 * The absorbed form multiplies every query by W_UK and every output by W_UV and scores against
 * the C-wide latents: right for decode, where a sequence has one query. A prefill chunk has
 * many queries per sequence: the expanded form multiplies each cached latent by kv_b_proj once
 * (one GEMM) into per-head keys [k_nope | k_pe] and values, then runs plain multi-head attention
 * with Dn + Dr wide keys. The keys of a long context would not fit (32k tokens of GLM-5: GBs),
 * so they are expanded KC positions at a time and each (query, head) carries an online softmax
 * across the pieces (running max and sum, accumulator rescaled), normalised after the last. */
#include "forward.h"

#include <stdlib.h>

#include "../base/knobs.h"

void mla_expand_init(MlaExpand *x, Backend *be, const ModelConfig *c, int max_tokens, int piece)
{
    size_t F4 = sizeof(float), H = c->n_heads;
    *x = (MlaExpand){.piece = piece};
    x->lat = be_alloc(be, (size_t)piece * (c->kv_lora_rank + c->qk_rope_dim) * F4);
    x->kv = be_alloc(be, (size_t)piece * H * (c->qk_nope_dim + c->v_head_dim) * F4);
    x->st = be_alloc(be, (size_t)max_tokens * H * 2 * F4);
}

void mla_expand_free(MlaExpand *x, Backend *be)
{
    be_free(be, x->lat);
    be_free(be, x->kv);
    be_free(be, x->st);
    *x = (MlaExpand){0};
}

int mla_expand_min(void) { return (int)knob_get(KNOB_MLA_EXPAND_MIN); }

/* The rule: prompt tokens are those of sequences with more tokens in the batch than decoding
 * brings (one, or with speculative decoding a token and its drafts: hb->verify_len; a few
 * queries of a sequence are the absorbed form's case too). The expanded form runs when the
 * batch has at least min_tokens prompt tokens and they are at least half its tokens (a batch
 * mostly of prefill chunks), for its prompt chunks only: the decoding sequences the engine puts
 * first keep the absorbed form (mla_attention_split; expanding a decoding sequence's whole
 * context for one query costs what its prompt did); every other batch, decoding ones above all,
 * keeps the absorbed form. A decoding batch never expands, whatever min_tokens (>= 1): the graphs
 * (forward_graph_run) capture only the absorbed form, whose launches do not depend on the
 * batch's contexts. Every rank of a distributed run sees the same batch and decides the same. */
int mla_expand_use(const Batch *hb, int min_tokens)
{
    int prompt = 0, q = hb->verify_len > 1 ? hb->verify_len : 1;
    for (int s = 0; s < hb->n_seqs; s++)
        if (hb->seq_ntok[s] > q) prompt += hb->seq_ntok[s];
    return prompt > 0 && prompt >= min_tokens && 2 * prompt >= hb->n_tokens;
}

int mla_decode_prefix(const Batch *hb, int *n_tokens)
{
    int q = hb->verify_len > 1 ? hb->verify_len : 1, s = 0, t = 0;
    while (s < hb->n_seqs && hb->seq_start[s] == t && hb->seq_ntok[s] <= q) t += hb->seq_ntok[s++];
    *n_tokens = t;
    return s;
}

void mla_attention_split(Backend *be, const MlaExpand *x, float *out, const float *q, const KVLayer *kv,
                         const QTensor *wkv_b, const int *topk, int ktop, const Batch *hb, const Batch *db,
                         const ModelConfig *c)
{
    int Td, Sd = mla_decode_prefix(hb, &Td);
    if (Sd > 0) { /* the decoding sequences: tokens [0, Td), the absorbed form */
        Batch hv = *hb, dv = *db;
        hv.n_tokens = dv.n_tokens = Td;
        hv.n_seqs = dv.n_seqs = Sd;
        be_attention_mla(be, out, q, kv, wkv_b, topk, ktop, &hv, &dv, c);
    }
    if (Sd == hb->n_seqs) return;
    /* the rest: sequences [Sd, S), their rows where they are (token indices stay the batch's) */
    Batch hp = *hb, dp = *db;
    hp.n_seqs = dp.n_seqs = hb->n_seqs - Sd;
    hp.seq_start += Sd, dp.seq_start += Sd;
    hp.seq_ntok += Sd, dp.seq_ntok += Sd;
    hp.ctx_len += Sd, dp.ctx_len += Sd;
    hp.block_table += (size_t)Sd * hb->bt_stride, dp.block_table += (size_t)Sd * db->bt_stride;
    mla_attention_expanded(be, x, out, q, kv, wkv_b, topk, ktop, &hp, &dp, c);
}

void mla_attention_expanded(Backend *be, const MlaExpand *x, float *out, const float *q, const KVLayer *kv,
                            const QTensor *wkv_b, const int *topk, int ktop, const Batch *hb, const Batch *db,
                            const ModelConfig *c)
{
    int C = c->kv_lora_rank, W = C + c->qk_rope_dim, N = c->n_heads * (c->qk_nope_dim + c->v_head_dim);
    for (int s = 0; s < hb->n_seqs; s++) {
        int t0 = hb->seq_start[s], nt = hb->seq_ntok[s], ctx = hb->ctx_len[s];
        if (nt <= 0) continue;
        /* the sequence's block-table row, in backend memory */
        const int *bt = db->block_table + (size_t)s * db->bt_stride;
        for (int j0 = 0; j0 < ctx; j0 += x->piece) {
            int n = ctx - j0 < x->piece ? ctx - j0 : x->piece;
            be_kv_gather(be, x->lat, kv->kv, kv->dtype, kv->k_scale, kv->kv_width, W, bt, kv->block_size, j0, n);
            be_matmul(be, OP_GEMM_ATTN, x->kv, N, x->lat, W, n, wkv_b, NULL);
            be_attention_mla_piece(be, out, x->st, q, x->kv, x->lat + C, W, j0, n, t0, nt, topk, ktop, j0 == 0,
                                   j0 + n >= ctx, hb, db, c);
        }
    }
}
