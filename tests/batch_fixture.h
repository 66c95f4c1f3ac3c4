/* batch_fixture: random paged batches for the attention op tests (tests/unit and tests/cuda). */
#ifndef MOESERVE_TEST_BATCH_FIXTURE_H
#define MOESERVE_TEST_BATCH_FIXTURE_H

#include "base/util.h"
#include "backend/backend.h"

/* A host batch of S sequences: sequence s has ctx[s] positions cached after this step and its
 * last ntok[s] tokens in the batch; its blocks of bs tokens are shuffled over a pool of exactly
 * the blocks needed, whose slot count goes to *n_slots. */
Batch test_batch_make(Rng *r, int S, const int *ctx, const int *ntok, int bs, int *n_slots);
void test_batch_free(Batch *b);

/* perm[0..n) = 0..n-1 in a random order (Fisher-Yates) */
void test_shuffle(Rng *r, int *perm, int n);

/* The MLA shape of a test: heads, latent rank, nope / rope / value dims, indexer top-k; the
 * softmax scale 1 / sqrt(Dn + Dr). */
ModelConfig test_mla_cfg(int H, int C, int Dn, int Dr, int Dv, int Ki);

#endif
