/* glm5: the attention block of GLM-5 (GlmMoeDsaAttention and GlmMoeDsaIndexer in transformers'
 * models/glm_moe_dsa/modeling_glm_moe_dsa.py): MLA with the q and kv low-rank
 * paths and their norms, interleaved RoPE on the rope dims, the latent and roped k_pe cached
 * per token, attention in the absorbed form for decode and the expanded one for prefill chunks
 * (mla.c), and the DSA indexer choosing which keys each query attends to. A "shared" indexer
 * layer reuses the top-k of the previous full layer (still in f->topk). DeepSeek-V3 (no
 * indexer) runs the same block with every causal key. */
#include "forward.h"

/* eps of q_a_layernorm / kv_a_layernorm: transformers builds them with its default 1e-6 (vLLM uses
   rms_norm_eps, 1e-5); the golden fixtures come from transformers */
#define MLA_NORM_EPS 1e-6f
#define INDEXER_NORM_EPS 1e-6f

void glm5_attention(Forward *f, int layer, KVCache *kv)
{
    const Batch *b = f->hb, *db = f->db;
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *w = &f->m->layers[layer];
    Backend *be = f->be;
    int T = b->n_tokens, D = c->hidden, H = c->n_heads, R = c->q_lora_rank, C = c->kv_lora_rank;
    int Dr = c->qk_rope_dim, Dq = c->qk_nope_dim + Dr, qd = H * Dq, kvd = C + Dr;

    be_rmsnorm(be, f->a, D, f->h, D, w->attn_norm, T, D, c->rms_eps);
    const float *qin = f->a;
    int qin_dim = D;
    /* the latent and k_pe: kv[T, kvd] rows kld apart, after q_a in the fused GEMM's rows (load.c fuse) */
    float *kvl = f->k;
    int kld = kvd;
    if (w->wqkv_a.rows) {
        be_matmul(be, OP_GEMM_ATTN, f->qkva, R + kvd, f->a, D, T, &w->wqkv_a, NULL);
        be_rmsnorm(be, f->qa, R, f->qkva, R + kvd, w->q_a_norm, T, R, MLA_NORM_EPS);
        kvl = f->qkva + R;
        kld = R + kvd;
    } else {
        if (R > 0) {
            be_matmul(be, OP_GEMM_ATTN, f->qa, R, f->a, D, T, &w->wq_a, NULL);
            be_rmsnorm(be, f->qa, R, f->qa, R, w->q_a_norm, T, R, MLA_NORM_EPS);
        }
        be_matmul(be, OP_GEMM_ATTN, f->k, kvd, f->a, D, T, &w->wkv_a, NULL);
    }
    if (R > 0) {
        qin = f->qa;
        qin_dim = R;
    }
    KVLayer *L = &kv->layers[layer];
    const int *topk = NULL;
    /* the indexer reads qa and a only, and writes its own cache and buffers: beside the query and
     * latent path below where the backend takes it (be_side_begin: on a GPU at decode sizes, a
     * chain of small launches that path hides), joined before the attention; the same sums */
    int side = 0;
    if (c->layer_indexer[layer] == INDEXER_FULL) {
        side = be_side_begin(be, T, SIDE_INDEXER);
        int Hi = c->index_n_heads, Di = c->index_head_dim;
        be_matmul(be, OP_GEMM_INDEXER, f->iq, Hi * Di, f->qa, R, T, &w->idx_wq_b, NULL);
        be_rope(be, f->iq, Hi * Di, T, Hi, Di, 0, Dr, db->pos, f->inv_freq, f->rope_scale, c->indexer_rope_interleave);
        be_matmul(be, OP_GEMM_INDEXER, f->ik, Di, f->a, D, T, &w->idx_wk, NULL);
        be_layernorm(be, f->ik, Di, f->ik, Di, w->idx_norm_w, w->idx_norm_b, T, Di, INDEXER_NORM_EPS);
        be_rope(be, f->ik, Di, T, 1, Di, 0, Dr, db->pos, f->inv_freq, f->rope_scale, c->indexer_rope_interleave);
        be_kv_write(be, L->idx, L->dtype, 1.0f, L->idx_width, 0, f->ik, Di, Di, db->slot, T);
        be_matmul(be, OP_GEMM_INDEXER, f->iw, Hi, f->a, D, T, &w->idx_wproj, NULL);
        be_indexer(be, f->topk, f->iq, f->iw, L, b, db, c);
        if (side) be_side_end(be);
        topk = f->topk;
    } else if (c->layer_indexer[layer] == INDEXER_SHARED) {
        topk = f->topk; /* the previous full layer's selection */
    }
    be_matmul(be, OP_GEMM_ATTN, f->q, qd, qin, qin_dim, T, &w->wq_b, NULL);
    be_rope(be, f->q, qd, T, H, Dq, c->qk_nope_dim, Dr, db->pos, f->inv_freq, f->rope_scale, c->rope_interleave);
    be_rmsnorm(be, kvl, kld, kvl, kld, w->kv_a_norm, T, C, MLA_NORM_EPS);
    be_rope(be, kvl, kld, T, 1, kvd, C, Dr, db->pos, f->inv_freq, f->rope_scale, c->rope_interleave);
    be_kv_write(be, L->kv, L->dtype, L->k_scale, L->kv_width, 0, kvl, kld, kvd, db->slot, T);
    if (side) be_side_join(be);
    if (mla_expand_use(b, mla_expand_min())) /* prefill chunks: the expanded form, decodes beside them not (mla.c) */
        mla_attention_split(be, &f->mla, f->attn, f->q, L, &w->wkv_b, topk, c->index_topk, b, db, c);
    else
        be_attention_mla(be, f->attn, f->q, L, &w->wkv_b, topk, c->index_topk, b, db, c);
    be_matmul(be, OP_GEMM_ATTN, f->a, D, f->attn, H * c->v_head_dim, T, &w->wo, NULL);
    dist_all_reduce(f->dist, be, f->a, (size_t)T * D); /* tensor parallel: each rank's heads' share */
    be_add(be, f->h, f->h, f->a, (size_t)T * D);
}
