/* test_sampler: greedy and its ties, seeded reproducibility, the sampled distribution against
 * the softmax (each frequency within 5 standard errors), top-k / top-p / min-p filters,
 * repetition / frequency / presence penalties, log-probabilities, parameter checks. */
#include <stdlib.h>
#include <string.h>

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
