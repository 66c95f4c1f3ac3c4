/* moe: the FFN half of every decoder layer: h += FFN(RMSNorm(h)). Dense layers run a SwiGLU
 * MLP; MoE layers route each token to K experts (router on the backend, no host round
 * trip), add the weighted expert outputs and the unscaled shared expert (as transformers'
 * GlmMoeDsaMoE.forward and Glm4MoeMoE.forward do; routed_scaling_factor scales the routed sum only).
 * Tensor parallel: each rank computes its slice of every width (or, under EP, its own whole
 * experts, the router numbering them from 0 and the others -1) and one all-reduce sums them. */
#include "forward.h"

/* out[T, D] = down(silu(gate(x)) * up(x)) */
/* gate_up: gate and up fused into one GEMM (load.c fuse), else empty and gate and up apart */
static void swiglu_mlp(Forward *f, float *out, const float *x, int T, const QTensor *gate_up, const QTensor *gate,
                       const QTensor *up, const QTensor *down)
{
    Backend *be = f->be;
    int D = f->m->cfg.hidden;
    if (gate_up->rows) { /* g[T, 2 Fw]: gate's Fw columns, then up's */
        int Fw = (int)gate_up->rows / 2;
        be_matmul(be, OP_GEMM_MLP, f->g, 2 * Fw, x, D, T, gate_up, NULL);
        be_swiglu(be, f->u, f->g, f->g + Fw, 2 * Fw, T, Fw);
        be_matmul(be, OP_GEMM_MLP, out, D, f->u, Fw, T, down, NULL);
        return;
    }
    int Fw = (int)gate->rows;
    be_matmul(be, OP_GEMM_MLP, f->g, Fw, x, D, T, gate, NULL);
    be_matmul(be, OP_GEMM_MLP, f->u, Fw, x, D, T, up, NULL);
    be_swiglu(be, f->g, f->g, f->u, Fw, T, Fw);
    be_matmul(be, OP_GEMM_MLP, out, D, f->g, Fw, T, down, NULL);
}

void moe_ffn(Forward *f, int layer)
{
    const Batch *b = f->hb;
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *w = &f->m->layers[layer];
    Backend *be = f->be;
    int T = b->n_tokens, D = c->hidden;
    size_t n = (size_t)T * D;

    be_rmsnorm(be, f->a, D, f->h, D, w->ffn_norm, T, D, c->rms_eps);
    if (!c->layer_moe[layer]) {
        swiglu_mlp(f, f->ffn, f->a, T, &w->w_gate_up, &w->w_gate, &w->w_up, &w->w_down);
        dist_all_reduce(f->dist, be, f->ffn, n);
        be_add(be, f->h, f->h, f->ffn, n);
        return;
    }
    /* the shared expert beside the routed ones where the backend takes it (be_side_begin: on a
     * GPU at decode sizes, a chain of small launches the routed kernels hide); the same sums */
    const int shared = c->n_shared_experts > 0, side = shared && be_side_begin(be, T, SIDE_SHARED_EXPERT);
    if (side) {
        swiglu_mlp(f, f->ffn2, f->a, T, &w->sh_gate_up, &w->sh_gate, &w->sh_up, &w->sh_down);
        be_side_end(be);
    }
    be_matmul(be, OP_GEMM_ROUTER, f->rlogits, c->n_experts, f->a, D, T, &w->router, NULL);
    be_router(be, f->ridx, f->rwts, f->rlogits, w->router_bias, T, c);
    const MoeExperts ex = {.gate = w->exp_gate, .up = w->exp_up, .down = w->exp_down, .table = w->exp_table};
    if (c->ep > 1) { /* this rank's experts only */
        ModelConfig lc = *c;
        lc.n_experts = c->n_local_experts;
        be_moe(be, f->ffn, f->a, f->ridx, f->rwts, T, &ex, &lc);
    } else {
        be_moe(be, f->ffn, f->a, f->ridx, f->rwts, T, &ex, c);
    }
    if (shared) { /* (routed + shared), then the residual, as transformers adds */
        if (side) be_side_join(be);
        else swiglu_mlp(f, f->ffn2, f->a, T, &w->sh_gate_up, &w->sh_gate, &w->sh_up, &w->sh_down);
        be_add(be, f->ffn, f->ffn, f->ffn2, n);
    }
    dist_all_reduce(f->dist, be, f->ffn, n);
    be_add(be, f->h, f->h, f->ffn, n);
}
