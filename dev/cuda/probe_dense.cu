/* probe_dense.cu: what a 1-row NVFP4 GEMM (W4P weights, w4_common.cuh) can stream on this GPU, by grid
 * and by where the weights and activations come from (session 9, issue #5). A dev tool, not
 * part of the engine: it times kernels written here against each other, each as a chain of R
 * calls on R copies of the weight inside one CUDA graph (nothing left in L2), median of many
 * replays, and checks the full kernels against a one-thread-per-row reference.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o probe_dense dev/cuda/probe_dense.cu
 *   ./probe_dense
 *
 * Kernel `pers<W, S, MODE>`: P blocks of W warps; the R records of the weight (row tile major,
 * the memory order) are cut into P W contiguous runs, one a warp. Each warp streams its run
 * through S slots of shared memory by bulk copy (cp.async.bulk, one mbarrier a slot), S ahead.
 * MODE 0: read only (xor of the words: the streaming ceiling of the grid); 1: decode + mma with
 * the activation row staged once per block in shared memory as BF16; 2: the same with the
 * activations read from global memory (L1) as the mma.sync tile mma_8_k4 does; 3: weights one record ahead in
 * registers (no ring), activations from shared memory. Partial row sums at a row tile's end
 * are added into out with atomics (the probe's fix-up; the engine needs a deterministic one). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/w4_common.cuh"
#include "backend/cuda/w4_wgmma.cuh"

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

__device__ uint32_t g_sink;

template <int W, int S, int MODE>
__global__ void __launch_bounds__(W * 32) pers(const uint8_t *wt, int N, int K, const __nv_bfloat16 *x, float *out, float gs)
{
    extern __shared__ __align__(128) uint8_t sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int ng = K / W4_KG, R = (N / 16) * ng;
    const long gw = (long)blockIdx.x * W + warp, nw = (long)gridDim.x * W;
    const int r0 = (int)(gw * R / nw), r1 = (int)((gw + 1) * R / nw);
    constexpr bool RING = MODE != 3;
    const bool XS = MODE == 1 || MODE == 3;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)sm;
    uint32_t slots = (uint32_t)__cvta_generic_to_shared(sm + (XS ? K * 2 : 0)) + warp * S * W4_REC;
    uint32_t bars = (uint32_t)__cvta_generic_to_shared(sm + (XS ? K * 2 : 0)) + W * S * W4_REC + warp * S * 8;
    if (RING) {
        if (lane == 0) {
            for (int s = 0; s < S; s++) mbar_init(bars + 8 * s, 1);
            mbar_init_fence();
        }
        __syncwarp();
        if (lane == 0)
            for (int s = 0; s < S && r0 + s < r1; s++) wg_ring_fill(slots + s * W4_REC, wt + (size_t)(r0 + s) * W4_REC, bars + 8 * s);
    }
    W4Frag nxt;
    if (!RING && r0 < r1) w4_load(nxt, wt + (size_t)r0 * W4_REC, lane);
    if (XS) {
        for (int q = threadIdx.x; q < K / 8; q += W * 32) ((uint4 *)xs)[q] = ((const uint4 *)x)[q];
        __syncthreads();
    }
    uint32_t sink = 0, ph = 0;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = r0; r < r1; r++) {
        const int q = (r - r0) % S, i = r / ng, G = r % ng;
        W4Frag cur;
        if (RING) {
            mbar_wait(bars + 8 * q, (ph >> q) & 1);
            ph ^= 1u << q;
            w4_lds(cur, slots + q * W4_REC, lane);
            __syncwarp();
            if (lane == 0 && r + S < r1) wg_ring_fill(slots + q * W4_REC, wt + (size_t)(r + S) * W4_REC, bars + 8 * q);
        } else {
            cur = nxt;
            if (r + 1 < r1) w4_load(nxt, wt + (size_t)(r + 1) * W4_REC, lane);
        }
        if (MODE == 0) {
#pragma unroll
            for (int c = 0; c < 4; c++) sink ^= cur.c[c].x ^ cur.c[c].y ^ cur.c[c].z ^ cur.c[c].w;
            sink ^= cur.s.x ^ cur.s.y;
            continue;
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[4][4];
            w4_decode_chunk(cur, c, a);
            uint4 b0, b1;
            if (XS) {
                const uint4 *p = (const uint4 *)(xs + G * W4_KG + c * 64 + t * 16);
                b0 = p[0];
                b1 = p[1];
            } else {
                const uint4 *p = (const uint4 *)(x + G * W4_KG + c * 64 + t * 16);
                b0 = __ldg(p);
                b1 = __ldg(p + 1);
            }
            w4_mma_chunk(acc, a, b0, b1);
        }
        if (G == ng - 1 || r + 1 == r1) { /* the row tile ends here for this warp */
            if (t == 0) {
                atomicAdd(out + 16 * i + g, acc[0] * gs);
                atomicAdd(out + 16 * i + g + 8, acc[2] * gs);
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
        }
    }
    if (MODE == 0 && sink == 0x12345678u) g_sink = sink;
}

__global__ void ref_kernel(QTensor w, const __nv_bfloat16 *x, float *out)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= w.rows) return;
    float s = 0.f;
    for (int k = 0; k < w.cols; k++) s += w4_elem(w, r, k) * __bfloat162float(x[k]);
    out[r] = s;
}

__global__ void copy_kernel(float4 *d, const float4 *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}

__global__ void fill_kernel(uint8_t *w, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        size_t off = i % W4_REC;
        w[i] = off < 2048 ? (uint8_t)h : (uint8_t)(72 + (h & 15)); /* scales 2^-2 .. 2^1 */
    }
}

typedef void (*Launch)(cudaStream_t, const uint8_t *, float *);

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* per-call us of a chain of R calls (one graph), median of it replays */
static float time_chain(int R, int it, const std::vector<uint8_t *> &w, float *out, size_t outn,
                        void (*launch)(cudaStream_t, const uint8_t *, float *, void *), void *ctx)
{
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < R; r++) launch(st, w[r], out, ctx);
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int k = 0; k < it + 2; k++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaStreamSynchronize(st));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (k >= 2) ts.push_back(ms * 1000.f / R);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(gr));
    CK(cudaStreamDestroy(st));
    return median(ts);
}

struct Cfg {
    int N, K, P, W, S, mode;
    const __nv_bfloat16 *x;
};

template <int W, int S, int MODE> static size_t smem_of(int K) { return (MODE == 1 || MODE == 3 ? K * 2 : 0) + W * S * (W4_REC + 8); }

template <int W, int S, int MODE> static void launch_t(cudaStream_t st, const uint8_t *w, float *out, void *vc)
{
    Cfg *c = (Cfg *)vc;
    size_t sm = smem_of<W, S, MODE>(c->K);
    static int done = 0;
    if (!done) {
        CK(cudaFuncSetAttribute(pers<W, S, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        done = 1;
    }
    pers<W, S, MODE><<<c->P, W * 32, sm, st>>>(w, c->N, c->K, c->x, out, 512.f); /* the tile epilogue's 2^9 (w4.cuh) */
}

struct Var {
    const char *name;
    int W, S, mode;
    void (*fn)(cudaStream_t, const uint8_t *, float *, void *);
    int (*occ)(int K);
};

template <int W, int S, int MODE> static int occ_t(int K)
{
    int n = 0;
    size_t sm = smem_of<W, S, MODE>(K);
    CK(cudaFuncSetAttribute(pers<W, S, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, pers<W, S, MODE>, W * 32, sm));
    return n;
}

#define V(W, S, M) {#W "w s" #S " m" #M, W, S, M, launch_t<W, S, M>, occ_t<W, S, M>}

int main(int argc, char **argv)
{
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int R = 8, IT = argc > 1 ? atoi(argv[1]) : 30;
    /* copy ceiling */
    {
        size_t n = (size_t)1 << 30;
        float4 *a, *b;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> ts;
        for (int k = 0; k < 12; k++) {
            CK(cudaEventRecord(e0));
            copy_kernel<<<sms * 8, 512>>>(b, a, n / 16);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (k >= 2) ts.push_back(ms);
        }
        printf("copy: %.2f TB/s (read + write)\n", 2.0 * n / (median(ts) * 1e-3) / 1e12);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    const float COPY_TBS = 4.0f; /* the percentages are of 4.0 TB/s; the measured copy is printed first */
    Var vars[] = {
        V(4, 2, 0), V(8, 4, 0), V(16, 3, 0), V(8, 6, 0),
        V(4, 2, 1), V(8, 3, 1), V(8, 4, 1), V(16, 3, 1), V(8, 6, 1), V(16, 4, 1),
        V(8, 4, 2), V(16, 3, 2),
        V(4, 1, 3), V(8, 1, 3), V(16, 1, 3),
    };
    int shapes[][2] = {{12288, 6144}, {6144, 16384}, {12288, 5120}, {6144, 2048}};
    for (auto &sh : shapes) {
        int N = sh[0], K = sh[1];
        size_t bytes = (size_t)N / 16 * (K / W4_KG) * W4_REC;
        std::vector<uint8_t *> w(R);
        for (int r = 0; r < R; r++) {
            CK(cudaMalloc(&w[r], bytes));
            fill_kernel<<<1024, 256>>>(w[r], bytes, 1234u + r);
        }
        __nv_bfloat16 *x;
        float *out, *ref;
        CK(cudaMalloc(&x, K * 2));
        CK(cudaMalloc(&out, N * 4));
        CK(cudaMalloc(&ref, N * 4));
        std::vector<__nv_bfloat16> hx(K);
        for (int k = 0; k < K; k++) hx[k] = __float2bfloat16((float)((k * 37) % 101 - 50) / 50.f);
        CK(cudaMemcpy(x, hx.data(), K * 2, cudaMemcpyHostToDevice));
        QTensor qt = {};
        qt.data = w[0];
        qt.rows = N;
        qt.cols = K;
        qt.gscale = 1.f;
        ref_kernel<<<N / 128, 128>>>(qt, x, ref);
        CK(cudaDeviceSynchronize());
        std::vector<float> href(N), hout(N);
        CK(cudaMemcpy(href.data(), ref, N * 4, cudaMemcpyDeviceToHost));
        printf("\nshape %d x %d: %.1f MB a copy\n", N, K, bytes / 1e6);
        for (auto &v : vars) {
            int occ = v.occ(K);
            if (occ == 0) {
                printf("  %-12s does not fit\n", v.name);
                continue;
            }
            int grids[3] = {sms * occ, (N / 16) * (K / W4_KG) / (v.W * 6), sms * std::max(1, occ / 2)};
            for (int gi = 0; gi < 3; gi++) {
                int P = grids[gi];
                if (P < 1 || (gi == 2 && grids[2] == grids[0])) continue;
                Cfg c = {N, K, P, v.W, v.S, v.mode, x};
                const char *err = "";
                if (v.mode != 0) {
                    CK(cudaMemset(out, 0, N * 4));
                    v.fn(0, w[0], out, &c);
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(hout.data(), out, N * 4, cudaMemcpyDeviceToHost));
                    double md = 0, mr = 0;
                    for (int n = 0; n < N; n++) {
                        md = std::max(md, (double)fabsf(hout[n] - href[n]));
                        mr = std::max(mr, (double)fabsf(href[n]));
                    }
                    if (!(md <= 1e-3 * mr)) err = "  WRONG";
                }
                float us = time_chain(R, IT, w, out, N, v.fn, &c);
                printf("  %-12s occ %d P %5d: %7.2f us  %5.2f TB/s  %5.1f%% of 4.0%s\n", v.name, occ, P, us, bytes / (us * 1e-6) / 1e12,
                       100.f * bytes / (us * 1e-6) / 1e12 / COPY_TBS, err);
            }
        }
        for (int r = 0; r < R; r++) CK(cudaFree(w[r]));
        CK(cudaFree(x));
        CK(cudaFree(out));
        CK(cudaFree(ref));
    }
    return 0;
}
