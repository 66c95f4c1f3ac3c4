/* sampler: penalties, temperature, top-k / top-p / min-p and seeded sampling on the CPU
 * (sampler.h). The penalties change the logits here; what follows them, the draw itself, is
 * sample_row (backend/cpu/sample.c), the definition the backends' sample op shares. */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the token map ---- */

static int map_slot(const Sampler *s, int tok)
{
    unsigned h = (unsigned)tok * 2654435761u;
    int i = (int)(h & (unsigned)(s->cap - 1));
    while (s->keys[i] != -1 && s->keys[i] != tok) i = (i + 1) & (s->cap - 1);
    return i;
}

static void map_grow(Sampler *s)
{
    int oc = s->cap, *ok = s->keys, *ocnt = s->out_count;
    unsigned char *op = s->in_prompt;
    s->cap = oc ? oc * 2 : 64;
    s->keys = xmalloc(s->cap * sizeof(int));
    s->out_count = xcalloc(s->cap, sizeof(int));
    s->in_prompt = xcalloc(s->cap, 1);
    memset(s->keys, 0xff, s->cap * sizeof(int));
    for (int i = 0; i < oc; i++)
        if (ok[i] != -1) {
            int j = map_slot(s, ok[i]);
            s->keys[j] = ok[i];
            s->out_count[j] = ocnt[i];
            s->in_prompt[j] = op[i];
        }
    free(ok);
    free(ocnt);
    free(op);
}

static int map_get(Sampler *s, int tok)
{
    if (2 * (s->used + 1) > s->cap) map_grow(s);
    int i = map_slot(s, tok);
    if (s->keys[i] == -1) {
        s->keys[i] = tok;
        s->used++;
    }
    return i;
}

void sampler_init(Sampler *s, const SamplingParams *p, int vocab, const int *prompt, int n_prompt)
{
    *s = (Sampler){.p = *p, .vocab = vocab};
    uint64_t seed = p->seed >= 0 ? (uint64_t)p->seed : (uint64_t)(clock_now() * 1e9);
    rng_seed(&s->rng, seed);
    map_grow(s);
    if (p->repetition_penalty != 1.0f)
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= 0 && prompt[i] < vocab) {
                int k = map_get(s, prompt[i]); /* may grow the arrays: index after the call */
                s->in_prompt[k] = 1;
            }
}

void sampler_free(Sampler *s)
{
    free(s->keys);
    free(s->out_count);
    free(s->in_prompt);
    free(s->work);
    *s = (Sampler){0};
}

void sampler_accept(Sampler *s, int token)
{
    if (token >= 0 && token < s->vocab) {
        int k = map_get(s, token); /* may grow the arrays: index after the call */
        s->out_count[k]++;
    }
}

/* ---- sampling ---- */

static void log_softmax_top(const float *logits, int V, int n, SampleResult *r, int chosen)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    float lse = mx + (float)log(sum);
    r->logprob = logits[chosen] - lse;
    SampleCand c[SAMPLER_MAX_LOGPROBS];
    r->n_top = n > 0 ? sample_top_n(logits, V, n, c) : 0;
    for (int i = 0; i < r->n_top; i++) {
        r->top_ids[i] = c[i].id;
        r->top_logprobs[i] = c[i].v - lse;
    }
}

int sampler_sample(Sampler *s, float *logits, SampleResult *res)
{
    const SamplingParams *p = &s->p;
    int V = s->vocab;
    size_t need = sample_row_work(V) + (size_t)V * sizeof(float);
    if (need > s->work_cap) {
        free(s->work);
        s->work = xmalloc(need);
        s->work_cap = need;
    }
    float *raw = NULL;
    if (p->logprobs >= 0) { /* log-probabilities of the model's own distribution */
        raw = (float *)((char *)s->work + sample_row_work(V));
        memcpy(raw, logits, V * sizeof(float));
    }
    /* penalties on the tokens seen */
    if (p->repetition_penalty != 1.0f || p->frequency_penalty != 0 || p->presence_penalty != 0)
        for (int i = 0; i < s->cap; i++) {
            int t = s->keys[i];
            if (t < 0) continue;
            int cnt = s->out_count[i];
            if (p->repetition_penalty != 1.0f && (cnt > 0 || s->in_prompt[i])) {
                /* a penalty near 0 (the range allows 1e-40) overflows the division: the largest
                 * float, not inf, which would turn the softmax's shift into inf - inf */
                double v = logits[t] > 0 ? (double)logits[t] / p->repetition_penalty : (double)logits[t] * p->repetition_penalty;
                logits[t] = v > FLT_MAX ? FLT_MAX : (float)v;
            }
            if (cnt > 0) logits[t] -= p->frequency_penalty * cnt + p->presence_penalty;
        }
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] >= 0 && p->bias_id[i] < V) logits[p->bias_id[i]] += p->bias_val[i];
    SampleRow row;
    sampler_row(s, &row);
    int token = sample_row(logits, V, &row, s->work);
    res->token = token;
    res->n_top = 0;
    res->logprob = 0;
    if (raw) log_softmax_top(raw, V, p->logprobs, res, token);
    return token;
}

void sampler_score(const Sampler *s, const float *logits, int token, SampleResult *res)
{
    res->token = token;
    res->n_top = 0;
    res->logprob = 0;
    if (s->p.logprobs >= 0) log_softmax_top(logits, s->vocab, s->p.logprobs, res, token);
}

int sampler_logits_only(const Sampler *s)
{
    const SamplingParams *p = &s->p;
    return p->logprobs < 0 && p->repetition_penalty == 1.0f && p->frequency_penalty == 0 && p->presence_penalty == 0 &&
           p->n_bias == 0;
}

int sampler_is_argmax(const Sampler *s) { return s->p.temperature == 0 && sampler_logits_only(s); }

void sampler_row(Sampler *s, SampleRow *row)
{
    const SamplingParams *p = &s->p;
    *row = (SampleRow){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p};
    if (p->temperature > 0) row->u = rng_uniform(&s->rng); /* the one draw of this token */
}
