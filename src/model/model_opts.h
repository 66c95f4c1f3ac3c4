/* model_opts: the model options every command shares and what they lead to: --model DIR or a
 * Hugging Face Hub id, --dummy-weights, --kv-cache-dtype, the parallel layout (dist/plan.h); the
 * model loaded for this rank and put where its backend reads it; a worker rank's loop. */
#ifndef MOESERVE_MODEL_OPTS_H
#define MOESERVE_MODEL_OPTS_H

#include "../backend/backend.h"
#include "../base/opt.h"
#include "../dist/plan.h"
#include "model.h"

/* A command's --model (or --tokenizer) argument as a directory: an existing path as it is; an id
 * of the Hugging Face Hub, "org/name[@rev]" (revision: --revision or NULL), the snapshot of it in
 * the cache, downloaded first where missing (src/hub/hub.h; weights 0: config and tokenizer
 * files only); a failure is fatal, naming the cause and the command. */
const char *model_dir_resolve(const char *cmd, const char *arg, const char *revision, int weights);

/* The model's weights where be reads them: the host model itself on the cpu, an uploaded copy
 * on a GPU (model_upload); model_on_backend_free frees only such a copy. */
void model_on_backend(Model *dev, const Model *host, Backend *be);
void model_on_backend_free(Model *dev, Backend *be);

/* Where the weights come from: --model DIR (or a Hub id, ORG/NAME [--revision R], made a directory
 * by model_dir_resolve), and --dummy-weights [--dummy-quant nvfp4|fp8|bf16]
 * [--num-layers N] for random weights from DIR's config.json alone (vLLM's --load-format dummy);
 * and the KV cache's element type, --kv-cache-dtype (model.h KVDtype, model_kv_dtype). */
typedef struct {
    const char *dir;
    const char *revision;      /* --revision, of a Hugging Face repository id in dir */
    int dummy;
    const char *dummy_quant;
    int num_layers;
    KVDtype kv_dtype;          /* --kv-cache-dtype; KV_DTYPE_AUTO when not given */
    ParOpts par;               /* --tp --pp --ep ... (src/dist/plan.h) */
} ModelOpts;
#define KV_DTYPE_USAGE "[--kv-cache-dtype auto|float32|bf16|fp8]"
#define MODEL_OPTS_USAGE "--model DIR|ORG/NAME [--revision R] " \
                         "[--dummy-weights [--dummy-quant nvfp4|fp8|bf16] [--num-layers N]] " KV_DTYPE_USAGE \
                         " " PAR_OPTS_USAGE
int opt_model(int argc, char **argv, int *i, ModelOpts *o);
/* Load (or make, --dummy-weights) the model with the command's KV cache dtype in its config;
 * under several ranks (model_dist_start) only this rank's shard. */
void model_open(Model *m, const ModelOpts *o);
/* Several ranks (--tp/--pp/--ep, or mpirun): start them before anything touches the GPU;
 * returns the device this rank opens. Alone: device unchanged. */
const char *model_dist_start(ModelOpts *o, const char *device);
/* After model_on_backend: on a worker rank run rank 0's steps until it is done, then return 1
 * (the command frees what it made and returns 0, printing nothing); on rank 0 or alone 0. */
int model_worker(const Model *dm, Backend *be);
/* --kv-cache-dtype VALUE; a value that is none of MODEL_KV_DTYPES is a fatal error listing them. */
int opt_kv_cache_dtype(int argc, char **argv, int *i, KVDtype *out);

#endif
