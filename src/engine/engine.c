/* engine: the step loop (engine.h). One engine thread owns every sequence's tokens, block table
 * and sampler, the KV pool and the Forward; other threads submit, poll, cancel and finish
 * through a mutex-protected request table and per-request event queues.
 *
 * A step: admit waiting requests (FIFO) up to max_running, looking their full prompt blocks up
 * in the prefix cache; give every running sequence its next tokens: one for those decoding, a
 * chunk of up to chunked_prefill for those prefilling, within max_batch_tokens; a sequence whose
 * blocks cannot be allocated makes the youngest running sequence that arrived after it give its
 * blocks back (it recomputes later from its tokens so far: preemption by recompute), or waits
 * when there is none; run the forward; sample for every sequence that computed its last token;
 * queue the events; wake the owners. With speculative decoding (spec_k > 0) a decoding sequence's
 * step carries its token and the MTP layer's drafts after it, every one a logits row; the rows'
 * tokens are taken while they equal the drafts (spec_accept), and after the step the MTP layer
 * catches up on the settled positions and drafts again (spec_draft).
 *
 * Attention data parallel (--dp D): D KV pools, one per attention group, each with its prefix
 * cache (rank 0 holds group 0's memory; the other pools are block allocators whose blocks live on
 * their groups' ranks). A request is placed on a group when first admitted, for life (a
 * preempted one resumes there): the group with the most free blocks, counting the blocks its
 * prefix cache already holds of the prompt, then the fewest running sequences (place). The Pool
 * functions below hold this; one pool without --dp. */
#include "engine.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/opt.h"
#include "../base/test_hooks.h"
#include "../base/util.h"
#include "../model/forward.h"
#include "../diag/gpu.h"
#include "../model/kv_cache.h"
#include "../model/mtp.h"

#define ENGINE_MAX_EOS 16
#define ENGINE_HOST_KV_FRACTION 0.5 /* the share of the host's available memory a CPU KV pool may take */
#define ENGINE_WAIT_PING_S 0.5     /* how often the owners of queued requests are woken (engine.h) */
#define ENGINE_DIAG_WINDOW_S 30.0  /* the diagnosis window's bucket: long enough to hold many profiled steps of a
                                      slow GPU step (250 ms x 16), short enough to follow a change of load */

typedef struct Seq {
    uint64_t id;
    int *tokens;               /* prompt then generated tokens */
    int n_tokens, cap, n_prompt;
    int n_computed;            /* tokens whose KV is in the cache */
    int n_generated, max_tokens, ignore_eos;
    int *stop_ids, n_stop_ids;
    int *forced, n_forced;     /* RequestParams.forced: generated tokens imposed (a test hook) */
    BlockTable bt;
    int group;                 /* its attention group and pool (--dp), for life; -1 until first admitted */
    int n_hashed;              /* leading full blocks registered in the prefix cache */
    uint64_t last_hash;        /* chain hash of block n_hashed - 1 */
    Sampler sampler;
    uint64_t leader;           /* engine_submit_n's first sample, whose prompt blocks this one shares (0: none) */
    int cached_tokens;         /* prompt tokens taken from the prefix cache */
    int draft[MTP_MAX_DRAFTS]; /* speculative decoding: the MTP layer's drafts of the tokens after the last one,
                                  verified in the next step (n_draft of them; 0: a plain decode) */
    int n_draft;
    /* owner side (under the engine mutex) */
    EngineEvent *ev;
    int ev_head, ev_len, ev_cap;
    EngineNotify notify;
    void *user;
    int cancelled, stop_requested, done; /* done: the final event is queued */
    int running;
} Seq;

/* One bucket of the diagnosis window: the steps of about diag_window_s seconds. */
typedef struct {
    ProfSum ps;                /* its profiled steps */
    long steps, tokens;        /* every step */
    double wall_ms;
    double t0;                 /* when its first step began (s, clock_now) */
} DiagBucket;

/* prefix cache: chain hash of a full block -> block id; the cache holds one reference */
typedef struct {
    uint64_t *keys;            /* [cap] 0 = empty */
    int *blocks;               /* [cap] */
    int cap, used;
} PrefixMap;

/* The blocks of one attention group (--dp; the only pool otherwise) and their prefix cache. */
typedef struct {
    KVCache *kv;               /* group 0: the engine's kv (rank 0's memory); else a block allocator alone */
    PrefixMap pm;
    uint64_t *block_hash;      /* [n_blocks] hash of the cached block, 0 = not cached */
    uint64_t *block_tick;      /* [n_blocks] last use, for LRU eviction */
    uint64_t placed;           /* requests placed on the group */
    int running;               /* its running sequences */
} Pool;

struct Engine {
    const Model *m;            /* borrowed */
    Backend *be;               /* borrowed */
    EngineOptions o;
    int eos[ENGINE_MAX_EOS], n_eos;
    KVCache kv;
    Forward f;
    int max_blocks_per_seq;
    int b_stride;              /* b_table's row length this step: its longest row (build_batch) */
    /* requests */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stopping, drain;
    uint64_t next_id;
    Seq **all;                 /* every live request (waiting, running, or done and unpolled) */
    int n_all, cap_all;
    Seq **waiting;             /* FIFO */
    int n_waiting, cap_waiting;
    double t_ping;             /* when the owners of the waiting requests were last woken (s, clock_now) */
    Seq **running;             /* in admission order (oldest first) */
    int n_running;
    /* the KV pools and their prefix caches: [n_pools], one per attention group */
    Pool *pools;
    int n_pools;
    uint64_t tick;
    /* one step's batch (host) */
    int *b_tokens, *b_pos, *b_seq, *b_slot, *b_start, *b_ntok, *b_ctx, *b_out, *b_table, *b_group;
    Seq **b_seqs, **b_outseq;
    int *b_outn;               /* [max_out] rows of the out row's sequence from it on: 1, or 1 + its drafts on the
                                  first row of a chain to verify (0 on the chain's other rows) */
    int *b_nd;                 /* [max_running] drafts the batch's sequence verifies */
    int max_out;               /* logits rows of a step: max_running, times 1 + spec_k with speculation */
    float *logits;             /* [max_out, V] host */
    int *d_ids, *h_ids;        /* [max_out] argmax or sampled ids: backend memory, host copy */
    SampleRow *d_rows, *h_rows; /* [max_out] the sample op's parameters: backend memory, host */
    /* speculative decoding (spec_k > 0): the MTP layer's passes after each step (spec_draft) */
    Mtp mtp;
    int *m_tokens, *m_pos, *m_seq, *m_slot, *m_rows, *m_start, *m_ntok, *m_ctx, *m_out, *m_table, *m_ids, *m_nd;
    Seq **m_outseq;
    EngineStats stats;
    /* diagnosis (diag/): one step in profile_every timed op by op; every step's wall time and
     * tokens. A diagnosis describes the recent steps: win[0] fills, win[1] is the bucket before it,
     * the report is both (diag_window_s to twice that). Cumulative counts are stats'. */
    Prof prof;
    DiagBucket win[2];
    double t_last_step;        /* when the last step ended (s, clock_now; 0: none yet) */
    double p2p_gbps;           /* pipeline transfers (calibrated), to split receive time */
    int host_delay_us;         /* MOESERVE_TEST_HOST_DELAY_US, read at create: a step pays one compare */
};

void engine_options_default(EngineOptions *o)
{
    *o = (EngineOptions){.max_running = 64, .max_batch_tokens = 2048, .chunked_prefill = 512, .max_model_len = 0,
                         .block_size = 16, .n_blocks = 0, .kv_fraction = 0, .decode_steps = 1, .prefix_caching = 1,
                         .max_queue = 4096, .profile_every = 16, .diag_window_s = ENGINE_DIAG_WINDOW_S,
                         .spec_fixed_draft = -1};
}

/* ---- the prefix map ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* chain hash of a block: its parent's hash and its tokens (never 0) */
static uint64_t block_hash(uint64_t parent, const int *t, int n)
{
    uint64_t h = mix64(parent + 0x9E3779B97F4A7C15ull);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)t[i]) + i;
    return h ? h : 1;
}

static int pm_slot(const PrefixMap *p, uint64_t k)
{
    int i = (int)(k & (uint64_t)(p->cap - 1));
    while (p->keys[i] && p->keys[i] != k) i = (i + 1) & (p->cap - 1);
    return i;
}

static int pm_get(const PrefixMap *p, uint64_t k)
{
    int i = pm_slot(p, k);
    return p->keys[i] ? p->blocks[i] : -1;
}

static void pm_put(PrefixMap *p, uint64_t k, int block)
{
    int i = pm_slot(p, k);
    if (!p->keys[i]) p->used++;
    p->keys[i] = k;
    p->blocks[i] = block;
}

/* delete with backward-shift so that probe chains stay intact */
static void pm_del(PrefixMap *p, uint64_t k)
{
    int i = pm_slot(p, k);
    if (!p->keys[i]) return;
    p->keys[i] = 0;
    p->used--;
    for (int j = (i + 1) & (p->cap - 1); p->keys[j]; j = (j + 1) & (p->cap - 1)) {
        uint64_t kk = p->keys[j];
        int b = p->blocks[j];
        p->keys[j] = 0;
        p->used--;
        pm_put(p, kk, b);
    }
}

/* Drop the least recently used cached block of pool p that only the cache references; 0 if none. */
static int evict_one(Pool *p)
{
    int best = -1;
    for (int b = 0; b < p->kv->n_blocks; b++)
        if (p->block_hash[b] && p->kv->refcount[b] == 1 && (best < 0 || p->block_tick[b] < p->block_tick[best]))
            best = b;
    if (best < 0) return 0;
    pm_del(&p->pm, p->block_hash[best]);
    p->block_hash[best] = 0;
    kv_cache_release_block(p->kv, best);
    return 1;
}

/* ---- the pools (attention groups) ---- */

/* s's pool (the first before it is placed: it holds no blocks then) */
static Pool *pool_of(Engine *e, const Seq *s) { return &e->pools[s->group > 0 ? s->group : 0]; }

static void pools_init(Engine *e, int n_pools, int n_blocks)
{
    e->n_pools = n_pools;
    e->pools = xcalloc(n_pools, sizeof(Pool));
    for (int g = 0; g < n_pools; g++) {
        Pool *p = &e->pools[g];
        if (g == 0) {
            p->kv = &e->kv;
        } else {
            p->kv = xcalloc(1, sizeof(KVCache));
            kv_cache_init_blocks(p->kv, e->o.block_size, n_blocks);
        }
        p->pm.cap = 1;
        while (p->pm.cap < 2 * n_blocks + 2) p->pm.cap *= 2;
        p->pm.keys = xcalloc(p->pm.cap, sizeof(uint64_t));
        p->pm.blocks = xcalloc(p->pm.cap, sizeof(int));
        p->block_hash = xcalloc(n_blocks, sizeof(uint64_t));
        p->block_tick = xcalloc(n_blocks, sizeof(uint64_t));
    }
}

static void pools_free(Engine *e)
{
    for (int g = 0; g < e->n_pools; g++) {
        Pool *p = &e->pools[g];
        for (int b = 0; b < p->kv->n_blocks; b++)
            if (p->block_hash[b]) kv_cache_release_block(p->kv, b);
        free(p->pm.keys);
        free(p->pm.blocks);
        free(p->block_hash);
        free(p->block_tick);
        if (g > 0) {
            kv_cache_free(p->kv);
            free(p->kv);
        }
    }
    free(e->pools);
    e->pools = NULL;
}

/* The full blocks of s's prompt that pool p's prefix cache holds (as admit_prefix would take them). */
static int pool_prefix_blocks(const Engine *e, const Pool *p, const Seq *s)
{
    if (!e->o.prefix_caching) return 0;
    int bs = e->o.block_size, nfull = (s->n_tokens - 1) / bs, n = 0;
    uint64_t h = 0;
    for (int i = 0; i < nfull; i++) {
        h = block_hash(h, s->tokens + (size_t)i * bs, bs);
        if (pm_get(&p->pm, h) < 0) break;
        n++;
    }
    return n;
}

/* The blocks pool p could give a new sequence: the free ones and the cached ones nothing else holds
 * (evict_one takes them back). */
static long pool_free_blocks(const Pool *p)
{
    long n = p->kv->n_free;
    for (int b = 0; b < p->kv->n_blocks; b++) n += p->block_hash[b] && p->kv->refcount[b] == 1;
    return n;
}

/* s's group, the first time it is admitted: the most free blocks, the blocks of its prompt the
 * group's prefix cache holds counted twice (free, and not to compute), then the fewest running,
 * then the fewest placed so far (so that one request at a time still alternates), then the
 * lowest index */
static void place(Engine *e, Seq *s)
{
    if (s->group >= 0) return;
    int best = 0;
    long best_free = -1;
    for (int g = 0; e->n_pools > 1 && g < e->n_pools; g++) {
        const Pool *p = &e->pools[g], *b = &e->pools[best];
        long fr = pool_free_blocks(p) + pool_prefix_blocks(e, p, s);
        if (fr > best_free || (fr == best_free && (p->running < b->running ||
                                                   (p->running == b->running && p->placed < b->placed))))
            best = g, best_free = fr;
    }
    s->group = best;
    e->pools[best].placed++;
}

/* s joins or leaves the running set of its group */
static void pool_count(Engine *e, const Seq *s, int d) { pool_of(e, s)->running += d; }

/* ---- sequences ---- */

static void seq_push_event(Seq *s, const EngineEvent *ev)
{
    if (s->ev_len == s->ev_cap) {
        int nc = s->ev_cap ? 2 * s->ev_cap : 16;
        EngineEvent *n = xmalloc(nc * sizeof *n);
        for (int i = 0; i < s->ev_len; i++) n[i] = s->ev[(s->ev_head + i) % (s->ev_cap ? s->ev_cap : 1)];
        free(s->ev);
        s->ev = n;
        s->ev_cap = nc;
        s->ev_head = 0;
    }
    s->ev[(s->ev_head + s->ev_len) % s->ev_cap] = *ev;
    s->ev_len++;
}

static void seq_release_blocks(Engine *e, Seq *s)
{
    s->n_draft = 0; /* drafts follow the cached context: recomputed, it drafts again */
    block_table_release(&s->bt, pool_of(e, s)->kv);
    s->n_computed = 0;
    s->n_hashed = 0;
    s->last_hash = 0;
}

static void seq_free(Seq *s)
{
    free(s->tokens);
    free(s->stop_ids);
    free(s->forced);
    free(s->ev);
    sampler_free(&s->sampler);
    free(s);
}

static void remove_ptr(Seq **arr, int *n, Seq *s)
{
    for (int i = 0; i < *n; i++)
        if (arr[i] == s) {
            memmove(arr + i, arr + i + 1, (*n - i - 1) * sizeof *arr);
            (*n)--;
            return;
        }
}

static Seq *find(Engine *e, uint64_t id)
{
    for (int i = 0; i < e->n_all; i++)
        if (e->all[i]->id == id) return e->all[i];
    return NULL;
}

/* under the mutex: forget s entirely (after its final event was read, or on cancel) */
static void drop(Engine *e, Seq *s)
{
    remove_ptr(e->all, &e->n_all, s);
    remove_ptr(e->waiting, &e->n_waiting, s);
    if (s->running) {
        remove_ptr(e->running, &e->n_running, s);
        pool_count(e, s, -1);
    }
    seq_release_blocks(e, s);
    seq_free(s);
}

/* ---- speculative decoding: set-up (the step's part is spec_accept and spec_draft) ---- */

static void spec_init_options(Engine *e)
{
    if (!e->m->cfg.mtp_loaded)
        fatal("engine: speculative decoding needs the model's MTP layer loaded (model_load_mtp)");
    if (e->o.spec_k > MTP_MAX_DRAFTS) e->o.spec_k = MTP_MAX_DRAFTS;
    log_info("engine: speculative decoding: %d drafts a step from the MTP layer, verified in one forward",
             e->o.spec_k);
}

static void spec_alloc(Engine *e)
{
    int T = e->o.max_batch_tokens, S = e->o.max_running;
    int **t[] = {&e->m_tokens, &e->m_pos, &e->m_seq, &e->m_slot, &e->m_rows};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) *t[i] = xcalloc(T, sizeof(int));
    int **sv[] = {&e->m_start, &e->m_ntok, &e->m_ctx, &e->m_out, &e->m_ids, &e->m_nd};
    for (size_t i = 0; i < sizeof sv / sizeof sv[0]; i++) *sv[i] = xcalloc(S, sizeof(int));
    e->m_table = xcalloc((size_t)S * e->max_blocks_per_seq, sizeof(int));
    e->m_outseq = xcalloc(S, sizeof(Seq *));
    mtp_init(&e->mtp, &e->f, e->o.spec_vocab);
}

static void spec_free(Engine *e)
{
    mtp_free(&e->mtp);
    void *p[] = {e->m_tokens, e->m_pos, e->m_seq, e->m_slot, e->m_rows, e->m_start, e->m_ntok, e->m_ctx, e->m_out,
                 e->m_ids, e->m_nd, e->m_table, e->m_outseq};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* ---- public API ---- */

Engine *engine_create(const Model *m, Backend *be, const EngineOptions *o, const int *eos, int n_eos)
{
    Engine *e = xcalloc(1, sizeof *e);
    e->m = m;
    e->be = be;
    e->o = *o;
    e->host_delay_us = test_hook_host_delay_us();
    const ModelConfig *c = &m->cfg;
    /* the context: the model's own (config.json) unless --max-model-len asks for less */
    int len_given = e->o.max_model_len > 0;
    if (!len_given || e->o.max_model_len > c->max_position) e->o.max_model_len = c->max_position;
    if (e->o.max_batch_tokens < e->o.max_running) e->o.max_batch_tokens = e->o.max_running;
    if (e->o.chunked_prefill <= 0 || e->o.chunked_prefill > e->o.max_batch_tokens) e->o.chunked_prefill = e->o.max_batch_tokens;
    if (!(e->o.diag_window_s > 0)) e->o.diag_window_s = ENGINE_DIAG_WINDOW_S;
    for (int i = 0; i < n_eos && e->n_eos < ENGINE_MAX_EOS; i++) e->eos[e->n_eos++] = eos[i];
    int bs = e->o.block_size;
    e->max_blocks_per_seq = (e->o.max_model_len + bs - 1) / bs;
    if (e->o.gpu_fraction > 0) {
        if (be->host_memory)
            log_info("engine: --gpu-memory-utilization %g does not apply on the %s backend (no GPU memory): the KV "
                     "pool is sized from the host's memory (--kv-fraction)", e->o.gpu_fraction, be->name);
        else e->o.kv_fraction = e->o.gpu_fraction;
    }
    int nb = e->o.n_blocks;
    size_t per_block = kv_cache_block_bytes(c, bs);
    if (nb <= 0) {
        /* the pool from the memory left, up to what every running sequence at full length needs;
         * under parallelism, the smallest that any rank can hold (its layers, its memory) */
        int from = 0;
        double want = (double)e->o.max_running * e->max_blocks_per_seq;
        double fraction = e->o.kv_fraction > 0 ? e->o.kv_fraction : be->host_memory ? ENGINE_HOST_KV_FRACTION : 0.9;
        double fit = forward_kv_fit(c, be, bs, fraction, &from);
        nb = (int)(fit < want ? fit : want);
        if (from > 0 && fit < want)
            log_info("engine: the KV pool is sized to rank %d, whose free memory and layers hold the fewest blocks (%d)",
                     from, nb);
    }
    if (nb < e->max_blocks_per_seq && !len_given && nb > 0) {
        /* the model's context does not fit one request: serve a shorter one rather than none */
        log_warn("engine: one request of the model's context, %d tokens, needs %d KV blocks but the cache holds %d: "
                 "max_model_len is %d (give the cache more memory with --kv-fraction or --num-kv-blocks, or set "
                 "--max-model-len)", e->o.max_model_len, e->max_blocks_per_seq, nb, nb * bs);
        e->o.max_model_len = nb * bs;
        e->max_blocks_per_seq = nb;
    }
    if (nb < e->max_blocks_per_seq)
        fatal("engine: the KV cache holds %d blocks of %d tokens (%.2f MiB each), but one request of --max-model-len "
              "%d needs %d; lower --max-model-len or give the cache more memory (--kv-fraction, --num-kv-blocks)",
              nb, bs, per_block / 1048576.0, e->o.max_model_len, e->max_blocks_per_seq);
    kv_cache_init(&e->kv, c, be, bs, nb);
    log_info("engine: KV cache (%s) %d blocks x %d tokens = %d tokens (%.2f GiB); max %d running, %d tokens per step",
             model_kv_dtype_name(e->kv.dtype), nb, bs, nb * bs, (double)nb * per_block / 1073741824.0, e->o.max_running,
             e->o.max_batch_tokens);
    prof_init(&e->prof, be);
    if (e->o.spec_k > 0) spec_init_options(e);
    e->max_out = e->o.max_running * (1 + e->o.spec_k);
    if (e->max_out > e->o.max_batch_tokens) e->max_out = e->o.max_batch_tokens > e->o.max_running ? e->o.max_batch_tokens
                                                                                                    : e->o.max_running;
    forward_init(&e->f, m, be, e->o.max_batch_tokens, e->max_out, e->o.max_running, e->max_blocks_per_seq);
    forward_share(&e->f, &e->kv);
    /* decoding steps (a token a running sequence, or a token and its drafts) and the MTP
     * layer's passes replayed as graphs on backends that have them, one per padded size,
     * captured on first use (forward.h) */
    if (!e->o.no_graphs) forward_enable_graphs(&e->f, e->max_blocks_per_seq * bs);
    int T = e->o.max_batch_tokens, S = e->o.max_running;
    int **bufs[] = {&e->b_tokens, &e->b_pos, &e->b_seq, &e->b_slot};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = xcalloc(T, sizeof(int));
    e->b_start = xcalloc(S, sizeof(int));
    e->b_ntok = xcalloc(S, sizeof(int));
    e->b_ctx = xcalloc(S, sizeof(int));
    e->b_group = xcalloc(S, sizeof(int));
    int MO = e->max_out;
    e->b_out = xcalloc(MO, sizeof(int));
    e->b_outn = xcalloc(MO, sizeof(int));
    e->b_nd = xcalloc(S, sizeof(int));
    e->b_table = xcalloc((size_t)S * e->max_blocks_per_seq, sizeof(int));
    e->b_seqs = xcalloc(S, sizeof(Seq *));
    e->b_outseq = xcalloc(MO, sizeof(Seq *));
    e->logits = xmalloc((size_t)MO * c->vocab * sizeof(float));
    e->d_ids = be_alloc(be, (size_t)MO * sizeof(int));
    e->h_ids = xcalloc(MO, sizeof(int));
    e->d_rows = be_alloc(be, (size_t)MO * sizeof(SampleRow));
    e->h_rows = xcalloc(MO, sizeof(SampleRow));
    if (e->o.spec_k > 0) spec_alloc(e);
    e->running = xcalloc(S, sizeof(Seq *));
    Dist *dist = dist_get();
    int groups = dist && dist->dp > 1 ? dist->dp : 1;
    CHECK(groups <= ENGINE_MAX_DP, "engine: %d attention groups, at most %d", groups, ENGINE_MAX_DP);
    pools_init(e, groups, nb);
    if (groups > 1)
        log_info("engine: %d attention groups, a KV pool of %d blocks each (%d tokens in all)", groups, nb,
                 groups * nb * bs);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    e->stats.kv_blocks_total = nb * groups;
    return e;
}

int engine_max_model_len(const Engine *e) { return e->o.max_model_len; }

int engine_check(const Engine *e, const RequestParams *p, char *err, size_t errlen)
{
    const ModelConfig *c = &e->m->cfg;
    if (p->n_prompt <= 0) { errbuf_set(err, errlen, "the prompt is empty"); return -1; }
    if (p->n_prompt >= e->o.max_model_len) {
        errbuf_set(err, errlen, "the prompt has %d tokens; this model's context is %d tokens (at least one is needed to generate)",
                   p->n_prompt, e->o.max_model_len);
        return -1;
    }
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= c->vocab) {
            errbuf_set(err, errlen, "token id %d is outside the vocabulary [0, %d)", p->prompt[i], c->vocab);
            return -1;
        }
    for (int i = 0; i < p->n_forced; i++)
        if (p->forced[i] < 0 || p->forced[i] >= c->vocab) {
            errbuf_set(err, errlen, "forced token id %d is outside the vocabulary [0, %d)", p->forced[i], c->vocab);
            return -1;
        }
    const char *bad = sampling_params_check(&p->sampling);
    if (bad) { errbuf_set(err, errlen, "%s", bad); return -1; }
    if (p->max_tokens < 1) { errbuf_set(err, errlen, "max_tokens must be at least 1"); return -1; }
    return 0;
}

static Seq *seq_new(Engine *e, const RequestParams *p, int64_t seed, EngineNotify notify, void *user)
{
    const ModelConfig *c = &e->m->cfg;
    Seq *s = xcalloc(1, sizeof *s);
    s->group = -1;
    s->cap = p->n_prompt + 16;
    s->tokens = xmalloc(s->cap * sizeof(int));
    memcpy(s->tokens, p->prompt, p->n_prompt * sizeof(int));
    s->n_tokens = s->n_prompt = p->n_prompt;
    int room = e->o.max_model_len - p->n_prompt;
    s->max_tokens = p->max_tokens < room ? p->max_tokens : room;
    s->ignore_eos = p->ignore_eos;
    if (p->n_stop_ids > 0) {
        s->stop_ids = xmalloc(p->n_stop_ids * sizeof(int));
        memcpy(s->stop_ids, p->stop_ids, p->n_stop_ids * sizeof(int));
        s->n_stop_ids = p->n_stop_ids;
    }
    if (p->n_forced > 0) {
        s->forced = xmalloc(p->n_forced * sizeof(int));
        memcpy(s->forced, p->forced, p->n_forced * sizeof(int));
        s->n_forced = p->n_forced;
    }
    SamplingParams sp = p->sampling;
    sp.seed = seed;
    sampler_init(&s->sampler, &sp, c->vocab, p->prompt, p->n_prompt);
    s->notify = notify;
    s->user = user;
    return s;
}

uint64_t engine_submit(Engine *e, const RequestParams *p, EngineNotify notify, void *user, char *err, size_t errlen)
{
    return engine_submit_n(e, p, 1, notify, user, err, errlen);
}

uint64_t engine_submit_n(Engine *e, const RequestParams *p, int n, EngineNotify notify, void *user, char *err, size_t errlen)
{
    if (engine_check(e, p, err, errlen)) return 0;
    if (n < 1) n = 1;
    /* one seed stream per sample: seed + i, from the clock when the request gives none (so
     * that samples drawn at the same instant still differ) */
    int64_t seed = p->sampling.seed >= 0 ? p->sampling.seed : (int64_t)(clock_now() * 1e9) & INT64_C(0x3fffffffffffffff);
    Seq **ss = xmalloc(n * sizeof *ss);
    for (int i = 0; i < n; i++) ss[i] = seq_new(e, p, seed + i, notify, user);
    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->n_waiting + n > e->o.max_queue) {
        pthread_mutex_unlock(&e->mu);
        errbuf_set(err, errlen, e->stopping ? "the server is shutting down" : "too many requests are waiting");
        for (int i = 0; i < n; i++) seq_free(ss[i]);
        free(ss);
        return 0;
    }
    uint64_t id = e->next_id;
    for (int i = 0; i < n; i++) {
        Seq *s = ss[i];
        s->id = e->next_id++;
        s->leader = i > 0 ? id : 0;
        if (e->n_all == e->cap_all) e->all = xrealloc(e->all, (e->cap_all = e->cap_all ? 2 * e->cap_all : 64) * sizeof(Seq *));
        e->all[e->n_all++] = s;
        if (e->n_waiting == e->cap_waiting)
            e->waiting = xrealloc(e->waiting, (e->cap_waiting = e->cap_waiting ? 2 * e->cap_waiting : 64) * sizeof(Seq *));
        e->waiting[e->n_waiting++] = s;
    }
    free(ss);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return id;
}

int engine_poll(Engine *e, uint64_t id, EngineEvent *ev, int max)
{
    pthread_mutex_lock(&e->mu);
    Seq *s = find(e, id);
    int n = 0;
    if (s && !s->cancelled) {
        while (n < max && s->ev_len > 0) {
            ev[n++] = s->ev[s->ev_head];
            s->ev_head = (s->ev_head + 1) % s->ev_cap;
            s->ev_len--;
        }
        if (s->done && s->ev_len == 0) drop(e, s); /* the final event is out */
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_cancel(Engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    Seq *s = find(e, id);
    if (s) {
        s->cancelled = 1;
        if (!s->running || s->done) drop(e, s); /* else the engine thread drops it between steps */
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

void engine_finish(Engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    Seq *s = find(e, id);
    if (s) s->stop_requested = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_diag(Engine *e, ProfSum *s, Deployment *d, double p2p_gbps)
{
    pthread_mutex_lock(&e->mu);
    e->p2p_gbps = p2p_gbps;
    const DiagBucket *cur = &e->win[0], *prev = &e->win[1];
    *s = cur->ps;
    prof_sum_add(s, &prev->ps);
    d->steps = cur->steps + prev->steps;
    d->steps_wall_ms = cur->wall_ms + prev->wall_ms;
    d->tokens = cur->tokens + prev->tokens;
    d->steps_total = (long)e->stats.steps;
    d->window_s = d->steps > 0 ? e->t_last_step - (prev->steps > 0 ? prev->t0 : cur->t0) : 0;
    /* nothing to run: the window keeps the last load's steps until the next load (window_roll) */
    d->idle_s = e->n_running == 0 && e->n_waiting == 0 && e->t_last_step > 0 ? clock_now() - e->t_last_step : 0;
    d->running = e->n_running;
    d->waiting = e->n_waiting;
    d->max_running = e->o.max_running;
    d->kv_blocks_total = d->kv_blocks_used = 0;
    for (int g = 0; g < e->n_pools; g++) {
        d->kv_blocks_total += e->pools[g].kv->n_blocks;
        d->kv_blocks_used += e->pools[g].kv->n_blocks - e->pools[g].kv->n_free;
    }
    d->preemptions = (long)e->stats.preemptions;
    d->spec_k = e->o.spec_k;
    d->spec_chains = (long)e->stats.spec_chains;
    d->spec_drafts = (long)e->stats.spec_draft_tokens;
    d->spec_accepted = (long)e->stats.spec_accepted_tokens;
    d->graphs = !e->o.no_graphs && !e->be->host_memory && e->be->ops->graph_begin; /* a backend that captures them */
    d->gpu = !e->be->host_memory;
    pthread_mutex_unlock(&e->mu);
}

void engine_stats(Engine *e, EngineStats *out)
{
    pthread_mutex_lock(&e->mu);
    e->stats.running = e->n_running;
    e->stats.waiting = e->n_waiting;
    e->stats.kv_blocks_used = 0;
    e->stats.dp = e->n_pools;
    for (int g = 0; g < e->n_pools; g++) {
        const Pool *p = &e->pools[g];
        EngineGroupStats *gs = &e->stats.group[g];
        gs->placed = p->placed;
        gs->running = p->running;
        gs->waiting = 0;
        gs->kv_blocks_total = p->kv->n_blocks;
        gs->kv_blocks_used = p->kv->n_blocks - p->kv->n_free;
        e->stats.kv_blocks_used += gs->kv_blocks_used;
    }
    for (int i = 0; i < e->n_waiting; i++) /* preempted: they resume on their group */
        if (e->waiting[i]->group >= 0) e->stats.group[e->waiting[i]->group].waiting++;
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}

/* the graph counts of EngineStats, from the Forward's (engine thread, after a step) */
static void graph_counts(Engine *e, long forward_before, int verify)
{
    const long *r = e->f.graph_replays;
    if (r[GRAPH_FORWARD] > forward_before) {
        e->stats.graph_steps++;
        e->stats.graph_verify_steps += verify;
    }
    e->stats.graph_mtp_passes = (uint64_t)(r[GRAPH_MTP_MAIN] + r[GRAPH_MTP_CHAIN]);
}

/* ---- the engine thread (everything below runs on it, the mutex held unless said) ---- */

/* The final event of s (its blocks go back now; s itself when the owner has read it). */
static void finish(Engine *e, Seq *s, FinishReason why, int token, const SampleResult *r)
{
    EngineEvent ev = {.token = token, .finish = why, .prompt_tokens = s->n_prompt,
                      .completion_tokens = s->n_generated, .cached_tokens = s->cached_tokens};
    if (r && token >= 0) {
        ev.logprob = r->logprob;
        ev.n_top = r->n_top;
        memcpy(ev.top_ids, r->top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, r->top_logprobs, sizeof ev.top_logprobs);
    }
    seq_push_event(s, &ev);
    s->done = 1;
    if (s->running) {
        remove_ptr(e->running, &e->n_running, s);
        pool_count(e, s, -1);
    }
    s->running = 0;
    seq_release_blocks(e, s);
}

/* Register s's newly completed full blocks in the prefix cache (the cache takes a reference). */
static void cache_full_blocks(Engine *e, Seq *s)
{
    if (!e->o.prefix_caching) return;
    int bs = e->o.block_size;
    Pool *p = pool_of(e, s);
    while ((s->n_hashed + 1) * bs <= s->n_computed) {
        int i = s->n_hashed, b = s->bt.blocks[i];
        uint64_t h = block_hash(s->last_hash, s->tokens + (size_t)i * bs, bs);
        if (!p->block_hash[b] && pm_get(&p->pm, h) < 0) {
            pm_put(&p->pm, h, b);
            p->block_hash[b] = h;
            kv_cache_ref_block(p->kv, b);
        }
        p->block_tick[b] = ++e->tick;
        s->last_hash = h;
        s->n_hashed++;
    }
}

/* Admission: the prompt's leading full blocks found in the prefix cache are shared (at least one
 * token is always left to compute, for the logits). */
static void admit_prefix(Engine *e, Seq *s)
{
    if (!e->o.prefix_caching) return;
    int bs = e->o.block_size, nfull = (s->n_tokens - 1) / bs;
    uint64_t h = 0;
    Pool *p = pool_of(e, s);
    e->stats.prefix_queries += s->n_prompt;
    for (int i = 0; i < nfull; i++) {
        uint64_t hi = block_hash(h, s->tokens + (size_t)i * bs, bs);
        int b = pm_get(&p->pm, hi);
        if (b < 0) break;
        if (s->bt.n_blocks == s->bt.cap) s->bt.blocks = xrealloc(s->bt.blocks, (s->bt.cap = s->bt.cap ? 2 * s->bt.cap : 8) * sizeof(int));
        s->bt.blocks[s->bt.n_blocks++] = b;
        kv_cache_ref_block(p->kv, b);
        p->block_tick[b] = ++e->tick;
        h = hi;
        s->n_hashed = i + 1;
        s->last_hash = h;
    }
    s->n_computed = s->n_hashed * bs;
    s->cached_tokens = s->n_computed < s->n_prompt ? s->n_computed : s->n_prompt;
    e->stats.prefix_hits += s->cached_tokens;
}

/* Blocks for s to hold n tokens; evicts cached blocks, then preempts the youngest running
 * sequence that arrived after s and holds blocks (arrival, not place: the running list is out
 * of order once preempted sequences come back). When there is none, s waits for this step with
 * what it holds. So the oldest sequence always progresses, where picking by place let two
 * sequences take each other's blocks in turn, each recomputing its whole context per token. */
static int ensure_blocks(Engine *e, Seq *s, int n)
{
    Pool *p = pool_of(e, s);
    for (;;) {
        if (block_table_reserve(&s->bt, p->kv, n) == 0) return 0;
        if (evict_one(p)) continue;
        Seq *victim = NULL; /* of the same group: only its blocks are of use */
        for (int i = 0; i < e->n_running; i++) {
            Seq *v = e->running[i];
            if (v->id > s->id && v->group == s->group && v->bt.n_blocks > 0 && (!victim || v->id > victim->id))
                victim = v;
        }
        if (!victim) return -1;
        remove_ptr(e->running, &e->n_running, victim);
        pool_count(e, victim, -1);
        victim->running = 0;
        seq_release_blocks(e, victim);
        /* back into the queue in arrival order, ahead of every later request: it resumes
         * first, recomputing what it had */
        if (e->n_waiting == e->cap_waiting)
            e->waiting = xrealloc(e->waiting, (e->cap_waiting = e->cap_waiting ? 2 * e->cap_waiting : 64) * sizeof(Seq *));
        int at = 0;
        while (at < e->n_waiting && e->waiting[at]->id < victim->id) at++;
        memmove(e->waiting + at + 1, e->waiting + at, (e->n_waiting - at) * sizeof(Seq *));
        e->waiting[at] = victim;
        e->n_waiting++;
        e->stats.preemptions++;
    }
}

/* Drop cancelled sequences, end those whose owner saw a stop string, admit waiting ones. */
static void schedule_admin(Engine *e)
{
    for (int i = 0; i < e->n_running;) {
        Seq *s = e->running[i];
        if (s->cancelled) { drop(e, s); continue; }
        if (s->stop_requested && !s->done) { finish(e, s, FINISH_STOP, -1, NULL); if (s->notify) s->notify(s->user, s->id); continue; }
        i++;
    }
    for (int i = 0; i < e->n_waiting;) {
        Seq *s = e->waiting[i];
        if (s->cancelled) { drop(e, s); continue; }
        if (s->stop_requested && !s->done) {
            remove_ptr(e->waiting, &e->n_waiting, s);
            finish(e, s, FINISH_STOP, -1, NULL);
            if (s->notify) s->notify(s->user, s->id);
            continue;
        }
        i++;
    }
    for (int i = 0; i < e->n_waiting && e->n_running < e->o.max_running;) {
        Seq *s = e->waiting[i];
        if (s->leader && e->o.prefix_caching) {
            /* a sample of n waits until the first has its prompt in the cache, then shares its
             * full blocks instead of computing them again */
            Seq *l = find(e, s->leader);
            if (l && !l->done && !l->cancelled && l->n_computed < l->n_prompt) { i++; continue; }
            s->leader = 0;
        }
        memmove(e->waiting + i, e->waiting + i + 1, (e->n_waiting - i - 1) * sizeof(Seq *));
        e->n_waiting--;
        place(e, s);
        admit_prefix(e, s);
        pool_count(e, s, 1);
        s->running = 1;
        e->running[e->n_running++] = s;
    }
    if (e->n_running > e->stats.peak_running) e->stats.peak_running = e->n_running;
}

/* Build one step's batch; returns its token count (0: nothing to do). */
static int build_batch(Engine *e, int *n_seqs, int *n_out)
{
    int T = 0, S = 0, O = 0, budget = e->o.max_batch_tokens, bs = e->o.block_size;
    /* decoding sequences first (one token each), then prefill chunks, oldest first */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->n_running && T < budget; i++) {
            Seq *s = e->running[i];
            int pending = s->n_tokens - s->n_computed;
            if (pending <= 0 || (pass == 0) != (pending == 1)) continue;
            int take = pending;
            if (take > e->o.chunked_prefill) take = e->o.chunked_prefill;
            if (take > budget - T) take = budget - T;
            /* a decoding sequence's drafts go after its token, as far as the step has room */
            int nd = pass == 0 ? s->n_draft : 0;
            if (nd > budget - T - take) nd = budget - T - take;
            if (ensure_blocks(e, s, s->n_computed + take + nd) < 0) continue;
            if (!s->running) continue;
            for (int k = 0; k < take + nd; k++) {
                int p = s->n_computed + k;
                e->b_tokens[T + k] = k < take ? s->tokens[p] : s->draft[k - take];
                e->b_pos[T + k] = p;
                e->b_seq[T + k] = S;
                e->b_slot[T + k] = block_table_slot(&s->bt, bs, p);
            }
            e->b_start[S] = T;
            e->b_ntok[S] = take + nd;
            e->b_ctx[S] = s->n_computed + take + nd;
            e->b_group[S] = s->group;
            e->b_seqs[S] = s;
            e->b_nd[S] = nd;
            if (nd > 0) { /* a chain to verify: every token a logits row */
                for (int k = 0; k <= nd; k++) {
                    e->b_out[O] = T + k;
                    e->b_outn[O] = k == 0 ? 1 + nd : 0;
                    e->b_outseq[O++] = s;
                }
                take += nd;
            } else if (s->n_computed + take == s->n_tokens) { /* its last token: logits */
                e->b_out[O] = T + take - 1;
                e->b_outn[O] = 1;
                e->b_outseq[O++] = s;
            }
            T += take;
            S++;
        }
    /* preemption inside the loop may have removed sequences already placed: rebuild if so */
    for (int i = 0; i < S; i++)
        if (!e->b_seqs[i]->running) return build_batch(e, n_seqs, n_out);
    /* the block table as wide as this step's longest row, not the longest a sequence may grow:
     * it goes to the device every step, and at 512 sequences of a 200k-token model the full width
     * is 26 MB a step */
    int stride = 1;
    for (int i = 0; i < S; i++) stride = e->b_seqs[i]->bt.n_blocks > stride ? e->b_seqs[i]->bt.n_blocks : stride;
    for (int i = 0; i < S; i++) {
        Seq *s = e->b_seqs[i];
        memcpy(e->b_table + (size_t)i * stride, s->bt.blocks, s->bt.n_blocks * sizeof(int));
    }
    e->b_stride = stride;
    *n_seqs = S;
    *n_out = O;
    return T;
}

static int is_stop(const Engine *e, const Seq *s, int t)
{
    if (!s->ignore_eos)
        for (int i = 0; i < e->n_eos; i++)
            if (t == e->eos[i]) return 1;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (t == s->stop_ids[i]) return 1;
    return 0;
}

/* Before a step's figures go in (t_start: when it began). A step after an idle spell of a window
 * or more starts a new window: the last load's figures stay on show while idle, and go when a new
 * load comes. Else the filling bucket, once a window old, becomes the previous one (dropping the
 * one before) -- but only when it holds a profiled step, so that however slow the steps the
 * report has a breakdown. */
static void window_roll(Engine *e, double t_start)
{
    double w = e->o.diag_window_s;
    if (e->t_last_step <= 0 || t_start - e->t_last_step >= w) {
        memset(e->win, 0, sizeof e->win);
        e->win[0].t0 = t_start;
    } else if (t_start - e->win[0].t0 >= w && (e->win[0].ps.steps > 0 || e->o.profile_every <= 0)) {
        e->win[1] = e->win[0];
        memset(&e->win[0], 0, sizeof e->win[0]);
        e->win[0].t0 = t_start;
    }
}

/* The token of logits row o for s (an id the backend drew, ids; else the host sampler's, or a forced one)
 * as a generated token: an event, or the final one when it ends s. Returns it. */
static int emit_row(Engine *e, Seq *s, int o, int ids)
{
    int V = e->m->cfg.vocab;
    SampleResult r;
    int t;
    if (ids) {
        t = e->h_ids[o];
        r = (SampleResult){.token = t};
    } else if (s->n_generated < s->n_forced) {
        t = s->forced[s->n_generated];
        sampler_score(&s->sampler, e->logits + (size_t)o * V, t, &r);
    } else {
        t = sampler_sample(&s->sampler, e->logits + (size_t)o * V, &r);
    }
    sampler_accept(&s->sampler, t);
    s->n_generated++;
    e->stats.generation_tokens++;
    if (s->stop_requested) finish(e, s, FINISH_STOP, -1, NULL);
    else if (is_stop(e, s, t)) finish(e, s, FINISH_STOP, t, &r);
    else if (s->n_generated >= s->max_tokens) finish(e, s, FINISH_LENGTH, t, &r);
    else {
        if (s->n_tokens == s->cap) s->tokens = xrealloc(s->tokens, (s->cap *= 2) * sizeof(int));
        s->tokens[s->n_tokens++] = t;
        EngineEvent ev = {.token = t, .logprob = r.logprob, .n_top = r.n_top};
        memcpy(ev.top_ids, r.top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, r.top_logprobs, sizeof ev.top_logprobs);
        seq_push_event(s, &ev);
    }
    return t;
}

/* A chain verified: rows o..o+n of s, row j the model's next token after s's token and drafts 1..j.
 * Each row's token is taken as it would be without drafts (the same argmax, the same sampler with
 * the same penalties state, drawn from the same distribution), in order, while it equals the draft
 * that the next row assumed; the first that differs is taken and ends the chain, and after the
 * last draft the last row gives one more. Greedy, the output is the one without speculation token
 * for token. Sampled, this is speculative sampling's rejection rule for a draft that is a point mass
 * (the MTP layer's argmax): accept draft d with probability min(1, p(d) / q(d)) = p(d), the row's
 * own draw equalling d; on rejection draw from the residual max(0, p - q), normalised: p without
 * d, which is the row's draw given that it is not d. Every token so comes from the model's own
 * distribution. The cache positions of rejected drafts are left to be written again. */
static void spec_accept(Engine *e, Seq *s, int o, int n, int ids)
{
    int base = s->n_computed, acc = 0;
    for (int j = 0; j < n && !s->cancelled && !s->done; j++) {
        int t = emit_row(e, s, o + j, ids);
        if (s->done || j == n - 1 || t != s->draft[j]) break;
        acc++;
    }
    e->stats.spec_chains++;
    e->stats.spec_draft_tokens += n - 1;
    e->stats.spec_accepted_tokens += acc;
    s->n_draft = 0;
    if (s->done || s->cancelled) return;
    s->n_computed = base + 1 + acc;
    cache_full_blocks(e, s);
}

/* Drafts s can use next step: up to spec_k, none past its max_tokens (the last token needs no
 * draft) or its context, the chain's cache entries in blocks s holds or can take from the free
 * pool (no preemption for a draft). */
static int spec_room(Engine *e, Seq *s)
{
    int nd = e->o.spec_k;
    if (nd > s->max_tokens - s->n_generated - 1) nd = s->max_tokens - s->n_generated - 1;
    if (nd > e->o.max_model_len - 1 - s->n_computed) nd = e->o.max_model_len - 1 - s->n_computed;
    if (nd <= 1) return nd > 0 ? nd : 0;
    /* the chain writes the layer's entries at positions n_computed .. n_computed + nd - 2 */
    if (block_table_reserve(&s->bt, pool_of(e, s)->kv, s->n_computed + nd - 1) < 0) {
        int held = s->bt.n_blocks * e->o.block_size - s->n_computed + 1;
        if (nd > held) nd = held;
    }
    return nd > 0 ? nd : 0;
}

/* After a step (mutex held; it runs the MTP layer without it): the MTP layer's catch-up over every
 * position the step settled (mtp.c), each paired with the token after it; the last row of each
 * decoding sequence drafts the token after its next one, and a chain of single-token passes the
 * rest, up to spec_room's count. The drafts are verified in the next step. */
static void spec_draft(Engine *e, int S)
{
    int T = 0, Sm = 0, O = 0, bs = e->o.block_size, nb = e->max_blocks_per_seq, max_nd = 0;
    for (int i = 0; i < S; i++) {
        Seq *s = e->b_seqs[i];
        if (!s->running || s->done || s->cancelled) continue;
        int r0 = e->b_start[i], first = e->b_pos[r0], nv = s->n_computed - first;
        if (nv <= 0) continue;
        for (int k = 0; k < nv; k++) {
            e->m_rows[T + k] = r0 + k;
            e->m_tokens[T + k] = s->tokens[first + k + 1];
            e->m_pos[T + k] = first + k;
            e->m_seq[T + k] = Sm;
            e->m_slot[T + k] = e->b_slot[r0 + k];
        }
        e->m_start[Sm] = T;
        e->m_ntok[Sm] = nv;
        e->m_ctx[Sm] = first + nv;
        memcpy(e->m_table + (size_t)Sm * nb, e->b_table + (size_t)i * nb, (size_t)nb * sizeof(int));
        int nd = s->n_tokens == s->n_computed + 1 ? spec_room(e, s) : 0;
        s->n_draft = nd; /* written below, before the next step reads them */
        if (nd > 0) {
            e->m_out[O] = T + nv - 1;
            e->m_nd[O] = nd;
            e->m_outseq[O++] = s;
            max_nd = nd > max_nd ? nd : max_nd;
        }
        T += nv;
        Sm++;
    }
    if (T == 0) return;
    Batch b = {.n_tokens = T, .tokens = e->m_tokens, .pos = e->m_pos, .seq = e->m_seq, .slot = e->m_slot,
               .n_seqs = Sm, .seq_start = e->m_start, .seq_ntok = e->m_ntok, .ctx_len = e->m_ctx,
               .block_table = e->m_table, .bt_stride = nb, .n_out = O, .out_idx = e->m_out,
               .verify_len = 1 + e->o.spec_k};
    for (int i = 0; i < Sm; i++) b.max_ctx = e->m_ctx[i] > b.max_ctx ? e->m_ctx[i] : b.max_ctx;
    pthread_mutex_unlock(&e->mu); /* running sequences are this thread's; only their flags are shared */
    mtp_run(&e->mtp, &b, &e->kv, e->m_rows, 1, e->m_ids);
    for (int o = 0; o < O; o++) e->m_outseq[o]->draft[0] = e->o.spec_fixed_draft >= 0 ? e->o.spec_fixed_draft : e->m_ids[o];
    /* the chain: step j pairs each sequence still drafting with its draft j - 1 and the state of
       its row in the previous pass (hidden rows kept in m_rows) */
    for (int j = 1; j < max_nd; j++) {
        int n = 0;
        for (int o = 0; o < O; o++) {
            Seq *s = e->m_outseq[o];
            if (e->m_nd[o] <= j) continue;
            int p = s->n_computed + j - 1;
            e->m_rows[n] = o;
            e->m_tokens[n] = s->draft[j - 1];
            e->m_pos[n] = p;
            e->m_seq[n] = n;
            e->m_slot[n] = block_table_slot(&s->bt, bs, p);
            e->m_start[n] = n;
            e->m_ntok[n] = 1;
            e->m_ctx[n] = p + 1;
            e->m_out[n] = n;
            memcpy(e->m_table + (size_t)n * nb, s->bt.blocks, (size_t)s->bt.n_blocks * sizeof(int));
            e->m_outseq[n] = s;
            e->m_nd[n] = e->m_nd[o];
            n++;
        }
        O = n;
        b = (Batch){.n_tokens = n, .tokens = e->m_tokens, .pos = e->m_pos, .seq = e->m_seq, .slot = e->m_slot,
                    .n_seqs = n, .seq_start = e->m_start, .seq_ntok = e->m_ntok, .ctx_len = e->m_ctx,
                    .block_table = e->m_table, .bt_stride = nb, .n_out = n, .out_idx = e->m_out,
                    .verify_len = 1 + e->o.spec_k};
        for (int i = 0; i < n; i++) b.max_ctx = e->m_ctx[i] > b.max_ctx ? e->m_ctx[i] : b.max_ctx;
        mtp_run(&e->mtp, &b, &e->kv, e->m_rows, 0, e->m_ids);
        for (int o = 0; o < n; o++) e->m_outseq[o]->draft[j] = e->o.spec_fixed_draft >= 0 ? e->o.spec_fixed_draft : e->m_ids[o];
    }
    /* only running sequences drafted, and no other thread frees one of those: no step's finished
       sequence (which its owner may free meanwhile) is touched past here */
    pthread_mutex_lock(&e->mu);
}

/* One step. Called with the mutex held; the forward runs without it. */
static void step(Engine *e)
{
    double t_sched = clock_now();
    if (e->host_delay_us > 0) { /* MOESERVE_TEST_HOST_DELAY_US: a slow scheduler (diagnosis tests) */
        struct timespec ts = {e->host_delay_us / 1000000, (long)(e->host_delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    int S, O, T = build_batch(e, &S, &O);
    if (T == 0) return;
    double sched_ms = (clock_now() - t_sched) * 1e3;
    /* one step in profile_every, never the first (it pays for first touches, every rank's too) */
    int profiled = e->o.profile_every > 0 && (e->stats.steps + 1) % e->o.profile_every == 0;
    int V = e->m->cfg.vocab;
    Batch b = {.n_tokens = T, .tokens = e->b_tokens, .pos = e->b_pos, .seq = e->b_seq, .slot = e->b_slot,
               .n_seqs = S, .seq_start = e->b_start, .seq_ntok = e->b_ntok, .ctx_len = e->b_ctx,
               .block_table = e->b_table, .bt_stride = e->b_stride, .n_out = O, .out_idx = e->b_out,
               .seq_group = e->b_group, .verify_len = 1 + e->o.spec_k};
    for (int i = 0; i < S; i++) b.max_ctx = e->b_ctx[i] > b.max_ctx ? e->b_ctx[i] : b.max_ctx;
    /* every output row plain greedy: argmax on the backend, only the ids cross (no V floats a
     * row); else every row's token a function of its logits alone (no penalties, log-probabilities
     * or forced token): the backend's sample op draws them, only the ids cross. One row that
     * needs its logits on the host takes the whole batch there. */
    int argmax = O > 0, sample = O > 0;
    for (int o = 0; o < O; o++) {
        Seq *s = e->b_outseq[o];
        int free_choice = s->n_generated >= s->n_forced;
        argmax = argmax && free_choice && sampler_is_argmax(&s->sampler);
        sample = sample && free_choice && sampler_logits_only(&s->sampler);
    }
    sample = sample && !argmax;
    if (sample) /* each row's uniform now, from its generator, as sampler_sample would take it */
        for (int o = 0; o < O; o++) sampler_row(&e->b_outseq[o]->sampler, &e->h_rows[o]);
    /* the sequences of this batch are only touched by this thread: run without the lock */
    pthread_mutex_unlock(&e->mu);
    double t0 = clock_now();
    if (sample) be_to_device(e->be, e->d_rows, e->h_rows, (size_t)O * sizeof(SampleRow));
    if (profiled) profile_begin_step(&e->prof, e->be);
    long graphs_before = e->f.graph_replays[GRAPH_FORWARD];
    forward_run(&e->f, &b, &e->kv, O && !argmax && !sample ? e->logits : NULL);
    if (argmax) be_argmax(e->be, e->d_ids, e->f.logits, O, V);
    if (sample) be_sample(e->be, e->d_ids, e->f.logits, O, V, e->d_rows);
    if (argmax || sample) be_to_host(e->be, e->h_ids, e->d_ids, (size_t)O * sizeof(int));
    double wall_ms = (clock_now() - t0) * 1e3;
    if (profiled) profile_stop(&e->prof, e->be);
    pthread_mutex_lock(&e->mu);
    window_roll(e, t_sched);
    DiagBucket *wb = &e->win[0];
    if (profiled) profile_end_step(&e->prof, e->be, &wb->ps, sched_ms, T, e->p2p_gbps);
    wb->steps++;
    wb->tokens += T;
    wb->wall_ms += wall_ms + sched_ms;
    e->t_last_step = clock_now();
    e->stats.steps++;
    int verify = 0;
    for (int i = 0; i < S; i++) verify |= e->b_nd[i] > 0;
    graph_counts(e, graphs_before, verify);
    for (int i = 0; i < S; i++) {
        Seq *s = e->b_seqs[i];
        if (e->b_nd[i]) continue; /* a chain: its verified tokens are settled in spec_accept */
        s->n_computed += e->b_ntok[i];
        if (s->n_computed <= s->n_prompt) e->stats.prompt_tokens += e->b_ntok[i];
        cache_full_blocks(e, s);
    }
    int ids = argmax || sample;
    for (int o = 0, n; o < O; o += n) {
        Seq *s = e->b_outseq[o];
        n = e->b_outn[o];
        if (n > 1) {
            spec_accept(e, s, o, n, ids);
        } else if (!s->cancelled && !s->done) {
            emit_row(e, s, o, ids);
        }
        if (s->notify) s->notify(s->user, s->id);
    }
    if (e->o.spec_k > 0) {
        double t1 = clock_now();
        spec_draft(e, S);
        graph_counts(e, e->f.graph_replays[GRAPH_FORWARD], 0);
        wb->wall_ms += (clock_now() - t1) * 1e3;
    }
}

static void *engine_main(void *arg)
{
    Engine *e = arg;
    pthread_setname_np(pthread_self(), "engine"); /* its CPU time told apart from the HTTP threads' */
    if (e->be->ops->bind_thread) e->be->ops->bind_thread(e->be); /* this rank's GPU */
    pthread_mutex_lock(&e->mu);
    for (;;) {
        schedule_admin(e);
        if (e->n_running == 0 && e->n_waiting == 0) {
            if (e->stopping) break;
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        if (e->stopping && !e->drain) { /* abort everything */
            while (e->n_running) { Seq *s = e->running[0]; finish(e, s, FINISH_ABORT, -1, NULL); if (s->notify) s->notify(s->user, s->id); }
            while (e->n_waiting) {
                Seq *s = e->waiting[0];
                remove_ptr(e->waiting, &e->n_waiting, s);
                finish(e, s, FINISH_ABORT, -1, NULL);
                if (s->notify) s->notify(s->user, s->id);
            }
            continue;
        }
        /* a queued request has no events to wake its owner, which therefore cannot see that its
         * client left: it would hold its place in the queue, then be prefilled for nobody */
        if (e->n_waiting > 0 && clock_now() - e->t_ping >= ENGINE_WAIT_PING_S) {
            e->t_ping = clock_now();
            for (int i = 0; i < e->n_waiting; i++)
                if (e->waiting[i]->notify) e->waiting[i]->notify(e->waiting[i]->user, e->waiting[i]->id);
        }
        for (int k = 0; k < (e->o.decode_steps > 0 ? e->o.decode_steps : 1); k++) step(e);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

void engine_start(Engine *e)
{
    if (e->started) return;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) die("engine: pthread_create failed");
    e->started = 1;
}

void engine_stop(Engine *e, int drain)
{
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    e->drain = drain;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->started) pthread_join(e->thread, NULL);
    e->started = 0;
}

void engine_free(Engine *e)
{
    if (!e) return;
    if (e->started) engine_stop(e, 0);
    while (e->n_all) drop(e, e->all[0]);
    pools_free(e);
    if (e->o.spec_k > 0) spec_free(e);
    forward_free(&e->f);
    prof_free(&e->prof, e->be);
    kv_cache_free(&e->kv);
    be_free(e->be, e->d_ids);
    be_free(e->be, e->d_rows);
    void *p[] = {e->b_tokens, e->b_pos, e->b_seq, e->b_slot, e->b_start, e->b_ntok, e->b_ctx, e->b_group, e->b_out,
                 e->b_table, e->b_seqs, e->b_outseq, e->logits, e->running, e->waiting, e->all, e->h_ids, e->h_rows,
                 e->b_outn, e->b_nd};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

void engine_diagnose(Engine *e, const Ceilings *c, const Deployment *layout, Diagnosis *g, Deployment *d)
{
    *d = *layout;
    ProfSum s;
    engine_diag(e, &s, d, c->p2p_gbps);
    if (d->gpu) {
        Dist *dist = dist_get();
        diag_gpu_power(dist ? dist->rank % 64 : 0, &d->power_w, &d->power_limit_w, &d->sm_clock_mhz, &d->sm_clock_max_mhz);
    }
    diagnose(&s, c, d, g);
}

OptGroup engine_opt_group(EngineOptions *o)
{
    OPT_GROUP_RETURN("engine",
        {.names = ENGINE_MAX_RUNNING_NAMES, .type = OPT_INT, .dst = &o->max_running, .metavar = "N",
         .help = "sequences running at once (a batch)", .def = opt_def("%d", o->max_running), .lo = 1, .hi = 1 << 16},
        {.names = ENGINE_MAX_BATCH_TOKENS_NAMES, .type = OPT_INT, .dst = &o->max_batch_tokens, .metavar = "N",
         .help = "tokens of one forward step (decode tokens and prefill chunks)",
         .def = opt_def("%d", o->max_batch_tokens),
         .lo = 1, .hi = 1 << 24},
        {.names = "--chunked-prefill-size", .type = OPT_INT, .dst = &o->chunked_prefill, .metavar = "N",
         .help = "prompt tokens of one sequence per step (-1: up to --max-batch-tokens)", .def = "--max-batch-tokens",
         .lo = -1, .hi = 1 << 24},
        {.names = ENGINE_MAX_MODEL_LEN_NAMES, .type = OPT_INT, .dst = &o->max_model_len, .metavar = "N",
         .help = "prompt + output tokens of a request", .def = "the model's context length", .lo = 2, .hi = 1 << 24},
        {.names = "--kv-fraction", .type = OPT_DOUBLE, .dst = &o->kv_fraction, .metavar = "F",
         .help = "the KV cache's share of the memory free after the weights",
         .def = o->kv_fraction > 0 ? opt_def("%g", o->kv_fraction) : "0.9 of a GPU's, 0.5 of the host's available",
         .lo = 0.01, .hi = 1},
        {.names = "--gpu-memory-utilization|--mem-fraction-static", .type = OPT_DOUBLE, .dst = &o->gpu_fraction,
         .metavar = "F",
         .help = "on a GPU, --kv-fraction (the KV cache's share of the GPU memory free after the weights); "
         "the CPU has no GPU memory: noted and ignored", .def = "--kv-fraction", .lo = 0.01, .hi = 1},
        {.names = "--num-kv-blocks|--num-gpu-blocks-override", .type = OPT_INT, .dst = &o->n_blocks, .metavar = "N",
         .help = "KV blocks of 16 tokens in the pool, instead of --kv-fraction", .def = "from --kv-fraction", .lo = 1,
         .hi = 1 << 30},
        {.names = "--num-continuous-decode-steps", .type = OPT_INT, .dst = &o->decode_steps, .metavar = "N",
         .help = "decode steps per scheduling round", .def = opt_def("%d", o->decode_steps), .lo = 1, .hi = 1024},
        {.names = "--enable-prefix-caching", .type = OPT_FLAG, .dst = &o->prefix_caching, .negatable = 1,
         .help = "share the KV blocks of a common prompt prefix between requests",
         .def = o->prefix_caching ? "on" : "off"},
        {.names = "--no-prefix-caching|--disable-radix-cache", .type = OPT_FLAG, .dst = &o->prefix_caching,
         .inverse = 1,
         .help = "turn prefix caching off"},
        {.names = "--max-queue", .type = OPT_INT, .dst = &o->max_queue, .metavar = "N",
         .help = "waiting requests accepted before a 503", .def = opt_def("%d", o->max_queue), .lo = 0, .hi = 1 << 24},
        {.names = "--disable-cuda-graph|--enforce-eager|--no-graphs", .type = OPT_FLAG, .dst = &o->no_graphs,
         .help = "run decode steps eagerly, without CUDA graphs", .def = "graphs on a GPU"},
        {.names = "--enable-chunked-prefill", .type = OPT_NOTE,
         .help = "prefill is always chunked (--chunked-prefill-size)"},
        {.names = "--swap-space", .type = OPT_NOTE, .metavar = "GiB",
         .help = "a preempted sequence is recomputed, not swapped to host memory"},
        {.names = "--disable-custom-all-reduce", .type = OPT_NOTE, .help = "the all-reduce is NCCL's (or MPI's)"},
        {.names = "--cuda-graph-max-bs", .type = OPT_NOTE, .metavar = "N",
         .help = "a decode graph is captured for each batch size on its first use"});
}

OptGroup engine_diag_group(EngineOptions *o)
{
    OPT_GROUP_RETURN("diagnosis",
        {.names = "--profile-every", .type = OPT_INT, .dst = &o->profile_every, .metavar = "N",
         .help = "time one step in N op by op, for the diagnosis (0: never)", .def = opt_def("%d", o->profile_every),
         .lo = 0, .hi = 1 << 20},
        {.names = "--diagnosis-window", .type = OPT_DOUBLE, .dst = &o->diag_window_s, .metavar = "S",
         .help = "the diagnosis covers the steps of the last S to 2 S seconds (an idle server: its last load's)",
         .def = opt_def("%g", o->diag_window_s), .lo = 0.01, .hi = 86400});
}
