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
 * the KV cache's element type, --kv-cache-dtype (model.h KVDtype, model_kv_dtype); the
 * checkpoint's quantization as the command line expects it (--quantization, checked). */
/* Speculative decoding with the checkpoint's MTP layer (model/mtp.h): vLLM's spelling
 * --speculative-config '{"method":"mtp","num_speculative_tokens":K}' and SGLang's
 * --speculative-algorithm NEXTN|EAGLE --speculative-num-steps K; k drafts per step, 0 off. */
typedef struct {
    int k;                     /* drafts per step, after model_opt_parse (0: off) */
    int config_k;              /* --speculative-config's num_speculative_tokens (0: not given) */
    int algo;                  /* --speculative-algorithm: 1 given (an MTP drafter), 0 not */
    int steps;                 /* --speculative-num-steps (0: not given) */
    int draft_vocab;           /* --speculative-config's draft_vocab_size: drafts among the first N ids (0: all) */
} SpecOpts;
/* The options of speculative decoding (serve, generate, bench model); model_opt_parse settles k. */
OptGroup spec_opt_group(SpecOpts *o);
/* k from the two spellings: 0, or -1 with err when they disagree or one is incomplete. */
int spec_opts_resolve(SpecOpts *o, char *err, size_t errlen);

typedef struct {
    const char *dir;
    const char *revision;      /* --revision, of a Hugging Face repository id in dir */
    int dummy;
    const char *dummy_quant;
    int num_layers;
    KVDtype kv_dtype;          /* --kv-cache-dtype; KV_DTYPE_AUTO when not given */
    const char *quantization;  /* --quantization: NULL, or what the checkpoint must be (model_quant_check) */
    ParOpts par;               /* --tp --pp --ep ... (src/dist/plan.h): par_opt_group */
    SpecOpts spec;             /* speculative decoding (spec_opt_group): model_open loads the MTP layer when on */
} ModelOpts;

/* Which of the model options a command takes (model_opt_group): the model's directory or Hub id
 * (--model, --revision), its weights (--dummy-weights, --quantization, ...), --kv-cache-dtype. */
enum { MODEL_OPT_DIR = 1, MODEL_OPT_WEIGHTS = 2, MODEL_OPT_KV = 4, MODEL_OPT_ALL = 7 };
OptGroup model_opt_group(ModelOpts *o, int which);
/* After opt_parse: the positional MODEL (pos, or NULL) into o->dir; both it and --model is a usage
 * error (exit 2), as is neither when required. */
void model_opt_positional(ModelOpts *o, const char *cmd, const char *pos, int required);
/* opt_parse of a command whose one positional argument is MODEL (c->max_pos 1), then
 * model_opt_positional with it under the command's name. */
void model_opt_parse(const OptCommand *c, int argc, char **argv, ModelOpts *o, int required);
/* --quantization want against the checkpoint in dir (or the --dummy-quant of dummy weights): 0,
 * or -1 with err saying what the checkpoint is and what moeserve would need. */
int model_quant_check(const char *dir, const ModelOpts *o, char *err, size_t errlen);
/* Load (or make, --dummy-weights) the model with the command's KV cache dtype in its config;
 * under several ranks (model_dist_start) only this rank's shard; with speculation on (o->spec.k),
 * its MTP layer too (model_load_mtp). */
void model_open(Model *m, const ModelOpts *o);
/* Before the model is resolved and opened: on a simulated device (--device sim:GPU) no weight is
 * read or made, so the model is dummy skeletons (config.json is enough; --dummy-quant and
 * --num-layers as with --dummy-weights). */
void model_opt_device(ModelOpts *o, const char *device);
/* Several ranks (--tp/--pp/--ep, or mpirun): start them before anything touches the GPU;
 * returns the device this rank opens. Alone: device unchanged. */
const char *model_dist_start(ModelOpts *o, const char *device);
/* After model_on_backend: on a worker rank run rank 0's steps until it is done, then return 1
 * (the command frees what it made and returns 0, printing nothing); on rank 0 or alone 0. */
int model_worker(const Model *dm, Backend *be);
#endif
