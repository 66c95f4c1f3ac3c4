/* sample: the definition of drawing a token from one row of logits (sample_row, sample.h),
 * used by the host sampler after its penalties (engine/sampler.c) and by the cpu's sample op
 * (cpu/sample.c); cuda/sample.cu is its CUDA twin. Probabilities are computed in double from
 * the float logits, the filtered candidates' weights rounded to float, as the sampler has always
 * done, so that a seed keeps giving the same tokens. */
#include <math.h>
#include <stdlib.h>

#include "sample.h"

/* top-k above this sorts every candidate instead of keeping a sorted list of k by insertion */
#define SAMPLE_TOP_N_MAX 64

/* descending value, ties to the lower id */
static int cand_cmp(const void *a, const void *b)
{
    const SampleCand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

int sample_top_n(const float *logits, int V, int n, SampleCand *c)
{
    int k = 0;
    for (int i = 0; i < V; i++) {
        float v = logits[i];
        if (v != v) continue;
        if (k == n && !(v > c[k - 1].v)) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && (c[j - 1].v < v)) { c[j] = c[j - 1]; j--; }
        c[j] = (SampleCand){v, i};
    }
    return k;
}

size_t sample_row_work(int V) { return (size_t)(V > 0 ? V : 1) * sizeof(SampleCand); }

int sample_row(const float *logits, int V, const SampleRow *p, void *work)
{
    int token = 0;
    if (p->temperature == 0) { /* greedy: the largest logit, ties to the lowest id */
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[token] || logits[token] != logits[token]) token = i;
        return token;
    }
    if ((p->top_k <= 0 || p->top_k >= V) && p->top_p >= 1 && p->min_p <= 0) {
        /* no filter: draw from the softmax over the whole vocabulary in id order, no sort */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp(((double)logits[i] - mx) / p->temperature);
        double u = (double)p->u * sum, acc = 0;
        for (int i = 0; i < V; i++) {
            if (logits[i] != logits[i]) continue;
            token = i;
            acc += exp(((double)logits[i] - mx) / p->temperature);
            if (u < acc) break;
        }
        return token;
    }
    SampleCand *c = work;
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    int n;
    if (k > SAMPLE_TOP_N_MAX) { /* the same order as sample_top_n's, in V log V rather than V k */
        n = 0;
        for (int i = 0; i < V; i++)
            if (logits[i] == logits[i]) c[n++] = (SampleCand){logits[i], i};
        qsort(c, n, sizeof *c, cand_cmp);
        if (n > k) n = k;
    } else {
        n = sample_top_n(logits, V, k, c);
    }
    if (n == 0) return 0; /* every logit NaN */
    /* softmax over the candidates at the temperature (weights rounded to float) */
    double sum = 0, mx = c[0].v;
    for (int i = 0; i < n; i++) {
        c[i].v = (float)exp(((double)c[i].v - mx) / p->temperature);
        sum += c[i].v;
    }
    /* top-p: the smallest prefix whose mass reaches top_p; min-p: prob >= min_p * max */
    double cum = 0, keep_mass = 0;
    int m = n;
    for (int i = 0; i < n; i++) {
        double pr = c[i].v / sum;
        if (p->min_p > 0 && pr < p->min_p * (c[0].v / sum)) { m = i; break; }
        keep_mass += c[i].v;
        cum += pr;
        if (cum >= p->top_p) { m = i + 1; break; }
    }
    if (m < 1) m = 1;
    if (m != n) {
        keep_mass = 0;
        for (int i = 0; i < m; i++) keep_mass += c[i].v;
    }
    double u = (double)p->u * keep_mass, acc = 0;
    token = c[m - 1].id;
    for (int i = 0; i < m; i++) {
        acc += c[i].v;
        if (u < acc) { token = c[i].id; break; }
    }
    return token;
}

