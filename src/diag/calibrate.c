/* calibrate: measuring and caching the ceilings (calibrate.h). */
#include "calibrate.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../backend/cpu/cpu.h"
#include "../backend/sim/sim.h"
#include "../base/knobs.h"
#include "../base/test_hooks.h"
#include "../base/util.h"
#include "gpu.h"
#ifdef MOESERVE_CUDA
#include "../backend/cuda/cuda.h"
void cuda_ceilings(Backend *be, int quick, double *copy, double *read, double *bf16, double *fp8);
#endif

/* ---- the CPU: memory and float32 FMA ---- */

/* the CPU time of every thread of this process, in seconds */
static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* *share: the CPU time its threads had over threads x the wall time of the timed loops (1: the
 * cores were theirs throughout; the setup and the frees between them are not counted, since a
 * lone thread runs those while the others sleep) */
static void cpu_ceilings(Ceilings *c, int threads, int quick, double *share)
{
    double cpu_s = 0, wall_s = 0;
#define TIMED(t0, c0) (wall_s += clock_now() - (t0), cpu_s += cpu_seconds() - (c0))
    size_t n = (size_t)(quick ? 64 : 256) << 20; /* bytes per buffer: well past the caches */
    float *a = xmalloc_aligned(n), *b = xmalloc_aligned(n);
    size_t m = n / sizeof(float);
#pragma omp parallel for num_threads(threads)
    for (size_t i = 0; i < m; i++) a[i] = b[i] = (float)(i & 1023);
    double best_copy = 1e30, best_read = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < (quick ? 3 : 6); r++) {
        double c0 = cpu_seconds(), t0 = clock_now();
#pragma omp parallel for num_threads(threads)
        for (size_t i = 0; i < m; i++) b[i] = a[i];
        double t1 = clock_now();
        /* integer xor: no float reduction order to keep, so it vectorises */
        const uint64_t *u = (const uint64_t *)a;
        uint64_t s = 0;
#pragma omp parallel for num_threads(threads) reduction(^ : s)
        for (size_t i = 0; i < n / 8; i++) s ^= u[i];
        double t2 = clock_now();
        TIMED(t0, c0);
        sink += (float)(s & 1);
        if (t1 - t0 < best_copy) best_copy = t1 - t0;
        if (t2 - t1 < best_read) best_read = t2 - t1;
    }
    c->copy_gbps = 2.0 * n / best_copy / 1e9;
    c->read_gbps = n / best_read / 1e9;
    free(a);
    free(b);
    /* float32 multiply-adds as the CPU backend's GEMMs do them (cpu_dot over rows in L1) */
    enum { DOT = 2048 };
    long reps = quick ? 4000 : 16000;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double c0 = cpu_seconds(), t0 = clock_now();
#pragma omp parallel num_threads(threads)
        {
            float *x = xmalloc_aligned(2 * DOT * sizeof(float)), *y = x + DOT, s = 0;
            for (int k = 0; k < 2 * DOT; k++) x[k] = 1e-3f * (k & 63);
            for (long i = 0; i < reps; i++) {
                s += cpu_dot(x, y, DOT);
                x[i & (DOT - 1)] = s * 1e-9f; /* a dependency, so that nothing is hoisted */
            }
            if (s == 1.2345f) sink += s;
            free(x);
        }
        double t = clock_now() - t0;
        TIMED(t0, c0);
        if (t < best) best = t;
    }
#undef TIMED
    c->bf16_tflops = 2.0 * DOT * reps * threads / best / 1e12;
    c->fp8_tflops = c->fp4_tflops = 0;
    *share = wall_s > 0 ? cpu_s / (wall_s * threads) : 1;
    (void)sink;
}

/* ---- collectives at a step's sizes ---- */

static void comm_ceilings(Ceilings *c, Backend *be, Dist *d)
{
    c->ranks = d ? d->world : 1;
    c->tp = d ? d->tp : 1;
    c->pp = d ? d->pp : 1;
    if (!d || d->world == 1) return;
    snprintf(c->comm, sizeof c->comm, "%s", d->ops->name);
    /* all-reduce: 64 tokens x 8192 floats (a decode step's hidden state), and one token's */
    size_t big = 64 * 8192, small = 8192;
    float *buf = be_alloc(be, big * sizeof(float));
    int reps = 20;
    double tb = 0, ts = 0;
    if (d->atp > 1) { /* the all-reduce spans a tensor group (under --dp an attention group's tp / dp ranks) */
        for (int w = 0; w < 3; w++) dist_all_reduce(d, be, buf, big);
        dist_flush(d, be);
        float probe;
        be_to_host(be, &probe, buf, sizeof probe);
        double t0 = clock_now();
        for (int r = 0; r < reps; r++) dist_all_reduce(d, be, buf, big);
        be_to_host(be, &probe, buf, sizeof probe);
        tb = (clock_now() - t0) / reps;
        t0 = clock_now();
        for (int r = 0; r < reps; r++) dist_all_reduce(d, be, buf, small);
        be_to_host(be, &probe, buf, sizeof probe);
        ts = (clock_now() - t0) / reps;
        /* bus bandwidth: a ring moves 2 (n - 1) / n of the buffer through each link */
        c->allreduce_gbps = big * 4.0 * 2 * (d->atp - 1) / d->atp / tb / 1e9;
        c->allreduce_us = ts * 1e6;
    }
    if (d->pp > 1) { /* stage 0 -> stage 1, same tensor rank */
        double t0 = clock_now();
        for (int r = 0; r < reps; r++) {
            if (d->pp_rank == 0) dist_send(d, be, buf, big * 4, dist_rank_of(d, 1, d->tp_rank));
            else if (d->pp_rank == 1) dist_recv(d, be, buf, big * 4, dist_rank_of(d, 0, d->tp_rank));
            dist_flush(d, be);
        }
        float probe;
        be_to_host(be, &probe, buf, sizeof probe);
        double t = (clock_now() - t0) / reps;
        c->p2p_gbps = big * 4.0 / t / 1e9;
    }
    be_free(be, buf);
    /* rank 0's numbers for everyone */
    double v[3] = {c->allreduce_gbps, c->allreduce_us, c->p2p_gbps};
    dist_bcast_host(d, v, sizeof v);
    c->allreduce_gbps = v[0];
    c->allreduce_us = v[1];
    c->p2p_gbps = v[2];
    if (!strcmp(c->comm, "mpi")) snprintf(c->link, sizeof c->link, "MPI (shared memory on one node, else network)");
    else snprintf(c->link, sizeof c->link, "NCCL (NVLink or PCIe as NCCL found it)");
}

/* ---- the cache ---- */

static void cache_path(const Ceilings *c, char *buf, size_t n)
{
    const char *env = knob_str(KNOB_CALIBRATE_CACHE); /* "" when unset */
    if (*env) {
        snprintf(buf, n, "%s", env);
        return;
    }
    const char *home = getenv("XDG_CACHE_HOME");
    char dir[1024];
    if (home && *home) snprintf(dir, sizeof dir, "%s/moeserve", home);
    else snprintf(dir, sizeof dir, "%s/.cache/moeserve", getenv("HOME") ? getenv("HOME") : "/tmp");
    char key[256];
    size_t k = 0;
    for (const char *p = c->key; *p && k + 1 < sizeof key; p++) key[k++] = (isalnum((unsigned char)*p) || *p == '-') ? *p : '_';
    key[k] = 0;
    snprintf(buf, n, "%.900s/calibrate-%.250s.json", dir, key);
}

static void mkdirs(const char *path)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
}

json_t *ceilings_json(const Ceilings *c)
{
    return json_pack("{s:s, s:s, s:b, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:f, s:f, s:f, s:s, s:s, s:s, s:s, s:s?}",
                     "key", c->key, "device", c->device, "gpu", c->gpu, "copy_gbps", c->copy_gbps, "read_gbps",
                     c->read_gbps, "bf16_tflops", c->bf16_tflops, "fp8_tflops", c->fp8_tflops, "fp4_tflops",
                     c->fp4_tflops, "ranks", c->ranks, "tp", c->tp, "pp", c->pp, "allreduce_gbps", c->allreduce_gbps,
                     "allreduce_us", c->allreduce_us, "p2p_gbps", c->p2p_gbps, "comm", c->comm, "link", c->link,
                     "measured", c->when, "p2p", c->p2p, "busy", c->busy[0] ? c->busy : NULL);
}

static int ceilings_from_json(Ceilings *c, json_t *o)
{
    const char *key = json_string_value(json_object_get(o, "key"));
    if (!key || strcmp(key, c->key)) return -1;
#define NUM(f) c->f = json_number_value(json_object_get(o, #f))
    NUM(copy_gbps); NUM(read_gbps); NUM(bf16_tflops); NUM(fp8_tflops); NUM(fp4_tflops);
    NUM(allreduce_gbps); NUM(allreduce_us); NUM(p2p_gbps);
#undef NUM
    const char *pp = json_string_value(json_object_get(o, "p2p"));
    snprintf(c->p2p, sizeof c->p2p, "%s", pp ? pp : "");
    const char *w = json_string_value(json_object_get(o, "measured"));
    snprintf(c->when, sizeof c->when, "%s", w ? w : "");
    const char *b = json_string_value(json_object_get(o, "busy")); /* null or absent: a quiet machine's */
    snprintf(c->busy, sizeof c->busy, "%s", b ? b : "");
    return c->copy_gbps > 0 && c->bf16_tflops > 0 ? 0 : -1;
}

/* Was the machine busy while c was measured (cpu_share: the CPU measurement's, or < 0; gpu_spread:
 * how far the GPU's two measurements differ, or < 0)? The reason into c->busy, "" when quiet. */
static void judge_busy(Ceilings *c, int threads, double cpu_share, double gpu_spread)
{
    c->busy[0] = 0;
    int hook = test_hook_calibrate_busy();
    if (hook) {
        if (hook == 2) snprintf(c->busy, sizeof c->busy, "MOESERVE_TEST_CALIBRATE_BUSY=2");
        return;
    }
    if (cpu_share >= 0 && cpu_share < CAL_MIN_CPU_SHARE) {
        int cpus = backend_cpu_count();
        snprintf(c->busy, sizeof c->busy, "its %d thread%s ran %.0f%% of the time measured%s", threads,
                 threads == 1 ? "" : "s", 100 * cpu_share,
                 threads > cpus ? ", more threads than the CPUs it may use" : ": other work took the CPUs");
    } else if (gpu_spread > CAL_MAX_DISAGREE) {
        snprintf(c->busy, sizeof c->busy, "two measurements differ by %.0f%%: other work shares the GPU",
                 100 * gpu_spread);
    }
}

/* A modelled device (--device sim:GPU) has its ceilings in its timer: asked, not measured, and
 * not cached (nothing of this machine is in them). */
static void calibrate_sim(Ceilings *c, Backend *be, Dist *d)
{
    const SimTimer *t = sim_timer(be);
    int tp = d ? d->tp : 1;
    double gb = 1e9, n = 8192, gemm = 2 * n * n * n, wbytes = 2 * n * n;
    *c = (Ceilings){.gpu = 1, .ranks = d ? d->world : 1, .tp = tp, .pp = d ? d->pp : 1};
    snprintf(c->device, sizeof c->device, "%s", t->name ? t->name : "sim");
    snprintf(c->key, sizeof c->key, "sim-%.200s-tp%d-pp%d-r%d", c->device, c->tp, c->pp, c->ranks);
    c->read_gbps = c->copy_gbps = gb / t->op_seconds(t->ctx, OP_ADD, 0, gb, 0, QF_COUNT) / 1e9;
    c->bf16_tflops = gemm / t->op_seconds(t->ctx, OP_GEMM_MLP, gemm, wbytes, (int)n, QF_BF16) / 1e12;
    c->fp8_tflops = gemm / t->op_seconds(t->ctx, OP_GEMM_MLP, gemm, wbytes / 2, (int)n, QF_FP8) / 1e12;
    if (c->ranks > 1) {
        c->allreduce_gbps = gb / t->comm_seconds(t->ctx, OP_ALL_REDUCE, gb, tp) / 1e9;
        c->allreduce_us = t->comm_seconds(t->ctx, OP_ALL_REDUCE, 0, tp) * 1e6;
        c->p2p_gbps = gb / t->comm_seconds(t->ctx, OP_PP_SEND, gb, 2) / 1e9;
        snprintf(c->comm, sizeof c->comm, "sim");
        snprintf(c->link, sizeof c->link, "modelled");
    }
    snprintf(c->when, sizeof c->when, "modelled");
}

CalResult calibrate_get(Ceilings *c, Backend *be, Dist *d, int quick, CalMode mode)
{
    if (backend_is_sim(be)) {
        calibrate_sim(c, be, d);
        return CAL_NOT_SAVED;
    }
    *c = (Ceilings){.gpu = !be->host_memory};
    int ranks = d ? d->world : 1;
#ifdef MOESERVE_CUDA
    if (c->gpu) cuda_device_name(0, c->device, sizeof c->device);
#endif
    if (!c->gpu) {
        char model[200] = "cpu";
        FILE *f = fopen("/proc/cpuinfo", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        if (f) fclose(f);
        snprintf(c->device, sizeof c->device, "%s, %d threads", model, be->n_threads);
    }
    snprintf(c->key, sizeof c->key, "%.16s-%.200s-tp%d-pp%d-r%d", be->name, c->device, d ? d->tp : 1, d ? d->pp : 1, ranks);
    char path[1200];
    cache_path(c, path, sizeof path);
    /* the profile cached now (rank 0 reads it; every rank decides alike), and whether it is a quiet
     * machine's: a cache that cannot be read counts as none */
    Ceilings old = *c;
    int cached = 0;
    {
        char why[400];
        json_t *o = (!d || d->rank == 0) ? file_read_json(path, 0, why, sizeof why) : NULL;
        cached = o && ceilings_from_json(&old, o) == 0;
        if (o) json_decref(o);
        if (d && d->world > 1) dist_bcast_host(d, &cached, sizeof cached);
    }
    if (cached && mode == CAL_CACHED) {
        if (d && d->world > 1) dist_bcast_host(d, &old, sizeof old);
        *c = old;
        c->ranks = ranks;
        c->tp = d ? d->tp : 1;
        c->pp = d ? d->pp : 1;
        return CAL_READ;
    }
    log_info("calibrate: measuring the ceilings of %s%s", c->device, quick ? " (quick)" : "");
    double cpu_share = -1, gpu_spread = -1;
#ifdef MOESERVE_CUDA
    if (c->gpu) {
        /* twice: where another process shares the GPU the two differ (the better of each is kept) */
        double m[2][4];
        for (int k = 0; k < 2; k++) cuda_ceilings(be, quick, &m[k][0], &m[k][1], &m[k][2], &m[k][3]);
        double *dst[4] = {&c->copy_gbps, &c->read_gbps, &c->bf16_tflops, &c->fp8_tflops};
        gpu_spread = 0;
        for (int j = 0; j < 4; j++) {
            double hi = fmax(m[0][j], m[1][j]), lo = fmin(m[0][j], m[1][j]);
            *dst[j] = hi;
            if (j != 3 && hi > 0 && 1 - lo / hi > gpu_spread) gpu_spread = 1 - lo / hi; /* FP8 may be absent */
        }
    }
#endif
    if (c->gpu) {
        c->copy_gbps /= 1e9;
        c->read_gbps /= 1e9;
        c->bf16_tflops /= 1e12;
        c->fp8_tflops /= 1e12;
    } else {
        cpu_ceilings(c, be->n_threads, quick, &cpu_share);
    }
    judge_busy(c, be->n_threads, cpu_share, gpu_spread);
    if (d && d->world > 1) dist_bcast_host(d, c->busy, sizeof c->busy); /* rank 0's judgement for all */
    comm_ceilings(c, be, d);
#ifdef MOESERVE_CUDA
    if (c->gpu) {
        char s[128];
        cuda_p2p_summary(s, sizeof s);
        int links = diag_nvlinks(0);
        snprintf(c->p2p, sizeof c->p2p, "%s; GPU 0: %d NVLink links up", s, links);
    }
#endif
    time_t now = time(NULL);
    strftime(c->when, sizeof c->when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    if (d && d->rank != 0) return CAL_SAVED; /* rank 0 writes */
    if (c->busy[0] && mode != CAL_FORCE && cached && !old.busy[0]) {
        log_warn("calibrate: the machine is busy (%s): these figures are not cached; the profile measured %s on a "
                 "quiet machine stays in %s (calibrate --force replaces it)", c->busy, old.when, path);
        return CAL_KEPT_CACHE;
    }
    if (c->busy[0]) {
        const char *why = mode == CAL_FORCE ? "--force"
                          : cached          ? "the cached profile was a busy one too"
                                            : "none was cached";
        log_warn("calibrate: the machine is busy (%s): cached all the same (%s), marked busy until a quiet measurement "
                 "replaces it", c->busy, why);
    }
    mkdirs(path);
    json_t *o = ceilings_json(c);
    int bad = json_dump_file(o, path, JSON_INDENT(2)) != 0, err = errno;
    json_decref(o);
    if (bad) {
        log_warn("calibrate: cannot write %s: %s", path, strerror(err));
        return CAL_NOT_SAVED;
    }
    log_info("calibrate: cached in %s", path);
    return CAL_SAVED;
}

void ceilings_print(const Ceilings *c)
{
    printf("device: %s\n", c->device);
    printf("memory: copy %.1f GB/s (read + write), read %.1f GB/s\n", c->copy_gbps, c->read_gbps);
    if (c->gpu)
        printf("tensor: BF16 %.1f TFLOP/s, FP8 %s, FP4 %s\n", c->bf16_tflops,
               c->fp8_tflops > 0 ? "measured" : "not offered", c->fp4_tflops > 0 ? "measured" : "none (no FP4 tensor cores)");
    else
        printf("compute: float32 FMA %.1f GFLOP/s (the CPU reference computes in float32)\n", c->bf16_tflops * 1e3);
    if (c->gpu && c->fp8_tflops > 0) printf("        FP8 %.1f TFLOP/s\n", c->fp8_tflops);
    if (c->ranks > 1)
        printf("collectives (%d ranks, tp %d, pp %d, %s): all-reduce %.2f GB/s bus, %.1f us small; point to point %.2f GB/s; %s\n",
               c->ranks, c->tp, c->pp, c->comm, c->allreduce_gbps, c->allreduce_us, c->p2p_gbps, c->link);
    else
        printf("collectives: one rank (none)\n");
    if (c->p2p[0]) printf("GPUs: %s\n", c->p2p);
    printf("measured: %s%s%s\n", c->when, c->busy[0] ? " on a busy machine: " : "", c->busy);
}
