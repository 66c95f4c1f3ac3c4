/* kv_cache: the paged KV cache. Memory is a pool of fixed-size blocks (block_size tokens each,
 * every layer); a sequence's block table maps its positions to blocks: position p lives in
 * slot block_table[p / block_size] * block_size + p % block_size. Prefill, decode and several
 * sequences at once are the same code. Blocks are reference counted so that later prefix
 * caching (#6) can share full blocks between sequences. */
#ifndef MOESERVE_KV_CACHE_H
#define MOESERVE_KV_CACHE_H

#include "../backend/backend.h"
#include "model.h"

typedef struct {
    int block_size;            /* tokens per block */
    int n_blocks;
    int n_layers;
    int kv_width, idx_width;   /* elements per token per layer (model_kv_width / model_index_width) */
    KVDtype dtype;             /* of every layer's kv and idx (model_kv_dtype) */
    KVLayer *layers;           /* [L] storage in backend memory */
    int *free_list;            /* [n_blocks] stack of free block ids */
    int n_free;
    int *refcount;             /* [n_blocks] */
    Backend *be;               /* borrowed */
} KVCache;

/* Bytes one block takes across all layers, in the cache dtype of c: c is the config of the model
 * in backend memory (model_upload resolved its KV_DTYPE_AUTO; a host model's AUTO is the cpu's). */
size_t kv_cache_block_bytes(const ModelConfig *c, int block_size);
/* The pool, its elements of model_kv_dtype(c, be->host_memory); FP8 layers take the checkpoint's
 * k_scale / v_scale (c->kv_scale), else 1. */
void kv_cache_init(KVCache *kv, const ModelConfig *c, Backend *be, int block_size, int n_blocks);
/* A block allocator alone, no memory (layers NULL): the pool of another rank's attention group (--dp),
 * whose blocks rank 0's scheduler hands out. */
void kv_cache_init_blocks(KVCache *kv, int block_size, int n_blocks);
void kv_cache_free(KVCache *kv);
int kv_cache_alloc_block(KVCache *kv);   /* block id, or -1 when the pool is exhausted */
void kv_cache_ref_block(KVCache *kv, int block);
void kv_cache_release_block(KVCache *kv, int block);

/* One sequence's block table. */
typedef struct {
    int *blocks;               /* [cap] block ids */
    int n_blocks, cap;
} BlockTable;

/* Grow t so that it covers n_tokens positions; 0 ok, -1 when the pool ran out (t unchanged). */
int block_table_reserve(BlockTable *t, KVCache *kv, int n_tokens);
void block_table_release(BlockTable *t, KVCache *kv);   /* gives every block back */
int block_table_slot(const BlockTable *t, int block_size, int pos);

#endif
