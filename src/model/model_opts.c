/* model_opts: where a command's model comes from and where it runs: --model (a directory, or a
 * Hub id resolved into the cache), --dummy-weights, --kv-cache-dtype, the layout options; the
 * model loaded for this rank, put where the backend reads it, and a worker rank's loop
 * (model_opts.h). */
#include "model_opts.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../hub/hub.h"
#include "forward.h"

const char *model_dir_resolve(const char *cmd, const char *arg, const char *revision, int weights)
{
    static char *kept[8]; /* the resolved directories live as long as the command */
    static int n_kept;
    (void)kept;
    if (!arg) return NULL;
    char dir[4096], err[4096];
    int r = hub_resolve(arg, revision, weights, dir, sizeof dir, err, sizeof err);
    if (r < 0) fatal("%s: %s", cmd, err);
    if (r == 0) return arg;
    char *d = xstrdup(dir);
    if (n_kept < 8) kept[n_kept++] = d;
    return d;
}

void model_on_backend(Model *dev, const Model *host, Backend *be)
{
    if (be->host_memory && !host->dummy) {
        *dev = *host;
        dev->cfg.kv_dtype = model_kv_dtype(&host->cfg, 1);
        return;
    }
    model_upload(dev, host, be);
}

void model_on_backend_free(Model *dev, Backend *be)
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

const char *model_dist_start(ModelOpts *o, const char *device) { return dist_setup(&o->par, device); }

int model_worker(const Model *dm, Backend *be)
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
