/* w4_device: what the W4A16 kernels ask of the device (its shared memory budget, whether its
 * loaded code has the sm_90a wgmma kernels, clusters and programmatic dependent launch), and the
 * tile choice in force: forced (the bench, the tuner, tests), tuned (`moeserve tune`'s table,
 * cached per device) or built in (w4_select.c); never a tile over the shared memory budget. */
#include "w4_launch.cuh"
#include "w4_wgmma.cuh" /* W4_WG_ARCH */

static W4Config w4_force = {-1, 0};
static size_t w4_budget_sim = 0;
static W4Table w4_table;
static int w4_have_table = 0;

extern "C" void w4_set_config(W4Config c) { w4_force = c; }
int w4_forced_splits(void) { return w4_force.splits; }
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

/* 1 if the wgmma tiles run on this device: the code loaded for it is sm_90a's (a build without
 * sm_90a, or another GPU, runs w4_wgmma.cuh's kernels as empty bodies: the probe says 0) */
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
int w4_pick(Backend *be, W4Kind kind, int tokens, double rows_per_weight)
{
    int dev = cuda_state(be)->device;
    size_t budget = w4_smem_budget(dev);
    int tile = w4_force.tile, wg = w4_wg_supported(dev);
    if (tile < 0 && w4_have_table) tile = w4_table.tile[kind][w4_bucket(tokens)];
    if (tile >= 0) {
        char why[256];
        if (!w4_tile_fits(w4_tiles[tile], budget, why, sizeof why) || !w4_tile_runs(w4_tiles[tile], wg, why, sizeof why))
            die("w4: tile %s %s", w4_tiles[tile].name, why);
        return tile;
    }
    return w4_default_tile(kind, rows_per_weight, budget, wg, w4_split_act());
}

int w4_sm_count(Backend *be)
{
    static int n = 0;
    if (!n) CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    return n;
}

/* Programmatic dependent launch of the stream-K tiles, the split-K wgmma tile and its reduction,
 * and of the MoE down kernels after gate/up: where the loaded code is sm_90's or later
 * (w4_code_arch: the kernels' griddepcontrol.wait is compiled in) and MOESERVE_W4_PDL is not 0,
 * the next kernel's first weight loads overlap the tail of the one before. */
extern "C" int w4_sk_pdl(void)
{
    static int arch90 = -1;
    if (arch90 < 0) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        arch90 = w4_code_arch(dev) >= 90;
    }
    return arch90 && knob_get(KNOB_W4_PDL);
}
