/* ckpt: writing a Hugging Face checkpoint directory tensor by tensor, shared by `moeserve synth`
 * and `moeserve quantize`. A CkptPlan lists the source tensors in file order; each is written
 * as is, or as ModelOpt NVFP4 (the tensors of modelopt/torch/export/unified_export_hf.py's
 * _export_quantized_weight: weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2
 * F32 [], input_scale F32 []). The plan is split into shards of at
 * most a given size (model-0000N-of-0000M.safetensors + model.safetensors.index.json, or one
 * model.safetensors), and the data are pulled from a callback one tensor (or row block) at a
 * time, so nothing close to the whole model is ever in memory. */
#ifndef MOESERVE_CKPT_H
#define MOESERVE_CKPT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "quant.h"
#include "safetensors.h"

/* input_scale written for every NVFP4 linear: a placeholder, as no activations are seen. The
 * engine runs NVFP4 weight-only (W4A16: activations are not quantised) and ignores it. */
#define CKPT_INPUT_SCALE 1.0f
#define CKPT_PRODUCER_VERSION "0.0 (moeserve)"

typedef struct {
    char *name;                  /* owned: source tensor name, e.g. "model.layers.3.mlp.gate.weight" */
    DType dtype;                 /* dtype of the source data (plain tensors are written in it) */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int nvfp4;                   /* 1: written as ModelOpt NVFP4 (2-D, BF16/F16/F32, K % 16 == 0) */
    int partner;                 /* NVFP4 gate_proj <-> up_proj sharing weight_scale_2, or -1 */
} CkptEntry;

typedef struct {
    CkptEntry *e;                /* owned: [n] in output order (capacity cap) */
    int n, cap;
} CkptPlan;

/* The data of rows [r0, r1) of entry i, in its dtype, row-major; rows are the first dimension
 * (1-D and 0-D tensors are one row). The pointer stays valid until the callback is called
 * twice more: the writer holds at most a gate_proj and its up_proj at a time. */
typedef const void *(*CkptFetch)(void *ctx, int i, int64_t r0, int64_t r1);

int ckpt_plan_add(CkptPlan *p, const char *name, DType dtype, int ndim, const int64_t *shape);
void ckpt_plan_free(CkptPlan *p);   /* safe on a zeroed plan */
int64_t ckpt_entry_rows(const CkptEntry *e);
/* Output bytes of the whole plan (data only, headers not counted) and its parameter count. */
uint64_t ckpt_plan_bytes(const CkptPlan *p);
double ckpt_plan_params(const CkptPlan *p);

/* The modules real NVFP4 releases leave unquantised (ModelOpt's default_disabled_quantizers.yaml;
 * transformers never builds the MTP layers, so ModelOpt never sees them): lm_head, embeddings, routers,
 * and the MTP layers (index >= num_hidden_layers: those of the config and any other found in
 * the plan). Appends patterns to q->exclude. */
void ckpt_default_excludes(QuantConfig *q, const ModelConfig *c, const CkptPlan *p);
/* Append the comma-separated patterns of list ("a,b*") to q->exclude. */
void ckpt_add_excludes(QuantConfig *q, const char *list);
/* Mark every 2-D BF16/F16/F32 "<module>.weight" whose module q does not exclude as NVFP4 and
 * pair gate_proj with up_proj. A linear whose K is not a multiple of 16 stays as it is and its
 * module is appended to q->exclude (so the recorded exclude list stays true). Returns the number
 * of NVFP4 linears. */
int ckpt_plan_nvfp4(CkptPlan *p, QuantConfig *q);

/* nvfp4_quantize (quant.c) with a given global scale g > 0, fast: branch-free rounding and
 * loops the compiler vectorizes, no call per element. Same bytes for every input, NaN
 * included (tests/unit/test_synth.c compares the pair). */
void ckpt_nvfp4_quantize(const float *w, int64_t N, int64_t K, float g, uint8_t *codes, uint8_t *scales);

/* Write the plan into dir: shards of at most shard_bytes of data (a larger tensor gets a shard
 * of its own), an index when there is more than one shard. Files of an earlier checkpoint that
 * would confuse a reader (model.safetensors, the index, other shards) are removed first.
 * fetch is called from the calling thread only; one I/O thread writes an entry while the next
 * is computed. label prefixes the progress lines. 0 ok, -1 with err set. */
int ckpt_write(const CkptPlan *p, const char *dir, uint64_t shard_bytes, CkptFetch fetch, void *ctx,
               const char *label, char *err, size_t errlen);

/* config.json text of the unquantised model -> dir/config.json with a ModelOpt
 * quantization_config (quant_method modelopt, NVFP4, config_groups, ignore) and
 * dir/hf_quant_config.json (exclude_modules), as ModelOpt's exporter writes them
 * (modelopt/torch/export: quant_utils.py get_quant_config, convert_hf_config.py). */
int ckpt_write_nvfp4_configs(const char *dir, const char *config_text, const QuantConfig *q,
                             char *err, size_t errlen);
/* JSON text the way transformers writes it: keys sorted, indent 2, trailing newline (owned). */
char *ckpt_json_text(const json_t *root);
/* dir/name <- text. 0 ok, -1 with err set. */
int ckpt_write_text(const char *dir, const char *name, const char *text, char *err, size_t errlen);
/* mkdir -p dir. 0 ok, -1 with err set. */
int ckpt_mkdir(const char *dir, char *err, size_t errlen);
/* Free bytes for an unprivileged writer on the filesystem of dir, or of its nearest existing
 * ancestor (statvfs); -1 if none can be asked. */
int64_t ckpt_free_bytes(const char *dir);
/* "1.23 GB" (decimal units) into buf. */
const char *ckpt_fmt_bytes(double bytes, char *buf, size_t n);

#endif
