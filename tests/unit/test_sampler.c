/* test_sampler: greedy and its ties, seeded reproducibility, the sampled distribution against
 * the softmax (each frequency within 5 standard errors), top-k / top-p / min-p filters,
 * repetition / frequency / presence penalties, log-probabilities, parameter checks. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "test.h"

static int draw(const float *logits, int V, Sampler *s)
{
    float *l = malloc(V * sizeof(float));
    memcpy(l, logits, V * sizeof(float));
    SampleResult r;
    int t = sampler_sample(s, l, &r);
    free(l);
    return t;
}

TEST(sampler_greedy_ties_lowest)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 2.0f};
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0;
    Sampler s;
    sampler_init(&s, &p, 6, NULL, 0);
    EXPECT_EQ_INT(draw(l, 6, &s), 1);
    sampler_free(&s);
}

TEST(sampler_seed_reproducible)
{
    int V = 50;
    float l[50];
    for (int i = 0; i < V; i++) l[i] = (float)sin(i * 1.7) * 2;
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 1234;
    int a[64], b[64], c[64];
    Sampler s1, s2, s3;
    sampler_init(&s1, &p, V, NULL, 0);
    sampler_init(&s2, &p, V, NULL, 0);
    p.seed = 99;
    sampler_init(&s3, &p, V, NULL, 0);
    for (int i = 0; i < 64; i++) {
        a[i] = draw(l, V, &s1);
        b[i] = draw(l, V, &s2);
        c[i] = draw(l, V, &s3);
    }
    EXPECT(!memcmp(a, b, sizeof a), "same seed, different tokens");
    EXPECT(memcmp(a, c, sizeof a) != 0, "seeds 1234 and 99 gave identical 64-token runs");
    sampler_free(&s1); sampler_free(&s2); sampler_free(&s3);
}

/* Frequencies of n draws against probabilities pr (0 where a filter removes the token). */
static void check_distribution(SamplingParams *p, const float *l, int V, const double *pr, int n, uint64_t seed)
{
    Sampler s;
    p->seed = (int64_t)seed;
    sampler_init(&s, p, V, NULL, 0);
    int *cnt = calloc(V, sizeof(int));
    for (int i = 0; i < n; i++) cnt[draw(l, V, &s)]++;
    for (int i = 0; i < V; i++) {
        double f = (double)cnt[i] / n, se = sqrt(pr[i] * (1 - pr[i]) / n);
        if (pr[i] == 0) EXPECT(cnt[i] == 0, "token %d was filtered out but drawn %d times (seed %llu)", i, cnt[i], (unsigned long long)seed);
        else EXPECT(fabs(f - pr[i]) <= 5 * se + 1e-9, "token %d: frequency %.4f, probability %.4f (seed %llu)", i, f, pr[i], (unsigned long long)seed);
    }
    free(cnt);
    sampler_free(&s);
}

TEST(sampler_distributions)
{
    float l[5] = {1.0f, 2.0f, 0.0f, 2.5f, -1.0f};
    double e[5], pr[5], sum = 0;
    SamplingParams p;
    /* plain softmax at temperature 0.7 */
    sampling_params_default(&p);
    p.temperature = 0.7f;
    for (int i = 0; i < 5; i++) sum += (e[i] = exp(l[i] / 0.7));
    for (int i = 0; i < 5; i++) pr[i] = e[i] / sum;
    check_distribution(&p, l, 5, pr, 40000, 1);
    /* top-k 2: tokens 3 and 1, renormalised */
    sampling_params_default(&p);
    p.top_k = 2;
    double a = exp(2.5), b = exp(2.0);
    double pk[5] = {0, b / (a + b), 0, a / (a + b), 0};
    check_distribution(&p, l, 5, pk, 40000, 2);
    /* top-p: softmax(l) = .. token 3 0.49, 1 0.30, 0 0.11: top_p 0.75 keeps 3 and 1 */
    sampling_params_default(&p);
    p.top_p = 0.75f;
    check_distribution(&p, l, 5, pk, 40000, 3);
    /* min-p 0.2: keep tokens with p >= 0.2 * p_max = 0.098: 3, 1, 0 */
    sampling_params_default(&p);
    p.min_p = 0.2f;
    double c0 = exp(1.0), s3 = a + b + c0;
    double pm[5] = {c0 / s3, b / s3, 0, a / s3, 0};
    check_distribution(&p, l, 5, pm, 40000, 4);
}

TEST(sampler_penalties)
{
    float l[4] = {3.0f, 2.9f, -1.0f, 0.5f};
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0;
    /* repetition penalty on a prompt token: 3.0 / 1.2 = 2.5 < 2.9 */
    p.repetition_penalty = 1.2f;
    int prompt[1] = {0};
    Sampler s;
    sampler_init(&s, &p, 4, prompt, 1);
    EXPECT_EQ_INT(draw(l, 4, &s), 1);
    sampler_free(&s);
    /* frequency penalty: token 0 generated twice: 3.0 - 2 * 0.1 = 2.8 < 2.9 */
    sampling_params_default(&p);
    p.temperature = 0;
    p.frequency_penalty = 0.1f;
    sampler_init(&s, &p, 4, NULL, 0);
    EXPECT_EQ_INT(draw(l, 4, &s), 0);
    sampler_accept(&s, 0);
    EXPECT_EQ_INT(draw(l, 4, &s), 0); /* 2.9 vs 2.9: tie -> 0 */
    sampler_accept(&s, 0);
    EXPECT_EQ_INT(draw(l, 4, &s), 1);
    sampler_free(&s);
    /* a denormal repetition penalty: the seen positive logits become the largest float (0.5 /
     * 1e-40 overflows), not inf: greedy and sampled draws take only them, never the NaN softmax's junk */
    float l6[6] = {3.0f, 2.9f, 0.5f, -1.0f, 1.0f, 0.2f};
    sampling_params_default(&p);
    p.repetition_penalty = 1e-40f;
    p.seed = 7;
    int seen[2] = {2, 0}, got[6] = {0};
    sampler_init(&s, &p, 6, seen, 2);
    for (int i = 0; i < 50; i++) {
        int t = draw(l6, 6, &s);
        EXPECT(t == 0 || t == 2, "draw %d with a denormal repetition penalty: token %d", i, t);
        got[t >= 0 && t < 6 ? t : 1]++;
    }
    EXPECT(got[0] > 0 && got[2] > 0, "two seen tokens at the largest float, drawn alike: %d and %d of 50", got[0], got[2]);
    sampler_free(&s);
    p.temperature = 0;
    sampler_init(&s, &p, 6, seen, 2);
    EXPECT_EQ_INT(draw(l6, 6, &s), 0); /* both at the largest float: the tie to the lower id */
    sampler_free(&s);
    /* presence penalty: once is enough */
    sampling_params_default(&p);
    p.temperature = 0;
    p.presence_penalty = 0.2f;
    sampler_init(&s, &p, 4, NULL, 0);
    sampler_accept(&s, 0);
    EXPECT_EQ_INT(draw(l, 4, &s), 1);
    sampler_free(&s);
}

TEST(sampler_logprobs)
{
    float l[5] = {1.0f, 2.0f, 0.0f, 2.5f, -1.0f};
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0;
    p.logprobs = 3;
    p.frequency_penalty = 0.5f; /* penalties do not change the reported log-probabilities */
    Sampler s;
    sampler_init(&s, &p, 5, NULL, 0);
    sampler_accept(&s, 3);
    float w[5];
    memcpy(w, l, sizeof w);
    SampleResult r;
    int t = sampler_sample(&s, w, &r);
    double lse = 0;
    for (int i = 0; i < 5; i++) lse += exp(l[i]);
    lse = log(lse);
    EXPECT_EQ_INT(t, 1); /* token 3: 2.5 - 0.5 = 2.0 ties token 1: the lower id wins */
    EXPECT_EQ_INT(r.n_top, 3);
    EXPECT_EQ_INT(r.top_ids[0], 3);
    EXPECT_EQ_INT(r.top_ids[1], 1);
    EXPECT_EQ_INT(r.top_ids[2], 0);
    EXPECT_NEAR(r.top_logprobs[0], 2.5 - lse, 1e-5, 0);
    EXPECT_NEAR(r.logprob, l[t] - lse, 1e-5, 0);
    sampler_free(&s);
}

TEST(sampler_param_checks)
{
    SamplingParams p;
    sampling_params_default(&p);
    EXPECT(sampling_params_check(&p) == NULL);
    p.temperature = -1;
    EXPECT(sampling_params_check(&p) != NULL);
    sampling_params_default(&p);
    p.top_p = 0;
    EXPECT(sampling_params_check(&p) != NULL);
    sampling_params_default(&p);
    p.logprobs = 21;
    EXPECT(sampling_params_check(&p) != NULL);
    sampling_params_default(&p);
    p.repetition_penalty = 0;
    EXPECT(sampling_params_check(&p) != NULL);
}

/* many distinct tokens grow the token map several times while counts are recorded */
TEST(sampler_map_growth)
{
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0;
    p.frequency_penalty = 1.0f;
    p.repetition_penalty = 1.5f;
    int V = 5000, prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = (i * 7) % V;
    Sampler s;
    sampler_init(&s, &p, V, prompt, 300);
    for (int t = 0; t < 2000; t++) sampler_accept(&s, (t * 13) % V);
    float *l = calloc(V, sizeof(float));
    l[13] = 1.0f; /* accepted once, out of the prompt: 1.0 / 1.5 - 1.0 < 0; token 1 stays 0 */
    SampleResult r;
    EXPECT_EQ_INT(sampler_sample(&s, l, &r), 1);
    free(l);
    sampler_free(&s);
}

/* ---- the sample op (be_sample, sample_row) against the sampler ---- */

/* the logits of the pinned runs: normal * 2, a tie of 1.0 every 7 ids, the last id tied with id 2 */
static void pinned_logits(float *l, int V)
{
    Rng r;
    rng_seed(&r, 77 + V);
    for (int i = 0; i < V; i++) l[i] = i % 7 == 3 ? 1.0f : rng_normal(&r) * 2;
    if (V > 5) l[V - 1] = l[2];
}

/* Seeded tokens recorded before sampling moved into sample_row (commit 6559c55's sampler): a
 * seed must keep giving the same tokens. */
TEST(sampler_seeded_tokens_pinned)
{
    static const struct { float t; int k; float p, m, rep; int64_t seed; int want[24]; } cases[] = {
        {0.8f, 0, 1, 0, 1, 7, {9, 5, 40, 25, 9, 9, 9, 9, 9, 9, 9, 46, 42, 40, 40, 9, 40, 9, 35, 40, 36, 9, 9, 9}},
        {1, 0, 1, 0, 1.3f, 1200, {40, 46, 9, 43, 36, 29, 20, 9, 9, 9, 25, 37, 42, 9, 40, 5, 9, 25, 35, 9, 9, 46, 9, 43}},
        {1, 5, 0.9f, 0.05f, 1, 1222, {46, 40, 46, 46, 9, 9, 9, 9, 9, 9, 40, 40, 40, 40, 46, 9, 40, 9, 9, 9, 9, 9, 9, 9}},
        {2, 0, 1, 0, 1.3f, 1300, {37, 40, 35, 27, 44, 41, 4, 43, 34, 42, 3, 47, 7, 5, 42, 5, 9, 14, 14, 35, 5, 27, 40, 36}},
        {2, 49, 1, 0, 1, 1330, {35, 35, 32, 8, 7, 15, 35, 25, 46, 21, 9, 47, 14, 42, 40, 2, 36, 17, 9, 20, 40, 15, 40, 40}},
        {2, 50, 1, 0.05f, 1, 1341, {45, 40, 24, 39, 42, 37, 27, 49, 40, 40, 32, 47, 27, 28, 35, 36, 9, 37, 10, 36, 46, 40, 17, 31}},
    };
    int V = 50, prompt[3] = {0, 1, 2};
    float l[50];
    pinned_logits(l, V);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SamplingParams p;
        sampling_params_default(&p);
        p.temperature = cases[c].t;
        p.top_k = cases[c].k;
        p.top_p = cases[c].p;
        p.min_p = cases[c].m;
        p.repetition_penalty = cases[c].rep;
        p.seed = cases[c].seed;
        Sampler s;
        sampler_init(&s, &p, V, prompt, 3);
        for (int n = 0; n < 24; n++) {
            int t = draw(l, V, &s);
            sampler_accept(&s, t);
            EXPECT(t == cases[c].want[n], "seed %lld token %d: %d, recorded %d", (long long)p.seed, n, t, cases[c].want[n]);
        }
        sampler_free(&s);
    }
}

/* Row r of a case: normal logits, every other row rounded to 1/4 (ties, ties across ids), and a
 * -inf here and there. */
static void op_logits(Rng *r, float *l, int V, int row)
{
    for (int i = 0; i < V; i++) {
        float v = rng_normal(r) * 2;
        l[i] = row % 2 ? roundf(v * 4) / 4 : v;
    }
    if (row % 3 == 2 && V > 3) l[V / 3] = -INFINITY;
}

/* be_sample on the cpu (sampler_row's parameters, all rows at once) against sampler_sample row by
 * row, with the same seeds, for 4 tokens in a row: the same ids, the generators in step. */
TEST(sampler_sample_op_matches_sampler)
{
    static const float Ts[] = {0, 0.3f, 1, 2}, Ps[] = {1, 0.9f, 0.2f, 1e-6f}, Ms[] = {0, 0.05f};
    static const int Vs[] = {1, 2, 7, 50, 1000};
    static const int row_counts[] = {1, 3, 8};
    Backend be;
    backend_cpu_init(&be, 2);
    Rng r;
    rng_seed(&r, 20240605);
    fprintf(stderr, "    seed 20240605\n");
    int cases = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++) {
        int V = Vs[vi];
        int Ks[5] = {0, 1, 5, V - 1, V};
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 5; b++)
                for (int c = 0; c < 4; c++)
                    for (int d = 0; d < 2; d++) {
                        int rows = row_counts[(a + b + c + d) % 3];
                        float *l = malloc((size_t)rows * V * sizeof(float)), *w = malloc((size_t)V * sizeof(float));
                        Sampler *host = calloc(rows, sizeof(Sampler)), *dev = calloc(rows, sizeof(Sampler));
                        SampleRow *rp = calloc(rows, sizeof(SampleRow));
                        int *ids = calloc(rows, sizeof(int));
                        for (int i = 0; i < rows; i++) {
                            SamplingParams p;
                            sampling_params_default(&p);
                            p.temperature = Ts[a];
                            p.top_k = Ks[b];
                            p.top_p = Ps[c];
                            p.min_p = Ms[d];
                            p.seed = 1000 * cases + i;
                            sampler_init(&host[i], &p, V, NULL, 0);
                            sampler_init(&dev[i], &p, V, NULL, 0);
                        }
                        for (int step = 0; step < 4; step++) {
                            for (int i = 0; i < rows; i++) {
                                op_logits(&r, l + (size_t)i * V, V, i + step);
                                sampler_row(&dev[i], &rp[i]);
                            }
                            be_sample(&be, ids, l, rows, V, rp);
                            for (int i = 0; i < rows; i++) {
                                memcpy(w, l + (size_t)i * V, V * sizeof(float));
                                SampleResult res;
                                int want = sampler_sample(&host[i], w, &res);
                                EXPECT(ids[i] == want, "V %d T %g top_k %d top_p %g min_p %g row %d/%d step %d: op %d, sampler %d",
                                       V, Ts[a], Ks[b], Ps[c], Ms[d], i, rows, step, ids[i], want);
                                sampler_accept(&host[i], want);
                                sampler_accept(&dev[i], ids[i]);
                            }
                        }
                        for (int i = 0; i < rows; i++) {
                            sampler_free(&host[i]);
                            sampler_free(&dev[i]);
                        }
                        free(l); free(w); free(host); free(dev); free(rp); free(ids);
                        cases++;
                    }
    }
    EXPECT(be.stats[OP_SAMPLE].calls == 4L * cases, "%ld sample ops counted for %d", be.stats[OP_SAMPLE].calls, 4 * cases);
    backend_free(&be);
}
