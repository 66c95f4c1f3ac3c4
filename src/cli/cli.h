/* cli.h: the commands of `moeserve <command>` and the small option parser they share. */
#ifndef MOESERVE_CLI_H
#define MOESERVE_CLI_H

/* Each command: int cmd_NAME(int argc, char **argv) with argv[0] the command name; returns
 * the process exit status. */
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
int cmd_download(int argc, char **argv);

/* A command's --model (or --tokenizer) argument as a directory: an existing path as it is; an id
 * of the Hugging Face Hub, "org/name[@rev]" (revision: --revision or NULL), the snapshot of it in
 * the cache, downloaded first where missing (src/hub/hub.h; weights 0: config and tokenizer
 * files only); a failure is fatal, naming the cause and the command. */
const char *cli_model_dir(const char *cmd, const char *arg, const char *revision, int weights);

/* The backend of --device cpu|cuda|cuda:N (NULL: cuda when built with it and a GPU is present,
 * else cpu), and the model's weights where that backend reads them (device_model: the host
 * model itself on the cpu, an uploaded copy on a GPU). */
#include "../backend/backend.h"
#include "../dist/plan.h"
const char *device_default(void);
void device_open(Backend *be, const char *device, int threads);
/* The device in words for logs and GET /get_server_info: the GPU's name, or "cpu (N threads)". */
void device_describe(const Backend *be, const char *device, char *buf, size_t n);
void device_model(Model *dev, const Model *host, Backend *be);
void device_model_free(Model *dev, Backend *be);

/* Where the weights come from: --model DIR (or a Hub id, ORG/NAME [--revision R], made a directory
 * by cli_model_dir), and --dummy-weights [--dummy-quant nvfp4|fp8|bf16]
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
 * under several ranks (cli_dist_start) only this rank's shard. */
void model_open(Model *m, const ModelOpts *o);
/* Several ranks (--tp/--pp/--ep, or mpirun): start them before anything touches the GPU;
 * returns the device this rank opens. Alone: device unchanged. */
const char *cli_dist_start(ModelOpts *o, const char *device);
/* After device_model: on a worker rank run rank 0's steps until it is done, then return 1
 * (the command frees what it made and returns 0, printing nothing); on rank 0 or alone 0. */
int cli_worker(const Model *dm, Backend *be);
/* --kv-cache-dtype VALUE; a value that is none of MODEL_KV_DTYPES is a fatal error listing them. */
int opt_kv_cache_dtype(int argc, char **argv, int *i, KVDtype *out);

/* The diagnosis options of an engine: --profile-every N, --inject-host-delay-us N,
 * --inject-gemm-repeat N (the last two are test hooks, issue #9). */
#include "../engine/engine.h"
int opt_engine_diag(int argc, char **argv, int *i, EngineOptions *eo);
#define DIAG_OPTS_USAGE "[--profile-every N] [--inject-host-delay-us N] [--inject-gemm-repeat N] [--inject-comm-delay-us N]"

/* Option parsing: opt_* look at argv[*i]; if it is `--name` they consume its value
 * (argv[*i + 1]), store it and return 1; a missing or malformed value is a fatal error naming
 * the option. */
int opt_str(int argc, char **argv, int *i, const char *name, const char **out);
int opt_int(int argc, char **argv, int *i, const char *name, long lo, long hi, int *out);
int opt_double(int argc, char **argv, int *i, const char *name, double lo, double hi, double *out);
int opt_flag(char **argv, int *i, const char *name, int *out);
/* Stop with "error: <cmd>: unknown option 'x'" and the usage line. */
void opt_unknown(const char *cmd, const char *arg, const char *usage);

#endif
