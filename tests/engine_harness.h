/* engine_harness: what the engine tests share (tests/unit/test_engine.c, test_spec.c): a waker
 * the engine's events signal, and collecting every request's tokens until all have finished. */
#ifndef MOESERVE_ENGINE_HARNESS_H
#define MOESERVE_ENGINE_HARNESS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"

#define MAXGEN 64

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int wakes;
} Waker;

/* engine_submit's callback: user is a Waker */
void waker_on_event(void *user, uint64_t id);

typedef struct {
    uint64_t id;
    int toks[MAXGEN + 1], n;
    EngineEvent last;
    int done;
} Out;

/* Poll every request until all have finished, collecting tokens; -1 when none has moved for
 * 120 s (a stall). Not a total deadline: on 2 cores shared with other work, OpenMP's barriers wait
 * for a thread the scheduler has put aside, and a batch that takes seconds alone took minutes. */
int engine_collect(Engine *e, Waker *w, Out *o, int n);

#endif
