/* engine_harness: the engine tests' waker and token collection (engine_harness.h). */
#include "engine_harness.h"

#include <time.h>

#include "base/util.h"

void waker_on_event(void *user, uint64_t id)
{
    (void)id;
    Waker *w = user;
    pthread_mutex_lock(&w->mu);
    w->wakes++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int engine_collect(Engine *e, Waker *w, Out *o, int n)
{
    double t0 = clock_now();
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (o[i].done || !o[i].id) continue;
            EngineEvent ev[16];
            int k;
            while ((k = engine_poll(e, o[i].id, ev, 16)) > 0) {
                t0 = clock_now();
                for (int j = 0; j < k; j++) {
                    if (ev[j].token >= 0 && o[i].n <= MAXGEN) o[i].toks[o[i].n++] = ev[j].token;
                    if (ev[j].finish) { o[i].done = 1; o[i].last = ev[j]; }
                }
            }
            left += !o[i].done;
        }
        if (!left) return 0;
        if (clock_now() - t0 > 120) return -1;
        pthread_mutex_lock(&w->mu);
        int before = w->wakes;
        while (w->wakes == before) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            if (pthread_cond_timedwait(&w->cv, &w->mu, &ts)) break;
        }
        pthread_mutex_unlock(&w->mu);
    }
}
