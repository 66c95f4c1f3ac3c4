/* runner: one sequence through the forward pass and the paged KV cache, for the commands that
 * need no scheduler (logits, generate, perplexity): tokens are appended a chunk at a time and
 * the logits of every appended position, or of the last one, come back on the host. The
 * server's engine (#6) batches many sequences with the same Forward and KVCache. A runner of
 * several sequences (runner_init_seqs, logits --seqs) feeds the same tokens to each, every one
 * in its own cache blocks, in one batch: under --dp sequence i runs on attention group i mod dp. */
#ifndef MOESERVE_RUNNER_H
#define MOESERVE_RUNNER_H

#include "../model/forward.h"
#include "../model/kv_cache.h"
#include "../model/mtp.h"

typedef struct {
    const Model *m;            /* borrowed: the model in the backend's memory */
    Backend *be;               /* borrowed */
    KVCache kv;
    BlockTable bt;             /* sequence 0's */
    BlockTable *bts;           /* [n_seqs] every sequence's (bts[0] is bt) */
    int n_seqs;
    int *group;                /* [n_seqs] the attention group of each (--dp) */
    Forward f;
    int chunk;                 /* tokens per forward */
    int max_ctx;               /* positions the cache holds */
    int n_ctx;                 /* positions filled so far */
    int *pos, *seq, *slot, *out_idx, *tok; /* [n_seqs * chunk] batch arrays */
    int *start, *ntok, *ctx, *table;       /* [n_seqs] ([n_seqs, blocks] the table) */
    float *rows;               /* [n_seqs * chunk, V] the logits of a chunk (several sequences) */
    /* speculative decoding (runner_enable_mtp): the MTP layer, and the last chunk fed (its tokens and
       first position), whose hidden state runner_draft pairs with the tokens after them */
    Mtp mtp;
    int *last, n_last, last_base, *mtok, *mpos;
    int *mrow;                 /* [chunk] 0, 1, ...: the hidden rows of a pass */
    int verify_len;            /* 1 + drafts at most (Batch.verify_len) */
} Runner;

void runner_init(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size);
/* n_seqs sequences (runner_feed: all != 0 only; logits [n_seqs, n, V]) */
void runner_init_seqs(Runner *r, const Model *m, Backend *be, int max_ctx, int chunk, int block_size, int n_seqs);
void runner_free(Runner *r);
/* Append ids[0..n) (n_ctx + n <= max_ctx); logits: all != 0 -> [n, V] for every appended
 * position, else [1, V] for the last one (NULL: none). Token ids must be in [0, vocab). */
void runner_feed(Runner *r, const int *ids, int n, int all, float *logits);
/* Run decoding steps (a token, or a token and its drafts) and the MTP layer's passes after them
 * as captured graphs (CUDA; forward_enable_graphs); prompt chunks stay eager. */
void runner_enable_graphs(Runner *r);
/* Speculative decoding with the model's MTP layer (loaded: model_load_mtp; draft_vocab: mtp_init's),
 * up to max_drafts drafts a step: from now on every chunk fed but the last of a runner_feed also
 * runs the layer's catch-up over its positions (mtp.c). */
void runner_enable_mtp(Runner *r, int draft_vocab, int max_drafts);
/* Right after a runner_feed: the layer's catch-up over the first n_keep positions of the last chunk
 * fed, paired with the tokens after them (the chunk's own, then `next`, the token that follows its
 * position n_keep - 1), and nd drafts of the tokens after `next` into drafts. Positions up to
 * n_ctx + nd - 2 (n_ctx after runner_rewind to the kept positions) must fit the cache. */
void runner_draft(Runner *r, int n_keep, int next, int nd, int *drafts);
/* Keep the first n_ctx positions (rejected drafts' are written again when fed). */
void runner_rewind(Runner *r, int n_ctx);
/* Forget the sequence (the cache is reused from position 0). */
void runner_reset(Runner *r);

#endif
