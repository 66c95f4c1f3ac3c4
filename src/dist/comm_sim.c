/* comm_sim: the layouts of --device sim:GPU in one process (dist.h). There are no workers: rank 0
 * runs its own shard, which under tensor and expert parallelism is every rank's work (the ranks
 * of a group do the same ops on equal slices, then meet in a collective), and each collective
 * moves nothing but takes its modelled time on rank 0's clock.
 *
 * A pipeline is not symmetric: rank 0 holds the first stage only. The later stages are replayed
 * from it: each micro-batch's compute on stage 0 (its modelled time, from the first op after the
 * previous micro-batch's send to this send) is what stage s takes for it, scaled by the stages'
 * layer counts; stage s starts a micro-batch when both it is free and the micro-batch has come
 * over the link from stage s - 1. The last stage adds the final lm_head GEMM; rank 0's receive of
 * the logits waits until the last stage has sent them. So a step's time shows the fill and drain
 * of the pipeline (the bubble) and its steady state, as the stages' real schedule would. */
#include <string.h>

#include "../backend/sim/sim.h"
#include "../base/util.h"
#include "dist.h"

typedef struct {
    int layers[PLAN_MAX_STAGES];   /* per stage */
    double free_at[PLAN_MAX_STAGES]; /* when stage s is done with what it was given */
    double last_done;              /* the last stage's end of the latest micro-batch */
    int hidden, vocab, vocab_local;
} SimComm;

static SimComm g_sc;

static double link_seconds(Backend *be, OpId op, double bytes, int ranks)
{
    const SimTimer *t = sim_timer(be);
    return t->comm_seconds(t->ctx, op, bytes, ranks);
}

static void sim_all_reduce(Dist *d, Backend *be, float *buf, size_t n)
{
    (void)buf, (void)n;
    sim_comm_ranks(be, d->tp);
}

static void sim_all_gather(Dist *d, Backend *be, float *out, const float *in, size_t n)
{
    (void)out, (void)in, (void)n;
    sim_comm_ranks(be, d->tp);
}

/* stage 0 sends a micro-batch's hidden state on: replay it through the later stages */
static void sim_send(Dist *d, Backend *be, const void *buf, size_t bytes, int peer)
{
    (void)buf, (void)peer;
    SimComm *sc = &g_sc;
    sim_comm_ranks(be, 2);
    double busy = sim_take_busy(be);
    if (busy <= 0) return; /* a second message of the same micro-batch (the indexer's selection) */
    double arrive = sim_clock(be) + link_seconds(be, OP_PP_SEND, (double)bytes, 2);
    for (int s = 1; s < d->pp; s++) {
        double dur = busy * (sc->layers[0] > 0 ? (double)sc->layers[s] / sc->layers[0] : 1.0);
        double start = sc->free_at[s] > arrive ? sc->free_at[s] : arrive;
        sc->free_at[s] = start + dur;
        arrive = sc->free_at[s] + link_seconds(be, OP_PP_SEND, (double)bytes, 2);
    }
    sc->last_done = sc->free_at[d->pp - 1];
}

/* rank 0 receives the logits from the last stage: they leave it after its lm_head */
static void sim_recv(Dist *d, Backend *be, void *buf, size_t bytes, int peer)
{
    (void)d, (void)buf, (void)peer;
    SimComm *sc = &g_sc;
    sim_comm_ranks(be, 2);
    double rows = sc->vocab > 0 ? (double)bytes / (4.0 * sc->vocab) : 0;
    if (rows > 0) { /* the lm_head GEMM of the last stage (BF16), over its vocabulary slice */
        const SimTimer *t = sim_timer(be);
        double D = sc->hidden, V = sc->vocab_local;
        double lm = t->op_seconds(t->ctx, OP_GEMM_LM_HEAD, 2.0 * rows * D * V, 2.0 * D * V + 4.0 * rows * (D + V),
                                  (int)rows, QF_BF16);
        sim_wait_until(be, sc->last_done + lm);
    }
    sim_take_busy(be);
}

static const DistOps sim_comm_ops = {
    .name = "sim",
    .all_reduce = sim_all_reduce,
    .all_gather = sim_all_gather,
    .send = sim_send,
    .recv = sim_recv,
};

void comm_sim_init(Dist *d)
{
    d->ops = &sim_comm_ops;
    d->rank = d->tp_rank = d->pp_rank = 0;
    memset(&g_sc, 0, sizeof g_sc);
}

int dist_simulated(const Dist *d) { return d && d->ops == &sim_comm_ops; }

void comm_sim_config(Dist *d, const ModelConfig *c, const ParOpts *p)
{
    SimComm *sc = &g_sc;
    for (int s = 0; s < d->pp && s < PLAN_MAX_STAGES; s++) {
        int b, e;
        plan_stage_layers(c, p, s, &b, &e);
        sc->layers[s] = e - b;
    }
    sc->hidden = c->hidden;
    sc->vocab = c->vocab;
    sc->vocab_local = c->vocab % d->tp == 0 ? c->vocab / d->tp : c->vocab;
}
