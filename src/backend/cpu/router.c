/* router: MoE routing on the CPU: scores, correction bias for the selection only, group-limited
 * top-k, normalisation and routed scaling (transformers' GlmMoeDsaMoE.route_tokens_to_experts).
 * Every top-k takes the highest values and breaks ties by the lowest index, as on every backend. */
#include <math.h>

#include "cpu.h"

/* Index of the largest v[i] with mask[i] == 0, ties to the lowest i; -1 when all are masked. */
static int argmax_masked(const float *v, const unsigned char *mask, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!mask[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

void router_cpu(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T,
                const ModelConfig *c)
{
    int E = c->n_experts, K = c->n_experts_per_tok, G = c->n_group > 0 ? c->n_group : 1;
    int per_group = E / G;
#pragma omp parallel for num_threads(be->n_threads) if (T > 8)
    for (int t = 0; t < T; t++) {
        float *s = cpu_scratch(1, 2 * E * sizeof(float) + 2 * E);
        float *choice = s + E;
        unsigned char *mask = (unsigned char *)(choice + E), *gmask = mask + E;
        const float *l = logits + (int64_t)t * E;
        if (c->scoring == SCORE_SOFTMAX) {
            float mx = l[0], sum = 0;
            for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
            for (int e = 0; e < E; e++) sum += (s[e] = expf(l[e] - mx));
            for (int e = 0; e < E; e++) s[e] /= sum;
        } else {
            for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-l[e]));
        }
        for (int e = 0; e < E; e++) {
            choice[e] = s[e] + (bias ? bias[e] : 0.0f);
            mask[e] = 0;
        }
        if (G > 1 && c->topk_group < G) {
            /* group score: sum of the two best choices in the group; keep topk_group groups */
            float gscore[256];
            for (int g = 0; g < G; g++) {
                float a = -INFINITY, b2 = -INFINITY;
                for (int e = g * per_group; e < (g + 1) * per_group; e++) {
                    if (choice[e] > a) { b2 = a; a = choice[e]; }
                    else if (choice[e] > b2) b2 = choice[e];
                }
                gscore[g] = per_group > 1 ? a + b2 : a;
                gmask[g] = 1; /* 1: not (yet) kept */
            }
            unsigned char taken[256] = {0};
            for (int k = 0; k < c->topk_group; k++) {
                int g = argmax_masked(gscore, taken, G);
                taken[g] = 1;
                gmask[g] = 0;
            }
            for (int e = 0; e < E; e++) mask[e] = gmask[e / per_group];
        }
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int e = argmax_masked(choice, mask, E);
            mask[e] = 1;
            idx[(int64_t)t * K + k] = e;
            sum += (wts[(int64_t)t * K + k] = s[e]);
        }
        for (int k = 0; k < K; k++) {
            float w = wts[(int64_t)t * K + k];
            if (c->norm_topk_prob) w /= sum + 1e-20f;
            wts[(int64_t)t * K + k] = w * c->routed_scaling;
        }
        if (c->ep > 1) /* expert parallel: this rank's experts numbered from 0, the others -1 */
            for (int k = 0; k < K; k++) {
                int e = idx[(int64_t)t * K + k] - c->expert0;
                idx[(int64_t)t * K + k] = e >= 0 && e < c->n_local_experts ? e : -1;
            }
    }
}
