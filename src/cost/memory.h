/* memory: what one rank of a layout holds (weights, activations, KV cache), the rule `info` and
 * `plan` share. */
#ifndef MOESERVE_COST_MEMORY_H
#define MOESERVE_COST_MEMORY_H

#include "../format/config.h"
#include "../model/model.h"

/* The GPU memory a rank holds before its weights (the CUDA context, cuBLASLt workspace, NCCL
 * buffers), and the share of what is left after weights and activations the KV pool takes (serve's
 * --kv-fraction default on a GPU). */
#define COST_RESERVE_BYTES (1.0 * (1 << 30))
#define COST_KV_FRACTION 0.9

/* Activation memory of one rank, as forward_init and the CUDA scratch size it (an estimate of the
 * larger buffers) for steps of T tokens and S logits rows. */
double cost_activation_bytes(const ModelConfig *c, int T, int S);

/* Under attention data parallelism (c->dp > 1) the MoE exchange's buffers (model/forward.h DpState):
 * the rows a rank sends, receives and gets back, T tokens x K experts x D floats each. */
double cost_dp_exchange_bytes(const ModelConfig *c, int T);

typedef struct {
    double weight_bytes;           /* every format */
    double nvfp4_bytes, bf16_bytes;
    double activation_bytes;
    double kv_bytes_per_token;     /* this rank's layers, its KV dtype (c->kv_dtype must be set) */
    double left_bytes;             /* memory - reserve - weights - activations (0 when no memory is given) */
    double kv_tokens;              /* tokens the rank's KV pool holds: COST_KV_FRACTION of left */
} CostRankMem;

/* The memory of the rank whose shard m is (model_load_dummy_shard or model_load_shard with the
 * layout's plan_apply; its c->dp > 1 adds the exchange's buffers), for steps of max_batch_tokens and max_running rows, on a device of
 * memory_bytes (0: not known; left_bytes and kv_tokens 0) holding reserve_bytes before weights. */
void cost_rank_memory(const Model *m, int max_batch_tokens, int max_running, double memory_bytes, double reserve_bytes,
                      CostRankMem *out);

#endif
