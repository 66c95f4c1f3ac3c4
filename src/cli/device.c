/* device: choosing and opening the backend for a command (--device cpu|cuda), and the model
 * options the commands share (--model, --dummy-weights, --kv-cache-dtype). The default device is
 * cuda when this build has the CUDA backend and a GPU is present, else cpu. */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../model/forward.h"
#include "cli.h"
#ifdef MOESERVE_CUDA
#include "../backend/cuda/cuda.h"
#endif

const char *device_default(void)
{
#ifdef MOESERVE_CUDA
    if (cuda_device_count() > 0) return "cuda";
#endif
    return "cpu";
}

void device_open(Backend *be, const char *device, int threads)
{
    if (!device) device = device_default();
    if (!strcmp(device, "cpu")) {
        if (threads <= 0) {
            threads = omp_get_max_threads();
            /* several ranks on this node share its cores, or they starve each other */
            const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
            if (local && atoi(local) > 1) threads = threads / atoi(local) > 1 ? threads / atoi(local) : 1;
        }
        backend_cpu_init(be, threads);
        return;
    }
    if (!strncmp(device, "cuda", 4)) {
        int index = 0;
        if (device[4] == ':') index = atoi(device + 5);
        else if (device[4]) fatal("--device '%s': expected cpu, cuda or cuda:N", device);
#ifdef MOESERVE_CUDA
        backend_cuda_init(be, index);
        char name[256];
        cuda_device_name(index, name, sizeof name);
        log_info("device: %s", name);
        return;
#else
        (void)index;
        fatal("--device %s: this moeserve was built without CUDA (nvcc was not found at build time)", device);
#endif
    }
    fatal("--device '%s': expected cpu, cuda or cuda:N", device);
}

void device_describe(const Backend *be, const char *device, char *buf, size_t n)
{
    if (!strcmp(be->name, "cpu")) {
        snprintf(buf, n, "cpu (%d threads)", be->n_threads);
        return;
    }
#ifdef MOESERVE_CUDA
    int index = device && device[4] == ':' ? atoi(device + 5) : 0;
    cuda_device_name(index, buf, n);
#else
    (void)device;
    snprintf(buf, n, "%s", be->name);
#endif
}

void device_model(Model *dev, const Model *host, Backend *be)
{
    if (be->host_memory && !host->dummy) {
        *dev = *host;
        dev->cfg.kv_dtype = model_kv_dtype(&host->cfg, 1);
        return;
    }
    model_upload(dev, host, be);
}

void device_model_free(Model *dev, Backend *be)
{
    if (!dev->dev_buffer) return; /* the host model itself: it owns everything */
    model_upload_free(dev, be);
}

int opt_kv_cache_dtype(int argc, char **argv, int *i, KVDtype *out)
{
    const char *v = NULL;
    if (!opt_str(argc, argv, i, "--kv-cache-dtype", &v)) return 0;
    if (model_kv_dtype_parse(v, out) < 0) fatal("option --kv-cache-dtype: '%s' is not one of %s", v, MODEL_KV_DTYPES);
    return 1;
}

int opt_model(int argc, char **argv, int *i, ModelOpts *o)
{
    return opt_str(argc, argv, i, "--model", &o->dir) || opt_str(argc, argv, i, "--revision", &o->revision) ||
           opt_flag(argv, i, "--dummy-weights", &o->dummy) ||
           opt_str(argc, argv, i, "--dummy-quant", &o->dummy_quant) ||
           opt_int(argc, argv, i, "--num-layers", 1, MODEL_MAX_LAYERS, &o->num_layers) ||
           opt_kv_cache_dtype(argc, argv, i, &o->kv_dtype) || par_opt(argc, argv, i, &o->par);
}

void model_open(Model *m, const ModelOpts *o)
{
    void (*shard)(ModelConfig *, void *) = dist_get() ? dist_shard : NULL;
    void *par = (void *)&o->par;
    if (!o->dummy) {
        if (o->dummy_quant || o->num_layers) fatal("--dummy-quant and --num-layers go with --dummy-weights");
        model_load_shard(m, o->dir, shard, par);
        m->cfg.kv_dtype = o->kv_dtype;
        return;
    }
    const char *q = o->dummy_quant ? o->dummy_quant : "nvfp4";
    QFormat fmt = !strcmp(q, "nvfp4") ? QF_NVFP4 : !strcmp(q, "fp8") ? QF_FP8 : !strcmp(q, "bf16") ? QF_BF16 : QF_COUNT;
    if (fmt == QF_COUNT) fatal("--dummy-quant '%s': expected nvfp4, fp8 or bf16", q);
    model_load_dummy_shard(m, o->dir, fmt, o->num_layers, shard, par);
    m->cfg.kv_dtype = o->kv_dtype;
}

int opt_engine_diag(int argc, char **argv, int *i, EngineOptions *eo)
{
    return opt_int(argc, argv, i, "--profile-every", 0, 1 << 20, &eo->profile_every) ||
           opt_int(argc, argv, i, "--inject-host-delay-us", 0, 10000000, &eo->host_delay_us) ||
           opt_int(argc, argv, i, "--inject-gemm-repeat", 1, 10000, &backend_gemm_repeat);
}

const char *cli_dist_start(ModelOpts *o, const char *device) { return dist_setup(&o->par, device); }

int cli_worker(const Model *dm, Backend *be)
{
    Dist *d = dist_get();
    if (!d || d->rank == 0) return 0;
    sigset_t none; /* a command may have blocked them for its own sigwait (serve) */
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    if (dist_under_mpirun()) { /* mpirun passes a Ctrl-C or SIGTERM to every rank: rank 0 drains, then stops us */
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
    }
    forward_worker(dm, be);
    return 1;
}
