/* mtp: the checkpoint's multi-token-prediction (nextn) layer as the drafter of speculative
 * decoding (mtp.c says what it computes and why). It runs through the main model's Forward (its
 * activation buffers and batch upload) and the same paged KV cache, in a cache layer of its own. */
#ifndef MOESERVE_MTP_H
#define MOESERVE_MTP_H

#include "forward.h"

#define MTP_MAX_DRAFTS 16      /* drafts per step at most (--speculative-num-steps) */

typedef struct {
    Forward *f;                /* borrowed: the main model's, loaded with model_load_mtp */
    float *hin;                /* [max_tokens, D] the hidden state paired with each token (backend) */
    float *cat;                /* [max_tokens, 2 D] enorm(embedding) | hnorm(hidden) (backend) */
    int *rows;                 /* [max_tokens] the hidden rows a pass gathers (backend) */
    int *hrows;                /* [max_tokens] their host copy, padded for a graph */
    int *ids;                  /* [max_out] greedy drafts (backend) */
    int vocab;                 /* drafts are among token ids [0, vocab): the head's first rows only (mtp_init: all) */
} Mtp;

/* draft_vocab: drafts only among the first draft_vocab token ids (0 or >= V: all). A byte-pair
 * vocabulary numbers its tokens in merge order, which is roughly frequency order, so its first ids
 * cover most of running text: the drafter's head pass, the largest part of a draft's cost on a
 * model with a small body, reads only those rows (the idea of FR-Spec's frequency-ranked draft
 * vocabulary, with the ids' own order for the ranking). A token outside it is never drafted. */
void mtp_init(Mtp *x, Forward *f, int draft_vocab);
void mtp_free(Mtp *x);
/* The layer over batch b: token i (the token that follows its pair's position) with the hidden
 * state of row rows[i] (host ints) — from_main: of the main model's last forward_run (f->h, its
 * final norm applied), the catch-up after a step; else of x->hin, the previous pass of a chain —
 * at b->pos[i], its cache entry written at b->slot[i]. For the rows b->out_idx: the greedy draft
 * of the token after next into ids (host, b->n_out of them), and the layer's output state into
 * x->hin rows 0..n_out, the hidden state of the next pass of a chain. The main model's logits
 * and hidden state in f are overwritten. Runs as a graph where forward_graph_fits says so. */
void mtp_run(Mtp *x, const Batch *b, KVCache *kv, const int *rows, int from_main, int *ids);

#endif
