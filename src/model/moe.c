/* moe: the FFN half of every decoder layer: h += FFN(RMSNorm(h)). Dense layers run a SwiGLU
 * MLP; MoE layers route each token to K experts (router on the backend, no host round
 * trip), add the weighted expert outputs and the unscaled shared expert (as transformers'
 * GlmMoeDsaMoE.forward and Glm4MoeMoE.forward do; routed_scaling_factor scales the routed sum only).
 * Tensor parallel: each rank computes its slice of every width (or, under EP, its own whole
 * experts, the router numbering them from 0 and the others -1) and one all-reduce sums them. */
#include "forward.h"

#include <string.h>

#include "../base/util.h"

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

/* Attention data parallel (--dp): the routed experts of the group's tokens, on the ranks that hold
 * them. The group's ranks hold the same T rows after attention; each takes its share [r0, r1) and
 * routes it. Dispatch sends the row of every (token, expert) pair to the expert's rank, with the
 * expert and the weight beside it (an all-to-all of the counts, then of the rows and of those two
 * numbers); each rank runs its experts over what it received, weights applied (be_moe, one expert
 * a row); combine sends the results back, and each token adds its K rows in the order of its
 * experts' ids, from zero, as one rank's be_moe adds them. out [T, D] is zero outside [r0, r1),
 * so that the group's all-reduce completes it. Every rank of the stage calls this at every MoE
 * layer, with no rows when its group has none this step: the exchange needs them all. */
static void moe_dispatch_combine(Forward *f, const LayerWeights *w, float *out, int T)
{
    Dist *d = f->dist;
    DpState *x = &f->dp;
    const ModelConfig *c = &f->m->cfg;
    Backend *be = f->be;
    int D = c->hidden, K = c->n_experts_per_tok, El = c->n_local_experts, P = d->tp;
    int r0 = (int)((int64_t)T * d->atp_rank / d->atp), r1 = (int)((int64_t)T * (d->atp_rank + 1) / d->atp);
    int n = r1 - r0, np = n * K;
    size_t row = (size_t)D * sizeof(float);
    if (T) be_fill(be, out, (size_t)T * row, FILL_U8_CONST, 0, 0, 0);
    if (n) { /* global expert ids: the router of one rank */
        ModelConfig gc = *c;
        gc.ep = 1;
        be_matmul(be, OP_GEMM_ROUTER, f->rlogits, c->n_experts, f->a + (size_t)r0 * D, D, n, &w->router, NULL);
        be_router(be, f->ridx, f->rwts, f->rlogits, w->router_bias, n, &gc);
        be_to_host(be, x->idx, f->ridx, (size_t)np * sizeof(int));
        be_to_host(be, x->wts, f->rwts, (size_t)np * sizeof(float));
    }
    /* dispatch: the pairs by destination rank, in token order within each */
    memset(x->cnt, 0, P * sizeof(int));
    for (int i = 0; i < np; i++) x->cnt[x->idx[i] / El]++;
    for (int r = 0, at = 0; r < P; at += x->cnt[r], r++) x->fill[r] = at;
    for (int i = 0; i < np; i++) {
        int e = x->idx[i], r = e / El, k = x->fill[r]++;
        x->pos[i] = k;
        x->rows[k] = r0 + i / K;
        x->meta[2 * k] = (float)(e - r * El);
        x->meta[2 * k + 1] = x->wts[i];
    }
    if (np) {
        if (x->rows_d != x->rows) be_to_device(be, x->rows_d, x->rows, (size_t)np * sizeof(int));
        if (x->meta_d != x->meta) be_to_device(be, x->meta_d, x->meta, (size_t)np * 2 * sizeof(float));
        be_get_rows(be, x->xs, f->a, D, x->rows_d, np, D);
    }
    if (x->cnt_d != x->cnt) be_to_device(be, x->cnt_d, x->cnt, P * sizeof(int));
    for (int r = 0; r < P; r++) x->sbytes[r] = x->rbytes[r] = sizeof(int);
    dist_all_to_all(d, be, x->cnt_d, x->sbytes, x->rcnt_d, x->rbytes);
    if (x->rcnt_d != x->rcnt) be_to_host(be, x->rcnt, x->rcnt_d, P * sizeof(int));
    int R = 0;
    for (int r = 0; r < P; r++) {
        R += x->rcnt[r];
        x->sbytes[r] = (size_t)x->cnt[r] * row;
        x->rbytes[r] = (size_t)x->rcnt[r] * row;
    }
    CHECK(R <= f->max_tokens * K, "moe: %d rows arrived, room for %d", R, f->max_tokens * K);
    dist_all_to_all(d, be, x->xs, x->sbytes, x->xr, x->rbytes);
    for (int r = 0; r < P; r++) {
        x->sbytes[r] = (size_t)x->cnt[r] * 2 * sizeof(float);
        x->rbytes[r] = (size_t)x->rcnt[r] * 2 * sizeof(float);
    }
    dist_all_to_all(d, be, x->meta_d, x->sbytes, x->rmeta_d, x->rbytes);
    /* this rank's experts over the rows that came */
    if (R) {
        if (x->rmeta_d != x->rmeta) be_to_host(be, x->rmeta, x->rmeta_d, (size_t)R * 2 * sizeof(float));
        for (int j = 0; j < R; j++) {
            x->eidx[j] = (int)x->rmeta[2 * j];
            x->ew[j] = x->rmeta[2 * j + 1];
            CHECK(x->eidx[j] >= 0 && x->eidx[j] < El, "moe: a row for expert %d of %d", x->eidx[j], El);
        }
        if (x->eidx_d != x->eidx) be_to_device(be, x->eidx_d, x->eidx, (size_t)R * sizeof(int));
        if (x->ew_d != x->ew) be_to_device(be, x->ew_d, x->ew, (size_t)R * sizeof(float));
        ModelConfig lc = *c; /* one expert a row, numbered on this rank */
        lc.n_experts = El;
        lc.n_experts_per_tok = 1;
        lc.ep = 1;
        const MoeExperts ex = {.gate = w->exp_gate, .up = w->exp_up, .down = w->exp_down, .table = w->exp_table};
        be_moe(be, x->y, x->xr, x->eidx_d, x->ew_d, R, &ex, &lc);
    }
    /* combine: the results back where they came from */
    for (int r = 0; r < P; r++) {
        x->sbytes[r] = (size_t)x->rcnt[r] * row;
        x->rbytes[r] = (size_t)x->cnt[r] * row;
    }
    dist_all_to_all(d, be, x->y, x->sbytes, x->xs, x->rbytes);
    if (!n) return;
    for (int t = 0; t < n; t++) { /* each token's pairs by expert id (top-k picks distinct experts) */
        int ord[64];
        CHECK(K <= 64, "moe: %d experts a token", K);
        for (int k = 0; k < K; k++) {
            int j = k;
            while (j > 0 && x->idx[t * K + ord[j - 1]] > x->idx[t * K + k]) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = k;
        }
        for (int k = 0; k < K; k++) x->rows[(size_t)k * n + t] = x->pos[t * K + ord[k]];
    }
    if (x->rows_d != x->rows) be_to_device(be, x->rows_d, x->rows, (size_t)np * sizeof(int));
    be_get_rows(be, x->xr, x->xs, D, x->rows_d, np, D);
    float *o = out + (size_t)r0 * D;
    for (int k = 0; k < K; k++) be_add(be, o, o, x->xr + (size_t)k * n * D, (size_t)n * D);
}

void moe_ffn(Forward *f, int layer)
{
    const Batch *b = f->hb;
    const ModelConfig *c = &f->m->cfg;
    const LayerWeights *w = &f->m->layers[layer];
    Backend *be = f->be;
    int T = b->n_tokens, D = c->hidden;
    size_t n = (size_t)T * D;

    if (c->dp > 1) { /* attention data parallel: the group's rows; the routed experts by exchange */
        if (T) be_rmsnorm(be, f->a, D, f->h, D, w->ffn_norm, T, D, c->rms_eps);
        if (!c->layer_moe[layer]) {
            if (!T) return;
            swiglu_mlp(f, f->ffn, f->a, T, &w->w_gate_up, &w->w_gate, &w->w_up, &w->w_down);
        } else {
            moe_dispatch_combine(f, w, f->ffn, T);
            if (!T) return;
            if (c->n_shared_experts > 0) { /* split over the group like the dense MLP */
                swiglu_mlp(f, f->ffn2, f->a, T, &w->sh_gate_up, &w->sh_gate, &w->sh_up, &w->sh_down);
                be_add(be, f->ffn, f->ffn, f->ffn2, n);
            }
        }
        dist_all_reduce(f->dist, be, f->ffn, n);
        be_add(be, f->h, f->h, f->ffn, n);
        return;
    }
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
