/* test_cuda_graphs: decode steps replayed from captured CUDA graphs give bit-identical logits to
 * the same steps run eagerly (the same kernels on the same buffers), on both architectures; and
 * dummy weights are the same on the CPU and the GPU (one fill function), so their logits agree. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/runner.h"
#include "base/knobs.h"
#include "test.h"

static long g_side_calls; /* the backend's be_side_begin calls that went beside, in the last decode_logits */

static float *decode_logits(const char *dir, int graphs, int steps)
{
    Model m, dm;
    model_load(&m, dir);
    Backend be;
    backend_cuda_init(&be, 0);
    model_upload(&dm, &m, &be);
    Runner r;
    runner_init(&r, &dm, &be, 64, 16, 16);
    if (graphs) runner_enable_graphs(&r);
    int V = m.cfg.vocab, prompt[12] = {5, 9, 2, 7, 1, 3, 3, 8, 100, 41, 7, 2};
    float *out = malloc((size_t)(steps + 1) * V * sizeof(float));
    runner_feed(&r, prompt, 12, 0, out);
    for (int s = 0; s < steps; s++) {
        const float *l = out + (size_t)s * V;
        int best = 0;
        for (int v = 1; v < V; v++) best = l[v] > l[best] ? v : best;
        runner_feed(&r, &best, 1, 0, out + (size_t)(s + 1) * V);
    }
    g_side_calls = cuda_side_calls(&be);
    runner_free(&r);
    model_upload_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    return out;
}

TEST(cuda_graph_decode_equals_eager)
{
    const char *names[] = {"golden/glm5-nvfp4", "golden/glm4moe-bf16"};
    for (int i = 0; i < 2; i++) {
        const char *dir = test_data(names[i]);
        float *a = decode_logits(dir, 0, 8), *b = decode_logits(dir, 1, 8);
        Model m;
        model_load(&m, dir);
        size_t n = (size_t)9 * m.cfg.vocab, diff = 0;
        model_free(&m);
        for (size_t k = 0; k < n; k++) diff += a[k] != b[k];
        EXPECT(diff == 0, "%s: %zu of %zu logits differ between graph and eager decode", names[i], diff, n);
        free(a);
        free(b);
    }
}

/* The pieces that run beside (be_side_begin, on stream3 with its own scratch and cuBLASLt
 * workspace: the MoE layers' shared expert, GLM-5's indexer) give the same logits, bit for bit,
 * as in order, eager and from graphs: the same kernels on the same inputs, added in the same
 * order. glm4moe-bf16's shared expert goes through the cuBLASLt route while the router's GEMM
 * does on the stream: one scratch set between them would race. At 64 rows the prompt's 12-token
 * step and every decode step go beside. */
TEST(cuda_side_equals_in_order)
{
    const char *names[] = {"golden/glm5-nvfp4", "golden/glm4moe-bf16"};
    for (int i = 0; i < 2; i++) {
        const char *dir = test_data(names[i]);
        knob_override(KNOB_SHARED_SIDE, 0);
        knob_override(KNOB_INDEXER_SIDE, 0);
        float *a = decode_logits(dir, 1, 8);
        EXPECT(g_side_calls == 0, "%s: %ld calls beside with the side off", names[i], g_side_calls);
        knob_override(KNOB_SHARED_SIDE, 64);
        knob_override(KNOB_INDEXER_SIDE, 64);
        float *b = decode_logits(dir, 1, 8);
        long calls_b = g_side_calls;
        float *e = decode_logits(dir, 0, 8);
        long calls_e = g_side_calls;
        knob_override(KNOB_SHARED_SIDE, -1);
        knob_override(KNOB_INDEXER_SIDE, -1);
        Model m;
        model_load(&m, dir);
        int per_step = 0; /* a MoE layer with shared experts, a layer with its own indexer: one each */
        for (int l = 0; l < m.cfg.n_layers; l++)
            per_step += (m.cfg.layer_moe[l] && m.cfg.n_shared_experts > 0) +
                        (m.cfg.index_n_heads > 0 && m.cfg.layer_indexer[l] == INDEXER_FULL);
        /* eager: every such piece of the 9 steps; graphs: at least the prompt's step (the decode
         * steps' graphs call it when captured, not when replayed) */
        EXPECT(per_step > 0 && calls_e == 9L * per_step, "%s: %ld calls beside in 9 eager steps of %d pieces", names[i], calls_e,
               per_step);
        EXPECT(calls_b >= per_step, "%s: %ld calls beside with graphs", names[i], calls_b);
        size_t n = (size_t)9 * m.cfg.vocab, db = 0, de = 0;
        model_free(&m);
        for (size_t k = 0; k < n; k++) db += a[k] != b[k], de += a[k] != e[k];
        EXPECT(db == 0, "%s: %zu of %zu logits differ between the pieces beside (graphs) and in order", names[i], db, n);
        EXPECT(de == 0, "%s: %zu of %zu logits differ between the pieces beside (eager) and in order", names[i], de, n);
        free(a);
        free(b);
        free(e);
    }
}

TEST(cuda_dummy_weights_match_cpu)
{
    char cmd[8192], *out = NULL;
    const char *dir = test_data("golden/glm5-bf16");
    for (int d = 0; d < 2; d++) {
        snprintf(cmd, sizeof cmd, "%s logits --model %s --dummy-weights --tokens 4,8,15,16,23,42 --device %s "
                 "--kv-cache-dtype float32 --out %s/dummy-%d.f32", test_bin(), dir, d ? "cuda" : "cpu", test_tmpdir(), d);
        int rc = test_run(cmd, &out);
        EXPECT(rc == 0, "%s: %s", cmd, out);
        free(out);
    }
    char p0[600], p1[600];
    snprintf(p0, sizeof p0, "%s/dummy-0.f32", test_tmpdir());
    snprintf(p1, sizeof p1, "%s/dummy-1.f32", test_tmpdir());
    FILE *f0 = fopen(p0, "rb"), *f1 = fopen(p1, "rb");
    ASSERT(f0 && f1);
    float a[4096], b[4096];
    size_t na = fread(a, 4, 4096, f0), nb = fread(b, 4, 4096, f1);
    fclose(f0);
    fclose(f1);
    ASSERT(na == nb && na > 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < na; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += (double)a[i] * a[i]; }
    EXPECT(sqrt(num / den) < 1e-4, "dummy logits differ: rel err %g", sqrt(num / den));
}

/* The engine on the GPU replays its decode steps as graphs (captured on first use, recaptured
 * when a scratch buffer grows): 4 requests of the built-in NVFP4 model decoded together give the
 * same greedy tokens with graphs as with --disable-cuda-graph (every decode step has 4 tokens,
 * a power of two, so the graph runs the very kernels the eager step runs). */
#include <unistd.h>

#include "engine/engine.h"

static void engine_tokens_spec(const Model *dm, Backend *be, int graphs, int spec_k, int out[4][24], EngineStats *st)
{
    EngineOptions o;
    engine_options_default(&o);
    o.spec_k = spec_k;
    o.max_running = 4;
    o.max_batch_tokens = 256;
    o.max_model_len = 512;
    o.n_blocks = 4 * 512 / 16;
    o.no_graphs = !graphs;
    int eos = 0;
    Engine *e = engine_create(dm, be, &o, &eos, 1);
    uint64_t id[4];
    for (int r = 0; r < 4; r++) {
        int prompt[20];
        for (int i = 0; i < 20; i++) prompt[i] = 3 + (r * 37 + i * 11) % 4000;
        RequestParams p = {.prompt = prompt, .n_prompt = 20, .max_tokens = 24, .ignore_eos = 1};
        sampling_params_default(&p.sampling);
        p.sampling.temperature = 0;
        char err[256];
        id[r] = engine_submit(e, &p, NULL, NULL, err, sizeof err);
        ASSERT(id[r], "%s", err);
    }
    engine_start(e);
    int n[4] = {0}, done = 0;
    for (int spin = 0; done < 4 && spin < 60000; spin++) {
        for (int r = 0; r < 4; r++) {
            EngineEvent ev[32];
            int k = engine_poll(e, id[r], ev, 32);
            for (int j = 0; j < k; j++) {
                if (ev[j].token >= 0 && n[r] < 24) out[r][n[r]++] = ev[j].token;
                if (ev[j].finish) done++;
            }
        }
        usleep(1000);
    }
    EXPECT(done == 4, "graphs %d: %d of 4 requests finished", graphs, done);
    if (st) engine_stats(e, st);
    engine_stop(e, 0);
    engine_free(e);
}

static void engine_tokens(const Model *dm, Backend *be, int graphs, int out[4][24])
{
    engine_tokens_spec(dm, be, graphs, 0, out, NULL);
}

TEST(cuda_engine_graphs_equal_eager)
{
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
    Model m, dm;
    model_load(&m, dir);
    Backend be;
    backend_cuda_init(&be, 0);
    model_upload(&dm, &m, &be);
    int a[4][24], b[4][24];
    memset(a, 0xff, sizeof a);
    memset(b, 0xff, sizeof b);
    engine_tokens(&dm, &be, 0, a);
    engine_tokens(&dm, &be, 1, b);
    EXPECT(memcmp(a, b, sizeof a) == 0, "greedy tokens differ between graph and eager decode in the engine");
    model_upload_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
}

/* Speculative decoding on the GPU (the built-in NVFP4 model's MTP layer, 3 drafts a step): the
 * verification steps and the MTP layer's passes replay graphs (padded to their sizes: chains of
 * unequal length, catch-ups of 1 to 4 positions), and the greedy tokens are those without drafts,
 * with graphs and without. */
TEST(cuda_engine_spec_graphs)
{
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/models/builtin-nvfp4", test_root());
    Model m, dm;
    model_load(&m, dir);
    ASSERT(m.cfg.n_mtp_layers > 0, "%s has no MTP layer", dir);
    model_load_mtp(&m, dir);
    Backend be;
    backend_cuda_init(&be, 0);
    model_upload(&dm, &m, &be);
    int plain[4][24], eager[4][24], graphs[4][24];
    memset(plain, 0xff, sizeof plain);
    memset(eager, 0xff, sizeof eager);
    memset(graphs, 0xff, sizeof graphs);
    EngineStats se, sg;
    engine_tokens(&dm, &be, 1, plain);
    engine_tokens_spec(&dm, &be, 0, 3, eager, &se);
    engine_tokens_spec(&dm, &be, 1, 3, graphs, &sg);
    EXPECT(se.graph_steps == 0 && se.graph_mtp_passes == 0, "--disable-cuda-graph: %llu graph steps",
           (unsigned long long)se.graph_steps);
    EXPECT(sg.graph_verify_steps > 0 && sg.graph_mtp_passes > 0, "%llu verification steps and %llu MTP passes from graphs",
           (unsigned long long)sg.graph_verify_steps, (unsigned long long)sg.graph_mtp_passes);
    EXPECT(sg.spec_draft_tokens > 0 && se.spec_draft_tokens > 0);
    fprintf(stderr, "    graphs: %llu of %llu steps (%llu verifying), %llu MTP passes; %llu of %llu drafts accepted\n",
            (unsigned long long)sg.graph_steps, (unsigned long long)sg.steps, (unsigned long long)sg.graph_verify_steps,
            (unsigned long long)sg.graph_mtp_passes, (unsigned long long)sg.spec_accepted_tokens,
            (unsigned long long)sg.spec_draft_tokens);
    EXPECT(memcmp(plain, eager, sizeof plain) == 0, "greedy tokens with drafts (eager) differ from without");
    EXPECT(memcmp(plain, graphs, sizeof plain) == 0, "greedy tokens with drafts (graphs) differ from without");
    model_upload_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
}
