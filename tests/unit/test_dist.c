/* dist: tensor, pipeline and expert parallelism on the CPU backend, ranks started by mpirun
 * (collectives through MPI), as CI runs them: root, 2 cores, --oversubscribe, one thread a rank.
 *   - logits of every layout equal the single-rank logits (float32 reduction order aside) and
 *     the transformers reference, on the golden fixtures of both architectures, at the full
 *     prompt length and one token at a time;
 *   - the server answers under TP2 and PP2 (several sequences in flight, so that pipeline
 *     micro-batches are exercised) with the tokens a single rank gives;
 *   - layouts that cannot work say why. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "server_harness.h"
#include "test.h"

/* (Open MPI keeps some allocations to the end of the process: no leak report for its ranks) */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -x MOESERVE_COMM_TIMEOUT=120 -x ASAN_OPTIONS=detect_leaks=0 "

static int have_mpirun(void)
{
    if (test_run("command -v mpirun >/dev/null 2>&1", NULL) == 0) return 1;
    test_skip("mpirun is not installed (scripts/bootstrap.sh installs openmpi-bin)");
    return 0;
}

/* "5,17,42" of a fixture's golden.json, and its reference logits and their std */
static char *fixture_tokens(const char *dir, int *n)
{
    char path[700];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) return NULL;
    json_t *t = json_object_get(g, "tokens");
    char *s = malloc(8 * json_array_size(t) + 1), *p = s;
    *p = 0;
    for (size_t i = 0; i < json_array_size(t); i++)
        p += sprintf(p, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(t, i)));
    *n = (int)json_array_size(t);
    json_decref(g);
    return s;
}

static double std_of(const float *x, size_t n)
{
    double m = 0, v = 0;
    for (size_t i = 0; i < n; i++) m += x[i];
    m /= n;
    for (size_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    return sqrt(v / n);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* the --dp layouts last: with one sequence every group but the first is idle and must still
 * join each MoE layer's exchange */
static const struct { int np; const char *args; } layouts[] = {
    {2, "--tp 2"}, {4, "--tp 4"}, {2, "--pp 2"}, {4, "--pp 4"}, {4, "--tp 2 --pp 2"},
    {2, "--ep 2"}, {4, "--ep 4"}, {4, "--ep 2 --pp 2"},
    {2, "--tp 2 --dp 2 --ep 2"}, {4, "--tp 4 --dp 2 --ep 4"}, {4, "--tp 4 --dp 4 --ep 4"},
    {4, "--tp 2 --dp 2 --ep 2 --pp 2"},
};
#define FIRST_DP_LAYOUT 8

/* env: environment settings prefixed to every command ("" none), exported to the ranks by
 * mpirun's -x options in xenv; the layouts from `first` on; seqs > 1: the prompt as that many
 * sequences of one batch (logits --seqs, on every group), each copy held to the one rank's */
static void check_fixture_seqs(const char *name, int chunk1, const char *env, const char *xenv, int seqs, size_t first)
{
    char dir[600], cmd[4096], ref[700], out[700];
    snprintf(dir, sizeof dir, "%s", test_data("golden"));
    strcat(dir, "/");
    strcat(dir, name);
    int T;
    char *tokens = fixture_tokens(dir, &T);
    ASSERT(tokens, "%s/golden.json", dir);
    const char *chunk = chunk1 ? "--chunk 1" : "";
    snprintf(ref, sizeof ref, "%s/%s-ref%s.f32", test_tmpdir(), name, chunk1 ? "-c1" : "");
    snprintf(cmd, sizeof cmd, "%s'%s' logits --model '%s' --tokens %s --device cpu --threads 1 %s --out '%s'", env,
             test_bin(), dir, tokens, chunk, ref);
    char *log = NULL;
    int rc = test_run(cmd, &log);
    ASSERT(rc == 0, "single rank: %s", log ? log : "");
    free(log);
    size_t n, ng;
    float *r = test_read_f32(ref, &n);
    char gpath[700];
    snprintf(gpath, sizeof gpath, "%s/logits.f32", dir);
    float *golden = test_read_f32(gpath, &ng);
    ASSERT(r && golden && n == ng, "%s: %zu logits, golden %zu", name, n, ng);
    double sd = std_of(golden, ng), single = max_diff(r, golden, n);
    char sq[32] = "";
    if (seqs > 1) snprintf(sq, sizeof sq, "--seqs %d", seqs);
    for (size_t i = first; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(out, sizeof out, "%s/%s-%zu%s-s%d.f32", test_tmpdir(), name, i, chunk1 ? "-c1" : "", seqs);
        snprintf(cmd, sizeof cmd,
                 "%s" MPIRUN "%s-np %d '%s' logits --model '%s' --tokens %s --device cpu --threads 1 %s %s %s "
                 "--out '%s' </dev/null",
                 env, xenv, layouts[i].np, test_bin(), dir, tokens, chunk, sq, layouts[i].args, out);
        log = NULL;
        rc = test_run(cmd, &log);
        EXPECT(rc == 0, "%s %s: %s", name, layouts[i].args, log ? log : "");
        free(log);
        if (rc) continue;
        size_t m;
        float *p = test_read_f32(out, &m);
        EXPECT(p && m == n * seqs, "%s %s: %zu logits, expected %zu", name, layouts[i].args, p ? m : 0, n * seqs);
        for (int q = 0; p && m == n * seqs && q < seqs; q++) {
            const float *pq = p + (size_t)q * n;
            double d = max_diff(pq, r, n), dg = max_diff(pq, golden, n);
            /* the same model: only the order of float32 sums differs (a few 1e-6 of std seen) */
            EXPECT(d <= 1e-4 * sd, "%s %s %s %s (copy %d): max|d| vs one rank %.3g = %.3g std", name, layouts[i].args,
                   chunk, sq, q, d, d / sd);
            /* and as close to transformers as the single rank (acceptance: 1e-3 std) */
            EXPECT(dg <= 1e-3 * sd && dg <= single + 1e-4 * sd, "%s %s %s: max|d| vs transformers %.3g std (one rank %.3g)",
                   name, layouts[i].args, chunk, dg / sd, single / sd);
        }
        free(p);
    }
    free(r);
    free(golden);
    free(tokens);
}

static void check_fixture_env(const char *name, int chunk1, const char *env, const char *xenv)
{
    check_fixture_seqs(name, chunk1, env, xenv, 1, 0);
}

static void check_fixture(const char *name, int chunk1) { check_fixture_env(name, chunk1, "", ""); }

TEST(dist_logits_glm4moe)
{
    if (!have_mpirun()) return;
    check_fixture("glm4moe-bf16", 0);
    check_fixture("glm4moe-nvfp4", 0);
    check_fixture("glm4moe-nvfp4", 1);
}

TEST(dist_logits_glm5)
{
    if (!have_mpirun()) return;
    check_fixture("glm5-bf16", 0);
    check_fixture("glm5-nvfp4", 0);
    check_fixture("glm5-shared-bf16", 0);
    check_fixture("glm5-shared-bf16", 1); /* a stage may start on a "shared" indexer layer */
}

/* attention data parallel on every fixture: one sequence one token at a time (the tests above
 * run it whole, groups but the first idle), and three sequences over two or four groups, whole
 * and one token at a time, each equal to the single rank's one sequence */
TEST(dist_logits_dp)
{
    if (!have_mpirun()) return;
    const char *fx[] = {"glm4moe-bf16", "glm4moe-nvfp4", "glm5-bf16", "glm5-nvfp4", "glm5-shared-bf16"};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        check_fixture_seqs(fx[i], 1, "", "", 1, FIRST_DP_LAYOUT);
        check_fixture_seqs(fx[i], 0, "", "", 3, FIRST_DP_LAYOUT);
        check_fixture_seqs(fx[i], 1, "", "", 3, FIRST_DP_LAYOUT);
    }
}

/* MLA's expanded form forced on (src/model/mla.c) in pieces of 8 positions: tensor parallel ranks
 * expand their own heads' rows of kv_b_proj; the layouts agree with one rank as above. */
TEST(dist_logits_glm5_mla_expanded)
{
    if (!have_mpirun()) return;
    check_fixture_env("glm5-bf16", 0, "MOESERVE_MLA_EXPAND_MIN=1 MOESERVE_MLA_PIECE=8 ",
                      "-x MOESERVE_MLA_EXPAND_MIN -x MOESERVE_MLA_PIECE ");
}

/* sig to every process whose parent is parent (the ranks mpirun started) */
static void signal_children(pid_t parent, int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
        int ppid = 0;
        char st;
        if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == parent) kill(pid, sig);
    }
    if (d) closedir(d);
}

/* greedy completions of n (at most 8) prompts at once; returns 0 and the texts */
static int completions_n(int port, int n, char texts[][512])
{
    static const char *prompts[8] = {"The Debian package", "To install a program", "The kernel",
                                     "Configuration files are", "A mirror", "The archive holds", "Security updates",
                                     "Each release"};
    for (int i = 0; i < n; i++) texts[i][0] = 0;
    /* in flight together: n connections, then the n answers */
    int fds[8];
    for (int i = 0; i < n; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true}", prompts[i]);
        fds[i] = hc_connect(port, 0);
        if (fds[i] < 0) return -1;
        char hdr[64];
        snprintf(hdr, sizeof hdr, "Content-Type: application/json\r\n");
        if (hc_send_request(fds[i], "POST", "/v1/completions", hdr, body, strlen(body)) < 0) return -1;
    }
    for (int i = 0; i < n; i++) {
        size_t len;
        char *raw = hc_read_all(fds[i], &len);
        close(fds[i]);
        Resp r;
        hc_parse(raw, len, &r);
        free(raw);
        json_t *j = r.status == 200 ? body_json(&r) : NULL;
        const char *t = j ? jstr(j, "choices.0.text") : NULL;
        if (t) snprintf(texts[i], 512, "%s", t);
        if (j) json_decref(j);
        int ok = r.status == 200 && t;
        if (!ok) fprintf(stderr, "    request %d: status %d %s\n", i, r.status, r.body ? r.body : "");
        resp_free(&r);
        if (!ok) return -1;
    }
    return 0;
}

static int completions(int port, char texts[4][512]) { return completions_n(port, 4, texts); }

/* one greedy completion of prompt, alone; 0 and its text */
static int completion(int port, const char *prompt, char text[512])
{
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}", prompt);
    Resp r;
    text[0] = 0;
    int ok = post(port, "/v1/completions", body, &r) == 0 && r.status == 200;
    json_t *j = ok ? body_json(&r) : NULL;
    const char *t = j ? jstr(j, "choices.0.text") : NULL;
    if (t) snprintf(text, 512, "%s", t);
    if (j) json_decref(j);
    resp_free(&r);
    return ok && t ? 0 : -1;
}

/* several blocks of 16 tokens, for the prefix cache */
#define LONG_A "Debian is a free operating system developed by a community of volunteers who maintain thousands " \
               "of packages, release them together, and support each stable release with security updates for years"
#define LONG_B "The kernel schedules processes, manages memory, drives the hardware and offers system calls through " \
               "which programs open files, create sockets, start other programs and wait for them to finish their work"

TEST(dist_serve_tp2_pp2)
{
    if (!have_mpirun()) return;
    Srv s;
    char ref[4][512], got[4][512];
    ASSERT(srv_start_model(&s, "dist-ref", model_dir(), "") == 0);
    int rc = completions(s.port, ref);
    srv_stop(&s, 30);
    ASSERT(rc == 0, "single-rank server");
    /* the last: uneven stages, and a pool sized from memory (a small fraction of it, under what
     * 1024 requests at full length would want) must be sized to the stage of 3 layers, rank 1 */
    const char *lay[] = {"--tp 2", "--pp 2", "--pp 2 --pp-microbatches 4",
                         "--pp-layers 1,3 --kv-fraction 0.01 --max-running-requests 1024"};
    for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++) {
        char launcher[256];
        snprintf(launcher, sizeof launcher, MPIRUN "-np 2");
        int st = srv_start_launched(&s, "dist", model_dir(), launcher, lay[k]);
        EXPECT(st == 0, "%s: the server did not start", lay[k]);
        if (st) continue;
        if (strstr(lay[k], "--pp-layers")) {
            size_t n = 0;
            char *log = file_read_all(s.log, &n);
            EXPECT(log && strstr(log, "the KV pool is sized to rank 1"), "%s: the pool was not sized to rank 1:\n%s", lay[k],
                   log ? log : "(no log)");
            free(log);
        }
        for (int round = 0; round < 2; round++) {
            rc = completions(s.port, got);
            EXPECT(rc == 0, "%s: requests failed", lay[k]);
            for (int i = 0; i < 4 && rc == 0; i++)
                EXPECT(!strcmp(got[i], ref[i]), "%s prompt %d: '%s', one rank '%s'", lay[k], i, got[i], ref[i]);
        }
        /* SIGTERM to the ranks themselves (mpirun would abort the job): rank 0 drains and stops
           the workers, which ignore the signal, and mpirun ends with their status */
        signal_children(s.pid, SIGTERM);
        EXPECT(srv_wait(&s, 60) == 0, "%s: the server did not stop cleanly", lay[k]);
    }
}

/* attention data parallel: 8 greedy requests at once answer as one rank does, both groups get
 * requests, and the diagnosis shows the MoE exchange's time */
TEST(dist_serve_dp)
{
    if (!have_mpirun()) return;
    Srv s;
    char ref[8][512], got[8][512], ref_a[512], ref_b[512], t[512];
    ASSERT(srv_start_model(&s, "dp-ref", model_dir(), "") == 0);
    int rc = completions_n(s.port, 8, ref) || completion(s.port, LONG_A, ref_a) || completion(s.port, LONG_B, ref_b);
    srv_stop(&s, 30);
    ASSERT(rc == 0, "single-rank server");
    ASSERT(srv_start_launched(&s, "dp", model_dir(), MPIRUN "-np 2", "--tp 2 --dp 2 --ep 2 --profile-every 2") == 0,
           "the --dp server did not start");
    /* one at a time: A on group 0; A again where its prompt's blocks are cached, group 0 (where the
     * other group, with as many free blocks and fewer placed, would win without them); then B, to
     * the group with fewer placed. Each answers as one rank does. */
    const char *g0 = "moeserve_dp_group_requests_total{group=\"0\"}";
    const char *g1 = "moeserve_dp_group_requests_total{group=\"1\"}";
    EXPECT(completion(s.port, LONG_A, t) == 0 && !strcmp(t, ref_a), "A: '%s', one rank '%s'", t, ref_a);
    EXPECT(metric(s.port, g0) == 1 && metric(s.port, g1) == 0, "A placed on %g / %g", metric(s.port, g0),
           metric(s.port, g1));
    EXPECT(completion(s.port, LONG_A, t) == 0 && !strcmp(t, ref_a), "A again: '%s', one rank '%s'", t, ref_a);
    EXPECT(metric(s.port, g0) == 2 && metric(s.port, g1) == 0,
           "A again placed on %g / %g (its cached prefix is on group 0)", metric(s.port, g0), metric(s.port, g1));
    EXPECT(metric(s.port, "moeserve_prefix_cache_hits_total") > 0, "no prefix-cache hit");
    EXPECT(completion(s.port, LONG_B, t) == 0 && !strcmp(t, ref_b), "B: '%s', one rank '%s'", t, ref_b);
    EXPECT(metric(s.port, g0) == 2 && metric(s.port, g1) == 1, "B placed on %g / %g", metric(s.port, g0),
           metric(s.port, g1));
    for (int round = 0; round < 2; round++) {
        rc = completions_n(s.port, 8, got);
        EXPECT(rc == 0, "requests failed");
        for (int i = 0; i < 8 && rc == 0; i++)
            EXPECT(!strcmp(got[i], ref[i]), "--dp 2 prompt %d: '%s', one rank '%s'", i, got[i], ref[i]);
    }
    double placed = 0;
    for (int g = 0; g < 2; g++) {
        char name[96];
        snprintf(name, sizeof name, "moeserve_dp_group_requests_total{group=\"%d\"}", g);
        double v = metric(s.port, name);
        EXPECT(v > 0, "%s: %g", name, v);
        placed += v;
        snprintf(name, sizeof name, "moeserve_dp_group_kv_cache_usage_ratio{group=\"%d\"}", g);
        EXPECT(metric(s.port, name) >= 0, "%s is missing", name);
    }
    EXPECT(placed == 19, "%g requests placed, 19 sent", placed);
    Resp r;
    EXPECT(http(s.port, "GET", "/v1/diagnosis", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *j = body_json(&r);
    EXPECT(j && json_number_value(jget(j, "breakdown.all_to_all.ms")) > 0, "all-to-all time: %s", r.body ? r.body : "");
    EXPECT(j && json_array_size(jget(j, "dp_groups")) == 2 &&
               json_integer_value(jget(j, "dp_groups.1.requests_total")) > 0,
           "dp_groups: %s", r.body ? r.body : "");
    EXPECT(j && json_integer_value(jget(j, "deployment.dp")) == 2, "deployment.dp: %s", r.body ? r.body : "");
    if (j) json_decref(j);
    resp_free(&r);
    signal_children(s.pid, SIGTERM);
    EXPECT(srv_wait(&s, 60) == 0, "the --dp server did not stop cleanly");
}

TEST(dist_layout_errors)
{
    if (!have_mpirun()) return;
    char dir[600], cmd[2048];
    snprintf(dir, sizeof dir, "%s/glm5-bf16", test_data("golden"));
    struct { const char *launch, *args, *want; } cases[] = {
        /* 4 attention heads do not split 3 ways */
        {MPIRUN "-np 3", "--tp 3", "attention heads do not split evenly"},
        /* the rank count must be tp x pp */
        {MPIRUN "-np 2", "--tp 2 --pp 2", "needs 4"},
        /* the CPU backend's ranks come from mpirun */
        {"", "--tp 2", "mpirun -np 2"},
        {"", "--ep 2 --tp 4", "--ep must equal --tp"},
        {MPIRUN "-np 2", "--pp-layers 3,2", "adds up to 5 layers"},
        {MPIRUN "-np 5", "--pp 5", "only 4 layers"},
        /* attention data parallel: groups within the tensor ranks, experts over all of them */
        {MPIRUN "-np 4", "--tp 4 --dp 3", "so --dp must divide --tp"},
        {MPIRUN "-np 2", "--tp 2 --dp 2 --ep 4", "--ep must equal --tp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s '%s' logits --model '%s' --tokens 1,2,3 --device cpu --threads 1 %s --out /dev/null </dev/null",
                 cases[i].launch, test_bin(), dir, cases[i].args);
        char *log = NULL;
        int rc = test_run(cmd, &log);
        EXPECT(rc != 0 && log && strstr(log, cases[i].want), "%s: exit %d, expected an error with '%s', got: %s",
               cases[i].args, rc, cases[i].want, log ? log : "");
        free(log);
    }
}

/* `generate` (greedy, 32 tokens) of dir under a launcher and layout, speculation args spec (""
 * none): 0 and its stdout in out, the drafts accepted and made (stderr's statistics line) */
static int gen_spec(const char *launch, const char *dir, const char *args, const char *spec, char *out, size_t cap,
                    long *acc, long *drafted)
{
    char cmd[12000], *log = NULL, path[700];
    snprintf(path, sizeof path, "%s/gen-spec.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s '%s' generate '%s' --device cpu --threads 1 %s --prompt 'The Debian project is an "
             "association of individuals' --max-tokens 32 --temperature 0 --ignore-eos %s </dev/null > '%s'",
             launch, test_bin(), dir, args, spec, path);
    int rc = test_run(cmd, &log);
    *acc = *drafted = -1;
    const char *st = log ? strstr(log, "speculative: ") : NULL;
    if (st) sscanf(st, "speculative: %ld of %ld", acc, drafted);
    if (rc) fprintf(stderr, "    %s: exit %d: %s\n", cmd, rc, log ? log : "");
    free(log);
    size_t n = 0;
    char *text = rc ? NULL : file_read_all(path, &n);
    snprintf(out, cap, "%s", text ? text : "");
    free(text);
    return rc || !text ? -1 : 0;
}

/* Speculative decoding under tensor and expert parallelism: the MTP layer sharded as the model's
 * layers are (its head in lm_head's vocabulary slices), every rank running each of its passes.
 * Greedy output with 3 drafts a step, under TP2, TP2 x EP2 and TP4 x EP4, is one rank's output
 * without drafts, on the built-in model (whose trained head gets drafts accepted) and on tiny
 * checkpoints of both architectures with a random MTP layer (the GLM-4.5 one with its own head
 * and embedding). */
TEST(dist_spec_generate)
{
    if (!have_mpirun()) return;
    char dirs[3][4300];
    snprintf(dirs[0], sizeof dirs[0], "%s/models/builtin", test_root());
    const char *arch[2] = {"glm5", "glm4_moe"}, *quant[2] = {"nvfp4", "bf16"};
    for (int i = 0; i < 2; i++) {
        char cmd[9000];
        snprintf(dirs[1 + i], sizeof dirs[1 + i], "%s/dist-spec-%s", test_tmpdir(), arch[i]);
        snprintf(cmd, sizeof cmd, "'%s' synth --arch %s --preset tiny --quant %s --mtp 1 --seed %d --out '%s' >/dev/null 2>&1",
                 test_bin(), arch[i], quant[i], 11 + i, dirs[1 + i]);
        ASSERT(test_run(cmd, NULL) == 0, "synth %s", arch[i]);
    }
    static const struct { const char *launch, *args; } lay[] = {
        {MPIRUN "-np 2", "--tp 2"}, {MPIRUN "-np 2", "--tp 2 --ep 2"}, {MPIRUN "-np 4", "--tp 4 --ep 4"}};
    const char *spec = "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'";
    for (int m = 0; m < 3; m++) {
        static char ref[8192], got[8192];
        long acc, drafted;
        ASSERT(gen_spec("", dirs[m], "", "", ref, sizeof ref, &acc, &drafted) == 0, "%s: one rank", dirs[m]);
        for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++) {
            int rc = gen_spec(lay[k].launch, dirs[m], lay[k].args, spec, got, sizeof got, &acc, &drafted);
            EXPECT(rc == 0, "%s %s: generate with drafts failed", dirs[m], lay[k].args);
            if (rc) continue;
            EXPECT(!strcmp(got, ref), "%s %s: with drafts '%s', one rank without '%s'", dirs[m], lay[k].args, got, ref);
            EXPECT(drafted > 0 && (m > 0 || acc > 0), "%s %s: %ld of %ld drafts accepted", dirs[m], lay[k].args, acc,
                   drafted);
        }
    }
    /* pipelines and attention groups: not yet, said so */
    static const struct { const char *args, *want; } no[] = {
        {"--pp 2", "speculative decoding runs without --pp"}, {"--tp 2 --dp 2", "speculative decoding runs without --dp"}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        char cmd[9000], *log = NULL;
        snprintf(cmd, sizeof cmd, MPIRUN "-np 2 '%s' generate '%s' --device cpu --threads 1 %s %s --prompt 'x' "
                 "--max-tokens 2 </dev/null >/dev/null", test_bin(), dirs[0], no[i].args, spec);
        int rc = test_run(cmd, &log);
        EXPECT(rc != 0 && log && strstr(log, no[i].want), "%s: exit %d, expected '%s': %s", no[i].args, rc, no[i].want,
               log ? log : "");
        free(log);
    }
}

/* The server under TP2 with 3 drafts a step: 4 greedy requests at once answer as one rank does
 * without drafts, and /metrics counts drafts made and accepted */
TEST(dist_serve_spec)
{
    if (!have_mpirun()) return;
    Srv s;
    char ref[4][512], got[4][512], dir[4300];
    snprintf(dir, sizeof dir, "%s/models/builtin", test_root());
    ASSERT(srv_start_model(&s, "spec-ref", dir, "") == 0);
    int rc = completions(s.port, ref);
    srv_stop(&s, 30);
    ASSERT(rc == 0, "single-rank server");
    int st = srv_start_launched(&s, "spec-tp2", dir, MPIRUN "-np 2",
                                "--tp 2 --speculative-algorithm NEXTN --speculative-num-steps 3");
    ASSERT(st == 0, "the server under --tp 2 with drafts did not start");
    for (int round = 0; round < 2; round++) {
        rc = completions(s.port, got);
        EXPECT(rc == 0, "requests failed");
        for (int i = 0; i < 4 && rc == 0; i++) EXPECT(!strcmp(got[i], ref[i]), "prompt %d: '%s', one rank '%s'", i, got[i], ref[i]);
    }
    Resp r;
    EXPECT(http(s.port, "GET", "/metrics", NULL, NULL, &r) == 0 && r.status == 200);
    double drafts = -1, accepted = -1;
    const char *p = r.body ? strstr(r.body, "\nmoeserve_spec_decode_draft_tokens_total ") : NULL;
    if (p) sscanf(p + 1, "moeserve_spec_decode_draft_tokens_total %lf", &drafts);
    p = r.body ? strstr(r.body, "\nmoeserve_spec_decode_accepted_tokens_total ") : NULL;
    if (p) sscanf(p + 1, "moeserve_spec_decode_accepted_tokens_total %lf", &accepted);
    EXPECT(drafts > 0 && accepted > 0 && accepted <= drafts, "/metrics: %g drafts, %g accepted", drafts, accepted);
    resp_free(&r);
    signal_children(s.pid, SIGTERM);
    EXPECT(srv_wait(&s, 60) == 0, "the server did not stop cleanly");
}

/* layouts --dp cannot take, told in one line before any rank starts (info checks as the ranks would) */
TEST(dist_dp_layout_errors)
{
    char dir[600], cmd[2048];
    struct { const char *model, *args, *want; } cases[] = {
        /* 4 heads over the 8 ranks of an attention group */
        {"glm5-bf16", "--tp 16 --dp 2",
         "error: --tp 16 --dp 2 (attention groups of 8): 4 attention heads do not split evenly"},
        {"glm4moe-bf16", "--tp 6 --dp 6", "error: --ep 6: 16 routed experts do not split evenly"},
        {"glm4moe-bf16", "--tp 4 --dp 8", "error: --dp 8 with --tp 4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", test_data("golden"), cases[i].model);
        snprintf(cmd, sizeof cmd, "'%s' info --model '%s' %s 2>&1 >/dev/null", test_bin(), dir, cases[i].args);
        char *log = NULL;
        int rc = test_run(cmd, &log);
        EXPECT(rc != 0 && log && !strncmp(log, cases[i].want, strlen(cases[i].want)) &&
                   (!strchr(log, '\n') || !strchr(log, '\n')[1]),
               "%s %s: exit %d, expected one line '%s', got: %s", cases[i].model, cases[i].args, rc, cases[i].want,
               log ? log : "");
        free(log);
    }
}

/* a rank that fails or stops answering takes every rank down, with a message naming it, well
 * before the test's patience runs out */
TEST(dist_rank_failure_stops_all)
{
    if (!have_mpirun()) return;
    char dir[600], cmd[2048];
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    struct { const char *env, *args, *want; } cases[] = {
        {"MOESERVE_TEST_FAULT=exit:1", "--tp 2", "rank 1"},
        {"MOESERVE_TEST_FAULT=exit:1", "--pp 2", "rank 1"},
        {"MOESERVE_TEST_FAULT=hang:1", "--tp 2", "did not complete in 3 s"},
        {"MOESERVE_TEST_FAULT=hang:0", "--pp 2", "did not complete in 3 s"},
        {"MOESERVE_TEST_FAULT=exit:1", "--tp 2 --dp 2 --ep 2", "rank 1"},
        {"MOESERVE_TEST_FAULT=hang:1", "--tp 2 --dp 2 --ep 2", "did not complete in 3 s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd,
                 "timeout 60 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -x MOESERVE_COMM_TIMEOUT=3 -x %s "
                 "-np 2 '%s' logits --model '%s' --tokens 1,2,3 --device cpu --threads 1 %s --out /dev/null </dev/null",
                 cases[i].env, test_bin(), dir, cases[i].args);
        char *log = NULL;
        double t0 = clock_now();
        int rc = test_run(cmd, &log);
        double el = clock_now() - t0;
        EXPECT(rc != 0 && rc != 124 && log && strstr(log, cases[i].want) && el < 45,
               "%s %s: exit %d after %.1f s, expected an error with '%s': %s", cases[i].env, cases[i].args, rc, el,
               cases[i].want, log ? log : "");
        free(log);
    }
}

/* `moeserve info` under a layout: per-stage weights add up to the whole model under PP, TP
 * halves the sliced weights, MLA's latent KV cache stays whole on every tensor rank while GQA's
 * splits by KV head, and GLM-5 in NVFP4 fits 8 x 141 GB but not 4 x 80 GB. */
static json_t *info_layout(const char *dir, const char *args)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' info --model '%s' --json %s 2>/dev/null", test_bin(), dir, args);
    if (test_run(cmd, &out) != 0) {
        fprintf(stderr, "    %s: %s\n", cmd, out ? out : "");
        free(out);
        return NULL;
    }
    const char *at = strstr(out, "{\"model\""); /* after any log lines */
    json_t *o = at ? json_loads(at, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(out);
    json_t *l = o ? json_incref(json_object_get(o, "layout")) : NULL;
    json_decref(o);
    return l;
}

static double stage_num(json_t *l, int s, const char *k)
{
    return json_number_value(json_object_get(json_array_get(json_object_get(l, "stages"), s), k));
}

TEST(dist_info_layout)
{
    char gqa[600], mla[600], glm5[600];
    snprintf(gqa, sizeof gqa, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(mla, sizeof mla, "%s/glm5-bf16", test_data("golden"));
    snprintf(glm5, sizeof glm5, "%s/glm5-nvfp4", test_data("configs"));
    for (int k = 0; k < 2; k++) {
        const char *dir = k ? mla : gqa;
        json_t *one = info_layout(dir, "--tp 1"), *pp = info_layout(dir, "--pp 2"), *tp = info_layout(dir, "--tp 2");
        ASSERT(one && pp && tp);
        double w1 = stage_num(one, 0, "weight_bytes");
        EXPECT(fabs(stage_num(pp, 0, "weight_bytes") + stage_num(pp, 1, "weight_bytes") - w1) < 1, "%s: stages add up", dir);
        double w2 = stage_num(tp, 0, "weight_bytes");
        EXPECT(w2 < 0.75 * w1 && w2 >= 0.5 * w1, "%s: tp2 rank %g of %g", dir, w2, w1);
        double kv1 = stage_num(one, 0, "kv_bytes_per_token"), kv2 = stage_num(tp, 0, "kv_bytes_per_token");
        if (k) EXPECT(kv1 == kv2, "MLA latent cache per rank %g, one rank %g", kv2, kv1);
        else EXPECT(kv2 == kv1 / 2, "GQA cache per rank %g, one rank %g", kv2, kv1);
        /* PP halves the layers, and with them the cache per rank */
        EXPECT(stage_num(pp, 0, "kv_bytes_per_token") == kv1 / 2, "%s", dir);
        json_decref(one);
        json_decref(pp);
        json_decref(tp);
    }
    /* shapes alone (config.json, dummy weights) count what the checkpoint holds: the untied
     * lm_head too (it was once skipped when neither it nor the embedding had data yet) */
    for (int k = 0; k < 2; k++) {
        char only[4200], cmd[10000], *out = NULL;
        snprintf(only, sizeof only, "%s/shapes-%d", test_tmpdir(), k);
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/config.json' '%s/'", only, k ? mla : gqa, only);
        ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
        free(out);
        json_t *real = info_layout(k ? mla : gqa, "--tp 1"), *shp = info_layout(only, "--tp 1");
        ASSERT(real && shp);
        EXPECT(stage_num(real, 0, "weight_bytes") == stage_num(shp, 0, "weight_bytes"), "%s: checkpoint %g B, shapes %g B",
               k ? mla : gqa, stage_num(real, 0, "weight_bytes"), stage_num(shp, 0, "weight_bytes"));
        json_decref(real);
        json_decref(shp);
    }
    json_t *l = info_layout(glm5, "--tp 8 --gpu-mem 141");
    ASSERT(l);
    EXPECT(json_is_true(json_object_get(l, "fits")));
    EXPECT(stage_num(l, 0, "weight_bytes") > 40e9 && stage_num(l, 0, "weight_bytes") < 70e9, "%g", stage_num(l, 0, "weight_bytes"));
    json_decref(l);
    l = info_layout(glm5, "--tp 4 --gpu-mem 80");
    ASSERT(l);
    EXPECT(json_is_false(json_object_get(l, "fits")));
    json_decref(l);
    l = info_layout(glm5, "--tp 4 --pp 2 --gpu-mem 141");
    ASSERT(l);
    EXPECT(json_is_true(json_object_get(l, "fits")) && json_array_size(json_object_get(l, "stages")) == 2);
    json_decref(l);
    /* attention data parallel: each of 8 groups holds its own requests' latent cache, so the
     * deployment holds several times the tokens of tp8 ep8 (where every rank holds the same ones);
     * pipeline stages take the fewest of a stage, never the sum */
    json_t *tp8 = info_layout(glm5, "--tp 8 --ep 8 --gpu-mem 141");
    json_t *dp8 = info_layout(glm5, "--tp 8 --dp 8 --ep 8 --gpu-mem 141");
    json_t *pp2 = info_layout(glm5, "--tp 4 --pp 2 --gpu-mem 141");
    json_t *dpp = info_layout(glm5, "--tp 4 --dp 4 --pp 2 --gpu-mem 141");
    ASSERT(tp8 && dp8 && pp2 && dpp);
    double k1 = json_number_value(json_object_get(tp8, "kv_tokens_total"));
    double k8 = json_number_value(json_object_get(dp8, "kv_tokens_total"));
    EXPECT(k1 > 0 && k1 == stage_num(tp8, 0, "kv_tokens"), "tp8 ep8: %g tokens, its rank %g", k1,
           stage_num(tp8, 0, "kv_tokens"));
    EXPECT(k8 >= 4 * k1 && k8 == 8 * stage_num(dp8, 0, "kv_tokens"), "tp8 dp8 ep8: %g tokens, tp8 ep8 %g", k8, k1);
    EXPECT(json_integer_value(json_object_get(dp8, "dp")) == 8 && json_is_true(json_object_get(dp8, "fits")));
    double p0 = stage_num(pp2, 0, "kv_tokens"), p1 = stage_num(pp2, 1, "kv_tokens");
    EXPECT(json_number_value(json_object_get(pp2, "kv_tokens_total")) == fmin(p0, p1), "pp2: %g, stages %g %g",
           json_number_value(json_object_get(pp2, "kv_tokens_total")), p0, p1);
    double d0 = stage_num(dpp, 0, "kv_tokens"), d1 = stage_num(dpp, 1, "kv_tokens");
    EXPECT(json_number_value(json_object_get(dpp, "kv_tokens_total")) == 4 * fmin(d0, d1), "dp4 pp2");
    json_decref(tp8);
    json_decref(dp8);
    json_decref(pp2);
    json_decref(dpp);
    /* GQA under --dp: a group's 2 ranks split the KV heads as --tp 2 does */
    json_t *g2 = info_layout(gqa, "--tp 2"), *gd = info_layout(gqa, "--tp 4 --dp 2");
    ASSERT(g2 && gd);
    EXPECT(stage_num(gd, 0, "kv_bytes_per_token") == stage_num(g2, 0, "kv_bytes_per_token"));
    json_decref(g2);
    json_decref(gd);
}

/* `bench model` under a layout: rank 0 runs the batches and prints one JSON line a batch size,
 * the other ranks follow its steps and print nothing */
TEST(dist_bench_model_layouts)
{
    if (!have_mpirun()) return;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    const char *layouts[] = {"--tp 2", "--pp 2"};
    for (int k = 0; k < 2; k++) {
        char cmd[1400], *out = NULL;
        snprintf(cmd, sizeof cmd, MPIRUN "-np 2 '%s' bench model '%s' --device cpu %s --batch 1,3 --input-len 6 "
                 "--output-len 3 --json 2>/dev/null", test_bin(), dir, layouts[k]);
        int rc = test_run(cmd, &out);
        EXPECT(rc == 0, "%s: exit %d: %s", layouts[k], rc, out ? out : "");
        int lines = 0, batch3 = 0;
        for (char *p = out, *save = NULL, *l = out ? strtok_r(p, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
            json_t *o = json_loads(l, 0, NULL);
            if (!o) continue;
            lines++;
            batch3 += json_integer_value(json_object_get(o, "batch")) == 3 && json_number_value(json_object_get(o, "tpot_ms")) > 0;
            json_decref(o);
        }
        EXPECT(lines == 2 && batch3 == 1, "%s: %d JSON lines", layouts[k], lines);
        free(out);
    }
}
