/* config: config.json -> ModelConfig (SPEC-models.md §1.2, §2.1 and "Config key variants"),
 * and the quantization description (§3.1): hf_quant_config.json with exclude_modules, or
 * config.json quantization_config with ignore. */
#ifndef MOESERVE_CONFIG_H
#define MOESERVE_CONFIG_H

#include <stddef.h>

#include "../model/model.h"

/* "an object", "a list", "a string", ... for messages that name a JSON value's kind */
struct json_t;
const char *json_kind(const struct json_t *v);
/* Parse a config.json text (path is for messages). 0 ok, -1 with err set. */
int config_parse(ModelConfig *c, const char *json_text, const char *path, char *err, size_t errlen);
/* Read dir/config.json. */
int config_load(ModelConfig *c, const char *dir, char *err, size_t errlen);

typedef enum { QALGO_NONE, QALGO_NVFP4, QALGO_W4A16_NVFP4, QALGO_FP8, QALGO_FP8_BLOCK,
               QALGO_MIXED, QALGO_OTHER } QuantAlgo;

typedef struct QuantIndex QuantIndex; /* the exclude patterns compiled (config.c) */

typedef struct {
    QuantAlgo algo;
    char algo_name[32];        /* as written, upper-cased */
    int group_size;            /* 16 for NVFP4 */
    char **exclude;  int n_exclude;   /* exclude_modules / ignore patterns */
    QuantIndex *index;         /* owned, or NULL: exclude compiled by quant_config_load; unused once
                                  n_exclude has changed (then each pattern is tried in turn) */
    char **mixed_names; QuantAlgo *mixed_algo; int n_mixed; /* MIXED_PRECISION quantized_layers */
    char kv_cache_algo[16];    /* "" or "FP8" */
    char source[32];           /* "hf_quant_config.json", "config.json", or "" */
} QuantConfig;

/* Read dir/hf_quant_config.json, else config.json quantization_config. Absent: algo NONE. */
int quant_config_load(QuantConfig *q, const char *dir, char *err, size_t errlen);
/* 1 if module (e.g. "model.layers.3.mlp.gate") matches an exclude pattern: exact, substring,
 * or fnmatch wildcard; "path*" also matches "path" and "path.*" (vLLM is_layer_excluded). */
int quant_config_excluded(const QuantConfig *q, const char *module);
void quant_config_free(QuantConfig *q);

#endif
