/* kv_cache: the block pool and block tables (kv_cache.h). */
#include "kv_cache.h"

#include <stdlib.h>

#include "../backend/kv_elem.h"
#include "../base/util.h"

size_t kv_cache_block_bytes(const ModelConfig *c, int block_size)
{
    size_t es = kv_elem_size(model_kv_dtype(c, 1));
    return (size_t)block_size * (model_kv_width(c) + model_index_width(c)) * es * (c->layer_end - c->layer_begin + c->mtp_loaded);
}

void kv_cache_init(KVCache *kv, const ModelConfig *c, Backend *be, int block_size, int n_blocks)
{
    CHECK(block_size > 0 && n_blocks > 0, "kv cache: block_size %d, n_blocks %d", block_size, n_blocks);
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_layers = c->n_layers + c->mtp_loaded; /* the MTP layer's own cache after the model's */
    kv->kv_width = model_kv_width(c);
    kv->idx_width = model_index_width(c);
    kv->dtype = model_kv_dtype(c, be->host_memory);
    kv->be = be;
    kv->layers = xcalloc(kv->n_layers, sizeof *kv->layers);
    size_t slots = (size_t)n_blocks * block_size, es = kv_elem_size(kv->dtype);
    /* this pipeline stage's layers, and the MTP layer's (index n_layers; loaded on one rank only) */
    for (int l = c->layer_begin; l < c->layer_end + c->mtp_loaded; l++) {
        KVLayer *L = &kv->layers[l];
        L->block_size = block_size;
        L->kv_width = kv->kv_width;
        L->idx_width = kv->idx_width;
        L->dtype = kv->dtype;
        int fp8 = kv->dtype == KV_DTYPE_FP8;
        L->k_scale = fp8 && c->kv_scale[l][0] > 0 ? c->kv_scale[l][0] : 1.0f;
        L->v_scale = fp8 && c->kv_scale[l][1] > 0 ? c->kv_scale[l][1] : 1.0f;
        L->kv = be_alloc(be, slots * kv->kv_width * es);
        /* a "shared" indexer layer keeps no keys of its own */
        if (kv->idx_width && c->layer_indexer[l] == INDEXER_FULL)
            L->idx = be_alloc(be, slots * kv->idx_width * es);
    }
    kv->free_list = xmalloc(n_blocks * sizeof(int));
    kv->refcount = xcalloc(n_blocks, sizeof(int));
    /* pop order: block 0 first */
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
}

void kv_cache_init_blocks(KVCache *kv, int block_size, int n_blocks)
{
    CHECK(block_size > 0 && n_blocks > 0, "kv cache: block_size %d, n_blocks %d", block_size, n_blocks);
    *kv = (KVCache){.block_size = block_size, .n_blocks = n_blocks};
    kv->free_list = xmalloc(n_blocks * sizeof(int));
    kv->refcount = xcalloc(n_blocks, sizeof(int));
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
}

void kv_cache_free(KVCache *kv)
{
    if (kv->layers)
        for (int l = 0; l < kv->n_layers; l++) {
            be_free(kv->be, kv->layers[l].kv);
            be_free(kv->be, kv->layers[l].idx);
        }
    free(kv->layers);
    free(kv->free_list);
    free(kv->refcount);
    *kv = (KVCache){0};
}

int kv_cache_alloc_block(KVCache *kv)
{
    if (kv->n_free == 0) return -1;
    int b = kv->free_list[--kv->n_free];
    kv->refcount[b] = 1;
    return b;
}

void kv_cache_ref_block(KVCache *kv, int block)
{
    CHECK(block >= 0 && block < kv->n_blocks && kv->refcount[block] > 0, "kv cache: ref of free block %d", block);
    kv->refcount[block]++;
}

void kv_cache_release_block(KVCache *kv, int block)
{
    CHECK(block >= 0 && block < kv->n_blocks && kv->refcount[block] > 0, "kv cache: release of free block %d", block);
    if (--kv->refcount[block] == 0) kv->free_list[kv->n_free++] = block;
}

int block_table_reserve(BlockTable *t, KVCache *kv, int n_tokens)
{
    int need = (n_tokens + kv->block_size - 1) / kv->block_size;
    if (need <= t->n_blocks) return 0;
    if (need - t->n_blocks > kv->n_free) return -1;
    if (need > t->cap) {
        t->cap = need > 2 * t->cap ? need : 2 * t->cap;
        t->blocks = xrealloc(t->blocks, t->cap * sizeof(int));
    }
    while (t->n_blocks < need) t->blocks[t->n_blocks++] = kv_cache_alloc_block(kv);
    return 0;
}

void block_table_release(BlockTable *t, KVCache *kv)
{
    for (int i = 0; i < t->n_blocks; i++) kv_cache_release_block(kv, t->blocks[i]);
    free(t->blocks);
    *t = (BlockTable){0};
}

int block_table_slot(const BlockTable *t, int block_size, int pos)
{
    return t->blocks[pos / block_size] * block_size + pos % block_size;
}
