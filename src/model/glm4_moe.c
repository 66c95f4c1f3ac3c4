/* glm4_moe: the attention block of GLM-4.5/4.6/4.7 (Glm4MoeAttention in transformers'
 * models/glm4_moe/modeling_glm4_moe.py): GQA with q/k/v biases,
 * per-head RMSNorm on q and k (qk-norm) before partial NeoX RoPE on the first rotary_dim dims,
 * K and V written to the paged cache, causal attention, o_proj without bias. */
#include "forward.h"

void glm4_moe_attention(Forward *f, int layer, KVCache *kv)
{
    const Batch *b = f->hb, *db = f->db;
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *w = &f->m->layers[layer];
    Backend *be = f->be;
    int T = b->n_tokens, D = c->hidden, H = c->n_heads, Hkv = c->n_kv_heads, Dh = c->head_dim;
    int qd = H * Dh, kd = Hkv * Dh;

    be_rmsnorm(be, f->a, D, f->h, D, w->attn_norm, T, D, c->rms_eps);
    be_matmul(be, OP_GEMM_ATTN, f->q, qd, f->a, D, T, &w->wq, w->bq);
    be_matmul(be, OP_GEMM_ATTN, f->k, kd, f->a, D, T, &w->wk, w->bk);
    be_matmul(be, OP_GEMM_ATTN, f->v, kd, f->a, D, T, &w->wv, w->bv);
    if (w->q_norm) { /* per head: rows of Dh */
        be_rmsnorm(be, f->q, Dh, f->q, Dh, w->q_norm, T * H, Dh, c->rms_eps);
        be_rmsnorm(be, f->k, Dh, f->k, Dh, w->k_norm, T * Hkv, Dh, c->rms_eps);
    }
    be_rope(be, f->q, qd, T, H, Dh, 0, c->rotary_dim, db->pos, f->inv_freq, f->rope_scale, c->rope_interleave);
    be_rope(be, f->k, kd, T, Hkv, Dh, 0, c->rotary_dim, db->pos, f->inv_freq, f->rope_scale, c->rope_interleave);

    KVLayer *L = &kv->layers[layer];
    be_kv_write(be, L->kv, L->dtype, L->k_scale, L->kv_width, 0, f->k, kd, kd, db->slot, T);
    be_kv_write(be, L->kv, L->dtype, L->v_scale, L->kv_width, kd, f->v, kd, kd, db->slot, T);
    be_attention_gqa(be, f->attn, f->q, L, b, db, c);
    be_matmul(be, OP_GEMM_ATTN, f->a, D, f->attn, qd, T, &w->wo, NULL);
    dist_all_reduce(f->dist, be, f->a, (size_t)T * D); /* tensor parallel: each rank's heads' share */
    be_add(be, f->h, f->h, f->a, (size_t)T * D);
}
