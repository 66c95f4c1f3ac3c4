/* router: MoE routing on the GPU, one block per token, the twin of router_cpu:
 * scores (sigmoid or softmax), the correction bias for the selection only, group-limited top-k
 * (group score = sum of its two best choices), top-K with ties to the lowest index,
 * normalisation and routed scaling. The selected ids stay on the device. */
#include "common.cuh"

#define ROUTER_THREADS 256
#define ROUTER_MAX_E 1024
#define ROUTER_MAX_G 64

static __global__ void router_kernel(int *idx, float *wts, const float *logits, const float *bias, int E, int K, int G,
                                     int topk_group, int softmax, int norm, float scaling, int e0, int n_local)
{
    __shared__ float s[ROUTER_MAX_E], choice[ROUTER_MAX_E], rv[ROUTER_THREADS], red[32];
    __shared__ unsigned char mask[ROUTER_MAX_E], gtaken[ROUTER_MAX_G];
    __shared__ float gscore[ROUTER_MAX_G];
    __shared__ int ri[ROUTER_THREADS];
    int t = blockIdx.x;
    const float *l = logits + (int64_t)t * E;
    if (softmax) {
        float mx = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
        mx = block_max(mx, red);
        float sum = 0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) sum += (s[e] = expf(l[e] - mx));
        sum = block_sum(sum, red);
        for (int e = threadIdx.x; e < E; e += blockDim.x) s[e] /= sum;
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x) s[e] = 1.0f / (1.0f + expf(-l[e]));
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        choice[e] = s[e] + (bias ? bias[e] : 0.0f);
        mask[e] = 0;
    }
    __syncthreads();
    if (G > 1 && topk_group < G) {
        int per = E / G;
        for (int g = threadIdx.x; g < G; g += blockDim.x) {
            float a = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > a) { b2 = a; a = choice[e]; }
                else if (choice[e] > b2) b2 = choice[e];
            }
            gscore[g] = per > 1 ? a + b2 : a;
            gtaken[g] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int k = 0; k < topk_group; k++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!gtaken[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
                gtaken[best] = 1;
            }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) mask[e] = !gtaken[e / per];
        __syncthreads();
    }
    float sum = 0;
    for (int k = 0; k < K; k++) {
        int e = block_argmax(choice, mask, E, rv, ri);
        if (threadIdx.x == 0) {
            mask[e] = 1;
            idx[(int64_t)t * K + k] = e;
            wts[(int64_t)t * K + k] = s[e];
        }
        sum += s[e];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int k = 0; k < K; k++) {
            float w = wts[(int64_t)t * K + k];
            if (norm) w /= sum + 1e-20f;
            wts[(int64_t)t * K + k] = w * scaling;
            if (n_local >= 0) { /* expert parallel: this rank's experts from 0, the others -1 */
                int e = idx[(int64_t)t * K + k] - e0;
                idx[(int64_t)t * K + k] = e >= 0 && e < n_local ? e : -1;
            }
        }
}

void router_cuda(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T, const ModelConfig *c)
{
    if (!T) return;
    if (c->n_experts > ROUTER_MAX_E || c->n_group > ROUTER_MAX_G)
        die("router: %d experts in %d groups exceed the kernel's limits (%d, %d)", c->n_experts, c->n_group,
            ROUTER_MAX_E, ROUTER_MAX_G);
    router_kernel<<<T, ROUTER_THREADS, 0, cuda_stream(be)>>>(idx, wts, logits, bias, c->n_experts, c->n_experts_per_tok,
                                                             c->n_group > 0 ? c->n_group : 1, c->topk_group,
                                                             c->scoring == SCORE_SOFTMAX, c->norm_topk_prob,
                                                             c->routed_scaling, c->expert0,
                                                             c->ep > 1 ? c->n_local_experts : -1);
    LAUNCH_CHECK("router_kernel");
}
