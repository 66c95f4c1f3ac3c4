/* test_sim: --device sim:GPU, the modelled device (src/backend/sim, src/dist/comm_sim.c,
 * src/cli/sim_device.c). The server under `bench serve` on a config-only model, generate's
 * repeatable output, a model too big for the modelled memory refused, the draws (decodable, never
 * an end of sequence unless asked), the clock (the host runs ahead and waits at a download) and a
 * simulated pipeline's schedule. Modelled times are exact, so they are checked exactly; wall-clock
 * checks are only lower bounds (a sleep is never shorter) or bounds seconds wide. */
#include "../test.h"

#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/sim/sim.h"
#include "base/util.h"
#include "cli/cli.h"
#include "dist/dist.h"
#include "server_harness.h"

/* A model directory of config.json alone (a release's, from tests/data/configs) plus the tiny
 * synth model's tokenizer: no weights. */
static const char *sim_model(const char *name, const char *config)
{
    static char dirs[4][600];
    static int next;
    char *dir = dirs[next++ % 4];
    snprintf(dir, sizeof dirs[0], "%s/sim-%s", test_tmpdir(), name);
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/config.json' '%s/' && cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'",
             dir, test_data(config), dir, model_dir(), model_dir(), dir);
    if (system(cmd) != 0) fprintf(stderr, "    $ %s failed\n", cmd);
    return dir;
}

TEST(sim_serve_completes_every_request_under_bench_serve)
{
    const char *dir = sim_model("air", "configs/glm4.5-air");
    Srv s;
    ASSERT(srv_start_model(&s, "sim", dir, "--device sim:h200 --num-layers 4 --max-running-requests 16") == 0);
    char file[600], cmd[2400];
    snprintf(file, sizeof file, "%s/sim-bench.jsonl", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s bench serve --base-url http://127.0.0.1:%d --dataset-name random-ids --random-input-len 64 "
             "--random-output-len 16 --random-range-ratio 1 --num-prompts 24 --max-concurrency 8 --warmup-requests 0 "
             "--output-file %s --quiet", test_bin(), s.port, file);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    EXPECT(rc == 0, "bench serve: %d\n%s", rc, out);
    free(out);
    json_error_t jerr;
    json_t *j = json_load_file(file, JSON_DECODE_ANY, &jerr);
    EXPECT(j, "%s: %s", file, jerr.text);
    if (j) {
        EXPECT_EQ_INT(jint(j, "completed"), 24);
        EXPECT_EQ_INT(jint(j, "failed"), 0);
        EXPECT_EQ_INT(jint(j, "total_output_tokens"), 24 * 16); /* no draw ended a request early */
        const char *dev = jstr(j, "server_info.device");
        EXPECT(dev && strstr(dev, "sim:h200"), "server_info.device: %s", dev ? dev : "(none)");
        json_decref(j);
    }
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    if (test_failed_now()) srv_print_log(&s);
}

/* stdout of generate (the prompt and its continuation); stderr to /dev/null or kept */
/* The modelled device and plan share one cost model: GLM-4.5-Air's whole shape (46 layers, NVFP4) on
 * one H200 at concurrency 32, 512 in / 128 out, served under bench serve, gives the output rate plan
 * predicts for that deployment, workload and scheduler, within 30%. The rate is the modelled
 * device's (output tokens over the time it was busy, from the sim's last log line), so a slow host
 * does not move it: the host runs ahead of the device and only waits for it. */
TEST(sim_agrees_with_plan_on_glm45_air)
{
    const char *dir = sim_model("air-plan", "configs/glm4.5-air");
    char cmd[2400], file[600];
    snprintf(cmd, sizeof cmd, "'%s' plan --model '%s' --gpu h200 --gpus 1 --layouts tp1 --input-len 512 --output-len 128 "
             "--concurrency 32 --max-running-requests 32 --json", test_bin(), dir);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    json_error_t jerr;
    json_t *plan = rc == 0 && out ? json_loads(out, 0, &jerr) : NULL;
    ASSERT(plan != NULL, "plan: exit %d\n%s", rc, out ? out : "");
    free(out);
    json_t *pt = jget(plan, "layouts.0.points.0");
    double predicted = pt ? json_number_value(json_object_get(pt, "output_tok_s")) : 0;
    json_decref(plan);
    ASSERT(predicted > 0, "plan predicted no output rate");

    Srv s;
    ASSERT(srv_start_model(&s, "sim-plan", dir, "--device sim:h200 --max-running-requests 32") == 0);
    snprintf(file, sizeof file, "%s/sim-plan-bench.jsonl", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s bench serve --base-url http://127.0.0.1:%d --dataset-name random-ids --random-input-len 512 "
             "--random-output-len 128 --random-range-ratio 1 --num-prompts 64 --max-concurrency 32 --warmup-requests 0 "
             "--output-file %s --quiet", test_bin(), s.port, file);
    rc = test_run(cmd, &out);
    EXPECT(rc == 0, "bench serve: %d\n%s", rc, out);
    free(out);
    json_t *j = json_load_file(file, JSON_DECODE_ANY, &jerr);
    long long toks = j ? jint(j, "total_output_tokens") : 0;
    EXPECT(j && jint(j, "completed") == 64 && toks == 64 * 128, "bench serve: %s", j ? "requests or tokens short" : jerr.text);
    if (j) json_decref(j);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    /* "...: the device was busy B s of L s (...)" */
    double busy = 0;
    FILE *f = fopen(s.log, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "the device was busy ");
        if (p) busy = atof(p + strlen("the device was busy "));
    }
    if (f) fclose(f);
    EXPECT(busy > 0, "no busy time in the server's log");
    if (busy > 0 && toks > 0) {
        double simulated = toks / busy;
        EXPECT(simulated > predicted * 0.7 && simulated < predicted * 1.3, "sim %.1f tok/s, plan %.1f tok/s", simulated,
               predicted);
    }
    if (test_failed_now()) srv_print_log(&s);
}

/* diagnose on the modelled device shows plan's breakdown beside the measured one; the two come
 * from one cost model, so the large categories agree (GLM-4.5-Air's shape, 4 layers, batch 16). */
TEST(sim_diagnose_shows_the_plan_beside_the_measurement)
{
    const char *dir = sim_model("air-diag", "configs/glm4.5-air");
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "'%s' diagnose '%s' --dummy-weights --num-layers 4 --device sim:h200 --batch 16 "
             "--input-len 128 --output-len 32 --json 2>/dev/null", test_bin(), dir);
    char *out = NULL;
    int rc = test_run(cmd, &out);
    json_error_t jerr;
    json_t *o = rc == 0 && out ? json_loads(out, 0, &jerr) : NULL;
    ASSERT(o != NULL, "diagnose: exit %d\n%s", rc, out ? out : "");
    free(out);
    json_t *plan = json_object_get(o, "plan");
    ASSERT(plan != NULL, "no plan beside the measurement");
    EXPECT(jstr(plan, "profile") && !strcmp(jstr(plan, "profile"), "h200"), "profile %s", jstr(plan, "profile"));
    EXPECT(jstr(plan, "layout") && !strcmp(jstr(plan, "layout"), "tp1"), "layout %s", jstr(plan, "layout"));
    double pm = json_number_value(jget(plan, "step_ms.predicted")), mm = json_number_value(jget(plan, "step_ms.measured"));
    EXPECT(pm > 0 && mm > 0 && fabs(pm - mm) < 0.25 * mm, "step: %.3f ms measured, %.3f predicted", mm, pm);
    json_t *off = json_object_get(plan, "disagree");
    EXPECT(json_is_array(off), "disagree is a list");
    for (size_t i = 0; i < json_array_size(off); i++) {
        const char *c = json_string_value(json_array_get(off, i));
        EXPECT(c && strcmp(c, "moe_gemm") && strcmp(c, "dense_gemm"), "%s disagrees on one cost model", c ? c : "?");
    }
    EXPECT(json_number_value(jget(plan, "breakdown.moe_gemm.predicted_ms")) > 0, "moe_gemm predicted");
    json_decref(o);
}

static char *generate(const char *dir, const char *extra, int keep_err, int *rc)
{
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:h200 --num-layers 2 --prompt 'Hello' --max-tokens 24 %s %s",
             test_bin(), dir, extra, keep_err ? "2>&1 >/dev/null" : "2>/dev/null");
    *rc = test_run(cmd, &out);
    return out;
}

TEST(sim_generate_is_repeatable_and_never_ends_early)
{
    const char *dir = sim_model("air", "configs/glm4.5-air");
    /* greedy (argmax on the device), sampled on the device, and the host sampler (a penalty
     * takes the logits to the host): each the same twice, each 24 tokens */
    const char *modes[] = {"--temperature 0", "--temperature 0.8 --seed 7", "--temperature 0 --repetition-penalty 1.3"};
    for (int m = 0; m < 3; m++) {
        int rc1, rc2, rc3;
        char *a = generate(dir, modes[m], 0, &rc1), *b = generate(dir, modes[m], 0, &rc2);
        char *log = generate(dir, modes[m], 1, &rc3);
        EXPECT(rc1 == 0 && rc2 == 0 && rc3 == 0, "%s: exit %d %d %d\n%s", modes[m], rc1, rc2, rc3, log);
        EXPECT(a && b && !strcmp(a, b), "%s: two runs differ:\n%s\n%s", modes[m], a, b);
        EXPECT(a && strlen(a) > strlen("Hello") + 5 && !strncmp(a, "Hello", 5), "%s: output '%s'", modes[m], a);
        EXPECT(log && strstr(log, "decode: 24 tokens") && strstr(log, "finish: length"), "%s:\n%s", modes[m], log);
        free(a);
        free(b);
        free(log);
    }
}

TEST(sim_refuses_a_model_too_big_for_the_device_and_runs_its_layouts)
{
    const char *dir = sim_model("glm5", "configs/glm5");
    char cmd[2400], *out = NULL;
    /* GLM-5 in NVFP4 is about 390 GiB: not on one H200 (141 GB), an eighth of it on each of 8 */
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:h200 --prompt 'Hi' --max-tokens 2", test_bin(), dir);
    int rc = test_run(cmd, &out);
    EXPECT(rc != 0 && out && strstr(out, "the model does not fit"), "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:h200 --tp 8 --prompt 'Hi' --max-tokens 2", test_bin(), dir);
    rc = test_run(cmd, &out);
    EXPECT(rc == 0 && out && strstr(out, "finish: length"), "exit %d:\n%s", rc, out);
    free(out);
    /* and as a pipeline of two stages of TP4, replayed from stage 0 */
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:h200 --tp 4 --pp 2 --prompt 'Hi' --max-tokens 2", test_bin(), dir);
    rc = test_run(cmd, &out);
    EXPECT(rc == 0 && out && strstr(out, "8 simulated ranks (tp 4, pp 2") && strstr(out, "finish: length"), "exit %d:\n%s",
           rc, out);
    free(out);
    /* attention data parallelism is planned, not simulated: said, not crashed */
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:h200 --tp 8 --dp 8 --prompt 'Hi' --max-tokens 2", test_bin(), dir);
    rc = test_run(cmd, &out);
    EXPECT(rc != 0 && rc != 136 && out && strstr(out, "--dp 8 is not simulated"), "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' generate '%s' --device sim:b17 --tp 8 --prompt 'Hi' --max-tokens 2", test_bin(), dir);
    rc = test_run(cmd, &out);
    EXPECT(rc != 0 && out && strstr(out, "unknown GPU 'b17': known GPUs are b200, cpu, h100, h200, rtx-pro-6000"), "exit %d:\n%s", rc, out);
    free(out);
}

/* ---- in this process: a timer of round numbers ---- */

static double fixed_op(void *ctx, OpId op, double flops, double bytes, int rows, QFormat wfmt)
{
    (void)op, (void)flops, (void)bytes, (void)rows, (void)wfmt;
    return *(double *)ctx;
}

static double free_comm(void *ctx, OpId op, double bytes, int ranks)
{
    (void)ctx, (void)op, (void)bytes, (void)ranks;
    return 0;
}

TEST(sim_memory_is_the_devices_and_the_kv_pool_gets_what_is_left)
{
    double op_s = 0;
    SimTimer t = {.op_seconds = fixed_op, .comm_seconds = free_comm, .ctx = &op_s, .mem_bytes = 10e9, .name = "t"};
    Backend be;
    backend_sim_init(&be, &t);
    size_t free0 = be_mem_free(&be);
    EXPECT_EQ_INT((long long)free0, (long long)(10e9 - (double)(1u << 30))); /* a runtime's reserve gone */
    void *w = be_alloc(&be, (size_t)6e9); /* reserved, never written: no host memory */
    EXPECT_EQ_INT((long long)be_mem_free(&be), (long long)(free0 - (size_t)6e9));
    EXPECT_EQ_INT((long long)sim_mem_used(&be), (long long)6e9);
    be_free(&be, w);
    EXPECT_EQ_INT((long long)be_mem_free(&be), (long long)free0);
    backend_free(&be);
}

TEST(sim_draws_decode_to_text_and_are_never_eos_unless_asked)
{
    ModelText *mt = model_text();
    int V = tokenizer_vocab_size(mt->tok);
    ASSERT(mt->n_eos > 0 && V > 100);
    backend_sim_set_resolver(cli_sim_timer);
    for (int ask = 0; ask < 2; ask++) {
        Backend be;
        backend_sim_open(&be, ask ? "h200,eos=4" : "h200");
        cli_sim_tokens(&be, mt, V);
        enum { ROWS = 64, DRAWS = 100 };
        int ids[ROWS], n_eos = 0, seen_other = 0, first = -1;
        for (int d = 0; d < DRAWS; d++) {
            be_argmax(&be, ids, NULL, ROWS, V);
            for (int r = 0; r < ROWS; r++) {
                int id = ids[r], eos = 0;
                for (int e = 0; e < mt->n_eos; e++) eos |= id == mt->eos_ids[e];
                if (eos) {
                    n_eos++;
                    continue;
                }
                if (first < 0) first = id;
                seen_other |= id != first;
                char *text = NULL;
                size_t len = 0;
                tokenizer_decode(mt->tok, &id, 1, 0, &text, &len);
                EXPECT(id >= 0 && id < V && !tokenizer_is_special(mt->tok, id) && len > 0 && !strstr(text, "\xEF\xBF\xBD"),
                       "id %d decodes to '%s'", id, text);
                free(text);
                if (test_failed_now()) break;
            }
        }
        EXPECT(seen_other, "every draw the same id");
        if (!ask) EXPECT_EQ_INT(n_eos, 0);
        else EXPECT(n_eos > ROWS * DRAWS / 8 && n_eos < ROWS * DRAWS * 3 / 8, "eos=4: %d of %d draws", n_eos, ROWS * DRAWS);
        /* the host sampler's path: whole logits rows come down with the draw as the one peak */
        if (!ask) {
            float *logits = be_alloc(&be, (size_t)2 * V * sizeof(float)), *host = malloc((size_t)2 * V * sizeof(float));
            be_to_host(&be, host, logits, (size_t)2 * V * sizeof(float));
            for (int r = 0; r < 2; r++) {
                int best = 0, n_peak = 0;
                for (int i = 0; i < V; i++) {
                    if (host[(size_t)r * V + i] > host[(size_t)r * V + best]) best = i;
                    n_peak += host[(size_t)r * V + i] != 0;
                }
                EXPECT_EQ_INT(n_peak, 1);
                EXPECT(!tokenizer_is_special(mt->tok, best), "row %d: peak at %d", r, best);
            }
            free(host);
            be_free(&be, logits);
        }
        backend_free(&be);
    }
}

TEST(sim_host_runs_ahead_and_waits_at_a_download)
{
    double op_s = 0.5;
    SimTimer t = {.op_seconds = fixed_op, .comm_seconds = free_comm, .ctx = &op_s, .mem_bytes = 10e9, .name = "t"};
    Backend be;
    backend_sim_init(&be, &t);
    float *x = be_alloc(&be, 64 * sizeof(float));
    double t0 = clock_now();
    for (int i = 0; i < 3; i++) be_add(&be, x, x, x, 64);
    double issued = clock_now() - t0;
    EXPECT(sim_clock(&be) - t0 >= 1.5, "the device is done %.3f s after the first op", sim_clock(&be) - t0);
    EXPECT(issued < 1.5, "the host waited %.3f s issuing three ops", issued); /* a stream: it does not wait */
    float y[64];
    be_to_host(&be, y, x, sizeof y);
    EXPECT(clock_now() - t0 >= 1.5, "a download came back %.3f s after the ops were issued", clock_now() - t0);
    be_free(&be, x);
    backend_free(&be);
}

/* Two stages of two layers each, two micro-batches, each micro-batch 1 s on a stage, links free:
 * stage 0 runs them in [0,1] and [1,2], stage 1 in [1,2] and [2,3], then its lm_head (1 s): the
 * logits are back at 4 s, not at 5 as one stage after the other would take. */
TEST(sim_pipeline_replays_the_later_stages)
{
    double op_s = 1.0;
    SimTimer t = {.op_seconds = fixed_op, .comm_seconds = free_comm, .ctx = &op_s, .mem_bytes = 10e9, .name = "t"};
    Backend be;
    backend_sim_init(&be, &t);
    Dist d = {.world = 2, .tp = 1, .pp = 2, .ep = 1, .microbatches = 2};
    comm_sim_init(&d);
    ModelConfig c = {.n_layers = 4, .hidden = 8, .vocab = 16};
    ParOpts p = {.tp = 1, .pp = 2, .ep = 1, .microbatches = 2};
    comm_sim_config(&d, &c, &p);
    EXPECT(dist_simulated(&d));
    float *h = be_alloc(&be, 2 * 16 * sizeof(float));
    double t0 = sim_clock(&be) > clock_now() ? sim_clock(&be) : clock_now();
    for (int mb = 0; mb < 2; mb++) {
        be_add(&be, h, h, h, 8); /* the stage's work on this micro-batch */
        dist_send(&d, &be, h, 8 * sizeof(float), 1);
    }
    double stage0 = sim_clock(&be) - t0;
    dist_recv(&d, &be, h, 2 * 16 * sizeof(float), 1);
    double back = sim_clock(&be) - t0;
    EXPECT(stage0 >= 2.0 && stage0 < 2.5, "stage 0 done at %.3f s", stage0);
    EXPECT(back >= 4.0 && back < 4.5, "logits back at %.3f s", back);
    be_free(&be, h);
    backend_free(&be);
}

static void on_any(void *user, uint64_t id)
{
    (void)user, (void)id;
}

/* What the host sends the device each step is the step's batch, not the widest block table a
 * sequence may ever need: 8 sequences of 40 tokens under a 131072-token context use 3 of 8192
 * blocks a row, and the full rows were 8 x 8192 x 4 = 256 KiB a step. */
TEST(sim_engine_uploads_only_the_block_table_in_use)
{
    const char *dir = sim_model("air1", "configs/glm4.5-air");
    Model m, dm;
    model_load_dummy(&m, dir, QF_NVFP4, 1);
    double op_s = 1e-6;
    SimTimer t = {.op_seconds = fixed_op, .comm_seconds = free_comm, .ctx = &op_s, .mem_bytes = 141e9, .name = "t"};
    Backend be;
    backend_sim_init(&be, &t);
    model_on_backend(&dm, &m, &be);
    EngineOptions o;
    engine_options_default(&o);
    o.max_running = 8;
    o.max_model_len = 131072;
    o.n_blocks = 8 * 8192;
    o.profile_every = 0;
    static const int eos[1] = {0};
    Engine *e = engine_create(&dm, &be, &o, eos, 1);
    engine_start(e);
    double up0 = sim_uploaded(&be);
    uint64_t ids[8];
    int prompt[32];
    for (int k = 0; k < 32; k++) prompt[k] = 1000 + k;
    for (int i = 0; i < 8; i++) {
        RequestParams r = {.prompt = prompt, .n_prompt = 32, .max_tokens = 8, .ignore_eos = 1};
        sampling_params_default(&r.sampling);
        r.sampling.temperature = 0;
        ids[i] = engine_submit(e, &r, on_any, NULL, NULL, 0);
        EXPECT(ids[i] > 0);
    }
    int done = 0;
    double t0 = clock_now();
    while (done < 8 && clock_now() - t0 < 120) {
        for (int i = 0; i < 8; i++) {
            EngineEvent ev[16];
            int k;
            while (ids[i] && (k = engine_poll(e, ids[i], ev, 16)) > 0)
                for (int j = 0; j < k; j++)
                    if (ev[j].finish) done++, ids[i] = 0;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    EXPECT_EQ_INT(done, 8);
    EngineStats st;
    engine_stats(e, &st);
    double per_step = (sim_uploaded(&be) - up0) / (st.steps ? st.steps : 1);
    EXPECT(st.steps >= 8 && per_step < 8 * 8192 * 4 / 8, "%.0f bytes uploaded a step over %llu steps", per_step,
           (unsigned long long)st.steps);
    engine_stop(e, 1);
    engine_free(e);
    model_on_backend_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
}
