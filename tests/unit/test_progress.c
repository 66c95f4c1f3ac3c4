/* test_progress: the progress lines of long jobs (src/base/progress.c) on a clock the test sets:
 * adds within PROGRESS_MIN_GAP print nothing, a tenth reached after it prints one line, a slow
 * tenth prints after PROGRESS_MAX_GAP, the final line is always printed (with the count, the time
 * and the rate; a debug line after a quick job), adds from an OpenMP loop count every unit and
 * print from one thread at a time; and `moeserve synth` / `quantize` / `logits` (its load, dummy
 * weights) / `bench model` on a tiny model print their final lines and no other, at the debug
 * level (none at the default one). No sleeps: the clock is the test's.
 * Run: make test FILTER=progress. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../test.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/progress.h"
#include "base/util.h"

/* ---- helpers ---- */

static double fake_now; /* the clock the helper reads */
static double fake_clock(void) { return fake_now; }

typedef struct {
    char lines[64][320], last[320]; /* the first 64 lines, the last one */
    int level[64];                  /* their log levels */
    int n;
    atomic_int inside; /* sinks running at once: never above 1 */
    int overlap;
} Sink;

static void sink(int level, const char *line, void *ctx)
{
    Sink *s = ctx;
    if (atomic_fetch_add(&s->inside, 1) != 0) s->overlap = 1;
    if (s->n < 64) {
        snprintf(s->lines[s->n], sizeof s->lines[0], "%s", line);
        s->level[s->n] = level;
    }
    snprintf(s->last, sizeof s->last, "%s", line);
    s->n++;
    atomic_fetch_sub(&s->inside, 1);
}

/* lines of out that start with prefix, as information or as a debug line ("debug: " before it) */
static int count_lines(const char *out, const char *prefix)
{
    int n = 0;
    size_t k = strlen(prefix);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *q = strncmp(p, "debug: ", 7) ? p : p + 7;
        if (!strncmp(q, prefix, k)) n++;
    }
    return n;
}

/* "moeserve args" at the debug level (MOESERVE_LOG=3, which shows a quick job's final line) */
static int moeserve(const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "MOESERVE_LOG=3 '%s' %s", test_bin(), args);
    int rc = test_run(cmd, out);
    if (rc != 0) fprintf(stderr, "    $ %s\n    -> exit %d:\n%s", cmd, rc, *out ? *out : "");
    return rc;
}

/* ---- the helper on the test's clock ---- */

TEST(progress_rate_limited)
{
    Sink s = {0};
    Progress p;
    fake_now = 100;
    progress_start_with(&p, "load", 100, "layers", fake_clock, sink, &s);
    /* 50 adds within the first PROGRESS_MIN_GAP: half the job, no line */
    for (int i = 0; i < 50; i++) {
        fake_now = 100 + i * (PROGRESS_MIN_GAP / 60);
        progress_add(&p, 1);
    }
    EXPECT_EQ_INT(s.n, 0);
    /* past the gap, a new tenth (6 of 10): one line, and more adds within the gap after it none */
    fake_now = 100 + PROGRESS_MIN_GAP + 0.5;
    progress_add(&p, 10);
    ASSERT(s.n == 1, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[0], "load: 60 of 100 layers (60%), 24.0 layers/s, about 2 s left"), "%s", s.lines[0]);
    for (int i = 0; i < 20; i++) {
        fake_now += 0.05;
        progress_add(&p, 1);
    }
    EXPECT_EQ_INT(s.n, 1);
    /* the gap passed since that line and the count reached a new tenth (8) in between: a line */
    fake_now += PROGRESS_MIN_GAP;
    progress_add(&p, 1); /* 81 */
    EXPECT_EQ_INT(s.n, 2);
    /* the gap passed again, the same tenth: nothing until PROGRESS_MAX_GAP after the last line */
    fake_now += PROGRESS_MIN_GAP + 1;
    progress_add(&p, 1); /* 82 */
    EXPECT_EQ_INT(s.n, 2);
    fake_now += PROGRESS_MAX_GAP - PROGRESS_MIN_GAP - 1;
    progress_add(&p, 1); /* 83: the same tenth, PROGRESS_MAX_GAP since the last line */
    EXPECT_EQ_INT(s.n, 3);
    EXPECT_EQ_INT(p.lines, 3);
    /* reaching the total prints nothing: the final line says it */
    fake_now += PROGRESS_MAX_GAP + 1;
    progress_add(&p, 17);
    EXPECT_EQ_INT(s.n, 3);
    fake_now = 150;
    progress_end(&p);
    ASSERT(s.n == 4, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[3], "load: 100 layers in 50.0 s (2.0 layers/s)"), "%s", s.lines[3]);
    for (int i = 0; i < 4; i++) EXPECT_EQ_INT(s.level[i], LOG_INFO);
}

TEST(progress_fast_job_final_line_only)
{
    Sink s = {0};
    Progress p;
    fake_now = 7;
    progress_start_with(&p, "upload", 3ull << 30, PROGRESS_BYTES, fake_clock, sink, &s);
    for (int i = 0; i < 3 * 1024; i++) {
        fake_now = 7 + i * (PROGRESS_MIN_GAP / 4096);
        progress_add(&p, 1 << 20);
    }
    EXPECT_EQ_INT(s.n, 0);
    fake_now = 7 + PROGRESS_MIN_GAP * 0.9;
    progress_end(&p);
    ASSERT(s.n == 1, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[0], "upload: 3.2 GB in 1.8 s (1.8 GB/s)"), "%s", s.lines[0]);
    EXPECT_EQ_INT(s.level[0], LOG_DEBUG); /* a blink: the final line is a debug one */
    /* a job of PROGRESS_MIN_GAP, even without a progress line, ends on an information line */
    progress_start_with(&p, "load", 4, "layers", fake_clock, sink, &s);
    fake_now += PROGRESS_MIN_GAP;
    progress_add(&p, 4);
    progress_end(&p);
    ASSERT(s.n == 2, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[1], "load: 4 layers in 2.0 s (2.0 layers/s)"), "%s", s.lines[1]);
    EXPECT_EQ_INT(s.level[1], LOG_INFO);
}

TEST(progress_bytes_and_short_stop)
{
    Sink s = {0};
    Progress p;
    fake_now = 0;
    progress_start_with(&p, "synth", 69100000000ull, PROGRESS_BYTES, fake_clock, sink, &s);
    fake_now = 6.5;
    progress_add(&p, 12300000000ull);
    ASSERT(s.n == 1, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[0], "synth: 12.3 of 69.1 GB (17%), 1.9 GB/s, about 30 s left"), "%s", s.lines[0]);
    /* stopped short: the final line says how far it got */
    fake_now = 10;
    progress_add(&p, 700000);
    progress_end(&p);
    ASSERT(s.n == 2, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[1], "synth: 12.3 of 69.1 GB in 10.0 s (1.2 GB/s)"), "%s", s.lines[1]);
    EXPECT_EQ_INT(s.level[0], LOG_INFO);
    EXPECT_EQ_INT(s.level[1], LOG_INFO);
    /* an unknown total: no percentage, no time left; small amounts in their own unit */
    s.n = 0;
    fake_now = 0;
    progress_start_with(&p, "bench model", 0, "steps", fake_clock, sink, &s);
    fake_now = PROGRESS_MAX_GAP;
    progress_add(&p, 30);
    progress_end(&p);
    ASSERT(s.n == 2, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[0], "bench model: 30 steps, 2.0 steps/s"), "%s", s.lines[0]);
    EXPECT(!strcmp(s.lines[1], "bench model: 30 steps in 15.0 s (2.0 steps/s)"), "%s", s.lines[1]);
    s.n = 0;
    progress_start_with(&p, "upload", 512, PROGRESS_BYTES, fake_clock, sink, &s);
    fake_now += 1;
    progress_add(&p, 512);
    progress_end(&p);
    ASSERT(s.n == 1, "%d lines", s.n);
    EXPECT(!strcmp(s.lines[0], "upload: 512 B in 1.0 s (512 B/s)"), "%s", s.lines[0]);
    EXPECT_EQ_INT(s.level[0], LOG_DEBUG);
}

/* Many threads adding at once: every unit counted, and a line printed by one thread at a time
 * (the clock jumps past MAX_GAP on every read, so each add that gets to decide prints). */
static double jumping_now;
static double jumping_clock(void)
{
    double t;
#pragma omp atomic capture
    t = jumping_now += PROGRESS_MAX_GAP;
    return t;
}

TEST(progress_threads)
{
    static Sink s; /* static: large, and shared with the threads */
    memset(&s, 0, sizeof s);
    Progress p;
    jumping_now = 0;
    progress_start_with(&p, "quantize", 1000000, "rows", jumping_clock, sink, &s);
#pragma omp parallel for num_threads(4) schedule(dynamic, 1)
    for (int i = 0; i < 10000; i++) progress_add(&p, 99);
    EXPECT_EQ_INT(atomic_load(&p.done), 990000);
    EXPECT(s.n >= 1, "no line at all");
    EXPECT_EQ_INT(p.lines, s.n);
    EXPECT(!s.overlap, "two threads printed at once");
    progress_end(&p);
    const char *want = "quantize: 990000 of 1000000 rows in ";
    EXPECT(!strncmp(s.last, want, strlen(want)), "%s", s.last);
}

/* ---- the commands on a tiny model ---- */

TEST(progress_commands_final_lines)
{
    char dir[600], qdir[600], args[2048];
    snprintf(dir, sizeof dir, "%s/progress", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/progress/bf16", test_tmpdir());
    snprintf(qdir, sizeof qdir, "%s/progress/nvfp4", test_tmpdir());
    char *out = NULL;
    snprintf(args, sizeof args, "synth --arch glm4_moe --preset tiny --quant bf16 --seed 3 --out '%s'", dir);
    ASSERT(moeserve(args, &out) == 0);
    /* the final line with the bytes (6.2 MB), and no other progress line on a job this fast */
    EXPECT_EQ_INT(count_lines(out, "synth tiny: 6.2 MB in "), 1);
    EXPECT(!strstr(out, "s left"), "%s", out);
    free(out);
    out = NULL;
    snprintf(args, sizeof args, "quantize '%s' --out '%s'", dir, qdir);
    ASSERT(moeserve(args, &out) == 0);
    EXPECT_EQ_INT(count_lines(out, "quantize: 4.8 MB in "), 1);
    EXPECT(!strstr(out, "s left"), "%s", out);
    free(out);
    out = NULL;
    /* loading it: the final line of load alone (the CPU reads the host weights: no upload) */
    snprintf(args, sizeof args, "logits --model '%s' --tokens 1,2,3 --out /dev/null", qdir);
    ASSERT(moeserve(args, &out) == 0);
    EXPECT_EQ_INT(count_lines(out, "load: 4 layers in "), 1);
    EXPECT(!strstr(out, "s left"), "%s", out);
    free(out);
    out = NULL;
    /* at the default level a load as quick as this one (microseconds of work) prints nothing: a
     * line there must say it took PROGRESS_MIN_GAP at least */
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "'%s' %s", test_bin(), args);
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    const char *ld = strstr(out, "load: ");
    double took = 0;
    EXPECT(!ld || (sscanf(ld, "load: 4 layers in %lf s", &took) == 1 && took >= PROGRESS_MIN_GAP), "%s", out);
    EXPECT(!strstr(out, "debug: "), "%s", out);
    free(out);
    out = NULL;
    /* dummy weights: made on the backend, counted in bytes */
    snprintf(args, sizeof args, "logits --model '%s' --dummy-weights --tokens 1,2,3 --out /dev/null", qdir);
    ASSERT(moeserve(args, &out) == 0);
    EXPECT_EQ_INT(count_lines(out, "dummy weights: 4.8 MB in "), 1);
    EXPECT_EQ_INT(count_lines(out, "load: 4 layers"), 0); /* skeletons: nothing is read */
    free(out);
    out = NULL;
    /* bench model counts its forward steps: B 1 (prefill 64 tokens in 2 steps of 32), B 4 (8 steps);
     * each a warm-up pass (4 decode steps) and a timed one (8): 6 + 10 + 12 + 16, all of them done */
    snprintf(args, sizeof args, "bench model '%s' --batch 1,4 --input-len 64 --output-len 8 --max-batch-tokens 32",
             qdir);
    ASSERT(moeserve(args, &out) == 0);
    EXPECT_EQ_INT(count_lines(out, "bench model: 44 steps in "), 1);
    free(out);
    out = NULL;
    snprintf(args, sizeof args, "bench model '%s' --batch 3 --input-len 5 --output-len 2 --warmup 0 --json", qdir);
    ASSERT(moeserve(args, &out) == 0);
    EXPECT_EQ_INT(count_lines(out, "bench model: 3 steps in "), 1);
    free(out);
    out = NULL;
    /* MOESERVE_LOG=1 silences it */
    snprintf(args, sizeof args, "synth --arch glm4_moe --preset tiny --quant bf16 --seed 3 --out '%s/progress/quiet'",
             test_tmpdir());
    snprintf(cmd, sizeof cmd, "MOESERVE_LOG=1 '%s' %s", test_bin(), args);
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    EXPECT(!strstr(out, "synth tiny: "), "%s", out);
    free(out);
}
