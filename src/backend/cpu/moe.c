/* moe: routed experts on the CPU: tokens are grouped by expert (dispatch), each touched
 * expert runs gate/up, SwiGLU and down once over its group with its weights decoded row by
 * row (matmul_cpu), and the outputs are added back weighted (combine). */
#include <string.h>

#include "cpu.h"

int moe_cpu(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
            const MoeExperts *ex, const ModelConfig *c)
{
    int E = c->n_experts, K = c->n_experts_per_tok, D = c->hidden, F = c->moe_intermediate;
    int *cnt = cpu_scratch(2, (size_t)(2 * E + 1 + 2 * T * K) * sizeof(int));
    int *start = cnt + E, *list = start + E + 1, *fill = list + T * K;
    memset(cnt, 0, E * sizeof(int));
    for (int i = 0; i < T * K; i++)
        if (idx[i] >= 0) cnt[idx[i]]++; /* -1: another rank's expert (EP) */
    start[0] = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + cnt[e];
    memcpy(fill, start, E * sizeof(int));
    for (int i = 0; i < T * K; i++) /* i = t * K + k, in token order */
        if (idx[i] >= 0) list[fill[idx[i]]++] = i;

    float *xg = cpu_scratch(3, (size_t)T * D * sizeof(float));
    float *g = cpu_scratch(4, (size_t)T * F * sizeof(float));
    float *u = cpu_scratch(5, (size_t)T * F * sizeof(float));
    float *y = cpu_scratch(6, (size_t)T * D * sizeof(float));
    memset(out, 0, (size_t)T * D * sizeof(float));
    int touched = 0;
    for (int e = 0; e < E; e++) {
        int n = cnt[e];
        if (!n) continue;
        touched++;
        for (int i = 0; i < n; i++)
            memcpy(xg + (int64_t)i * D, x + (int64_t)(list[start[e] + i] / K) * D, D * sizeof(float));
        matmul_cpu(be, g, F, xg, D, n, &ex->gate[e], NULL);
        matmul_cpu(be, u, F, xg, D, n, &ex->up[e], NULL);
        swiglu_cpu(be, g, g, u, F, n, F);
        matmul_cpu(be, y, D, g, F, n, &ex->down[e], NULL);
        for (int i = 0; i < n; i++) {
            int tk = list[start[e] + i];
            float w = wts[tk];
            float *o = out + (int64_t)(tk / K) * D;
            const float *yi = y + (int64_t)i * D;
            for (int d = 0; d < D; d++) o[d] += w * yi[d];
        }
    }
    return touched;
}
