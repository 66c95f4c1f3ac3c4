/* engine: the step loop (docs/ARCHITECTURE.md). Requests come in from any thread (engine_submit);
 * one engine thread owns the sequences, the paged KV cache and the Forward: each step it builds
 * one Batch (continuous batching: the decode tokens of running sequences plus chunked prefill of
 * new ones, bounded by max_batch_tokens and max_running), runs the forward, samples, and hands
 * each request its new tokens through a per-request event queue, waking its owner through the
 * notify callback. When KV blocks run out the youngest running sequence is preempted (its blocks
 * freed, recomputed later): never dropped. Full KV blocks are shared between requests with the
 * same prompt prefix (a hash per block, reference counts, LRU eviction of unreferenced cached
 * blocks). Text-level concerns (detokenization, stop strings, JSON) belong to the caller. */
#ifndef MOESERVE_ENGINE_H
#define MOESERVE_ENGINE_H

#include <stdint.h>

#include "../backend/backend.h"
#include "../base/opt.h"
#include "../diag/verdict.h"
#include "../model/model.h"
#include "sampler.h"

typedef struct {
    int max_running;           /* --max-running-requests: sequences in a batch at once */
    int max_batch_tokens;      /* --max-batch-tokens: tokens per forward step */
    int chunked_prefill;       /* --chunked-prefill-size: prompt tokens of one sequence per step */
    int max_model_len;         /* --max-model-len: prompt + output limit (<= the model's context); 0: the
                                  model's context (config.json), shortened with a warning to what the
                                  KV pool holds when one request of it does not fit */
    int block_size;            /* KV block size in tokens (16) */
    int n_blocks;              /* KV blocks in the pool (0: max_running requests of max_model_len, at
                                  most what kv_fraction of the free memory holds) */
    double kv_fraction;        /* --kv-fraction of the memory left after weights and activations (0:
                                  0.9 of a GPU's, 0.5 of the host's available memory) */
    double gpu_fraction;       /* --gpu-memory-utilization: kv_fraction on a GPU backend (0: not given) */
    int decode_steps;          /* --num-continuous-decode-steps: decode steps per scheduling round */
    int prefix_caching;        /* 1: share full prompt blocks between requests */
    int max_queue;             /* waiting requests accepted before engine_submit refuses (busy) */
    int no_graphs;             /* --disable-cuda-graph: decode steps eager (graphs: GPU backends) */
    int profile_every;         /* --profile-every N: one step in N timed op by op for diagnosis (0: never) */
    int spec_k;                /* speculative decoding: drafts per step with the model's MTP layer (model_load_mtp;
                                  model/mtp.h), each verified in the next step's forward; 0: off */
    int spec_vocab;            /* drafts among the first spec_vocab token ids (mtp_init; 0: all) */
    int spec_fixed_draft;      /* tests (in-process): every draft is this token id instead of the MTP layer's, so
                                  that a test chooses how often drafts are accepted; -1: the layer's */
    double diag_window_s;      /* --diagnosis-window S: the diagnosis covers the steps of the last S to 2 S
                                  seconds (two buckets of S seconds), not the whole run */
} EngineOptions;

void engine_options_default(EngineOptions *o);

typedef enum {
    FINISH_NONE = 0,
    FINISH_STOP,               /* an eos or stop token id, or engine_finish (a stop string) */
    FINISH_LENGTH,             /* max_tokens, or the context is full */
    FINISH_ABORT,              /* cancelled (client gone, shutdown) */
} FinishReason;

typedef struct {
    const int *prompt;         /* token ids, copied by engine_submit */
    int n_prompt;
    SamplingParams sampling;   /* including seed and the number of logprobs */
    int max_tokens;            /* new tokens at most (>= 1) */
    int ignore_eos;
    const int *stop_ids;       /* extra stop token ids (copied), besides the model's eos */
    int n_stop_ids;
    const int *forced;         /* a test hook (serve --script-output): the first n_forced generated
                                  tokens are these (copied) instead of sampled ones; the forward,
                                  stops, max_tokens and usage stay real. NULL: none */
    int n_forced;
} RequestParams;

/* One sampled token, or the end of the request. */
typedef struct {
    int token;                 /* -1 on the final event when it carries no token */
    float logprob;
    int n_top;
    int top_ids[SAMPLER_MAX_LOGPROBS];
    float top_logprobs[SAMPLER_MAX_LOGPROBS];
    FinishReason finish;       /* != FINISH_NONE on the request's last event */
    int prompt_tokens;         /* usage, valid on the last event */
    int completion_tokens;
    int cached_tokens;         /* prompt tokens served from the prefix cache */
} EngineEvent;

/* Called on the engine thread when new events wait for request `id`, and every half second
 * while it waits in the queue, so that its owner can cancel it if its client has gone (keep it
 * short: resume a suspended connection, signal a condition variable). */
typedef void (*EngineNotify)(void *user, uint64_t id);

typedef struct Engine Engine;

/* Engine over a model in the backend's memory (borrowed; the caller keeps model and backend
 * alive until engine_free). eos ids end a request unless ignore_eos. Sizes the KV pool and stops
 * with a clear error (the numbers) when the model and one request do not fit. */
Engine *engine_create(const Model *m, Backend *be, const EngineOptions *o, const int *eos, int n_eos);
void engine_start(Engine *e);   /* the engine thread */
/* The context the engine serves: prompt + output tokens of one request at most. */
int engine_max_model_len(const Engine *e);
/* Stop: with drain, wait until every accepted request has finished; else abort them. */
void engine_stop(Engine *e, int drain);
void engine_free(Engine *e);

/* Returns the request id (> 0), or 0 with err set: prompt empty or longer than max_model_len,
 * a token outside the vocabulary, sampling out of range, the queue full. Never blocks on the
 * model. */
uint64_t engine_submit(Engine *e, const RequestParams *p, EngineNotify notify, void *user, char *err, size_t errlen);
/* n samples of one request (the `n` of the OpenAI API): ids first .. first + n - 1, the first
 * returned (0 with err set: as engine_submit). Sample i draws from seed + i (a seed from the clock
 * when p gives none); the others wait until the first has computed the prompt, then share its
 * KV blocks through the prefix cache (with prefix caching off each computes its own). */
uint64_t engine_submit_n(Engine *e, const RequestParams *p, int n, EngineNotify notify, void *user, char *err, size_t errlen);
/* What engine_submit checks of p before it queues it: 0, or -1 with err saying what is wrong
 * with the request (engine_submit's other refusals, a full queue or a stop, are the server's). */
int engine_check(const Engine *e, const RequestParams *p, char *err, size_t errlen);
/* Move up to max pending events of id into ev (non-blocking); returns how many. After the event
 * with finish != FINISH_NONE the request is gone and its id unknown. */
int engine_poll(Engine *e, uint64_t id, EngineEvent *ev, int max);
/* The client is gone: stop generating, free the sequence; no more events are delivered. */
void engine_cancel(Engine *e, uint64_t id);
/* The caller saw a stop string: end the request with FINISH_STOP (a final event follows). */
void engine_finish(Engine *e, uint64_t id);

#define ENGINE_MAX_DP 64

/* One attention group's figures (--dp). */
typedef struct {
    uint64_t placed;           /* requests placed on it since the start */
    int running, waiting;      /* its sequences running; preempted ones waiting to resume on it */
    int kv_blocks_total, kv_blocks_used;
} EngineGroupStats;

typedef struct {
    int running, waiting;      /* sequences */
    int peak_running;          /* the most sequences running at once since the start */
    int kv_blocks_total, kv_blocks_used;
    uint64_t prefix_queries, prefix_hits; /* prompt tokens looked up / found in the cache */
    uint64_t preemptions;
    uint64_t steps, prompt_tokens, generation_tokens;
    int dp;                    /* attention groups (1 without --dp) */
    EngineGroupStats group[ENGINE_MAX_DP];
    /* speculative decoding: chains verified, drafts in them, drafts accepted (tokens generated per
       verified chain: 1 + accepted / chains) */
    uint64_t spec_chains, spec_draft_tokens, spec_accepted_tokens;
    /* steps run from captured graphs (forward.h: CUDA, or MOESERVE_TEST_GRAPH_PAD's padded steps),
       those of them that verified drafts, and the MTP layer's passes run so */
    uint64_t graph_steps, graph_verify_steps, graph_mtp_passes;
} EngineStats;

void engine_stats(Engine *e, EngineStats *s);
/* The diagnosis inputs (diag/verdict.h): the profile sums and the engine's side of the
 * deployment (the caller adds the layout, the power). p2p_gbps: pipeline link bandwidth. */
void engine_diag(Engine *e, ProfSum *s, Deployment *d, double p2p_gbps);
/* The engine's diagnosis against the ceilings c: layout gives tp, pp, ep and micro-batches, the
 * rest of *d is filled from the engine (and the GPU's power and clocks through NVML). */
void engine_diagnose(Engine *e, const Ceilings *c, const Deployment *layout, Diagnosis *g, Deployment *d);

/* The engine's options on a command line (scheduling, the KV pool, graphs) into o, and the
 * diagnosis options (--profile-every; test hooks). Their defaults, shown by help, are o's. */
OptGroup engine_opt_group(EngineOptions *o);
OptGroup engine_diag_group(EngineOptions *o);
/* the spellings of the options `moeserve info` shares with the engine */
#define ENGINE_MAX_RUNNING_NAMES "--max-running-requests|--max-num-seqs"
#define ENGINE_MAX_BATCH_TOKENS_NAMES "--max-batch-tokens|--max-num-batched-tokens|--max-prefill-tokens"
#define ENGINE_MAX_MODEL_LEN_NAMES "--max-model-len|--context-length"

#endif
