/* w4: NVFP4 weights streamed at the memory roof (issue #5). The W4P repack at upload, the dense
 * W4A16 GEMM (split-K when the row tiles alone cannot fill the GPU) and the grouped MoE GEMMs
 * (gate and up in one pass with SwiGLU in the epilogue, then down), all on w4_warp (w4.cuh).
 * Activations enter as BF16 (one conversion per op); accumulation is float32; outputs are
 * float32 except the SwiGLU output h, which is the down projection's BF16 input. */
#include "w4.cuh"
#include "w4_wg.cuh"
#include "w4.h"

#define W4_WARPS 4      /* warps per block: 4 row tiles of 16 */

/* ---- repack ---- */

/* w4_elem's flattened bit positions (common.cuh) say what W4_BITS says */
static constexpr bool w4_bits_flat_ok()
{
    constexpr int b[4][2][2] = W4_BITS;
    for (int r = 0; r < 4; r++)
        for (int h = 0; h < 2; h++) {
            int f = 5 * (2 * r + h);
            if ((int)((W4_BITS_MAG >> f) & 31) != b[r][h][0] || (int)((W4_BITS_SIGN >> f) & 31) != b[r][h][1]) return false;
        }
    return true;
}
static_assert(w4_bits_flat_ok(), "W4_BITS_MAG / W4_BITS_SIGN out of step with W4_BITS");

/* E4M3 scale byte -> the unsigned E5M3 byte of the W4P layout (0 for zero). NaN saturates. */
__device__ __forceinline__ uint8_t w4_scale_enc(uint8_t s)
{
    int e = (s >> 3) & 15, m = s & 7, E, mant;
    if (e == 15 && m == 7) return (uint8_t)((18 << 3) | 7);
    if (e == 0) {
        if (!m) return 0;
        int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;
        E = p - 9;
        mant = (m << (3 - p)) & 7;
    } else {
        E = e - 7;
        mant = m;
    }
    return (uint8_t)(((E + 10) << 3) | mant);
}

/* thread (record, lane): its 64 code bytes and 8 scale bytes */
static __global__ void w4_pack_kernel(uint8_t *dst, const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K)
{
    int64_t ng = K / W4_KG, items = (N / 16) * ng * 32;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < items; it += (int64_t)gridDim.x * blockDim.x) {
        int lane = (int)(it & 31), g = lane >> 2, t = lane & 3;
        int64_t rec = it >> 5, G = rec % ng, i = rec / ng;
        uint8_t *out = dst + rec * W4_REC;
        for (int c = 0; c < 4; c++) {
            int64_t k0 = G * W4_KG + c * 64 + t * 16;
            int zero[2], neg[2];
            for (int hi = 0; hi < 2; hi++) {
                uint8_t s = scales[(16 * i + g + 8 * hi) * (K / 16) + k0 / 16];
                uint8_t b = w4_scale_enc(s & 0x7f);
                zero[hi] = b == 0;
                neg[hi] = (s & 0x80) != 0;
                out[2048 + lane * 8 + 2 * c + hi] = b;
            }
            const int bits[4][2][2] = W4_BITS; /* [register][half]: magnitude, sign bit */
            uint32_t words[4];
            for (int j = 0; j < 4; j++) {
                uint32_t w = 0;
                for (int q = 0; q < 4; q++)
                    for (int hi = 0; hi < 2; hi++) {
                        int64_t k = k0 + 4 * j + q, row = 16 * i + g + 8 * hi;
                        uint8_t byte = codes[row * (K / 2) + k / 2];
                        uint32_t code = (k & 1) ? byte >> 4 : byte & 15;
                        if (zero[hi]) code = 0;
                        if (neg[hi]) code ^= 8;
                        const int *b = bits[2 * (q >> 1) + hi][q & 1];
                        w |= (code & 7) << b[0] | (code >> 3) << b[1];
                    }
                words[j] = w;
            }
            *(uint4 *)(out + c * 512 + lane * 16) = make_uint4(words[0], words[1], words[2], words[3]);
        }
    }
}

extern "C" int w4_packable(const QTensor *w)
{
    return w->fmt == QF_NVFP4 && !w->packed && w->rows > 0 && w->rows % 16 == 0 && w->cols % W4_KG == 0;
}

void w4_pack_cuda(Backend *be, uint8_t *dst, const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K)
{
    int64_t items = (N / 16) * (K / W4_KG) * 32;
    int nb = cdiv(items, 256) < 65535 ? cdiv(items, 256) : 65535;
    w4_pack_kernel<<<nb, 256, 0, cuda_stream(be)>>>(dst, codes, scales, N, K);
    LAUNCH_CHECK("w4_pack_kernel");
}

/* ---- activations to BF16 ---- */

/* y[i] = bf16(x) and, with split, y[T*K + i] = bf16(x - bf16(x)) (see w4_loadb) */
__device__ __forceinline__ void w4_split_store(__nv_bfloat16 *y, int64_t i, int64_t n, float v, int split)
{
    __nv_bfloat16 h = __float2bfloat16(v);
    y[i] = h;
    if (split) y[n + i] = __float2bfloat16(v - __bfloat162float(h));
}

/* perm: each row stored permuted for the wg tiles (w4_wg_perm; K % 64 == 0) */
static __global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, int ldx, int T, int K, int split, int perm)
{
    pdl_trigger(); /* the GEMM launched after it (w4_dense_wg) may fetch its first weights meanwhile */
    int64_t n = (int64_t)T * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / K;
        int k = (int)(i - r * K);
        w4_split_store(y, perm ? r * K + w4_wg_perm(k) : i, n, x[r * ldx + k], split);
    }
}

static void to_bf16(Backend *be, __nv_bfloat16 *y, const float *x, int ldx, int T, int K, int split, int perm = 0)
{
    int64_t n = (int64_t)T * K;
    to_bf16_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, cuda_stream(be)>>>(y, x, ldx, T, K, split, perm);
    LAUNCH_CHECK("to_bf16_kernel");
}

/* A switch that is on unless the environment variable name holds off: forced (tests) when force
 * >= 0, else read once into *cached */
static int w4_switch(int force, int *cached, const char *name, const char *off)
{
    if (force >= 0) return force;
    if (*cached < 0) {
        const char *e = getenv(name);
        *cached = !(e && !strcmp(e, off));
    }
    return *cached;
}

/* Activations as two BF16 halves (the default), or plain BF16 (MOESERVE_W4_ACT=bf16: half the
 * tensor-core work at prefill, and the rounding of other engines' W4A16 kernels). */
static int w4_split_force = -1, w4_split_env = -1;

extern "C" void w4_set_act_split(int on) { w4_split_force = on; }

static int w4_split_act(void) { return w4_switch(w4_split_force, &w4_split_env, "MOESERVE_W4_ACT", "bf16"); }

/* The wg ring kernels' persistent blocks (the default; MOESERVE_W4_WG_PERSIST=0: a block an item,
 * as before session 12; w4_set_wg_persist for tests) */
static int w4_wg_persist_force = -1, w4_wg_persist_env = -1, w4_wg_persist_cap;

extern "C" void w4_set_wg_persist(int on, int max_blocks)
{
    w4_wg_persist_force = on;
    w4_wg_persist_cap = max_blocks > 0 ? max_blocks : 0;
}

static int w4_wg_persist(void) { return w4_switch(w4_wg_persist_force, &w4_wg_persist_env, "MOESERVE_W4_WG_PERSIST", "0"); }

/* The MoE's hot and small classes of experts (w4_tiles.c w4_moe_classes says which call tiles have
 * them and at what thresholds): MOESERVE_W4_MOE_HOT=N and MOESERVE_W4_MOE_SMALL=N pairs (0: off)
 * override the defaults, w4_set_moe_hot / w4_set_moe_small the environment (tests; -1: back to
 * the environment and the default). -1: no override. */
static int w4_moe_hot_force = -1, w4_moe_hot_env = -2, w4_moe_small_force = -1, w4_moe_small_env = -2;

extern "C" void w4_set_moe_hot(int pairs) { w4_moe_hot_force = pairs; }
extern "C" void w4_set_moe_small(int pairs) { w4_moe_small_force = pairs; }

static int w4_moe_pairs_set(int force, int *env, const char *name)
{
    if (force >= 0) return force;
    if (*env == -2) {
        const char *e = getenv(name);
        char *end = NULL;
        long v = e && *e ? strtol(e, &end, 10) : -1;
        if (e && *e && (*end || v < 0 || v > 1 << 20)) {
            log_warn("%s=%s: expected a number of pairs (0: off); using the default", name, e);
            v = -1;
        }
        *env = (int)v;
    }
    return *env;
}

/* ---- dense ---- */

/* block: W4_WARPS row tiles x 8 NT tokens x one K split. splits == 1: out = acc * gscale + bias;
 * else part[split][T][N] = acc * gscale (w4_reduce_kernel adds the splits and the bias). */
template <int NT, int ST, int KS, bool XF, bool SP, int WRD = 0>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_dense_kernel(float *out, int ldo, float *part,
                                                                         const void *x, int ldx, size_t lo, int T,
                                                                         QTensor w, const float *bias, int splits)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG;
    __shared__ float red[KS > 1 ? (KS - 1) * NT * 4 * 32 : 1];
    int i = blockIdx.x * (W4_WARPS / KS) + (threadIdx.x >> 5) / KS, active = i < N / 16;
    if (ST == 0 && !active) return; /* KS > 1: the whole block */
    int m0 = blockIdx.y * 8 * NT, m = min(8 * NT, T - m0), split = blockIdx.z;
    int g0 = (int)((int64_t)split * ng / splits), g1 = (int)((int64_t)(split + 1) * ng / splits);
    w4_krange<KS>(g0, g1);
    if (threadIdx.x < 8 * NT) {
        size_t r = (size_t)(m0 + min((int)threadIdx.x, m - 1)) * ldx;
        rowp[threadIdx.x] = XF ? (const void *)((const float *)x + r) : (const void *)((const __nv_bfloat16 *)x + r);
    }
    __syncthreads();
    const uint8_t *rec[1] = {w.data + (size_t)(active ? i : 0) * ng * W4_REC};
    float acc[1][NT][4];
    w4_tile<NT, 1, ST, XF, SP, WRD>(acc, rec, active, rowp, lo, (m + 7) / 8, g0, g1, w4_sx);
    if (!w4_kreduce<1, NT, KS>(acc, red) || !active) return;
    float sc = w.gscale * 512.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int slot = nt * 8 + 2 * t + (e & 1), row = 16 * i + g + 8 * (e >> 1);
            if (slot >= m) continue;
            float v = acc[0][nt][e] * sc;
            if (splits == 1) out[(size_t)(m0 + slot) * ldo + row] = v + (bias ? bias[row] : 0.f);
            else part[((size_t)split * T + m0 + slot) * N + row] = v;
        }
}

static __global__ void w4_reduce_kernel(float *out, int ldo, const float *part, const float *bias, int T, int N, int splits)
{
    pdl_wait(); /* launched dependent after tile 36's GEMM (w4_dense_wg): its sums */
    int64_t n = (int64_t)T * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = bias ? bias[i % N] : 0.f;
        for (int s = 0; s < splits; s++) v += part[s * n + i];
        out[(i / N) * ldo + i % N] = v;
    }
}

/* ---- configuration: forced, tuned or built-in; never a tile over the shared memory budget ---- */

static W4Config w4_force = {-1, 0};
static size_t w4_budget_sim = 0;
static W4Table w4_table;
static int w4_have_table = 0;

extern "C" void w4_set_config(W4Config c) { w4_force = c; }
extern "C" void w4_set_smem_budget(size_t bytes) { w4_budget_sim = bytes; }
extern "C" void w4_use_table(const W4Table *t)
{
    w4_have_table = t != NULL;
    if (t) w4_table = *t;
}

extern "C" size_t w4_smem_budget(int device)
{
    if (w4_budget_sim) return w4_budget_sim;
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return (size_t)optin;
}

extern "C" void w4_device_key(int device, char *buf, size_t n)
{
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    int drv = 0;
    cudaDriverGetVersion(&drv);
    snprintf(buf, n, "%s|%d SMs|%zu B smem|driver %d", p.name, p.multiProcessorCount, p.sharedMemPerBlockOptin, drv);
}

extern "C" int w4_load_cached(int device)
{
    char path[4096], err[512], key[256];
    w4_table_path(path, sizeof path);
    W4Table t;
    if (!file_exists(path)) return 0;
    if (w4_table_load(&t, path, err, sizeof err) < 0) {
        log_warn("w4: tuned table not taken (%s); the built-in tile choice is used: run `moeserve tune` again", err);
        return 0;
    }
    w4_device_key(device, key, sizeof key);
    if (strcmp(key, t.device) != 0) {
        log_info("w4: %s was tuned on another device (%s), not taken", path, t.device);
        return 0;
    }
    w4_use_table(&t);
    log_info("w4: tile table from %s", path);
    return 1;
}

/* what the code loaded for the device was built for: its __CUDA_ARCH__ / 10 (80, 90, ...; PTX
 * compiled for an older target and JIT-compiled for a newer GPU says the older) times 2, plus 1
 * where it has the sm_90a wgmma kernels */
static __global__ void w4_probe_kernel(int *out)
{
#ifdef __CUDA_ARCH__
    *out = __CUDA_ARCH__ / 10 * 2 + W4_WG_ARCH;
#endif
}

/* The probe's answer for a device, once: a build with no code the device can run is stopped here
 * with what to build instead (the first launch would otherwise fail with "no kernel image"). */
static int w4_probe(int device)
{
    static int known[64], val[64];
    if (device < 0 || device >= 64) return 0;
    if (!known[device]) {
        int prev = 0, *d = NULL, v = 0;
        CUDA_CHECK(cudaGetDevice(&prev));
        CUDA_CHECK(cudaSetDevice(device));
        cudaFuncAttributes fa;
        cudaError_t e = cudaFuncGetAttributes(&fa, w4_probe_kernel);
        if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
            char name[256];
            cuda_device_name(device, name, sizeof name);
            int cc = w4_device_cc(device);
            const char *a = cc == 90 ? "a" : ""; /* sm_90a: the wgmma tiles */
            fatal("--device cuda: this build has no GPU code that %s can run (compute capability %d.%d); build for it "
                  "with make CUDA_ARCH=\"-gencode=arch=compute_%d%s,code=sm_%d%s\" (several -gencode for several GPUs; "
                  "README, \"Building for other GPUs\")", name, cc / 10, cc % 10, cc, a, cc, a);
        }
        CUDA_CHECK(e);
        CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
        w4_probe_kernel<<<1, 1>>>(d);
        LAUNCH_CHECK("w4_probe_kernel");
        CUDA_CHECK(cudaMemcpy(&v, d, sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(d));
        CUDA_CHECK(cudaSetDevice(prev));
        val[device] = v;
        known[device] = 1;
    }
    return val[device];
}

/* 1 if the wg tiles run on this device: the code loaded for it is sm_90a's (a build without
 * sm_90a, or another GPU, runs w4_wg.cuh's kernels as empty bodies: the probe says 0) */
extern "C" int w4_wg_supported(int device) { return w4_probe(device) & 1; }

/* the architecture the device's loaded code was compiled for (80, 90, ...): the stream-K tiles'
 * clusters and programmatic dependent launch need code of 90 or later (griddepcontrol, the
 * cluster's shared memory), not only a GPU that has them: PTX for sm_80 JIT-compiled for an H100
 * or a Blackwell GPU has neither compiled in */
extern "C" int w4_code_arch(int device) { return w4_probe(device) / 2; }

extern "C" int w4_device_cc(int device)
{
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return 10 * major + minor;
}

/* The tile for an op with `tokens` rows (dense) or tokens (MoE, rows_per_weight pairs per expert) */
static int w4_pick(Backend *be, W4Kind kind, int tokens, double rows_per_weight)
{
    int dev = cuda_state(be)->device;
    size_t budget = w4_smem_budget(dev);
    int tile = w4_force.tile, wg = w4_wg_supported(dev);
    if (tile < 0 && w4_have_table) tile = w4_table.tile[kind][w4_bucket(tokens)];
    if (tile >= 0) {
        char why[256];
        if (!w4_tile_fits(w4_tiles[tile], budget, why, sizeof why) || !w4_tile_runs(w4_tiles[tile], wg, why, sizeof why))
            die("w4: tile %d (nt %d, st %d, ks %d) %s", tile, w4_tiles[tile].nt, w4_tiles[tile].st, w4_tiles[tile].ks, why);
        return tile;
    }
    return w4_default_tile(kind, rows_per_weight, budget, wg, w4_split_act());
}

static int sm_count(Backend *be)
{
    static int n = 0;
    if (!n) CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    return n;
}

/* Splits of K so that about 16 warps per SM stream weights (at most 16, at most the groups). */
static int w4_splits(int T, int N, int K, int nt, int ks, int sms)
{
    if (w4_force.splits > 0) return w4_force.splits < K / W4_KG ? w4_force.splits : K / W4_KG;
    int ng = K / W4_KG;
    int64_t warps = (int64_t)(N / 16) * cdiv(T, 8 * nt) * ks;
    int s = (int)((16L * sms + warps - 1) / warps);
    return s < 1 ? 1 : s > ng ? ng : s > 16 ? 16 : s;
}

/* Launch kernel template K<NT, ST> for tile index `tile`, with its dynamic shared memory
 * (raising the kernel's limit the first time it needs more than 48 KB). */
#define W4_SET_SMEM(KER, NTV, STV, KSV, SPV)                                                                           \
    do {                                                                                                               \
        static int done_ = 0;                                                                                          \
        if (!done_ && W4_SMEM(NTV, STV) > 48 * 1024) {                                                                 \
            CUDA_CHECK(cudaFuncSetAttribute(KER<NTV, STV, KSV, SPV>, cudaFuncAttributeMaxDynamicSharedMemorySize,       \
                                            W4_SMEM(NTV, STV)));                                                       \
            done_ = 1;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define W4_SET_SMEM2(KER, NTV, STV, KSV, XFV, SPV)                                                                     \
    do {                                                                                                               \
        static int done_ = 0;                                                                                          \
        if (!done_ && W4_SMEM(NTV, STV) > 48 * 1024) {                                                                 \
            CUDA_CHECK(cudaFuncSetAttribute(KER<NTV, STV, KSV, XFV, SPV>, cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                            W4_SMEM(NTV, STV)));                                                       \
            done_ = 1;                                                                                                 \
        }                                                                                                              \
    } while (0)
#define W4_DISPATCH(tile, LAUNCH)                                                                                      \
    switch (tile) {                                                                                                    \
    case 0: LAUNCH(1, 0, 1, false); break;                                                                                    \
    case 1: LAUNCH(2, 0, 1, false); break;                                                                                    \
    case 2: LAUNCH(4, 0, 1, false); break;                                                                                    \
    case 3: LAUNCH(2, 2, 1, false); break;                                                                                    \
    case 4: LAUNCH(4, 2, 1, false); break;                                                                                    \
    case 5: LAUNCH(4, 3, 1, false); break;                                                                                    \
    case 6: LAUNCH(4, 4, 1, false); break;                                                                                    \
    case 7: LAUNCH(8, 2, 1, false); break;                                                                                    \
    case 8: LAUNCH(8, 3, 1, false); break;                                                                                    \
    case 9: LAUNCH(8, 4, 1, false); break;                                                                                    \
    case 10: LAUNCH(1, 0, 4, false); break;                                                                            \
    case 11: LAUNCH(2, 0, 4, false); break;                                                                            \
    case 12: LAUNCH(1, 0, 1, true); break;                                                                             \
    case 13: LAUNCH(2, 0, 1, true); break;                                                                             \
    case 14: LAUNCH(4, 0, 1, true); break;                                                                             \
    case 15: LAUNCH(2, 2, 1, true); break;                                                                             \
    case 16: LAUNCH(4, 2, 1, true); break;                                                                             \
    case 17: LAUNCH(4, 3, 1, true); break;                                                                             \
    default: LAUNCH(8, 2, 1, true); break;                                                                             \
    }

/* ---- many rows (prefill): decode W to BF16 once, then cuBLASLt's tensor-core GEMM ---- */

/* one warp per record (16 rows x 256 columns): its mma.sync A fragments, decoded exactly as the
 * W4A16 tile decodes them (value * scale * 2^-9, exact in BF16), stored row-major; the GEMM's
 * alpha applies gscale * 2^9, as the tile's epilogue does */
static __global__ void w4_to_bf16_kernel(__nv_bfloat16 *out, const uint8_t *data, int64_t N, int64_t K)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t ng = K / W4_KG, recs = (N / 16) * ng;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < recs; r += (int64_t)gridDim.x * blockDim.x / 32) {
        int64_t i = r / ng, G = r % ng;
        W4Frag f;
        w4_load(f, data + r * W4_REC, lane);
        __nv_bfloat16 *r0 = out + (16 * i + g) * K + G * W4_KG, *r1 = r0 + 8 * K;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t sw = (c < 2) ? f.s.x : f.s.y;
            uint32_t sg = w4_scale2(sw, (2 * c) & 3), sh = w4_scale2(sw, (2 * c + 1) & 3);
            uint32_t words[4] = {f.c[c].x, f.c[c].y, f.c[c].z, f.c[c].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t a[4];
                w4_decode(words[j], sg, sh, a);
                /* logical k (2t, 2t+1, 2t+8, 2t+9) of step j is physical column 64c + 16t + 4j + q */
                int col = 64 * c + 16 * t + 4 * j;
                *(uint2 *)(r0 + col) = make_uint2(a[0], a[2]);
                *(uint2 *)(r1 + col) = make_uint2(a[1], a[3]);
            }
        }
    }
}

/* Rows from which a dense GEMM of a weight with n rows takes the BF16 route (n <= 0: the fewest of
 * any weight): MOESERVE_W4_LT_ROWS or w4_set_lt_rows for every weight (0: never), else 1536 where
 * tile 36 can run the call (n % 128 == 0, wgmma, its shared memory within the budget) and 256
 * where it cannot. Session 22 (H200): tile 36 in token tiles of 64 costs ~0.36 us a row on GLM-5
 * gate/up (BF16; 0.55 split), the route ~200 us (decoding W to BF16 and cuBLASLt's start at few
 * rows) plus 0.23 a row (0.40 split): even at 1536 rows (gate/up 517 against 522 us BF16, 879
 * against 827 split), the route ahead from 2048. The mma.sync tiles (n % 128 != 0: kv_a, q_a+kv_a)
 * lose to the route 2-4x from 256 rows. */
static int w4_lt_override = -1;
extern "C" void w4_set_lt_rows(int rows) { w4_lt_override = rows; }

extern "C" int w4_lt_rows(int n, int device)
{
    static int v = -2;
    if (w4_lt_override >= 0) return w4_lt_override;
    if (v == -2) {
        const char *e = getenv("MOESERVE_W4_LT_ROWS");
        v = e && *e ? atoi(e) : -1;
        if (e && *e && v < 0) v = 0;
    }
    if (v >= 0) return v;
    const int t36 = n > 0 && n % 128 == 0 && w4_wg_supported(device) &&
                    w4_tile_fits(w4_tiles[W4_DENSE_WG_TILE], w4_smem_budget(device), NULL, 0);
    return t36 ? 1536 : 256;
}

/* Prefill: compute-bound, where cuBLASLt's wgmma kernels reach the tensor roof and our mma.sync
 * tile does not; decoding W (0.56 bytes read and 2 written per weight, once per call) is
 * small next to 2 T FLOPs per weight once T is in the hundreds. The activations as the W4A16
 * kernels take them: two BF16 halves (2 T GEMM rows) by default, one with MOESERVE_W4_ACT=bf16. */
static void w4_matmul_lt(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                         const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols, split = w4_split_act();
    cudaStream_t st = cuda_stream(be);
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_WB, (size_t)N * K * sizeof(__nv_bfloat16));
    int64_t recs = (int64_t)(N / 16) * (K / W4_KG);
    int nb = (int)(recs / 8 + 1 < 65535 ? recs / 8 + 1 : 65535);
    w4_to_bf16_kernel<<<nb, 256, 0, st>>>(wb, w->data, N, K);
    LAUNCH_CHECK("w4_to_bf16_kernel");
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
    to_bf16(be, xb, x, ldx, T, K, split);
    float alpha = w->gscale * 512.f;
    if (split) { /* [x_hi; x_lo] as 2T rows, then their sum */
        float *y = (float *)cuda_scratch(be, SCR_MM_Y, (size_t)2 * T * N * sizeof(float)); /* as matmul.cu's BF16 route */
        lt_matmul_scaled(be, y, N, xb, CUDA_R_16BF, K, wb, CUDA_R_16BF, 2 * T, N, K, alpha);
        join_halves_cuda(be, out, ldo, y, bias, T, N);
        return;
    }
    lt_matmul_scaled(be, out, ldo, xb, CUDA_R_16BF, K, wb, CUDA_R_16BF, T, N, K, alpha);
    if (bias) add_bias_cuda(be, out, ldo, bias, T, N);
}

/* the ring tiles of the decode GEMM (st 0, wr > 0): each warp's weights through wr slots of
 * shared memory (w4_tile's WRD) */
template <int NT, int KS, int WRD>
static void w4_dense_ring(cudaStream_t st, dim3 grid, int xf, int split, float *out, int ldo, float *part, const void *xa,
                          int lda, size_t lo, int T, const QTensor *w, const float *bias, int splits)
{
    size_t smem = (size_t)W4_WARPS * WRD * W4_REC; /* at most 46 KB: no opt-in */
    static_assert(W4_WARPS * WRD * W4_REC <= 48 * 1024, "a dense ring tile over 48 KB");
    if (xf && split) w4_dense_kernel<NT, 0, KS, true, true, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else if (xf) w4_dense_kernel<NT, 0, KS, true, false, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else if (split) w4_dense_kernel<NT, 0, KS, false, true, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
    else w4_dense_kernel<NT, 0, KS, false, false, WRD><<<grid, W4_WARPS * 32, smem, st>>>(out, ldo, part, xa, lda, lo, T, *w, bias, splits);
}

/* ---- dense decode, stream-K (pf 3 tiles): one wave of blocks, contiguous runs of records ----
 * One wave of P blocks of W4_SK_WARPS warps: block b takes the row tiles [b n / P, (b + 1) n / P)
 * of W's n = N / 16 (blocks differ by one row tile at most: ~3% of imbalance on the GLM shapes), and its
 * warps cut the block's records (row tile major, the memory order) into equal contiguous runs, so
 * that no warp waits for a second wave and none idles at the tail. The block first stages its
 * token tile's activation rows whole (up to 8 NT rows x K, BF16 halves) in shared memory, once for
 * all its warps, instead of every warp reading and converting them through L1 (session 9's probe,
 * dev/cuda/probe_dense.cu: 69-80% of 4.0 TB/s at 1 row against tile 10's ~50%). The weights stream
 * through registers one record ahead (w4_load; L1 bypassed; two register sets taking turns). A
 * row tile a warp covers whole is
 * stored at once; one shared by several warps of the block (at most a run's first and last)
 * leaves each warp's sums in shared memory, and after one barrier the warp whose run holds the
 * tile's first record adds the shares in warp order (deterministic) and stores it.
 * KS (w4_sk_ksplit): clusters of S blocks, each cluster the row tiles a block would take, each
 * block of it K part rank (its records, its columns of the rows staged); a block's row tile sums
 * go to its shared memory, and after a cluster barrier each block adds the S parts of its share of
 * the cluster's row tiles in rank order and stores them. */
#define W4_SK_WARPS 16

/* a row tile's sums (acc, a warp's mma layout) for the m valid token slots: slot s, row r (of its
 * 16) to dst[s ld + r], scaled, plus bias[r] (bias: the tile's first, or null) */
template <int NT>
__device__ __forceinline__ void w4_sk_store(float *dst, int ld, const float (&acc)[NT][4], float sc, const float *bias, int m)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int slot = nt * 8 + 2 * t + (e & 1), row = g + 8 * (e >> 1);
            if (slot < m) dst[(size_t)slot * ld + row] = acc[nt][e] * sc + (bias ? bias[row] : 0.f);
        }
}

/* shared memory of a launch: the shares (2 a warp of NT x 4 floats x 32 lanes), then the staged rows */
#define W4_SK_SHARES(NT) ((size_t)W4_SK_WARPS * 2 * (NT) * 4 * 32 * sizeof(float))

/* this block's place in its cluster (x; 0 outside a cluster launch) and the cluster's size (y; 1) */
__device__ __forceinline__ uint2 cl_place()
{
    uint2 p = make_uint2(0, 1);
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(p.x), "=r"(p.y));
#endif
    return p;
}
/* shared address a of this block -> the same place in block `rank` of the cluster (shared::cluster) */
__device__ __forceinline__ uint32_t cl_map(uint32_t a, unsigned rank)
{
    uint32_t r = a;
#if __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}
__device__ __forceinline__ void cl_st(uint32_t a, uint2 v)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(a), "r"(v.x), "r"(v.y) : "memory");
#endif
}
__device__ __forceinline__ float cl_ldf(uint32_t a)
{
    float v = 0.f;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ void cl_arrive_relaxed()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_arrive()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive;" ::: "memory");
#endif
}
__device__ __forceinline__ void cl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;" ::: "memory");
#endif
}

/* The block's m activation rows x[m0 ..] into shared memory xs (row stride XS): BF16 hi halves, then
 * (SP) the lo halves m rows further; 8 float4 loads in flight a thread before any is converted
 * (a loop of one load at a time waited an L2 round trip per 4 values: 24 of them at 8 rows). In a
 * cluster of ncl blocks (the same token tile), block `rank` reads and converts only columns
 * [rank K / ncl, (rank + 1) K / ncl) and stores them into every block's xs (distributed shared
 * memory; xsp[p]: block p's xs as a shared::cluster address): each block reads 1 / ncl of the
 * rows from L2 (every block of the wave needs all of them: 8 rows of K = 6144 floats are 26 MB
 * of L2 reads for 132 blocks, that no weight load overlaps but the first record). */
template <bool SP, bool CL>
__device__ __forceinline__ void w4_sk_stage(__nv_bfloat16 *xs, const uint32_t *xsp, int XS, const float *x, int ldx, int m0, int m,
                                            int K, unsigned rank, unsigned ncl, int kx = 0)
{
    const bool v4 = (ldx & 3) == 0 && ((uintptr_t)x & 15) == 0;
    if (!CL) rank = 0, ncl = 1;
    const int Kq = CL ? K / (4 * (int)ncl) : K / 4, kc0 = (int)rank * 4 * Kq; /* this block's columns, in groups of 4 */
    x += kx; /* (K split) the block's columns start at kx of x; xs holds K from its column 0 */
    const int n = m * Kq;
    for (int q0 = threadIdx.x; q0 < n; q0 += 8 * blockDim.x) {
        float4 f[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = q0 + u * blockDim.x;
            if (q >= n) break;
            const float *src = x + (size_t)(m0 + q / Kq) * ldx + kc0 + 4 * (q % Kq);
            if (v4) f[u] = __ldg((const float4 *)src);
            else f[u] = make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = q0 + u * blockDim.x;
            if (q >= n) break;
            int rr = q / Kq, k = kc0 + 4 * (q % Kq);
            __nv_bfloat162 h0 = __floats2bfloat162_rn(f[u].x, f[u].y), h1 = __floats2bfloat162_rn(f[u].z, f[u].w);
            uint2 hv = make_uint2(*(uint32_t *)&h0, *(uint32_t *)&h1), lv = hv;
            if (SP) {
                __nv_bfloat162 l0 = __floats2bfloat162_rn(f[u].x - __low2float(h0), f[u].y - __high2float(h0));
                __nv_bfloat162 l1 = __floats2bfloat162_rn(f[u].z - __low2float(h1), f[u].w - __high2float(h1));
                lv = make_uint2(*(uint32_t *)&l0, *(uint32_t *)&l1);
            }
            if (!CL) {
                *(uint2 *)(xs + (size_t)rr * XS + k) = hv;
                if (SP) *(uint2 *)(xs + (size_t)(m + rr) * XS + k) = lv;
            } else {
#pragma unroll
                for (int p = 0; p < 4; p++) /* constant indices: xsp stays in registers */
                    if (p < (int)ncl) {
                        cl_st(xsp[p] + 2u * (uint32_t)(rr * XS + k), hv);
                        if (SP) cl_st(xsp[p] + 2u * (uint32_t)((m + rr) * XS + k), lv);
                    }
            }
        }
    }
}

/* PDL: launched with programmatic stream serialization (w4_sk_pdl), the kernel may start while
 * the one before it in the stream finishes: the first records are loaded before waiting for
 * it (griddepcontrol.wait; the weights are constant), the activations and the outputs after. */
template <int NT, bool SP, bool PK, bool CL, bool KS = false>
static __global__ void __launch_bounds__(W4_SK_WARPS * 32, 1) w4_dense_sk_kernel(float *out, int ldo, const float *x, int ldx,
                                                                                int T, QTensor w, const float *bias)
{
    extern __shared__ __align__(16) float w4_sks[];
    static_assert(!PK || (NT == 1 && SP), "packed halves: one n8 tile of split activations");
    static_assert(!(CL && KS), "a cluster stages the rows together (CL) or splits K (KS)");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const uint2 place = CL || KS ? cl_place() : make_uint2(0, 1); /* CL, KS: launched in clusters */
    const unsigned ncl = place.y, rank = place.x;
    /* KS: the ncl blocks of a cluster take the same row tiles, block `rank` the K part rank of ncl
     * (gk of each row tile's ng record groups); record j of the block's own numbering (row tile
     * major over its gk) is W's record (j / gk) ng + rank gk + j % gk */
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG, S = KS ? (int)ncl : 1, gk = ng / S, kr = KS ? (int)rank : 0;
    const int XS = K / S + 8; /* rows 16 bytes apart mod 128 */
    const int nb = (int)gridDim.x / S, bi = (int)blockIdx.x / S; /* the block (KS: the cluster) among them */
    const int tb0 = (int)((int64_t)bi * (N / 16) / nb), tb1 = (int)((int64_t)(bi + 1) * (N / 16) / nb);
    const int rb0 = tb0 * gk, Rb = (tb1 - tb0) * gk; /* the block's records */
    const int r0 = rb0 + warp * Rb / W4_SK_WARPS, r1 = rb0 + (warp + 1) * Rb / W4_SK_WARPS;
    const int m0 = blockIdx.y * 8 * NT, m = min(8 * NT, T - m0);
    auto recp = [&](int j) {
        if constexpr (!KS) {
            return w.data + (size_t)j * W4_REC;
        } else {
            int i = j / gk;
            return w.data + ((size_t)i * ng + kr * gk + (j - i * gk)) * W4_REC;
        }
    };
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(w4_sks + W4_SK_SHARES(NT) / sizeof(float));
    /* KS: the block's sums of each of its row tiles, [row tile - tb0][8 NT token slots][16 rows], after the rows */
    float *part = (float *)(xs + (((size_t)m * XS * (SP ? 2 : 1) + 7) & ~(size_t)7));
    if (CL && ncl > 1) cl_arrive_relaxed(); /* this block has started (its peers write into its xs) */
    W4Frag nxt;
    if (r0 < r1) w4_load(nxt, recp(r0), lane); /* in flight while the rows are staged */
    pdl_wait();    /* the kernel before: done, visible */
    pdl_trigger(); /* the next may take SMs as they free (it waits for this grid's end itself) */
    uint32_t xsp[4] = {0, 0, 0, 0}; /* xs in each block of the cluster */
    if (CL && ncl > 1) {
        const uint32_t xa = (uint32_t)__cvta_generic_to_shared(xs);
#pragma unroll
        for (unsigned p = 0; p < 4; p++)
            if (p < ncl) xsp[p] = cl_map(xa, p);
        cl_wait(); /* every block of the cluster has started */
    }
    if (CL && ncl > 1) { /* every block's share of the rows has landed in every xs */
        w4_sk_stage<SP, true>(xs, xsp, XS, x, ldx, m0, m, K, rank, ncl);
        cl_arrive();
        cl_wait();
    } else {
        w4_sk_stage<SP, false>(xs, xsp, XS, x, ldx, m0, m, K / S, 0, 1, kr * gk * W4_KG);
        __syncthreads();
    }
    const int ntv = (m + 7) / 8;
    const __nv_bfloat16 *xr[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) /* PK: lanes of g 4..7 read the low halves (w4_packs) */
        xr[nt] = xs + (size_t)(PK ? (g < 4 ? min(g, m - 1) : m + min(g - 4, m - 1)) : min(nt * 8 + g, m - 1)) * XS + t * 16;
    const size_t lo = (size_t)m * XS;
    const float sc = w.gscale * 512.f;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    int i = r0 / gk, G = r0 - i * gk;
    /* row tile it's sums: to out (scaled, the bias added), or (KS) to part, as they are */
    auto put = [&](const float (&a)[NT][4], int it) {
        if constexpr (KS) w4_sk_store<NT>(part + (size_t)(it - tb0) * 8 * NT * 16, 16, a, 1.f, nullptr, m);
        else w4_sk_store<NT>(out + (size_t)m0 * ldo + 16 * it, ldo, a, sc, bias ? bias + 16 * it : nullptr, m);
    };
    /* record r from registers cur: its MMAs, and at the end of row tile i its store or share */
    auto step = [&](const W4Frag &cur, int r) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t a[4][4];
            w4_decode_chunk(cur, c, a);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (nt < ntv)
#pragma unroll
                    for (int h = 0; h < (SP && !PK ? 2 : 1); h++) {
                        const uint4 *p = (const uint4 *)(xr[nt] + h * lo + G * W4_KG + c * 64);
                        w4_mma_chunk(acc[nt], a, p[0], p[1]);
                    }
        }
        if (++G < gk && r + 1 < r1) return;
        if constexpr (PK) w4_fold4(acc[0]);
        /* the end of row tile i in this run: stored if whole, else the warp's share kept */
        if (i * gk >= r0 && (i + 1) * gk <= r1) put(acc, i);
        else {
            float *p = w4_sks + (size_t)(warp * 2 + (i == r0 / gk ? 0 : 1)) * NT * 4 * 32;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) p[(nt * 4 + e) * 32 + lane] = acc[nt][e];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        i++;
        G = 0;
    };
    /* two register sets taking turns (unrolled by 2: no copy of a record between them) */
    W4Frag alt;
    for (int r = r0; r < r1; r += 2) {
        if (r + 1 < r1) w4_load(alt, recp(r + 1), lane);
        step(nxt, r);
        if (r + 1 >= r1) break;
        if (r + 2 < r1) w4_load(nxt, recp(r + 2), lane);
        step(alt, r + 1);
    }
    __syncthreads();
    /* the shared row tile that starts in this run (its last, if shared): the shares of warps
     * warp .. wb in warp order; warp u holds record r of the block iff u = ((r - rb0 + 1) 16 - 1) / Rb.
     * None where the run is empty, or its last row tile starts in an earlier run or ends in this one. */
    const int il = (r1 - 1) / gk;
    if (r0 < r1 && il * gk >= r0 && (il + 1) * gk > r1) {
        const int wb = (int)(((int64_t)((il + 1) * gk - rb0) * W4_SK_WARPS - 1) / Rb);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        for (int u = warp; u <= wb; u++) {
            const int ur0 = rb0 + u * Rb / W4_SK_WARPS;
            if (ur0 == rb0 + (u + 1) * Rb / W4_SK_WARPS) continue; /* a warp with no record (Rb < 16) */
            const float *p = w4_sks + (size_t)(u * 2 + (il == ur0 / gk ? 0 : 1)) * NT * 4 * 32;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[nt][e] += p[(nt * 4 + e) * 32 + lane];
        }
        put(acc, il);
    }
    if constexpr (KS) {
        /* every block's sums of the cluster's row tiles are in its part; block `rank` adds the K
         * parts of its share of the row tiles in rank order (the same result every call), scales,
         * adds the bias and stores; the second barrier keeps each part alive until its readers are done */
        cl_arrive();
        cl_wait();
        const int nr = tb1 - tb0, la = (int)rank * nr / S, lb = ((int)rank + 1) * nr / S, per = m * 16;
        const uint32_t pa = (uint32_t)__cvta_generic_to_shared(part);
        for (int q = threadIdx.x; q < (lb - la) * per; q += blockDim.x) {
            const int li = la + q / per, slot = (q % per) >> 4, row = q & 15;
            const uint32_t off = 4u * (uint32_t)(((size_t)li * 8 * NT + slot) * 16 + row);
            float v = 0.f;
            for (int p = 0; p < S; p++) v += cl_ldf(cl_map(pa + off, (unsigned)p));
            const int n = 16 * (tb0 + li) + row;
            out[(size_t)(m0 + slot) * ldo + n] = v * sc + (bias ? bias[n] : 0.f);
        }
        cl_arrive();
        cl_wait();
    }
}

/* Shared memory of a stream-K launch: the shares, then its token tile's rows (K whole, or its part
 * of ks), as BF16 halves; with K in parts, then the sums of prt row tiles */
static size_t w4_sk_smem(int T, int K, int nt, int split, int ks = 1, int prt = 0)
{
    size_t rows = (size_t)(T < 8 * nt ? T : 8 * nt) * (K / ks + 8) * (split ? 2 : 1); /* BF16 values */
    if (ks == 1) return W4_SK_SHARES(nt) + rows * 2;
    return W4_SK_SHARES(nt) + ((rows + 7) & ~(size_t)7) * 2 + (size_t)prt * 8 * nt * 16 * sizeof(float);
}

/* Programmatic dependent launch of the stream-K tiles and of the MoE down kernel after gate/up
 * (on where the loaded code is sm_90's or later, w4_code_arch; MOESERVE_W4_PDL=0 turns it off): the next kernel's first weight loads overlap the
 * tail of the one before. */
extern "C" int w4_sk_pdl(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MOESERVE_W4_PDL");
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        v = w4_code_arch(dev) >= 90 && !(e && !strcmp(e, "0")); /* the kernels' griddepcontrol.wait is compiled in */
    }
    return v;
}

/* the launch attribute that groups blocks x .. x + cl - 1 into a cluster (they run together and
 * share their shared memory) */
static cudaLaunchAttribute w4_cluster_attr(int cl)
{
    cudaLaunchAttribute a = {};
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = cl;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
    return a;
}

/* kernel<<<grid, block, smem, st>>>(args) with programmatic dependent launch where w4_sk_pdl()
 * says so (the kernel may begin while the one before it ends, and waits for it and its memory at
 * its pdl_wait), in clusters of `cluster` blocks where that is over 1 */
template <typename... KArgs, typename... Args>
static void w4_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, int cluster,
                              Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    int na = 0;
    if (w4_sk_pdl()) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) attr[na++] = w4_cluster_attr(cluster);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = na;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename... KArgs, typename... Args>
static void w4_launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args... args)
{
    w4_launch_cluster(kernel, grid, block, smem, st, 1, args...);
}

/* The blocks of one wave of kernel <NT, SP, PK, cl > 1> with smem bytes of dynamic shared memory, in
 * clusters of cl blocks (its limit raised the first time a call needs it): asked of the runtime
 * once a (size, cluster), not on every eager call (the calls of a model alternate between a few
 * sizes, one per shape). Clusters of 4 need 4 free SMs of one GPC: a wave may leave a few SMs out. */
template <int NT, bool SP, bool PK, bool CL, bool KS = false>
static int w4_sk_blocks(size_t smem, int cl, int sms)
{
    static size_t raised, key[8];
    static int kcl[8], val[8], n;
    for (int k = 0; k < n && k < 8; k++)
        if (key[k] == smem && kcl[k] == cl) return val[k];
    if (smem > raised) {
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_sk_kernel<NT, SP, PK, CL, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        raised = smem;
    }
    int blocks = 0;
    if (cl <= 1) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, w4_dense_sk_kernel<NT, SP, PK, CL, KS>, W4_SK_WARPS * 32, smem));
        blocks *= sms;
    } else {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1] = {w4_cluster_attr(cl)};
        cfg.gridDim = dim3(sms / cl * cl, 1, 1);
        cfg.blockDim = dim3(W4_SK_WARPS * 32, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, w4_dense_sk_kernel<NT, SP, PK, CL, KS>, &cfg));
        blocks = clusters * cl;
    }
    key[n % 8] = smem;
    kcl[n % 8] = cl;
    val[n % 8] = blocks;
    n++;
    return blocks;
}

/* Blocks a cluster of the stream-K launch staging T rows of K (twice with split activations):
 * MOESERVE_W4_SK_CLUSTER (1, 2 or 4), else 2 where the staged values are 24576 or more, 1 below
 * (session 11, docs/PERFORMANCE.md: small stagings lose the cluster barrier's cost; clusters of 4
 * leave SMs of the wave idle, a GPC's SMs are not a multiple of 4; a pair is a TPC's two SMs). */
static int w4_sk_cluster_set;
extern "C" void w4_set_sk_cluster(int cl) { w4_sk_cluster_set = cl == 1 || cl == 2 || cl == 4 ? cl : 0; }

static int w4_sk_cluster(int T, int K, int split)
{
    static int v = -1;
    if (w4_sk_cluster_set) return w4_sk_cluster_set;
    if (v < 0) {
        const char *e = getenv("MOESERVE_W4_SK_CLUSTER");
        v = e && *e ? atoi(e) : 0;
        if (e && *e && v != 1 && v != 2 && v != 4) log_warn("MOESERVE_W4_SK_CLUSTER=%s: expected 1, 2 or 4; using the default", e);
        if (v != 1 && v != 2 && v != 4) v = 0;
    }
    return v ? v : (long)T * K * (split ? 2 : 1) >= 24576 ? 2 : 1;
}

/* K parts of a stream-K launch (KS: a cluster of that many blocks takes the same row tiles, each
 * block its part of K, staging only its part of the rows; the parts' sums are added through the
 * cluster's shared memory). MOESERVE_W4_SK_KSPLIT (1, 2 or 4), else (fit = 0) where the launch
 * with K whole cannot run, up to 8 rows (tile 34): its rows over the shared memory budget, or
 * fewer row tiles than SMs; 4 parts where K has them, else 2 (session 17, H200, docs/PERFORMANCE.md:
 * GLM-5 shared gate/up 2048 x 6144 at 1-8 rows 9.0-10.4 -> 7.3-8.1 us BF16, split 10.4-11.7 ->
 * 7.4-9.0; GLM-5 o_proj at 8 rows BF16 28.0 -> 23.1, at 4 split 27.4 -> 22.1. Where the launch
 * with K whole runs, the parts lose: the cluster's start and its two barriers, 1-3 us at 1 row).
 * Returns the parts (1: K whole). */
static int w4_sk_ksplit_set;
extern "C" void w4_set_sk_ksplit(int s) { w4_sk_ksplit_set = s == 1 || s == 2 || s == 4 ? s : 0; }

static int w4_sk_ksplit(int nt, int K, int fit)
{
    static int v = -1;
    int ng = K / W4_KG, s = w4_sk_ksplit_set;
    if (!s) {
        if (v < 0) {
            const char *e = getenv("MOESERVE_W4_SK_KSPLIT");
            v = e && *e ? atoi(e) : 0;
            if (e && *e && v != 1 && v != 2 && v != 4) log_warn("MOESERVE_W4_SK_KSPLIT=%s: expected 1, 2 or 4; using the default", e);
            if (v != 1 && v != 2 && v != 4) v = 0;
        }
        s = v ? v : fit || nt > 1 ? 1 : 4;
    }
    while (s > 1 && ng % s) s /= 2;
    return s;
}

static long w4_sk_count;
extern "C" long w4_sk_calls(void) { return w4_sk_count; }

/* Run tile `tile` (pf 3) if this call suits it: 1 with the GEMM launched, 0 if not (more rows
 * than two token tiles, rows over the shared memory budget, or fewer row tiles than a wave has
 * blocks: a row tile is never split across blocks). */
static int w4_dense_sk(Backend *be, int tile, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                       const float *bias, int split, size_t budget)
{
    int nt = w4_tiles[tile].nt, N = (int)w->rows, K = (int)w->cols, sms = sm_count(be);
    int gy = cdiv(T, 8 * nt);
    /* KS (w4_sk_ksplit): the K parts of a cluster's blocks; each stages its part of the rows and
     * keeps its sums of the cluster's row tiles (room for clusters down to half the SMs' worth) */
    size_t smem = w4_sk_smem(T, K, nt, split);
    const int clus = w4_code_arch(cuda_state(be)->device) >= 90; /* clusters: sm_90 code (cl_place, DSMEM) */
    const int ks = clus ? w4_sk_ksplit(nt, K, smem <= budget && N / 16 >= sms) : 1;
    const int prt = ks > 1 ? cdiv(N / 16, sms / ks / 2 > 0 ? sms / ks / 2 : 1) : 0;
    if (ks > 1) smem = w4_sk_smem(T, K, nt, split, ks, prt);
    if (gy > 2 || nt * gy > 2 || smem > budget) return 0;
    /* the kernel for (nt, split), its shared memory limit raised as the calls need, and the blocks
     * of its wave (1 an SM: 16 warps at up to 128 registers), in clusters of cl that stage the
     * rows together (w4_sk_stage) */
    int blocks = 0, cl = ks > 1 ? ks : clus ? w4_sk_cluster(T, K, split) : 1;
    cudaStream_t st = cuda_stream(be);
#define W4_SK_LAUNCH_CL(NTV, SPV, PKV, CLV, KSV)                                                                       \
    do {                                                                                                               \
        blocks = w4_sk_blocks<NTV, SPV, PKV, CLV, KSV>(smem, cl, sms);                                                 \
        if (blocks < cl || N / 16 < (KSV ? blocks / cl : blocks) || (KSV && cdiv(N / 16, blocks / cl) > prt)) return 0; \
        w4_launch_cluster(w4_dense_sk_kernel<NTV, SPV, PKV, CLV, KSV>, dim3(blocks, gy), W4_SK_WARPS * 32, smem, st, cl, \
                          out, ldo, x, ldx, T, *w, bias);                                                              \
    } while (0)
#define W4_SK_LAUNCH(NTV, SPV, PKV)                                                                                    \
    do {                                                                                                               \
        if (ks > 1) W4_SK_LAUNCH_CL(NTV, SPV, PKV, false, true);                                                       \
        else if (cl > 1) W4_SK_LAUNCH_CL(NTV, SPV, PKV, true, false);                                                  \
        else W4_SK_LAUNCH_CL(NTV, SPV, PKV, false, false);                                                             \
    } while (0)
    if (nt == 1 && split && T <= 4) W4_SK_LAUNCH(1, true, true); /* the halves in one n8 tile (w4_packs) */
    else if (nt == 1 && split) W4_SK_LAUNCH(1, true, false);
    else if (nt == 1) W4_SK_LAUNCH(1, false, false);
    else if (nt == 2 && split) W4_SK_LAUNCH(2, true, false);
    else if (nt == 2) W4_SK_LAUNCH(2, false, false);
    else die("w4: tile %d is no stream-K kernel (nt %d)", tile, nt);
#undef W4_SK_LAUNCH
#undef W4_SK_LAUNCH_CL
    LAUNCH_CHECK("w4_dense_sk_kernel");
    w4_sk_count++;
    return 1;
}

/* ---- dense decode on the wg ring tile (sm_90a) ----
 * The MoE's tile 30 GEMM (w4_wg_gemm: 2 warpgroups of 64 weight rows, wgmma with the decoded
 * weights as A and up to 32 token rows as B, the weights through each warp's ring of records)
 * for a dense W [N, K] and T <= 32 rows: block (rb, s) takes rows [128 rb, 128 rb + 128) over the
 * record groups of K split s of `splits` (as many splits as fill two blocks an SM); with splits > 1
 * the partial sums go to part[s][T][N] and w4_reduce_kernel adds them in split order (the same
 * result every call). The activations enter as BF16 rows permuted inside each 64-column chunk
 * (to_bf16 perm), their low halves lo elements further. Launched with PDL after to_bf16 (w4_dense_wg),
 * it asks for its first ring records before waiting for the activations, and the reduction after
 * it is launched so too (session 19: -5 to -11% at 17-32 rows; adding the splits in the kernel,
 * by each row block's last split, was slower in sessions 15 and 19: a serial tail). */
template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, 2) w4_dense_wg_kernel(float *out, int ldo, float *part, const __nv_bfloat16 *xb,
                                                                   size_t lo, int T, QTensor w, const float *bias, int splits)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int N = (int)w.rows, K = (int)w.cols, ng = K / W4_KG, split = blockIdx.y, i = 8 * blockIdx.x + warp;
    const int g0 = (int)((int64_t)split * ng / splits), g1 = (int)((int64_t)(split + 1) * ng / splits);
    const uint8_t *rec = w.data + ((size_t)i * ng + g0) * W4_REC;
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (g1 - g0 >= WR - 1) { /* the first records, before the activations are ready (to_bf16 before, PDL) */
        if (lane == 0)
            for (int G = 0; G < WR - 1; G++) wg_ring_fill(ring.slots + G * W4_REC, rec + (size_t)G * W4_REC, ring.bars + 8 * G);
        ring.pre = 1;
    }
    pdl_wait(); /* to_bf16: done, its rows visible */
    pdl_trigger();
    const int m0 = 8 * NT * blockIdx.z, m = min(8 * NT, T - m0); /* this block's token tile */
    if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(m0 + min((int)threadIdx.x, m - 1)) * K + (size_t)g0 * W4_KG;
    __syncthreads();
    float acc[4 * NT];
    w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, rec, rowp, lo, g1 - g0, m, sm, ring, nullptr);
    const float sc = w.gscale * 512.f;
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
        for (int p = 0; p < 2; p++) {
            int slot = 8 * b + 2 * t + p, row = 16 * i + g;
            if (slot >= m) continue;
            slot += m0;
            float v0 = acc[4 * b + p] * sc, v1 = acc[4 * b + p + 2] * sc;
            if (splits == 1) {
                out[(size_t)slot * ldo + row] = v0 + (bias ? bias[row] : 0.f);
                out[(size_t)slot * ldo + row + 8] = v1 + (bias ? bias[row + 8] : 0.f);
            } else {
                float *pr = part + ((size_t)split * T + slot) * N + row;
                pr[0] = v0;
                pr[8] = v1;
            }
        }
#endif
}

static long w4_dense_wg_count;
extern "C" long w4_dense_wg_calls(void) { return w4_dense_wg_count; }

/* tile 36's launch on the GEMM of a ring tile <NT, ST, WR, CPS>: tile 30's (32 rows) or tile 28's (64) */
template <int NT, int ST, int WR, int CPS>
static void w4_dense_wg_launch(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols;
    const int smem = W4_WG_SMEM(NT, ST, WR);
    static int ready = 0;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_wg_kernel<NT, ST, WR, CPS, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_dense_wg_kernel<NT, ST, WR, CPS, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        ready = 1;
    }
    /* splits of K: as many as one wave of two blocks an SM holds (a second, partial wave would
     * cost a whole item's time: session 15 measured 2x), each split 2 record groups or more */
    int rb = N / 128, ng = K / W4_KG, ntt = cdiv(T, 8 * NT), splits = 2 * sm_count(be) / (rb * ntt);
    if (splits > ng / 2) splits = ng / 2;
    if (splits < 1) splits = 1;
    int split = w4_split_act();
    cudaStream_t st = cuda_stream(be);
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
    to_bf16(be, xb, x, ldx, T, K, split, 1);
    float *part = splits > 1 ? (float *)cuda_scratch(be, SCR_W4_PART, (size_t)splits * T * N * sizeof(float)) : NULL;
    if (split)
        w4_launch_dependent(w4_dense_wg_kernel<NT, ST, WR, CPS, 1>, dim3(rb, splits, ntt), 256, smem, st, out, ldo, part,
                            (const __nv_bfloat16 *)xb, (size_t)T * K, T, *w, bias, splits);
    else
        w4_launch_dependent(w4_dense_wg_kernel<NT, ST, WR, CPS, 0>, dim3(rb, splits, ntt), 256, smem, st, out, ldo, part,
                            (const __nv_bfloat16 *)xb, (size_t)0, T, *w, bias, splits);
    LAUNCH_CHECK("w4_dense_wg_kernel");
    if (splits > 1) {
        int64_t n = (int64_t)T * N;
        const int nb = cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535;
        w4_launch_dependent(w4_reduce_kernel, dim3(nb), 256, 0, st, out, ldo, (const float *)part, bias, T, N, splits);
        LAUNCH_CHECK("w4_reduce_kernel");
    }
    w4_dense_wg_count++;
}

/* 1 with the GEMM launched on the wg ring tile, 0 where the call does not suit it (N % 128, no
 * wgmma, tile 30's shared memory over the budget): up to 32 rows on tile 30's GEMM, from 33 on
 * tile 28's (the same shared memory; session 19, H200: GLM-5 gate/up at 33 rows 131 -> 34 us BF16,
 * at 64 rows 75 -> 43, against w4_sk_fallback's tile 4), above 64 rows in token tiles of 64 (a
 * grid dimension; each token tile's blocks decode the weights again; session 22, H200: GLM-5
 * gate/up at 128 rows 215 -> 64 us BF16 and 470 -> 100 split against tile 7, at 512 rows 319 ->
 * 182 and 444 -> 280 against the BF16 + cuBLASLt route, which takes the calls from
 * w4_lt_rows(N)) */
static int w4_dense_wg(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, dev = cuda_state(be)->device;
    const W4Tile tw = w4_tiles[W4_DENSE_WG_TILE];
    if (N % 128 || cdiv(T, 64) > 65535 || !w4_wg_supported(dev) || !w4_tile_fits(tw, w4_smem_budget(dev), NULL, 0)) return 0;
    constexpr int NT = 4, ST = 6, WR = 3, CPS = 2; /* tile 30 */
    CHECK(tw.nt == NT && tw.st == ST && tw.wr == WR && tw.sc == CPS, "w4: tile %d is not <%d, %d, %d, %d>", W4_DENSE_WG_TILE, NT, ST,
          WR, CPS);
    static_assert(W4_WG_SMEM(8, 3, 3) == W4_WG_SMEM(NT, ST, WR), "tile 28's GEMM fits where tile 36 does");
    if (T > 8 * NT) w4_dense_wg_launch<8, 3, 3, 1>(be, out, ldo, x, ldx, T, w, bias); /* tile 28's GEMM */
    else w4_dense_wg_launch<NT, ST, WR, CPS>(be, out, ldo, x, ldx, T, w, bias);
    return 1;
}

void w4_matmul_cuda(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w, const float *bias)
{
    int N = (int)w->rows, K = (int)w->cols;
    cudaStream_t st = cuda_stream(be);
    const int lt = w4_lt_rows(N, cuda_state(be)->device);
    if (lt > 0 && T >= lt) {
        w4_matmul_lt(be, out, ldo, x, ldx, T, w, bias);
        return;
    }
    int tile = w4_pick(be, W4_DENSE, T, T);
    if (w4_tiles[tile].pf == 3 || w4_tiles[tile].pf == 4) {
        /* stream-K or tile 36, where the call suits it (stream-K, then tile 36); else the choice without them */
        size_t budget = w4_smem_budget(cuda_state(be)->device);
        if (w4_tiles[tile].pf == 3 && w4_dense_sk(be, tile, out, ldo, x, ldx, T, w, bias, w4_split_act(), budget)) return;
        /* tile 36 where stream-K does not suit the call, but at up to 8 rows of a weight with fewer
         * than 32 row blocks (its K split into items of 2 record groups): tile 10's K split inside a
         * block is faster there (session 15: GLM-5 q_a at 1 row 8.7 us against 10.1) */
        if ((w4_tiles[tile].pf == 4 || T > 8 || N >= 32 * 128) && w4_dense_wg(be, out, ldo, x, ldx, T, w, bias)) return;
        tile = w4_sk_fallback(T, budget, w4_split_act());
    }
    if (w4_tiles[tile].pf) tile = w4_tiles[tile].pf == 2 ? W4_WG_DENSE_TWIN : W4_PF_DENSE_TWIN; /* MoE-only: fits wherever the pf tile fits (test_w4_tiles) */
    int nt = w4_tiles[tile].nt;
    int splits = w4_splits(T, N, K, nt, w4_tiles[tile].ks, sm_count(be));
    /* tiles reading activations from global memory round the float32 rows themselves */
    int xf = w4_tiles[tile].st == 0 && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0, split = w4_split_act();
    const void *xa = x;
    int lda = ldx;
    size_t lo = split; /* XF: a flag */
    if (!xf) {
        __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * K * sizeof(__nv_bfloat16));
        to_bf16(be, xb, x, ldx, T, K, split);
        xa = xb;
        lda = K;
        lo = split ? (size_t)T * K : 0;
    }
    float *part = splits > 1 ? (float *)cuda_scratch(be, SCR_W4_PART, (size_t)splits * T * N * sizeof(float)) : NULL;
    dim3 grid(cdiv(N / 16, W4_WARPS / w4_tiles[tile].ks), cdiv(T, 8 * nt), splits);
#define LAUNCH_DENSE_SP(NTV, STV, KSV, SPV)                                                                           \
    if (STV == 0 && xf)                                                                                                \
        w4_dense_kernel<NTV, STV, KSV, true, SPV><<<grid, W4_WARPS * 32, 0, st>>>(out, ldo, part, xa, lda, lo, T, *w,   \
                                                                                  bias, splits);                       \
    else {                                                                                                             \
        W4_SET_SMEM2(w4_dense_kernel, NTV, STV, KSV, false, SPV);                                                      \
        w4_dense_kernel<NTV, STV, KSV, false, SPV><<<grid, W4_WARPS * 32, W4_SMEM(NTV, STV), st>>>(                    \
            out, ldo, part, xa, lda, lo, T, *w, bias, splits);                                                         \
    }
/* one weight stream: a stream-split tile (ss) runs as its ss 0 twin */
#define LAUNCH_DENSE_T(NTV, STV, KSV, SSV) LAUNCH_DENSE_SP(NTV, STV, KSV, true)
#define LAUNCH_DENSE_F(NTV, STV, KSV, SSV) LAUNCH_DENSE_SP(NTV, STV, KSV, false)
    if (!w4_tiles[tile].pf && w4_tiles[tile].wr) {
#define W4_DENSE_RING(NTV, KSV, WRV)                                                                                   \
    CHECK(w4_tiles[tile].nt == NTV && w4_tiles[tile].st == 0 && w4_tiles[tile].ks == KSV && w4_tiles[tile].wr == WRV,    \
          "w4: dense ring tile %d is not <%d, 0, %d, %d>", tile, NTV, KSV, WRV);                                       \
    w4_dense_ring<NTV, KSV, WRV>(st, grid, xf, split, out, ldo, part, xa, lda, lo, T, w, bias, splits)
        switch (tile) {
        case 31: W4_DENSE_RING(1, 4, 3); break;
        case 32: W4_DENSE_RING(1, 4, 4); break;
        case 33: W4_DENSE_RING(2, 4, 3); break;
        default: die("w4: tile %d has no dense ring kernel", tile);
        }
#undef W4_DENSE_RING
    } else if (split) {
        W4_DISPATCH(tile, LAUNCH_DENSE_T)
    } else {
        W4_DISPATCH(tile, LAUNCH_DENSE_F)
    }
#undef LAUNCH_DENSE_T
#undef LAUNCH_DENSE_F
#undef LAUNCH_DENSE_SP
    LAUNCH_CHECK("w4_dense_kernel");
    if (splits > 1) {
        int64_t n = (int64_t)T * N;
        w4_reduce_kernel<<<cdiv(n, 256) < 65535 ? cdiv(n, 256) : 65535, 256, 0, st>>>(out, ldo, part, bias, T, N, splits);
        LAUNCH_CHECK("w4_reduce_kernel");
    }
}

/* ---- grouped MoE ---- */

/* A token tile's facts as w4_route_kernel stores them: its expert and token count in tile_e, its
 * first pair (in the list sorted by expert) in tile_base */
#define W4_TILE_M_SHIFT 16
__device__ __forceinline__ int w4_tile_expert(const int *tile_e, int tile) { return tile_e[tile] & ((1 << W4_TILE_M_SHIFT) - 1); }
__device__ __forceinline__ void w4_tile_facts(const int *tile_e, const int *tile_base, int tile, int &e, int &m, int &base)
{
    int te = tile_e[tile];
    e = te & ((1 << W4_TILE_M_SHIFT) - 1);
    m = te >> W4_TILE_M_SHIFT;
    base = tile_base[tile];
}

/* The dispatch in one launch: block 0 (1024 threads, E <= 1024) counts the pairs per expert in
 * shared memory, scans them into offsets and the tile list (a tile for every MT pairs of expert
 * e, in expert order: w4_tile_facts) and lists each expert's pairs (rows); the other blocks convert x
 * to BF16 meanwhile. The order of the pairs inside an expert's list depends on the atomics, but
 * each pair's result does not (every token column of the MMA is computed alone). */
/* A class of experts beside the call's tile (w4_moe_cuda): its token tiles' lists, its tile count,
 * the wg ring kernels' item counters, its tokens a tile and its threshold (0: no such class) */
struct W4MoeClass {
    int *tile_e, *tile_base, *n_tiles, *ctr;
    int mt, thr;
};

static __global__ void w4_route_kernel(int *rows, int *tile_e, int *tile_base, int *n_tiles, int *ctr, const int *idx, int P,
                                       int E, int MT, __nv_bfloat16 *xb, const float *x, int64_t nx, int split, int perm_d,
                                       W4MoeClass hot, W4MoeClass small, __nv_bfloat16 *xb2, int perm2, int d)
{
    if (blockIdx.x > 0) { /* perm_d: rows of perm_d, each stored permuted for the wg tiles (w4_wg_perm); xb2: the
                           * rows (of d) again, in the other order (perm2: permuted for the hot class beside an
                           * mma.sync tile; 0: natural for the small class beside a wg tile) */
        for (int64_t i = (blockIdx.x - 1) * (int64_t)blockDim.x + threadIdx.x; i < nx; i += (int64_t)(gridDim.x - 1) * blockDim.x) {
            w4_split_store(xb, perm_d ? i - i % perm_d + w4_wg_perm((int)(i % perm_d)) : i, nx, x[i], split);
            if (xb2) w4_split_store(xb2, perm2 ? i - i % d + w4_wg_perm((int)(i % d)) : i, nx, x[i], split);
        }
        return;
    }
    __shared__ int cnt[1024], sc[1024], st[1024], sb[1024], ss[1024], fill[1024];
    int e = threadIdx.x;
    cnt[e] = 0;
    fill[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x)
        if (idx[i] >= 0) atomicAdd(&cnt[idx[i]], 1); /* -1: another rank's expert (EP) */
    __syncthreads();
    /* an expert of more than hot.thr pairs is listed in the hot class (tiles of hot.mt), one of at
     * most small.thr in the small class (tiles of small.mt), the rest in the call's (MT) */
    int c = e < E ? cnt[e] : 0, hb = hot.thr > 0 && c > hot.thr, sm = small.thr > 0 && c <= small.thr;
    int nt = hb || sm ? 0 : (c + MT - 1) / MT, ntb = hb ? (c + hot.mt - 1) / hot.mt : 0, nts = sm ? (c + small.mt - 1) / small.mt : 0;
    sc[e] = c;
    st[e] = nt;
    sb[e] = ntb;
    ss[e] = nts;
    __syncthreads();
    for (int d = 1; d < 1024; d <<= 1) {
        int a = e >= d ? sc[e - d] : 0, b = e >= d ? st[e - d] : 0, bb = e >= d ? sb[e - d] : 0, bs = e >= d ? ss[e - d] : 0;
        __syncthreads();
        sc[e] += a;
        st[e] += b;
        sb[e] += bb;
        ss[e] += bs;
        __syncthreads();
    }
    int off = sc[e] - c;
    /* expert e's n tiles of mt pairs from list entry t0: the kernels read a tile's facts in one round of loads */
    auto list = [&](int *te, int *tb, int t0, int n, int mt) {
        for (int k = 0; k < n; k++) {
            te[t0 + k] = e | min(mt, c - k * mt) << W4_TILE_M_SHIFT; /* the expert, and the tile's tokens above it */
            tb[t0 + k] = off + k * mt;                               /* the tile's first pair in the sorted list */
        }
    };
    if (e < E) {
        list(tile_e, tile_base, st[e] - nt, nt, MT);
        if (hot.thr > 0) list(hot.tile_e, hot.tile_base, sb[e] - ntb, ntb, hot.mt);
        if (small.thr > 0) list(small.tile_e, small.tile_base, ss[e] - nts, nts, small.mt);
    }
    if (e == 1023) {
        *n_tiles = st[1023];
        if (hot.thr > 0) *hot.n_tiles = sb[1023];
        if (small.thr > 0) *small.n_tiles = ss[1023];
    }
    if (e == 0) ctr[0] = ctr[1] = 0; /* the wg ring kernels' item counters (gate/up, down) */
    if (e == 0 && hot.thr > 0) hot.ctr[0] = hot.ctr[1] = 0;
    sc[e] = off; /* exclusive offsets, for the listing */
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        int x_e = idx[i];
        if (x_e >= 0) rows[sc[x_e] + atomicAdd(&fill[x_e], 1)] = i;
    }
}

/* The gate/up epilogue of one warp's row tile: h[pos, f] = silu(gate) * up as BF16 (and its low
 * half with SP) for the tile's valid token slots; up(nt, q) gives the up sum of accumulator q. */
template <int NT, bool SP, typename Up>
__device__ __forceinline__ void w4_swiglu_store(__nv_bfloat16 *h, size_t hlo, const float (&gate)[NT][4], Up up, float sg,
                                                float su, int m, int base, int F, int i)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int slot = nt * 8 + 2 * t + (q & 1), f = 16 * i + g + 8 * (q >> 1);
            if (slot >= m) continue;
            float gv = gate[nt][q] * sg, uv = up(nt, q) * su;
            size_t at = (size_t)(base + slot) * F + f;
            float hv = gv / (1.f + __expf(-gv)) * uv;
            __nv_bfloat16 hh = __float2bfloat16(hv);
            h[at] = hh;
            if (SP) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
        }
}

/* gate and up of expert e for one tile of its pairs: h[pos, f] = silu(gate) * up (BF16), pos the
 * pair's place in the sorted list. Row tiles of F along blockIdx.y. SS: warps 2r and 2r + 1
 * stream gate and up of the block's row tile r (one weight stream a warp: half the registers);
 * the up warp hands its sums to the gate warp through shared memory. */
template <int NT, int ST, int KS, bool SP, bool SS>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_moe_gateup_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int F, int K,
    size_t xlo, size_t hlo)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31;
    pdl_trigger(); /* the down kernel may take SMs as they free */
    int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    static_assert(!SS || KS == 1, "stream split and K split do not combine");
    __shared__ float red[SS ? (W4_WARPS / 2) * NT * 4 * 32 : KS > 1 ? (KS - 1) * 2 * NT * 4 * 32 : 1];
    const int warp = threadIdx.x >> 5;
    int i = SS ? blockIdx.y * (W4_WARPS / 2) + warp / 2 : blockIdx.y * (W4_WARPS / KS) + warp / KS, active = i < F / 16;
    if (ST == 0 && !SS && !active) return; /* SS: every warp meets the exchange barrier */
    int e, m, base;
    w4_tile_facts(tile_e, tile_base, tile, e, m, base);
    const QTensor &wg = table[e], &wu = table[E + e];
    int ng = K / W4_KG;
    const bool pk = w4_packs<NT, ST, SP>(m);
    if (threadIdx.x < 8 * NT)
        rowp[threadIdx.x] = w4_pk_row(threadIdx.x, m, pk, xlo, [&](int s) { return xb + (size_t)(rows[base + s] / topk) * K; });
    __syncthreads();
    int ia = active ? i : 0;
    float sg = wg.gscale * 512.f, su = wu.gscale * 512.f;
    if (SS) {
        int up = warp & 1;
        const uint8_t *rec[1] = {(up ? wu : wg).data + (size_t)ia * ng * W4_REC};
        float acc[1][NT][4];
        w4_tile_sp<NT, 1, ST, SP>(acc, rec, active, rowp, xlo, m, pk, 0, ng, w4_sx);
        float *xu = red + (warp / 2) * NT * 4 * 32;
        if (up)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) xu[(nt * 4 + q) * 32 + lane] = acc[0][nt][q];
        __syncthreads();
        if (up || !active) return;
        w4_swiglu_store<NT, SP>(h, hlo, acc[0], [&](int nt, int q) { return xu[(nt * 4 + q) * 32 + lane]; }, sg, su, m, base, F, i);
        return;
    }
    const uint8_t *rec[2] = {wg.data + (size_t)ia * ng * W4_REC, wu.data + (size_t)ia * ng * W4_REC};
    float acc[2][NT][4];
    int g0 = 0, g1 = ng;
    w4_krange<KS>(g0, g1);
    w4_tile_sp<NT, 2, ST, SP>(acc, rec, active, rowp, xlo, m, pk, g0, g1, w4_sx);
    if (!w4_kreduce<2, NT, KS>(acc, red) || !active) return;
    w4_swiglu_store<NT, SP>(h, hlo, acc[0], [&](int nt, int q) { return acc[1][nt][q]; }, sg, su, m, base, F, i);
}

/* down of expert e: y[pair, d] = h[pos] . W_down[d]. Launched with programmatic dependent launch
 * after the gate/up kernel (w4_launch_dependent): before griddepcontrol.wait it reads only
 * what the routing wrote (done before gate/up began) and asks L2 for its first two weight records
 * (constant), so that they arrive while gate/up ends; h only after the wait. */
template <int NT, int ST, int KS, bool SP>
static __global__ void __launch_bounds__(W4_WARPS * 32) w4_moe_down_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t hlo)
{
    extern __shared__ __align__(16) __nv_bfloat16 w4_sx[];
    __shared__ const void *rowp[8 * NT];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    __shared__ float red[KS > 1 ? (KS - 1) * NT * 4 * 32 : 1];
    int i = blockIdx.y * (W4_WARPS / KS) + (threadIdx.x >> 5) / KS, active = i < D / 16;
    if (ST == 0 && !active) return;
    int e, m, base;
    w4_tile_facts(tile_e, tile_base, tile, e, m, base);
    const QTensor &wd = table[2 * E + e];
    int ng = F / W4_KG;
    const uint8_t *rec[1] = {wd.data + (size_t)(active ? i : 0) * ng * W4_REC};
    int g0 = 0, g1 = ng;
    w4_krange<KS>(g0, g1);
#if __CUDA_ARCH__ >= 900
    if (active)
        for (int b = lane * 128; b < min(2, g1 - g0) * W4_REC; b += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(rec[0] + (size_t)g0 * W4_REC + b));
    pdl_wait(); /* gate/up: done, h visible */
#endif
    const bool pk = w4_packs<NT, ST, SP>(m);
    if (threadIdx.x < 8 * NT)
        rowp[threadIdx.x] = w4_pk_row(threadIdx.x, m, pk, hlo, [&](int s) { return h + (size_t)(base + s) * F; });
    __syncthreads();
    float acc[1][NT][4];
    w4_tile_sp<NT, 1, ST, SP>(acc, rec, active, rowp, hlo, m, pk, g0, g1, w4_sx);
    if (!w4_kreduce<1, NT, KS>(acc, red) || !active) return;
    float sd = wd.gscale * 512.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int slot = nt * 8 + 2 * t + (q & 1), d = 16 * i + g + 8 * (q >> 1);
            if (slot >= m) continue;
            y[(size_t)rows[base + slot] * D + d] = acc[0][nt][q] * sd;
        }
}

/* ---- many tokens per expert: the pf tiles (w4_pf_gemm, w4.cuh) ----
 * The same ops and outputs as the two kernels above, for tiles of 8 NT tokens; block
 * (blockIdx.x, blockIdx.y) takes row block blockIdx.x of the token tiles blockIdx.y,
 * blockIdx.y + gridDim.y, ... (consecutive blocks share a token tile: its activations and the
 * expert's weights stay in L2 across the row blocks). */
template <int NT, int ST>
static __global__ void __launch_bounds__(NT * 32, 16 / NT) w4_moe_gateup_pf_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int F, int K,
    size_t xlo, size_t hlo)
{
    extern __shared__ __align__(16) uint8_t w4_pf_sm[];
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ const uint8_t *recp[W4_PF_RECS];
    __shared__ int4 tinfo; /* the token tile's valid tokens, first pair, gate and up scales (float bits) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const int ng = K / W4_KG, nrt = F / 16;
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        {
            int e, m, base;
            w4_tile_facts(tile_e, tile_base, tile, e, m, base);
            const QTensor &wg = table[e], &wu = table[E + e];
            __syncthreads(); /* the previous tile's readers of rowp, recp and tinfo are done */
            if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(rows[base + min((int)threadIdx.x, m - 1)] / topk) * K;
            if (threadIdx.x < W4_PF_RECS) { /* slot 4 w + q: gate (q < 2) or up of row tile 8 blockIdx.x + 2 w + (q & 1) */
                int r = threadIdx.x, q = r & 3, i = 8 * blockIdx.x + 2 * (r >> 2) + (q & 1);
                recp[r] = (q < 2 ? wg : wu).data + (size_t)(i < nrt ? i : 0) * ng * W4_REC;
            }
            if (threadIdx.x == 0) tinfo = make_int4(m, base, __float_as_int(wg.gscale * 512.f), __float_as_int(wu.gscale * 512.f));
            __syncthreads();
        }
        float acc[4][4][4];
        w4_pf_gemm<NT, ST>(acc, recp, rowp, (unsigned)(xlo / W4_KG), ng, (tinfo.x + 7) / 8, w4_pf_sm);
        /* the tile's facts from shared memory: fewer registers held across the GEMM */
        int m = tinfo.x, base = tinfo.y;
        float sg = __int_as_float(tinfo.z), su = __int_as_float(tinfo.w);
        /* acc[q] (gate) and acc[q + 2] (up): row tile 8 blockIdx.x + 2 wm + q; element d of n8
         * tile nt: token slot 32 wn + 8 nt + 2 t + (d & 1), row g + 8 (d >> 1) of the tile */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int i = 8 * blockIdx.x + 2 * wm + q;
            if (i >= nrt) continue;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int d = 0; d < 4; d++) {
                    int slot = 32 * wn + 8 * nt + 2 * t + (d & 1), f = 16 * i + g + 8 * (d >> 1);
                    if (slot >= m) continue;
                    float gv = acc[q][nt][d] * sg, uv = acc[q + 2][nt][d] * su;
                    size_t at = (size_t)(base + slot) * F + f;
                    float hv = gv / (1.f + __expf(-gv)) * uv;
                    __nv_bfloat16 hh = __float2bfloat16(hv);
                    h[at] = hh;
                    if (hlo) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
                }
        }
    }
}

template <int NT, int ST>
static __global__ void __launch_bounds__(NT * 32, 16 / NT) w4_moe_down_pf_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t hlo)
{
    extern __shared__ __align__(16) uint8_t w4_pf_sm[];
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ const uint8_t *recp[W4_PF_RECS];
    __shared__ int4 tinfo; /* the token tile's valid tokens, first pair, down scale (float bits) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
    const int ng = F / W4_KG, nrt = D / 16;
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        {
            int e, m, base;
            w4_tile_facts(tile_e, tile_base, tile, e, m, base);
            const QTensor &wd = table[2 * E + e];
            __syncthreads(); /* the previous tile's readers of rowp, recp and tinfo are done */
            if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = h + (size_t)(base + min((int)threadIdx.x, m - 1)) * F;
            if (threadIdx.x < W4_PF_RECS) { /* slot r: row tile 16 blockIdx.x + r */
                int i = 16 * blockIdx.x + threadIdx.x;
                recp[threadIdx.x] = wd.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC;
            }
            if (threadIdx.x == 0) tinfo = make_int4(m, base, __float_as_int(wd.gscale * 512.f), 0);
            __syncthreads();
        }
        float acc[4][4][4];
        w4_pf_gemm<NT, ST>(acc, recp, rowp, (unsigned)(hlo / W4_KG), ng, (tinfo.x + 7) / 8, w4_pf_sm);
        int m = tinfo.x, base = tinfo.y;
        float sd = __int_as_float(tinfo.z);
        /* acc[q]: row tile 16 blockIdx.x + 4 wm + q, token slots as in the gate/up kernel */
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int p = 0; p < 2; p++) {
                int slot = 32 * wn + 8 * nt + 2 * t + p;
                if (slot >= m) continue;
                float *yr = y + (size_t)rows[base + slot] * D;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int i = 16 * blockIdx.x + 4 * wm + q;
                    if (i >= nrt) continue;
                    yr[16 * i + g] = acc[q][nt][p] * sd;
                    yr[16 * i + g + 8] = acc[q][nt][p + 2] * sd;
                }
            }
    }
}

/* gate/up then down on pf tile <NT, ST>; the grids' y walk the token tiles (at most 65535) */
template <int NT, int ST>
static void w4_moe_pf(cudaStream_t st, int max_tiles, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                      const QTensor *tb, int E, int topk, const int *rows,
                      const int *tile_e, const int *tile_base, const int *n_tiles, int D, int F, size_t xlo, size_t hlo)
{
    const int smem = (int)(ST * W4_PF_STAGE(NT));
    static int ready = 0;
    if (!ready) { /* over 48 KB: opt in; and the most shared memory an SM can hold, for 2 blocks of 64 tokens */
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_pf_kernel<NT, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_pf_kernel<NT, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_pf_kernel<NT, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_pf_kernel<NT, ST>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
        ready = 1;
    }
    int ny = max_tiles < 65535 ? max_tiles : 65535;
    dim3 gf(cdiv(F / 16, W4_PF_RECS / 2), ny), gd(cdiv(D / 16, W4_PF_RECS), ny);
    w4_moe_gateup_pf_kernel<NT, ST><<<gf, NT * 32, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base,
                                                              n_tiles, F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_pf_kernel");
    w4_moe_down_pf_kernel<NT, ST><<<gd, NT * 32, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles,
                                                            D, F, hlo);
    LAUNCH_CHECK("w4_moe_down_pf_kernel");
}

/* ---- many tokens per expert on wgmma: the wg tiles (pf 2; w4_wg.cuh, sm_90a) ----
 * A block's work items are (token tile, row block) pairs, w = tile x RB + row block, in order (the
 * row blocks of a token tile side by side: they share its activations in L2); a block runs item
 * blockIdx.x, then those wg_first_next and wg_ask_next give it. gate/up: warpgroup 0 computes gate, warpgroup 1 up, of the same 64
 * rows of F (row tiles 4 rb + warp % 4); each warpgroup hands the other the sums of half the
 * tokens through shared memory and computes SwiGLU for its own half; h is written permuted
 * (w4_wg_perm) for the down kernel. down: 128 rows of D a block.
 * Without a weight ring (WR == 0) the launch gives a block an item. With the ring the blocks stay
 * (one wave: the blocks the SMs hold), and each warp asks for the next item's first weight records
 * while it finishes one (w4_wg_gemm_r's nrec): a block starts an item with its weights in flight
 * instead of waiting an HBM latency with its SM idle (one block an SM at 128 tokens). */
/* The ring kernels' items after the first come from a counter (ctr, zeroed by the routing kernel),
 * one item ahead: a block knows its next item when it starts one (for nrec) and asks for the one
 * after at the same time, storing the answer only once its GEMM is done, so that the atomic's
 * latency hides behind the item (session 12: a block that waited for it lost 0.7%; a static
 * stride, blocks of 31 items at 256-512 tokens, lost 4-7% to blocks that drew slower items).
 * Without the ring a block strides by the grid (the launch gives it one item). */
template <int WR>
__device__ __forceinline__ int wg_first_next(int *ctr)
{
    if constexpr (WR > 0) return (int)gridDim.x + atomicAdd(ctr, 1);
    else return (int)(blockIdx.x + gridDim.x);
}
template <int WR>
__device__ __forceinline__ int wg_ask_next(int *ctr, int wn, int W)
{
    if constexpr (WR > 0) return threadIdx.x == 0 && wn < W ? atomicAdd(ctr, 1) : 0;
    else return 0;
}
template <int WR>
__device__ __forceinline__ int wg_next_of(int after, int wn)
{
    if constexpr (WR > 0) return (int)gridDim.x + after;
    else return wn + (int)gridDim.x;
}

__device__ __forceinline__ void cp_async4_s(void *smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem));
}

/* AF: the activation form the kernel is built for (w4_wg_gemm): 0 plain BF16, 1 split, 2 either */
template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, NT == 4 || (WR > 0 && NT == 8) ? 2 : 1) w4_moe_gateup_wg_kernel(
    __nv_bfloat16 *h, const __nv_bfloat16 *xb, const QTensor *table, int E, int topk, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int F, int K,
    size_t xlo, size_t hlo)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ int wnext;
    constexpr int HT = 4 * NT, XS = HT + 1; /* the tokens a warpgroup hands over (half the tile); their row stride (floats) */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5, wgp = warp >> 2;
    const int ng = K / W4_KG, nrt = F / 16, RB = F / 64, W = *n_tiles * RB;
    float *ex = (float *)sm; /* [2][64 rows][XS]: the up sums of tokens 0..HT (from warpgroup 1), the gate sums of the rest (0) */
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (threadIdx.x == 0) wnext = wg_first_next<WR>(ctr);
    int wn = 0;
    for (int w = blockIdx.x; w < W; w = wn) {
        int tile = w / RB, i = 4 * (w - tile * RB) + (warp & 3);
        int e, m, base;
        w4_tile_facts(tile_e, tile_base, tile, e, m, base);
        __syncthreads(); /* the previous item's readers of rowp and ex are done */
        if (threadIdx.x < 8 * NT) rowp[threadIdx.x] = xb + (size_t)(rows[base + min((int)threadIdx.x, m - 1)] / topk) * K;
        __syncthreads();
        wn = wnext;
        int after = wg_ask_next<WR>(ctr, wn, W);
        const QTensor &wq = table[wgp * E + e]; /* gate, or up */
        const uint8_t *nrec = nullptr;
        if (WR > 0 && wn < W) {
            int tn = wn / RB, in = 4 * (wn - tn * RB) + (warp & 3);
            nrec = table[wgp * E + w4_tile_expert(tile_e, tn)].data + (size_t)(in < nrt ? in : 0) * ng * W4_REC;
        }
        float acc[4 * NT];
        w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, wq.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC, rowp, xlo, ng, m, sm, ring, nrec);
        if (threadIdx.x == 0) wnext = wg_next_of<WR>(after, wn); /* every thread read wnext before the GEMM's barriers */
        float sc = wq.gscale * 512.f;
        __syncthreads(); /* every warp is done with the stages: ex reuses them */
        /* accumulator b holds tokens 8 b ..: warpgroup 1 hands over b < NT / 2, warpgroup 0 the rest */
        float *mine = ex + wgp * 64 * XS;
#pragma unroll
        for (int b = 0; b < NT; b++)
            if ((b < NT / 2) == (wgp == 1))
#pragma unroll
                for (int d = 0; d < 4; d++)
                    mine[(16 * (warp & 3) + g + 8 * (d >> 1)) * XS + 8 * (b % (NT / 2)) + 2 * t + (d & 1)] = acc[4 * b + d] * sc;
        __syncthreads();
        if (i >= nrt) continue;
        const float *other = ex + (1 - wgp) * 64 * XS;
#pragma unroll
        for (int b = 0; b < NT; b++)
            if ((b < NT / 2) == (wgp == 0))
#pragma unroll
                for (int d = 0; d < 4; d++) {
                    int slot = 8 * b + 2 * t + (d & 1), r = g + 8 * (d >> 1);
                    if (slot >= m) continue;
                    float mv = acc[4 * b + d] * sc, ov = other[(16 * (warp & 3) + r) * XS + 8 * (b % (NT / 2)) + 2 * t + (d & 1)];
                    float gv = wgp == 0 ? mv : ov, uv = wgp == 0 ? ov : mv;
                    size_t at = (size_t)(base + slot) * F + w4_wg_perm(16 * i + r);
                    float hv = gv / (1.f + __expf(-gv)) * uv;
                    __nv_bfloat16 hh = __float2bfloat16(hv);
                    h[at] = hh;
                    if (hlo) h[hlo + at] = __float2bfloat16(hv - __bfloat162float(hh));
                }
    }
#endif
}

template <int NT, int ST, int WR, int CPS, int AF>
static __global__ void __launch_bounds__(256, NT == 4 || (WR > 0 && NT == 8) ? 2 : 1) w4_moe_down_wg_kernel(
    float *y, const __nv_bfloat16 *h, const QTensor *table, int E, const int *rows, const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int D, int F, size_t hlo)
{
#if W4_WG_ARCH
    extern __shared__ __align__(16) uint8_t w4_wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)w4_wg_raw + 1023) & ~(uintptr_t)1023);
    __shared__ const __nv_bfloat16 *rowp[8 * NT];
    __shared__ int yrow[8 * NT]; /* the output row of each token slot */
    __shared__ int wnext;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    const int ng = F / W4_KG, nrt = D / 16, RB = D / 128, W = *n_tiles * RB;
    WgRing ring = wg_ring_init<NT, ST, WR>(sm);
    if (threadIdx.x == 0) wnext = wg_first_next<WR>(ctr);
    int wn = 0;
    for (int w = blockIdx.x; w < W; w = wn) {
        int tile = w / RB, i = 8 * (w - tile * RB) + warp;
        int e, m, base;
        w4_tile_facts(tile_e, tile_base, tile, e, m, base);
        __syncthreads(); /* the previous item's readers of rowp and yrow are done */
        if (threadIdx.x < 8 * NT) {
            rowp[threadIdx.x] = h + (size_t)(base + min((int)threadIdx.x, m - 1)) * F;
            /* asynchronously: it lands with the GEMM's first stage (the next commit group), and the
             * GEMM's barriers publish it; the epilogue reads it from shared memory instead of
             * waiting on a global load per token slot (session 12: ~20% of the kernel at 8192 tokens) */
            cp_async4_s(&yrow[threadIdx.x], rows + base + min((int)threadIdx.x, m - 1));
        }
        __syncthreads();
        wn = wnext;
        int after = wg_ask_next<WR>(ctr, wn, W);
        const QTensor &wd = table[2 * E + e];
        const uint8_t *nrec = nullptr;
        if (WR > 0 && wn < W) {
            int tn = wn / RB, in = 8 * (wn - tn * RB) + warp;
            nrec = table[2 * E + w4_tile_expert(tile_e, tn)].data + (size_t)(in < nrt ? in : 0) * ng * W4_REC;
        }
        float acc[4 * NT];
        w4_wg_gemm<NT, ST, WR, CPS, AF>(acc, wd.data + (size_t)(i < nrt ? i : 0) * ng * W4_REC, rowp, hlo, ng, m, sm, ring, nrec);
        if (threadIdx.x == 0) wnext = wg_next_of<WR>(after, wn); /* every thread read wnext before the GEMM's barriers */
        if (i >= nrt) continue;
        float sd = wd.gscale * 512.f;
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int p = 0; p < 2; p++) {
                int slot = 8 * b + 2 * t + p;
                if (slot >= m) continue;
                float *yr = y + (size_t)yrow[slot] * D + 16 * i + g;
                yr[0] = acc[4 * b + p] * sd;
                yr[8] = acc[4 * b + p + 2] * sd;
            }
    }
#endif
}

/* the blocks the SMs hold at once: the grid of the ring kernels' persistent blocks */
template <typename Kern>
static int wg_wave(Kern k, int smem)
{
    int blocks = 0, dev = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, 256, smem));
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return (blocks > 0 ? blocks : 1) * sms;
}

template <int NT, int ST, int WR, int CPS>
static void w4_moe_wg(cudaStream_t st, int max_tiles, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                      const QTensor *tb, int E, int topk, const int *rows,
                      const int *tile_e, const int *tile_base, const int *n_tiles, int *ctr, int D, int F, size_t xlo, size_t hlo)
{
    const int smem = W4_WG_SMEM(NT, ST, WR);
    constexpr int AFS = NT == 4 ? 1 : 2, AFB = NT == 4 ? 0 : 2; /* the kernels' activation forms (w4_wg_gemm): split, plain BF16 */
    static int ready = 0, gfp = 0, gdp = 0;
    if (!ready) { /* the kernels of both activation forms hold the same blocks an SM (the same launch bounds and shared memory) */
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int a = wg_wave(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS>, smem), b = wg_wave(w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB>, smem);
        int c = wg_wave(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS>, smem), d = wg_wave(w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB>, smem);
        gfp = a < b ? a : b;
        gdp = c < d ? c : d;
        ready = 1;
    }
    /* the grids: an item a block, or (the ring kernels) one wave of persistent blocks */
    long fi = (long)max_tiles * (F / 64), di = (long)max_tiles * (D / 128);
    CHECK(fi < INT_MAX && di < INT_MAX, "w4: %d token tiles x %d row blocks: too many items", max_tiles, F / 64);
    int persist = WR > 0 && w4_wg_persist();
    long wf = w4_wg_persist_cap ? w4_wg_persist_cap : gfp, wd = w4_wg_persist_cap ? w4_wg_persist_cap : gdp;
    int gf = (int)(persist && wf < fi ? wf : fi), gd = (int)(persist && wd < di ? wd : di);
    if (xlo) /* split activations (xlo and hlo both set) */
        w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFS><<<gf, 256, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base, n_tiles, ctr,
                                                                            F, D, xlo, hlo);
    else
        w4_moe_gateup_wg_kernel<NT, ST, WR, CPS, AFB><<<gf, 256, smem, st>>>(h, xb, tb, E, topk, rows, tile_e, tile_base, n_tiles, ctr,
                                                                             F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_wg_kernel");
    if (hlo)
        w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFS><<<gd, 256, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles, ctr + 1, D, F,
                                                                          hlo);
    else
        w4_moe_down_wg_kernel<NT, ST, WR, CPS, AFB><<<gd, 256, smem, st>>>(y, h, tb, E, rows, tile_e, tile_base, n_tiles, ctr + 1, D, F,
                                                                           hlo);
    LAUNCH_CHECK("w4_moe_down_wg_kernel");
}

/* the small class on the side stream, beside the call's tile (MOESERVE_W4_MOE_SIDE=0: after it, on
 * the stream; w4_set_moe_side for tests, -1: back to the environment) */
static int w4_moe_side_force = -1, w4_moe_side_env = -1;

extern "C" void w4_set_moe_side(int on) { w4_moe_side_force = on; }

/* 0: both classes after the call's tile on the one stream; 1 (the default): the small class
 * beside it, and the hot class beside it on a third stream where the call's tile is tile 12;
 * 2: the hot class beside every call's tile (w4_moe_cuda says why) */
static int w4_moe_side(void)
{
    if (w4_moe_side_force >= 0) return w4_moe_side_force;
    if (w4_moe_side_env < 0) {
        const char *e = getenv("MOESERVE_W4_MOE_SIDE");
        w4_moe_side_env = !e || !*e ? 1 : !strcmp(e, "0") ? 0 : !strcmp(e, "1") ? 1 : !strcmp(e, "2") ? 2 : -1;
        if (w4_moe_side_env < 0) {
            log_warn("MOESERVE_W4_MOE_SIDE=%s: expected 0, 1 or 2; using 1", e);
            w4_moe_side_env = 1;
        }
    }
    return w4_moe_side_env;
}

/* the small class's gate/up and down on tile 12 (w4_moe_small) */
template <bool SP>
static void w4_moe_small_launch(cudaStream_t st, dim3 gf, dim3 gd, __nv_bfloat16 *h, const __nv_bfloat16 *xb, float *y,
                                const QTensor *tb, int E, int K, const int *rows, const W4MoeClass &sc, int D, int F, size_t xlo,
                                size_t hlo)
{
    w4_moe_gateup_kernel<1, 0, 1, SP, true><<<gf, W4_WARPS * 32, W4_SMEM(1, 0), st>>>(h, xb, tb, E, K, rows, sc.tile_e, sc.tile_base,
                                                                                  sc.n_tiles, F, D, xlo, hlo);
    LAUNCH_CHECK("w4_moe_gateup_kernel (small experts)");
    w4_launch_dependent(w4_moe_down_kernel<1, 0, 1, SP>, gd, W4_WARPS * 32, W4_SMEM(1, 0), st, y, (const __nv_bfloat16 *)h, tb, E,
                        rows, (const int *)sc.tile_e, (const int *)sc.tile_base, (const int *)sc.n_tiles, D, F, hlo);
    LAUNCH_CHECK("w4_moe_down_kernel (small experts)");
}

int w4_moe_cuda(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T, const LayerWeights *lw,
                const ModelConfig *c)
{
    int E = c->n_experts, K = c->n_experts_per_tok, D = c->hidden, F = c->moe_intermediate, P = T * K;
    cudaStream_t st = cuda_stream(be);
    CHECK(E <= 1024, "w4_moe_cuda: %d experts (at most 1024)", E);
    int tile = w4_pick(be, W4_MOE, T, (double)T * K / E);
    if (!w4_tiles[tile].pf && w4_tiles[tile].wr) tile = 10; /* the dense ring tiles: their register twin */
    if (w4_tiles[tile].pf == 3) tile = 12;                  /* the stream-K dense tiles: the MoE decode tile */
    if (w4_tiles[tile].pf == 4) tile = 30;                  /* the dense wg tile: the MoE tile whose GEMM it runs */
    int NT = w4_tiles[tile].nt, MT = 8 * NT;
    int max_tiles = P / MT + (E < P ? E : P);
    /* the hot class: tile 29 for the experts of more than `hot` pairs, where it runs and fits; the
     * small class: tile 12 for those of at most `small` (w4_moe_classes) */
    int hot = 0, small = 0, dev = cuda_state(be)->device, split = w4_split_act();
    w4_moe_classes(tile, T, split, w4_wg_supported(dev) && w4_tile_fits(w4_tiles[29], w4_smem_budget(dev), NULL, 0),
                   w4_moe_pairs_set(w4_moe_hot_force, &w4_moe_hot_env, "MOESERVE_W4_MOE_HOT"),
                   w4_moe_pairs_set(w4_moe_small_force, &w4_moe_small_env, "MOESERVE_W4_MOE_SMALL"), &hot, &small);
    const int wg = w4_tiles[tile].pf == 2;
    /* a second copy of the activations in the other order, where a class beside the call's tile reads
     * them so: tile 29 beside tile 13 (mma.sync, natural order) the wg order, tile 12 beside a wg
     * tile the natural order; in scratch that a graph being captured cannot grow (cuda_reserve sizes
     * it up to 2048 tokens): past that the class is off */
    __nv_bfloat16 *xb2 = NULL;
    if ((hot > 0 && !wg) || (small > 0 && wg)) {
        size_t need = (size_t)2 * T * D * sizeof(__nv_bfloat16);
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(st, &cs));
        if (cs == cudaStreamCaptureStatusNone || need <= cuda_scratch_cap(be, SCR_W4_XP))
            xb2 = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_XP, need);
        else if (!wg)
            hot = 0;
        else
            small = 0;
    }
    const int MTB = 8 * w4_tiles[29].nt, max_tiles_b = P / MTB + P / (hot + 1) + 1;
    const int MTS = 8 * w4_tiles[12].nt, nsmall = E < P ? E : P;
    const long ms1 = (long)nsmall * cdiv(small > 0 ? small : 1, MTS), ms2 = (long)P / MTS + nsmall;
    const int max_tiles_s = (int)(ms1 < ms2 ? ms1 : ms2);
    const size_t nlist = (size_t)3 + 2 * (P + E); /* a class's ints: its tile count, its lists, its counters */
    int *ibuf = (int *)cuda_scratch(be, SCR_MOE_COUNT, 3 * nlist * sizeof(int));
    int *n_tiles = ibuf, *tile_e = n_tiles + 1,
        *tile_base = tile_e + (P + E), *ctr = tile_base + (P + E);
    auto klass = [&](int k, int mt, int thr) {
        int *b = ibuf + k * nlist;
        return W4MoeClass{b + 1, b + 1 + (P + E), b, b + 1 + 2 * (P + E), mt, thr};
    };
    const W4MoeClass hc = klass(1, MTB, hot), sc = klass(2, MTS, small);
    int *rows = (int *)cuda_scratch(be, SCR_MOE_ROWS, (size_t)P * sizeof(int));
    size_t xlo = split ? (size_t)T * D : 0, hlo = split ? (size_t)P * F : 0;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, SCR_W4_X, (size_t)2 * T * D * sizeof(__nv_bfloat16));
    __nv_bfloat16 *h = (__nv_bfloat16 *)cuda_scratch(be, SCR_MOE_H, (size_t)2 * P * F * sizeof(__nv_bfloat16));
    float *y = (float *)cuda_scratch(be, SCR_MOE_Y, (size_t)P * D * sizeof(float));
    int64_t nx = (int64_t)T * D;
    int nb = 1 + (int)(nx / 4096 < 512 ? (nx + 4095) / 4096 : 512);
    w4_route_kernel<<<nb, 1024, 0, st>>>(rows, tile_e, tile_base, n_tiles, ctr, idx, P, E, MT, xb, x, nx, split,
                                         wg ? D : 0, hc, sc, xb2, !wg, D);
    LAUNCH_CHECK("w4_route_kernel");
    int rpb = W4_WARPS / w4_tiles[tile].ks; /* row tiles per block */
    int rpb_gu = w4_tiles[tile].ss ? W4_WARPS / 2 : rpb; /* gate and up on two warps a row tile */
    dim3 gf(max_tiles, cdiv(F / 16, rpb_gu)), gd(max_tiles, cdiv(D / 16, rpb));
    const QTensor *tb = lw->exp_table;
    /* the small class's launches on stream s */
    auto small_launch = [&](cudaStream_t s) {
        const __nv_bfloat16 *xs = wg ? xb2 : xb;
        dim3 sf(max_tiles_s, cdiv(F / 16, W4_WARPS / 2)), sd(max_tiles_s, cdiv(D / 16, W4_WARPS));
        if (split) w4_moe_small_launch<true>(s, sf, sd, h, xs, y, tb, E, K, rows, sc, D, F, xlo, hlo);
        else w4_moe_small_launch<false>(s, sf, sd, h, xs, y, tb, E, K, rows, sc, D, F, xlo, hlo);
    };
    /* the small class runs beside the call's tile, on the side stream (w4_moe_side): a class of a few
     * experts is a chain of dependent record loads a warp (~70 us on the H200 for 2-5 experts),
     * which the call's kernels hide; its blocks take SMs as the call's leave them room */
    CudaState *cs = cuda_state(be);
    auto hot_launch = [&](cudaStream_t s) {
        w4_moe_wg<16, 4, 3, 1>(s, max_tiles_b, h, wg ? xb : xb2, y, tb, E, K, rows, hc.tile_e, hc.tile_base, hc.n_tiles, hc.ctr, D,
                               F, xlo, hlo);
    };
    /* the hot class on a third stream, beside the call's tile and the small class: where the call's
     * tile is tile 12 (w4_moe_side 1, the default), and beside every call's tile (2). Beside tile 12
     * the class holds the few experts of more than 16 pairs (0-2 at 192 tokens random), whose tile
     * 29 launch after the call's was a latency chain of its own (session 17, H200: 192 tokens random
     * -2 to -8%, skewed 128-192 -2 to -6% in both forms; beside tiles 13 and 30 mixed, 384 tokens
     * random BF16 +3%, so not there by default) */
    const int sm = w4_moe_side(), side = small > 0 && sm, side2 = hot > 0 && (sm == 2 || (sm == 1 && tile == 12));
    if (side || side2) CUDA_CHECK(cudaEventRecord(cs->fork, st));
    if (side) {
        CUDA_CHECK(cudaStreamWaitEvent(cs->side, cs->fork, 0));
        small_launch(cs->side);
        CUDA_CHECK(cudaEventRecord(cs->join, cs->side));
    }
    if (side2) {
        CUDA_CHECK(cudaStreamWaitEvent(cs->side2, cs->fork, 0));
        hot_launch(cs->side2);
        CUDA_CHECK(cudaEventRecord(cs->join2, cs->side2));
    }
    /* after the call's tile: the small experts' tiles (tile 12, on the activations in their natural
     * order: the copy beside a wg tile), the hot experts' tiles (on the activations in the wg order:
     * xb beside a wg tile, the permuted copy beside tiles 12 and 13), then the weighted combine */
    auto finish = [&]() {
        if (small > 0 && !side) small_launch(st);
        if (hot > 0 && !side2) hot_launch(st);
        if (side) CUDA_CHECK(cudaStreamWaitEvent(st, cs->join, 0)); /* the small class, beside: done */
        if (side2) CUDA_CHECK(cudaStreamWaitEvent(st, cs->join2, 0)); /* the hot class, beside: done */
        moe_combine_cuda(be, out, y, wts, idx, T, K, D);
        return -1;
    };
    if (wg) {
#define W4_MOE_WG(NTV, STV, WRV, CPSV)                                                                                     \
    CHECK(w4_tiles[tile].nt == NTV && w4_tiles[tile].st == STV && w4_tiles[tile].wr == WRV &&                           \
              (w4_tiles[tile].sc > 1 ? w4_tiles[tile].sc : 1) == CPSV,                                                 \
          "w4: wg tile %d is not <%d, %d, %d, %d>", tile, NTV, STV, WRV, CPSV);                                        \
    w4_moe_wg<NTV, STV, WRV, CPSV>(st, max_tiles, h, xb, y, tb, E, K, rows, tile_e, tile_base, n_tiles, ctr, D, F, xlo, hlo)
        switch (tile) {
        case 22: W4_MOE_WG(16, 4, 0, 1); break;
        case 23: W4_MOE_WG(16, 3, 0, 1); break;
        case 24: W4_MOE_WG(16, 6, 0, 1); break;
        case 25: W4_MOE_WG(8, 5, 0, 1); break;
        case 27: W4_MOE_WG(4, 4, 4, 1); break;
        case 28: W4_MOE_WG(8, 3, 3, 1); break;
        case 29: W4_MOE_WG(16, 4, 3, 1); break;
        case 30: W4_MOE_WG(4, 6, 3, 2); break;
        default: W4_MOE_WG(4, 4, 0, 1); break;
        }
#undef W4_MOE_WG
        return finish();
    }
    if (w4_tiles[tile].pf) {
        /* the pf tiles (w4_tiles.c), by index */
#define W4_MOE_PF(NTV, STV)                                                                                            \
    CHECK(w4_tiles[tile].nt == NTV && w4_tiles[tile].st == STV, "w4: pf tile %d is not <%d, %d>", tile, NTV, STV);        \
    w4_moe_pf<NTV, STV>(st, max_tiles, h, xb, y, tb, E, K, rows, tile_e, tile_base, n_tiles, D, F, xlo, hlo)
        switch (tile) {
        case 19: W4_MOE_PF(8, 3); break;
        case 20: W4_MOE_PF(8, 2); break;
        default: W4_MOE_PF(4, 3); break;
        }
#undef W4_MOE_PF
        return finish();
    }
#define W4_MOE_SP(NTV, STV, KSV, SPV, SSV)                                                                               \
    W4_SET_SMEM2(w4_moe_gateup_kernel, NTV, STV, KSV, SPV, SSV);                                                            \
    W4_SET_SMEM(w4_moe_down_kernel, NTV, STV, KSV, SPV);                                                                    \
    w4_moe_gateup_kernel<NTV, STV, KSV, SPV, SSV><<<gf, W4_WARPS * 32, W4_SMEM(NTV, STV), st>>>(h, xb, tb, E, K, rows,  \
                                                                                 tile_e, tile_base, n_tiles, F, D, xlo, hlo); \
    LAUNCH_CHECK("w4_moe_gateup_kernel");                                                                              \
    w4_launch_dependent(w4_moe_down_kernel<NTV, STV, KSV, SPV>, gd, W4_WARPS * 32, W4_SMEM(NTV, STV), st, y,              \
                        (const __nv_bfloat16 *)h, (const QTensor *)tb, E,       \
                        (const int *)rows, (const int *)tile_e, (const int *)tile_base, (const int *)n_tiles, D, F, hlo); \
    LAUNCH_CHECK("w4_moe_down_kernel");
#define W4_MOE_T(NTV, STV, KSV, SSV) W4_MOE_SP(NTV, STV, KSV, true, SSV)
#define W4_MOE_F(NTV, STV, KSV, SSV) W4_MOE_SP(NTV, STV, KSV, false, SSV)
    if (split) {
        W4_DISPATCH(tile, W4_MOE_T)
    } else {
        W4_DISPATCH(tile, W4_MOE_F)
    }
#undef W4_MOE_T
#undef W4_MOE_F
#undef W4_MOE_SP
    return finish();
}

extern "C" int w4_moe_ready(const LayerWeights *lw, const ModelConfig *c)
{
    if (!lw->exp_gate || c->hidden % W4_KG || c->moe_intermediate % W4_KG || c->n_experts > 1024) return 0;
    for (int e = 0; e < c->n_experts; e++)
        if (!lw->exp_gate[e].packed || !lw->exp_up[e].packed || !lw->exp_down[e].packed) return 0;
    return 1;
}
