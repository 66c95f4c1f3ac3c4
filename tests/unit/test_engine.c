/* test_engine: the step loop on the CPU with the built-in model (models/builtin-nvfp4). Greedy
 * outputs must not depend on what else is in the batch (the CPU ops compute every row the same
 * way whatever the batch), so every scheduling situation is checked against each request run
 * alone: concurrency above max_running (queueing), chunked prefill, preemption by recompute
 * when the KV pool is too small, prefix caching, cancellation, stop requests, max_tokens. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "../engine_harness.h"
#include "test.h"

#define MAXREQ 32
static Model M;
static Backend BE;
static int loaded;

static int setup(void)
{
    if (!loaded) {
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
        model_load(&M, dir);
        backend_cpu_init(&BE, 2);
        loaded = 1;
    }
    return 1;
}

static const int eos[3] = {8168, 8175, 8177};

/* prompt i: a deterministic run of ids from the text range of the vocabulary */
static int make_prompt(int i, int *p, int len)
{
    for (int k = 0; k < len; k++) p[k] = 300 + (int)((i * 7919u + k * 104729u) % 7000u);
    return len;
}

static RequestParams greedy(const int *p, int n, int max_tokens)
{
    RequestParams r = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .ignore_eos = 1};
    sampling_params_default(&r.sampling);
    r.sampling.temperature = 0;
    return r;
}

/* each request alone (max_running 1): the reference outputs */
static void solo(int n_req, const int *lens, int max_tokens, Out *ref)
{
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 1;
    o.n_blocks = 64;
    o.max_model_len = 1024;
    Engine *e = engine_create(&M, &BE, &o, eos, 3);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    for (int i = 0; i < n_req; i++) {
        int p[600];
        make_prompt(i, p, lens[i]);
        RequestParams r = greedy(p, lens[i], max_tokens);
        memset(&ref[i], 0, sizeof ref[i]);
        ref[i].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
        EXPECT(ref[i].id > 0);
        EXPECT(engine_collect(e, &w, &ref[i], 1) == 0, "solo request %d did not finish", i);
    }
    engine_stop(e, 1);
    engine_free(e);
}

static void run_batched(const EngineOptions *o, int n_req, const int *lens, int max_tokens, Out *out)
{
    Engine *e = engine_create(&M, &BE, o, eos, 3);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    for (int i = 0; i < n_req; i++) {
        int p[600];
        make_prompt(i, p, lens[i]);
        RequestParams r = greedy(p, lens[i], max_tokens);
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
        EXPECT(out[i].id > 0);
    }
    EXPECT(engine_collect(e, &w, out, n_req) == 0, "batched requests did not finish");
    EngineStats st;
    engine_stats(e, &st);
    if (o->n_blocks < 32) EXPECT(st.preemptions > 0, "a pool of %d blocks preempted nobody", o->n_blocks);
    fprintf(stderr, "    %llu steps, %llu preemptions, prefix %llu/%llu tokens\n", (unsigned long long)st.steps,
            (unsigned long long)st.preemptions, (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries);
    engine_stop(e, 1);
    engine_free(e);
}

static void expect_same(const Out *a, const Out *b, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        EXPECT(a[i].n == b[i].n && !memcmp(a[i].toks, b[i].toks, a[i].n * sizeof(int)),
               "%s: request %d: %d tokens vs %d alone", what, i, a[i].n, b[i].n);
        EXPECT(a[i].last.finish == FINISH_LENGTH && a[i].last.completion_tokens == b[i].last.completion_tokens,
               "%s: request %d finish %d tokens %d", what, i, a[i].last.finish, a[i].last.completion_tokens);
    }
}

TEST(engine_batching_matches_solo)
{
    ASSERT(setup());
    int n = 12, lens[12], mt = 12;
    for (int i = 0; i < n; i++) lens[i] = 5 + (i * 37) % 90;
    Out ref[12], got[12];
    solo(n, lens, mt, ref);
    for (int i = 0; i < n; i++) EXPECT_EQ_INT(ref[i].last.completion_tokens, mt);
    /* several requests a step, queueing beyond max_running, prefill chunks of 16 */
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 5;
    o.max_batch_tokens = 40;
    o.chunked_prefill = 16;
    o.n_blocks = 128;
    o.max_model_len = 1024;
    run_batched(&o, n, lens, mt, got);
    expect_same(got, ref, n, "batched");
    /* a pool too small for everyone at once: preemption by recompute */
    o.max_running = 8;
    o.max_batch_tokens = 256;
    o.max_model_len = 256;
    o.n_blocks = 20; /* 16 for one full-length request; 8 running prompts need about 40 */
    run_batched(&o, n, lens, mt, got);
    expect_same(got, ref, n, "preempted");
    o.max_model_len = 1024;
    /* more decode steps per round */
    o.n_blocks = 256;
    o.decode_steps = 4;
    run_batched(&o, n, lens, mt, got);
    expect_same(got, ref, n, "4 decode steps per round");
}

TEST(engine_prefix_cache)
{
    ASSERT(setup());
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 4;
    o.n_blocks = 128;
    o.max_model_len = 512;
    Engine *e = engine_create(&M, &BE, &o, eos, 3);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int p[200];
    make_prompt(3, p, 100);
    Out a = {0}, b = {0};
    RequestParams r = greedy(p, 100, 8);
    a.id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    ASSERT(engine_collect(e, &w, &a, 1) == 0);
    b.id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    ASSERT(engine_collect(e, &w, &b, 1) == 0);
    EXPECT_EQ_INT(a.last.cached_tokens, 0);
    EXPECT_EQ_INT(b.last.cached_tokens, 96); /* 6 full blocks of 16; the last token is computed */
    EXPECT(a.n == b.n && !memcmp(a.toks, b.toks, a.n * sizeof(int)), "the cached prefix changed the output");
    EngineStats st;
    engine_stats(e, &st);
    EXPECT(st.prefix_hits == 96 && st.prefix_queries == 200, "hits %llu queries %llu",
           (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries);
    engine_stop(e, 1);
    engine_free(e);
}

TEST(engine_cancel_finish_errors)
{
    ASSERT(setup());
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 4;
    o.n_blocks = 64;
    o.max_model_len = 256;
    Engine *e = engine_create(&M, &BE, &o, eos, 3);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int p[300];
    make_prompt(1, p, 20);
    char err[256];
    /* errors */
    RequestParams r = greedy(p, 0, 4);
    EXPECT(engine_submit(e, &r, NULL, NULL, err, sizeof err) == 0 && strstr(err, "empty"), "%s", err);
    make_prompt(2, p, 256);
    r = greedy(p, 256, 4);
    EXPECT(engine_submit(e, &r, NULL, NULL, err, sizeof err) == 0 && strstr(err, "context"), "%s", err);
    make_prompt(1, p, 20);
    p[3] = 99999;
    r = greedy(p, 20, 4);
    EXPECT(engine_submit(e, &r, NULL, NULL, err, sizeof err) == 0 && strstr(err, "vocabulary"), "%s", err);
    p[3] = 400;
    r = greedy(p, 20, 4);
    r.sampling.top_p = 2;
    EXPECT(engine_submit(e, &r, NULL, NULL, err, sizeof err) == 0 && strstr(err, "top_p"), "%s", err);
    /* a long request cancelled; a second finished by a stop request; a third runs to max_tokens */
    Out c[3] = {{0}};
    r = greedy(p, 20, 200);
    c[0].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    c[1].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    r = greedy(p, 20, 7);
    c[2].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    engine_cancel(e, c[0].id);
    engine_finish(e, c[1].id);
    c[0].done = 1;
    EXPECT(engine_collect(e, &w, c, 3) == 0, "requests did not finish");
    EXPECT_EQ_INT(c[1].last.finish, FINISH_STOP);
    EXPECT(c[1].n < 200, "a stop request did not stop: %d tokens", c[1].n);
    EXPECT_EQ_INT(c[2].last.finish, FINISH_LENGTH);
    EXPECT_EQ_INT(c[2].last.completion_tokens, 7);
    EXPECT_EQ_INT(c[2].n, 7);
    EngineEvent ev[4];
    EXPECT_EQ_INT(engine_poll(e, c[0].id, ev, 4), 0); /* cancelled: nothing more */
    EXPECT_EQ_INT(engine_poll(e, c[2].id, ev, 4), 0); /* finished and read: forgotten */
    /* max_tokens beyond the context: FINISH_LENGTH at the context */
    make_prompt(5, p, 250);
    r = greedy(p, 250, 100);
    Out d = {0};
    d.id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
    EXPECT(engine_collect(e, &w, &d, 1) == 0);
    EXPECT(d.last.finish == FINISH_LENGTH && d.last.completion_tokens == 6, "finish %d after %d tokens", d.last.finish,
           d.last.completion_tokens);
    EngineStats st;
    engine_stats(e, &st);
    EXPECT(st.running == 0 && st.waiting == 0, "running %d waiting %d", st.running, st.waiting);
    engine_stop(e, 1);
    engine_free(e);
}

/* Seeded sampling through the backend's sample op (every row's token a function of its logits:
 * the ids alone cross) gives the tokens of the host path (sampler_sample, taken when a request
 * asks for log-probabilities), batched with other requests or alone; a batch with one row that
 * needs the host takes the host path whole and still gives them. */
static const struct { float t; int k; float p, m; } sample_cases[6] = {
    {0.8f, 0, 1, 0}, {1, 40, 1, 0}, {0.7f, 0, 0.9f, 0}, {1.3f, 100, 0.8f, 0.05f}, {0.5f, 0, 1, 0.1f}, {2, 5, 0.95f, 0},
};

static void run_sampled(int max_running, const int *logprobs, Out *out)
{
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = max_running;
    o.max_batch_tokens = 64;
    o.chunked_prefill = 16;
    o.n_blocks = 128;
    o.max_model_len = 512;
    Engine *e = engine_create(&M, &BE, &o, eos, 3);
    engine_start(e);
    Waker w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    for (int i = 0; i < 6; i++) {
        int p[200], n = make_prompt(i, p, 5 + (i * 37) % 90);
        RequestParams r = {.prompt = p, .n_prompt = n, .max_tokens = 10, .ignore_eos = 1};
        sampling_params_default(&r.sampling);
        r.sampling.temperature = sample_cases[i].t;
        r.sampling.top_k = sample_cases[i].k;
        r.sampling.top_p = sample_cases[i].p;
        r.sampling.min_p = sample_cases[i].m;
        r.sampling.seed = 11 + i;
        r.sampling.logprobs = logprobs[i];
        memset(&out[i], 0, sizeof out[i]);
        out[i].id = engine_submit(e, &r, waker_on_event, &w, NULL, 0);
        EXPECT(out[i].id > 0);
        if (max_running == 1) EXPECT(engine_collect(e, &w, &out[i], 1) == 0, "request %d did not finish", i);
    }
    if (max_running > 1) EXPECT(engine_collect(e, &w, out, 6) == 0, "requests did not finish");
    engine_stop(e, 1);
    engine_free(e);
}

TEST(engine_sample_on_device_matches_host)
{
    ASSERT(setup());
    static const int host[6] = {0, 0, 0, 0, 0, 0}, device[6] = {-1, -1, -1, -1, -1, -1},
                     mixed[6] = {-1, -1, -1, 2, -1, -1};
    Out ref[6], got[6];
    long calls = BE.stats[OP_SAMPLE].calls;
    run_sampled(1, host, ref);
    EXPECT(BE.stats[OP_SAMPLE].calls == calls, "the host path ran %ld sample ops", BE.stats[OP_SAMPLE].calls - calls);
    int distinct = 0;
    for (int i = 0; i < 6; i++) {
        EXPECT_EQ_INT(ref[i].n, 10);
        for (int k = 1; k < ref[i].n; k++) distinct += ref[i].toks[k] != ref[i].toks[0];
    }
    EXPECT(distinct > 0, "every request repeated one token: nothing was sampled");
    const int *modes[3] = {device, device, mixed};
    const int running[3] = {1, 6, 6};
    const char *names[3] = {"on the device alone", "on the device batched", "one row on the host"};
    for (int m = 0; m < 3; m++) {
        calls = BE.stats[OP_SAMPLE].calls;
        run_sampled(running[m], modes[m], got);
        EXPECT(BE.stats[OP_SAMPLE].calls > calls, "%s: no sample op ran", names[m]);
        expect_same(got, ref, 6, names[m]);
    }
}
