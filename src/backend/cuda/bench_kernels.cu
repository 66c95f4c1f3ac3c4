/* bench_kernels: `moeserve bench kernels` (issue #5). In one run on one GPU: the ceilings
 * (device copy and read bandwidth, cuBLASLt BF16 and the mma.sync BF16 rate), then the NVFP4
 * kernels at the shapes that matter: the grouped MoE layer of GLM-5 (256 experts, top-8, hidden
 * 6144, width 2048: gate and up with SwiGLU, down, weighted combine) with random and skewed
 * routing from 1 to 8192 tokens, and the dense GEMMs of GLM-5 and GLM-4.5 from 1 to 4096 rows.
 * Each timing is the median of --iters replays of a CUDA graph of the op, timed one by one with
 * events. Effective bandwidth counts the NVFP4 bytes (codes + block scales) of the weights the
 * op had to read (the touched experts for MoE), against the copy bandwidth measured here.
 * --torch FILE reads tools/bench_torch_moe.py's JSON lines (torch._grouped_mm in BF16, same
 * shapes, measured on the same GPU) and prints the speedup. --v0 also times the weights unpacked
 * on the dequantising GEMM (qgemm.cuh), to say what the W4P layout and its kernels gain. Also
 * here: `moeserve tune` (cuda_w4_tune) and the ceilings `moeserve calibrate` measures. */
#include <algorithm>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#include "common.cuh"
#include "w4.h"


namespace {

struct Timer {
    cudaEvent_t a, b;
    Timer() { cudaEventCreate(&a); cudaEventCreate(&b); }
    ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds of back-to-back replays before each timing (`bench kernels --warmup-ms`, default 0; 0
 * in the tuner): the H200 runs its first second of memory-bound load at 1980 MHz, then holds
 * 1785-1965 MHz under its power cap, and boosts again after the idle gaps between a run's cases,
 * so that without a warm-up a case's figures depend on where it stands in the run (with one, the
 * MoE kernels measure 5-13% slower, their steady state) */
double g_case_warm_s = 0;

double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The SM clock a case ran at: one warp counts its SM's cycles (clock64) over 250 us of the global
 * timer, launched right after the case's last replay, while the clock is still where the case's
 * load left it (the power cap's governor moves it over milliseconds). Printed beside each timing
 * (MHz): memory-bound kernels that decode on the way run slower when the clock drops, the copy
 * ceiling hardly does, so that % of copy from two calls that ran at different clocks is not the
 * same comparison (the same binary's 512-token MoE layer took 1659-2017 us across calls).
 * g_clock_buf: two device words (cycles, ns), set by cuda_bench_kernels; NULL in the tuner. */
unsigned long long *g_clock_buf;
double g_case_mhz; /* the clock after the last time_graph, MHz; 0: not read */

__global__ void clock_probe_kernel(unsigned long long *out, unsigned long long ns)
{
    unsigned long long g0, g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    const long long c0 = clock64();
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    while (g1 - g0 < ns);
    const long long c1 = clock64();
    if (threadIdx.x == 0) {
        out[0] = (unsigned long long)(c1 - c0);
        out[1] = g1 - g0;
    }
}

/* the SM clock now, MHz (on the stream, after what it holds) */
double clock_probe(cudaStream_t st)
{
    unsigned long long h[2] = {0, 0};
    clock_probe_kernel<<<1, 32, 0, st>>>(g_clock_buf, 250000);
    LAUNCH_CHECK("clock_probe_kernel");
    CUDA_CHECK(cudaMemcpyAsync(h, g_clock_buf, sizeof h, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return h[1] ? 1e3 * (double)h[0] / (double)h[1] : 0;
}

/* median seconds of iters graph replays of what issue() enqueues on the backend's stream (and,
 * where g_clock_buf is set, the SM clock right after them in g_case_mhz) */
template <class F>
double time_graph(Backend *be, int iters, F issue)
{
    cudaStream_t st = cuda_stream(be);
    issue(); /* eager once: scratch reaches its size outside the capture */
    CUDA_CHECK(cudaStreamSynchronize(st));
    be->ops->graph_begin(be);
    issue();
    void *g = be->ops->graph_end(be);
    Timer tm;
    std::vector<double> t;
    for (int i = 0; i < 3; i++) CHECK(be->ops->graph_launch(be, g) == 0, "bench: a scratch buffer grew inside the timing");
    if (g_case_warm_s > 0) { /* replays in batches of 8 until the warm-up time has passed */
        double t0 = wall_s();
        do {
            for (int i = 0; i < 8; i++) CHECK(be->ops->graph_launch(be, g) == 0, "bench: a scratch buffer grew inside the timing");
            CUDA_CHECK(cudaStreamSynchronize(st));
        } while (wall_s() - t0 < g_case_warm_s);
    }
    for (int i = 0; i < iters; i++) {
        CUDA_CHECK(cudaEventRecord(tm.a, st));
        CHECK(be->ops->graph_launch(be, g) == 0, "bench: a scratch buffer grew inside the timing");
        CUDA_CHECK(cudaEventRecord(tm.b, st));
        CUDA_CHECK(cudaEventSynchronize(tm.b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, tm.a, tm.b));
        t.push_back(ms * 1e-3);
    }
    if (g_clock_buf) g_case_mhz = clock_probe(st);
    be->ops->graph_free(be, g);
    return median(t);
}

__global__ void copy_kernel(uint4 *dst, const uint4 *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = __ldg(src + i);
}

__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(p + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[0] = 1;
}

/* The floor of a dense shape's chain: R of these on the R copies of its weight, in a graph, launched
 * as the GEMMs are (PDL where they use it): a thread asks for its first 16 bytes, waits for the
 * kernel before it (griddepcontrol.wait), lets the next one start and reads the rest: what a
 * decode step's GEMM that only read its weight would cost a call at this size (launch, ramp and
 * tail included, which the small weights cannot amortize) */
__global__ void __launch_bounds__(512) read_chain_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    uint4 acc = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    pdl_wait();
    pdl_trigger();
#pragma unroll 4
    for (i += stride; i < n; i += stride) {
        uint4 v = __ldg(p + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[0] = 1;
}

void read_chain_launch(cudaStream_t st, int blocks, const void *p, size_t bytes, unsigned *sink, int pdl)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    a.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(512);
    cfg.stream = st;
    cfg.attrs = &a;
    cfg.numAttrs = pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, read_chain_kernel, (const uint4 *)p, bytes / 16, sink));
}

/* mma.sync BF16 rate: each warp runs chains of independent m16n8k16 on registers */
__global__ void mma_rate_kernel(float *sink, int reps)
{
    float acc[8][4] = {};
    uint32_t a = 0x3f803f80u + threadIdx.x, b = 0x3f803f80u ^ threadIdx.x;
    for (int r = 0; r < reps; r++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%5,%5}, "
                         "{%0,%1,%2,%3};"
                         : "+f"(acc[k][0]), "+f"(acc[k][1]), "+f"(acc[k][2]), "+f"(acc[k][3])
                         : "r"(a), "r"(b));
    float s = 0;
    for (int k = 0; k < 8; k++) s += acc[k][0] + acc[k][1] + acc[k][2] + acc[k][3];
    if (s == 1.2345f) sink[0] = s;
}

/* cuBLASLt BF16 GEMM 8192^3 (float32 output), the same call the BF16 matmul op makes */
double bf16_peak(Backend *be, int iters)
{
    const int n = 8192;
    void *A, *B, *C;
    CUDA_CHECK(cudaMalloc(&A, (size_t)n * n * 2));
    CUDA_CHECK(cudaMalloc(&B, (size_t)n * n * 2));
    CUDA_CHECK(cudaMalloc(&C, (size_t)n * n * 4));
    be_fill(be, A, (size_t)n * n, FILL_BF16_NORMAL, 0, 1, 1);
    be_fill(be, B, (size_t)n * n, FILL_BF16_NORMAL, 0, 1, 2);
    double t = time_graph(be, iters, [&] { lt_matmul(be, (float *)C, n, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, n, n); });
    cudaFree(A); cudaFree(B); cudaFree(C);
    return 2.0 * n * n * (double)n / t;
}

/* ---- NVFP4 weights ---- */

struct W4Set {
    std::vector<QTensor> t;   /* device QTensors */
    std::vector<void *> bufs;
};

/* an NVFP4 [N, K] tensor on the device, random codes, scale 1.0, packed or in checkpoint layout */
QTensor make_w(Backend *be, W4Set &set, int64_t N, int64_t K, int packed, uint64_t seed, uint8_t *stage)
{
    size_t n = (size_t)N * K;
    QTensor q = {};
    q.fmt = QF_NVFP4;
    q.rows = N;
    q.cols = K;
    q.gscale = 1.0f / sqrtf((float)K) / 2.9257f;
    if (packed) {
        be_fill(be, stage, n / 2, FILL_U8_RANDOM, 0, 0, seed);
        be_fill(be, stage + n / 2, n / 16, FILL_U8_CONST, 0x38, 0, seed + 1);
        uint8_t *p = (uint8_t *)be_alloc(be, n / 2 + n / 16);
        w4_pack_cuda(be, p, stage, stage + n / 2, N, K);
        q.data = p;
        q.packed = 1;
        set.bufs.push_back(p);
    } else {
        uint8_t *p = (uint8_t *)be_alloc(be, n / 2 + n / 16);
        be_fill(be, p, n / 2, FILL_U8_RANDOM, 0, 0, seed);
        be_fill(be, p + n / 2, n / 16, FILL_U8_CONST, 0x38, 0, seed + 1);
        q.data = p;
        q.scale = p + n / 2;
        set.bufs.push_back(p);
    }
    set.t.push_back(q);
    return q;
}

void free_set(Backend *be, W4Set &set)
{
    for (void *p : set.bufs) be_free(be, p);
    set.bufs.clear();
    set.t.clear();
}

/* ---- routing ---- */

uint64_t rng_next(uint64_t &s)
{
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    return s;
}

/* T tokens x K distinct experts of E; skewed: expert e has weight 1/(rank(e)+1)^1.2 over a fixed
 * random ranking (a few hot experts), as tools/bench_torch_moe.py does */
std::vector<int> route(int T, int E, int K, int skewed, uint64_t seed)
{
    std::vector<int> idx((size_t)T * K);
    std::vector<double> w(E, 1.0);
    std::vector<int> perm(E);
    for (int e = 0; e < E; e++) perm[e] = e;
    uint64_t s = seed * 2654435761u + 88172645463325252ull;
    for (int e = E - 1; e > 0; e--) std::swap(perm[e], perm[rng_next(s) % (e + 1)]);
    if (skewed)
        for (int r = 0; r < E; r++) w[perm[r]] = 1.0 / pow(r + 1.0, 1.2);
    for (int t = 0; t < T; t++) {
        std::vector<double> ww = w;
        for (int k = 0; k < K; k++) {
            double tot = 0;
            for (int e = 0; e < E; e++) tot += ww[e];
            double u = (rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * tot;
            int pick = E - 1;
            for (int e = 0; e < E; e++) {
                if (u < ww[e]) { pick = e; break; }
                u -= ww[e];
            }
            if (ww[pick] == 0) /* rounding at the end: the last expert still available */
                for (int e = E - 1; e >= 0; e--) if (ww[e] > 0) { pick = e; break; }
            idx[(size_t)t * K + k] = pick;
            ww[pick] = 0;
        }
    }
    return idx;
}

/* torch baseline: median_ms by (routing, tokens) */
struct TorchRow { char routing[16]; int tokens; double ms; };

std::vector<TorchRow> read_torch(const char *path)
{
    std::vector<TorchRow> rows;
    FILE *f = fopen(path, "r");
    if (!f) fatal("bench kernels: --torch %s: cannot open", path);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        TorchRow r = {};
        const char *rt = json_string_value(json_object_get(j, "routing"));
        snprintf(r.routing, sizeof r.routing, "%s", rt ? rt : "?");
        r.tokens = (int)json_integer_value(json_object_get(j, "tokens"));
        r.ms = json_number_value(json_object_get(j, "median_ms"));
        if (r.tokens > 0 && r.ms > 0) rows.push_back(r);
        json_decref(j);
    }
    fclose(f);
    return rows;
}

double torch_ms(const std::vector<TorchRow> &rows, const char *routing, int T)
{
    for (const TorchRow &r : rows)
        if (r.tokens == T && !strcmp(r.routing, routing)) return r.ms;
    return 0;
}

} /* namespace */

extern "C" int cuda_bench_kernels(const BenchKernelsOpts *o)
{
    int device = o->device, iters = o->iters, no_moe = o->no_moe, no_dense = o->no_dense, v0 = o->v0;
    int do_random = o->random, do_skewed = o->skewed;
    const char *torch_path = o->torch_path, *json_path = o->json_path;
    std::vector<int> tokens(o->tokens, o->tokens + o->n_tokens), rowsv(o->rows, o->rows + o->n_rows);
    std::vector<TorchRow> torch;
    if (torch_path) torch = read_torch(torch_path);
    FILE *jf = json_path ? fopen(json_path, "a") : NULL;
    if (json_path && !jf) fatal("bench kernels: --json %s: cannot open for appending", json_path);
    w4_set_config({o->tile, o->splits});

    Backend be;
    backend_cuda_init(&be, device);
    char name[256];
    cuda_device_name(device, name, sizeof name);
    printf("device: %s\n", name);
    /* the warm-up: warmup_ms of replays before the first timing, a tenth of it (at most 100 ms)
     * before each of the others (g_case_warm_s) */
    g_case_warm_s = o->warmup_ms * 1e-3;
    double case_warm = std::min(o->warmup_ms * 1e-4, 0.1);

    /* ---- ceilings ---- */
    size_t big = (size_t)2 << 30;
    uint8_t *src = (uint8_t *)be_alloc(&be, big), *dst = (uint8_t *)be_alloc(&be, big);
    unsigned *sink = (unsigned *)be_alloc(&be, 64);
    g_clock_buf = (unsigned long long *)be_alloc(&be, 2 * sizeof(unsigned long long));
    cudaStream_t st = cuda_stream(&be);
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    /* a copy kernel (a memcpy node in a graph may go to the copy engines, which are slower) */
    double t_copy = time_graph(&be, iters, [&] {
        copy_kernel<<<sms * 8, 512, 0, st>>>((uint4 *)dst, (const uint4 *)src, big / 16);
        LAUNCH_CHECK("copy_kernel");
    });
    const double copy_mhz = g_case_mhz;
    g_case_warm_s = case_warm;
    double t_read = time_graph(&be, iters, [&] {
        read_kernel<<<sms * 8, 512, 0, st>>>((const uint4 *)src, big / 16, sink);
        LAUNCH_CHECK("read_kernel");
    });
    double copy_bw = 2.0 * big / t_copy, read_bw = big / t_read;
    be_free(&be, src);
    be_free(&be, dst);
    double t_mma = time_graph(&be, 5, [&] {
        mma_rate_kernel<<<sms * 4, 256, 0, st>>>((float *)sink, 4096);
        LAUNCH_CHECK("mma_rate_kernel");
    });
    double mma_peak = 2.0 * 16 * 8 * 16 * 8 * 4096.0 * (sms * 4 * 8) / t_mma;
    double bf16 = bf16_peak(&be, iters);
    printf("ceilings: copy %.2f TB/s (read + write; SM clock %.0f MHz), read %.2f TB/s, cuBLASLt BF16 %.0f TFLOP/s, "
           "mma.sync BF16 %.0f TFLOP/s\n", copy_bw / 1e12, copy_mhz, read_bw / 1e12, bf16 / 1e12, mma_peak / 1e12);
    printf("(MHz: the SM clock right after each case's replays; the GPU lowers it under its power cap)\n");
    if (jf)
        fprintf(jf, "{\"what\":\"ceilings\",\"device\":\"%s\",\"copy_tbps\":%.4f,\"copy_sm_mhz\":%.0f,\"read_tbps\":%.4f,"
                    "\"bf16_tflops\":%.1f,\"mma_bf16_tflops\":%.1f}\n",
                name, copy_bw / 1e12, copy_mhz, read_bw / 1e12, bf16 / 1e12, mma_peak / 1e12);

    /* ---- grouped MoE, GLM-5 layer ---- */
    if (!no_moe) {
        const int E = 256, K = 8, D = 6144, F = 2048;
        ModelConfig c = {};
        c.n_experts = E;
        c.n_experts_per_tok = K;
        c.hidden = D;
        c.moe_intermediate = F;
        uint8_t *stage = (uint8_t *)be_alloc(&be, (size_t)D * F / 2 + (size_t)D * F / 16);
        W4Set sets[2];
        MoeExperts lw[2] = {};
        std::vector<QTensor> host[2];
        for (int ver = 1; ver >= (v0 ? 0 : 1); ver--) {
            host[ver].resize(3 * E);
            for (int i = 0; i < 3 * E; i++)
                host[ver][i] = make_w(&be, sets[ver], i < 2 * E ? F : D, i < 2 * E ? D : F, ver, 1000 + 2 * i, stage);
            lw[ver].gate = host[ver].data();
            lw[ver].up = lw[ver].gate + E;
            lw[ver].down = lw[ver].gate + 2 * E;
            void *tb = be_alloc(&be, 3 * E * sizeof(QTensor));
            be_to_device(&be, tb, host[ver].data(), 3 * E * sizeof(QTensor));
            lw[ver].table = (const QTensor *)tb;
        }
        double exp_bytes = 3.0 * D * F * 9 / 16;
        printf("\ngrouped MoE, GLM-5 layer: %d experts, top-%d, hidden %d, width %d, NVFP4 (%.2f MB per expert); "
               "bandwidth over the touched experts' bytes, %% of copy\n", E, K, D, F, exp_bytes / 1e6);
        printf("%-8s %7s %7s %10s %10s %7s %9s %10s %9s %6s\n", "routing", "tokens", "touched", "time us", "GB/s", "% copy",
               "TFLOP/s", "torch us", "speedup", "MHz");
        int maxT = *std::max_element(tokens.begin(), tokens.end());
        float *x = (float *)be_alloc(&be, (size_t)maxT * D * 4), *out = (float *)be_alloc(&be, (size_t)maxT * D * 4);
        be_fill(&be, x, (size_t)maxT * D, FILL_F32_NORMAL, 0, 1, 7);
        int *didx = (int *)be_alloc(&be, (size_t)maxT * K * 4);
        float *dw = (float *)be_alloc(&be, (size_t)maxT * K * 4);
        std::vector<float> wts((size_t)maxT * K, 1.0f / K);
        be_to_device(&be, dw, wts.data(), wts.size() * 4);
        for (int sk = 0; sk < 2; sk++) {
            if ((sk == 0 && !do_random) || (sk == 1 && !do_skewed)) continue;
            const char *rname = sk ? "skewed" : "random";
            for (int T : tokens) {
                std::vector<int> idx = route(T, E, K, sk, 42 + T);
                std::vector<char> seen(E, 0);
                int touched = 0;
                for (int v : idx) if (!seen[v]) { seen[v] = 1; touched++; }
                be_to_device(&be, didx, idx.data(), idx.size() * 4);
                for (int ver = 1; ver >= (v0 ? 0 : 1); ver--) {
                    if (ver == 0 && T > 64) continue; /* v0 is slow: its point is made at small batches */
                    double t = time_graph(&be, iters, [&] { be.ops->moe(&be, out, x, didx, dw, T, &lw[ver], &c); });
                    double bw = touched * exp_bytes / t, fl = 2.0 * 3 * T * K * (double)D * F / t;
                    double tms = ver ? torch_ms(torch, rname, T) : 0;
                    char tcol[32] = "-", scol[32] = "-";
                    if (tms > 0) {
                        snprintf(tcol, sizeof tcol, "%.1f", tms * 1e3);
                        snprintf(scol, sizeof scol, "%.2fx", tms * 1e-3 / t);
                    }
                    printf("%-8s %7d %7d %10.1f %10.0f %6.1f%% %9.1f %10s %9s %6.0f%s\n", rname, T, touched, t * 1e6, bw / 1e9,
                           100 * bw / copy_bw, fl / 1e12, tcol, scol, g_case_mhz, ver ? "" : "   (v0 kernels)");
                    if (jf)
                        fprintf(jf, "{\"what\":\"moe\",\"kernel\":\"v%d\",\"routing\":\"%s\",\"tokens\":%d,\"touched\":%d,"
                                    "\"us\":%.2f,\"gbps\":%.1f,\"pct_copy\":%.2f,\"tflops\":%.2f,\"torch_us\":%.2f,\"sm_mhz\":%.0f}\n",
                                ver, rname, T, touched, t * 1e6, bw / 1e9, 100 * bw / copy_bw, fl / 1e12, tms * 1e3, g_case_mhz);
                }
            }
        }
        be_free(&be, x); be_free(&be, out); be_free(&be, didx); be_free(&be, dw); be_free(&be, stage);
        for (int ver = 0; ver < 2; ver++) {
            free_set(&be, sets[ver]);
            if (lw[ver].table) be_free(&be, (void *)lw[ver].table);
        }
    }

    /* ---- dense ---- */
    if (!no_dense) {
        struct Shape { const char *name; int N, K; } shapes[] = {
            {"glm5 dense gate/up", 12288, 6144}, {"glm5 dense down", 6144, 12288}, {"glm5 shared gate/up", 2048, 6144},
            {"glm5 shared down", 6144, 2048}, {"glm5 q_b", 16384, 2048}, {"glm5 o_proj", 6144, 16384},
            {"glm5 kv_a", 576, 6144}, {"glm5 q_a", 2048, 6144}, {"glm4.5 q_proj", 12288, 5120},
            {"glm4.5 o_proj", 5120, 12288}, {"glm4.5 kv_proj", 1024, 5120}, {"glm4.5 shared down", 5120, 1536},
            /* what the engine runs where the checkpoint lets it fuse them (model/load.c fuse) */
            {"glm5 q_a+kv_a", 2624, 6144}, {"glm5 shared gate+up", 4096, 6144}, {"glm5 dense gate+up", 24576, 6144}};
        int maxT = *std::max_element(rowsv.begin(), rowsv.end()), maxK = 0, maxN = 0;
        size_t maxW = 0;
        for (const Shape &s : shapes) {
            maxK = std::max(maxK, s.K);
            maxN = std::max(maxN, s.N);
            maxW = std::max(maxW, (size_t)s.N * s.K);
        }
        float *x = (float *)be_alloc(&be, (size_t)maxT * maxK * 4), *out = (float *)be_alloc(&be, (size_t)maxT * maxN * 4);
        be_fill(&be, x, (size_t)maxT * maxK, FILL_F32_NORMAL, 0, 1, 9);
        uint8_t *stage = (uint8_t *)be_alloc(&be, maxW * 9 / 16);
        printf("\ndense NVFP4 GEMM: bandwidth over the weight's bytes (%% of copy); TFLOP/s (%% of cuBLASLt BF16)\n");
        printf("(time us: one call a graph replay; chain us: a graph of R calls on R copies of the weight, R x the bytes\n"
               " over 200 MB so that no copy stays in L2, per call: as the GEMMs of a decode step's graph run, without\n"
               " the replay's launch)\n");
        printf("(read us: the chain's floor, the same graph of kernels that only read each copy of the weight, launched\n"
               " as the GEMMs are; MHz: after the chain's replays, else the call's)\n");
        printf("%-20s %6s %6s %6s %10s %10s %7s %9s %7s %10s %7s %8s %6s\n", "shape", "N", "K", "rows", "time us", "GB/s", "% copy",
               "TFLOP/s", "% bf16", "chain us", "% copy", "read us", "MHz");
        const int pdl = w4_sk_pdl(); /* the read floor launches as the stream-K GEMMs do */
        for (const Shape &s : shapes) {
            W4Set set;
            for (int ver = 1; ver >= (v0 ? 0 : 1); ver--) {
                QTensor w = make_w(&be, set, s.N, s.K, ver, 77, stage);
                double bytes = (double)s.N * s.K * 9 / 16;
                /* the chain's copies of the packed weight (distinct memory, the same values) */
                std::vector<QTensor> ws;
                if (ver) {
                    int R = (int)std::min(96.0, std::max(4.0, ceil(200e6 / bytes)));
                    for (int r = 0; r < R; r++) {
                        QTensor c = w;
                        uint8_t *p = (uint8_t *)be_alloc(&be, (size_t)bytes);
                        CUDA_CHECK(cudaMemcpy(p, w.data, (size_t)bytes, cudaMemcpyDeviceToDevice));
                        set.bufs.push_back(p);
                        c.data = p;
                        ws.push_back(c);
                    }
                }
                double tr = 0; /* the read floor a call, seconds */
                if (ver) {
                    tr = time_graph(&be, iters, [&] {
                             for (const QTensor &c : ws) read_chain_launch(st, sms * 4, c.data, (size_t)bytes, sink, pdl);
                             LAUNCH_CHECK("read_chain_kernel");
                         }) / ws.size();
                }
                for (int T : rowsv) {
                    if (ver == 0 && T > 16) continue;
                    double t = time_graph(&be, iters, [&] { be.ops->matmul(&be, out, s.N, x, s.K, T, &w, NULL); });
                    double bw = bytes / t, fl = 2.0 * T * (double)s.N * s.K / t, tc = 0;
                    char ccol[32] = "", cpct[32] = "", rcol[32] = "";
                    if (ver) {
                        tc = time_graph(&be, iters, [&] {
                                 for (const QTensor &c : ws) be.ops->matmul(&be, out, s.N, x, s.K, T, &c, NULL);
                             }) / ws.size();
                        snprintf(ccol, sizeof ccol, "%.1f", tc * 1e6);
                        snprintf(cpct, sizeof cpct, "%.1f%%", 100 * bytes / tc / copy_bw);
                        snprintf(rcol, sizeof rcol, "%.1f", tr * 1e6);
                    }
                    printf("%-20s %6d %6d %6d %10.1f %10.0f %6.1f%% %9.1f %6.1f%% %10s %7s %8s %6.0f%s\n", s.name, s.N, s.K, T,
                           t * 1e6, bw / 1e9, 100 * bw / copy_bw, fl / 1e12, 100 * fl / bf16, ccol, cpct, rcol, g_case_mhz,
                           ver ? "" : "   (v0 kernel)");
                    if (jf)
                        fprintf(jf, "{\"what\":\"dense\",\"kernel\":\"v%d\",\"shape\":\"%s\",\"N\":%d,\"K\":%d,\"rows\":%d,"
                                    "\"us\":%.2f,\"gbps\":%.1f,\"pct_copy\":%.2f,\"tflops\":%.2f,\"pct_bf16\":%.2f,\"chain_us\":%.2f,"
                                    "\"read_chain_us\":%.2f,\"sm_mhz\":%.0f}\n",
                                ver, s.name, s.N, s.K, T, t * 1e6, bw / 1e9, 100 * bw / copy_bw, fl / 1e12, 100 * fl / bf16, tc * 1e6,
                                tr * 1e6, g_case_mhz);
                }
            }
            free_set(&be, set);
        }
        be_free(&be, x); be_free(&be, out); be_free(&be, stage);
    }
    if (jf) fclose(jf);
    be_free(&be, g_clock_buf);
    g_clock_buf = NULL;
    g_case_mhz = 0;
    backend_free(&be);
    g_case_warm_s = 0;
    return 0;
}

/* ---- moeserve tune ---- */

namespace {

/* max |a - b| / max |b| over n floats on the device */
double max_rel_diff(Backend *be, const float *a, const float *b, size_t n)
{
    std::vector<float> ha(n), hb(n);
    be_to_host(be, ha.data(), a, n * 4);
    be_to_host(be, hb.data(), b, n * 4);
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = std::max(d, (double)fabsf(ha[i] - hb[i]));
        m = std::max(m, (double)fabsf(hb[i]));
    }
    return m > 0 ? d / m : d;
}

} /* namespace */

/* For each kind and bucket, every tile: rejected before launch if its shared memory is over the
 * budget (the reason printed), else run, checked against mma_8_l1 (the same maths; dense splits
 * only reorder the K sum) and timed; the fastest correct one goes into the table. */
extern "C" int cuda_w4_tune(const W4TuneOpts *o)
{
    Backend be;
    backend_cuda_init(&be, o->device);
    w4_use_table(NULL);
    knob_override(KNOB_W4_LT_ROWS, 0); /* the tiles themselves, also where prefill takes the BF16 route */
    if (o->budget) w4_set_smem_budget(o->budget);
    size_t budget = w4_smem_budget(o->device);
    int wg = w4_wg_supported(o->device);
    W4Table tab;
    w4_table_clear(&tab);
    w4_device_key(o->device, tab.device, sizeof tab.device);
    printf("device: %s\nshared memory budget per block: %zu B%s\n", tab.device, budget, o->budget ? " (simulated)" : "");
    const int E = o->quick ? 16 : 256, K = 8 > E ? E : (o->quick ? 4 : 8), D = o->quick ? 512 : 6144, F = o->quick ? 256 : 2048;
    const int DN = o->quick ? 512 : 6144, DK = o->quick ? 512 : 6144;
    std::vector<int> moe_t = o->quick ? std::vector<int>{1, 64, 512} : std::vector<int>{1, 8, 64, 256, 512, 2048, 8192};
    std::vector<int> dense_t = o->quick ? std::vector<int>{1, 16, 300} : std::vector<int>{1, 8, 16, 64, 256, 4096};
    int maxT = 8192;
    uint8_t *stage = (uint8_t *)be_alloc(&be, (size_t)std::max((size_t)D * F, (size_t)DN * DK) * 9 / 16);
    /* MoE layer */
    W4Set set;
    std::vector<QTensor> host(3 * E);
    for (int i = 0; i < 3 * E; i++) host[i] = make_w(&be, set, i < 2 * E ? F : D, i < 2 * E ? D : F, 1, 500 + 2 * i, stage);
    MoeExperts lw = {};
    lw.gate = host.data();
    lw.up = lw.gate + E;
    lw.down = lw.gate + 2 * E;
    void *tb = be_alloc(&be, 3 * E * sizeof(QTensor));
    be_to_device(&be, tb, host.data(), 3 * E * sizeof(QTensor));
    lw.table = (const QTensor *)tb;
    ModelConfig c = {};
    c.n_experts = E;
    c.n_experts_per_tok = K;
    c.hidden = D;
    c.moe_intermediate = F;
    QTensor wd = make_w(&be, set, DN, DK, 1, 99, stage);
    size_t xmax = (size_t)maxT * std::max(D, DK);
    float *x = (float *)be_alloc(&be, xmax * 4), *ref = (float *)be_alloc(&be, xmax * 4), *out = (float *)be_alloc(&be, xmax * 4);
    be_fill(&be, x, xmax, FILL_F32_NORMAL, 0, 1, 3);
    int *didx = (int *)be_alloc(&be, (size_t)maxT * K * 4);
    float *dw = (float *)be_alloc(&be, (size_t)maxT * K * 4);
    std::vector<float> wts((size_t)maxT * K, 1.0f / K);
    be_to_device(&be, dw, wts.data(), wts.size() * 4);
    printf("\n%-6s %6s %4s %-24s %3s %3s %3s %3s %4s %3s %8s  %s\n", "kind", "tokens", "id", "tile", "n8", "st", "kw", "gu", "ring",
           "ch", "smem B", "result");
    for (int kind = 0; kind < W4_KINDS; kind++) {
        std::vector<int> &ts = kind == W4_MOE ? moe_t : dense_t;
        for (int T : ts) {
            if (kind == W4_MOE) {
                std::vector<int> idx = route(T, E, K, 0, 7 + T);
                be_to_device(&be, didx, idx.data(), idx.size() * 4);
            }
            int N = kind == W4_MOE ? D : DN;
            auto issue = [&](float *dst) {
                if (kind == W4_MOE) be.ops->moe(&be, dst, x, didx, dw, T, &lw, &c);
                else be.ops->matmul(&be, dst, N, x, DK, T, &wd, NULL);
            };
            w4_set_config({0, 0});
            issue(ref);
            double best = 1e30;
            int best_tile = -1;
            for (int tile = 0; tile < W4_N_TILES; tile++) {
                W4Tile w = w4_tiles[tile];
                char why[256];
                /* dense: one weight stream, the MoE-only families run as a twin; MoE: the dense-only
                 * families run as their MoE twins */
                if (kind == W4_DENSE && (w.gu_warps || w.fam == W4_FAM_MMA_BLOCK || w.fam == W4_FAM_WGMMA)) continue;
                if (kind == W4_MOE && (w.fam == W4_FAM_STREAMK || w.fam == W4_FAM_DENSE_WG)) continue;
                printf("%-6s %6d %4d %-24s %3d %3d %3d %3d %4d %3d %8zu  ", kind == W4_MOE ? "moe" : "dense", T, tile, w.name, w.n8,
                       w.stages, w.kwarps, w.gu_warps, w.ring, w.chunks, w4_tile_smem(w));
                if (!w4_tile_fits(w, budget, why, sizeof why) || !w4_tile_runs(w, wg, why, sizeof why)) {
                    printf("rejected: %s\n", why);
                    continue;
                }
                w4_set_config({tile, 0});
                issue(out);
                CUDA_CHECK(cudaStreamSynchronize(cuda_stream(&be)));
                /* tiles differ in the order of the K sums (splits, ks) and so in float rounding;
                 * activations enter as two BF16 halves (2^-17): 1e-4 of the largest output */
                double err = max_rel_diff(&be, out, ref, (size_t)T * N), tol = 1e-4;
                if (err > tol) {
                    printf("wrong: max diff %.3g of the largest value against %s\n", err, w4_tiles[0].name);
                    continue;
                }
                double t = time_graph(&be, o->iters, [&] { issue(out); });
                printf("%.1f us\n", t * 1e6);
                if (t < best) { best = t; best_tile = tile; }
            }
            tab.tile[kind][w4_bucket(T)] = best_tile;
            printf("%-6s %6d  -> %s\n", kind == W4_MOE ? "moe" : "dense", T, best_tile >= 0 ? w4_tiles[best_tile].name : "none");
        }
    }
    w4_set_config({-1, 0});
    if (o->out) *o->out = tab;
    int rc = 0;
    if (o->path) {
        char err[512];
        if (w4_table_save(&tab, o->path, err, sizeof err) < 0) {
            log_error("tune: %s", err);
            rc = 1;
        } else {
            printf("saved %s\n", o->path);
        }
    }
    if (o->budget) w4_set_smem_budget(0);
    knob_override(KNOB_W4_LT_ROWS, -1);
    be_free(&be, x); be_free(&be, ref); be_free(&be, out); be_free(&be, didx); be_free(&be, dw); be_free(&be, stage);
    be_free(&be, tb);
    free_set(&be, set);
    backend_free(&be);
    return rc;
}

/* ---- the ceilings diagnosis uses (moeserve calibrate) ---- */

/* cuBLASLt FP8 E4M3 GEMM n^3 with BF16 output; 0 when this GPU or library offers none */
static double fp8_peak(Backend *be, int iters)
{
    const int n = 8192;
    CudaState *s = cuda_state(be);
    void *A, *B, *C;
    CUDA_CHECK(cudaMalloc(&A, (size_t)n * n));
    CUDA_CHECK(cudaMalloc(&B, (size_t)n * n));
    CUDA_CHECK(cudaMalloc(&C, (size_t)n * n * 2));
    be_fill(be, A, (size_t)n * n, FILL_E4M3_UNIT, 0, 0, 3);
    be_fill(be, B, (size_t)n * n, FILL_E4M3_UNIT, 0, 0, 4);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    double rate = 0;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n);
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n);
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s->lt_ws_size, sizeof s->lt_ws_size);
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        if (cublasLtMatmulAlgoGetHeuristic(s->lt, op, la, lb, lc, lc, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS && found) {
            float alpha = 1.f, beta = 0.f;
            double t = time_graph(be, iters, [&] {
                CUBLAS_CHECK(cublasLtMatmul(s->lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &heur.algo, cuda_lt_ws(be),
                                            s->lt_ws_size, cuda_stream(be)));
            });
            rate = 2.0 * n * n * (double)n / t;
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
    }
    cudaGetLastError();
    cudaFree(A); cudaFree(B); cudaFree(C);
    return rate;
}

extern "C" void cuda_ceilings(Backend *be, int quick, double *copy, double *read, double *bf16, double *fp8)
{
    int iters = quick ? 5 : 20, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    size_t big = (size_t)(quick ? 512 : 2048) << 20;
    uint8_t *src = (uint8_t *)be_alloc(be, big), *dst = (uint8_t *)be_alloc(be, big);
    unsigned *sink = (unsigned *)be_alloc(be, 64);
    cudaStream_t st = cuda_stream(be);
    double t_copy = time_graph(be, iters, [&] {
        copy_kernel<<<sms * 8, 512, 0, st>>>((uint4 *)dst, (const uint4 *)src, big / 16);
        LAUNCH_CHECK("copy_kernel");
    });
    double t_read = time_graph(be, iters, [&] {
        read_kernel<<<sms * 8, 512, 0, st>>>((const uint4 *)src, big / 16, sink);
        LAUNCH_CHECK("read_kernel");
    });
    *copy = 2.0 * big / t_copy;
    *read = big / t_read;
    be_free(be, src);
    be_free(be, dst);
    be_free(be, sink);
    *bf16 = bf16_peak(be, iters);
    *fp8 = fp8_peak(be, iters);
}
