/* dist: one process per rank. The world is tp x pp ranks (plan.h); rank 0 owns
 * the command (the server, the scheduler, the output) and every other rank runs dist_worker,
 * which repeats rank 0's forward steps on its shard.
 *
 * How ranks start and talk:
 *   - under mpirun (Open MPI's OMPI_COMM_WORLD_SIZE in the environment): MPI finds the ranks;
 *     the CPU backend's collectives are MPI's, a GPU backend's are NCCL's (the NCCL id is
 *     broadcast through MPI), the step plans go through MPI_Bcast;
 *   - on one node without mpirun (GPU backends only): rank 0 forks the other ranks before any
 *     CUDA call, one per GPU, hands them the NCCL id and then each step's plan through pipes;
 *     the CPU backend needs mpirun (it says so).
 * A failing rank stops every rank with a message that names it; a collective that does not
 * complete within the timeout (MOESERVE_COMM_TIMEOUT, default 300 s) stops them too. Spawned ranks
 * keep NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0: multicast can take a shared host's
 * GPUs out of service).
 *
 * Collectives work on backend memory and are counted and timed as ops (backend.h OP_ALL_REDUCE
 * ...), so that diagnosis sees them; the test hook MOESERVE_TEST_COMM_DELAY_US adds a delay to each. */
#ifndef MOESERVE_DIST_H
#define MOESERVE_DIST_H

#include <stddef.h>

#include "../backend/backend.h"
#include "plan.h"

typedef struct Dist Dist;

/* Rank 0's messages to the workers (host memory, dist_bcast_host): model/forward.c. */
enum { DIST_MSG_INIT = 1, DIST_MSG_GRAPHS, DIST_MSG_RUN, DIST_MSG_FREE, DIST_MSG_STOP, DIST_MSG_KV_FIT };
typedef struct { int op; int v[11]; } DistMsg;

typedef struct {
    const char *name;   /* "mpi", "nccl" */
    /* tensor-parallel group of the caller (under --dp its attention group), in place: buf[n] = sum over the group */
    void (*all_reduce)(Dist *d, Backend *be, float *buf, size_t n);
    /* tensor-parallel group (under --dp its attention group): out[r * n .. (r+1) * n) = rank r's in[0..n) */
    void (*all_gather)(Dist *d, Backend *be, float *out, const float *in, size_t n);
    /* every tensor rank of the caller's stage (r its tp_rank), backend memory: send[r] bytes from send (in rank
     * order, packed) go to rank r, recv[r] bytes from rank r arrive in recv (in rank order, packed); the
     * sizes of each pair agree (the caller exchanged them) */
    void (*all_to_all)(Dist *d, Backend *be, const void *send, const size_t *send_bytes, void *recv,
                       const size_t *recv_bytes);
    /* point to point (global ranks); a send may complete later, at the latest in flush */
    void (*send)(Dist *d, Backend *be, const void *buf, size_t bytes, int peer);
    void (*recv)(Dist *d, Backend *be, void *buf, size_t bytes, int peer);
    void (*flush)(Dist *d, Backend *be);
    /* host memory, every rank, from rank 0; waits without a timeout (an idle server) */
    void (*bcast_host)(Dist *d, void *buf, size_t bytes);
    void (*abort)(Dist *d, int code);
    void (*finalize)(Dist *d);
} DistOps;

struct Dist {
    int world, rank;
    int tp, pp, ep, tp_rank, pp_rank;
    int dp, dp_rank;           /* --dp: attention groups per stage, this rank's (tp_rank / atp) */
    int atp, atp_rank;         /* ranks of an attention group (tp / dp; tp without --dp), this rank's place in it */
    int microbatches;          /* --pp-microbatches */
    int comm_delay_us;         /* MOESERVE_TEST_COMM_DELAY_US, read once at setup: a collective pays one compare */
    double timeout_s;          /* a collective not done after this stops every rank */
    const DistOps *ops;
    void *impl;
};

/* The process's Dist, NULL when it runs alone (the single-rank path has no collectives). */
Dist *dist_get(void);

/* Start the ranks of layout p for a command on `device` (cpu, cuda, cuda:N or NULL for the
 * default). Call before anything touches the GPU. One rank and no MOESERVE_COMM: nothing
 * happens (dist_get() stays NULL). MOESERVE_COMM=nccl with one rank gives a one-rank NCCL
 * communicator (the NCCL path on a single GPU, for tests). Returns the device this rank
 * opens (cuda:<local rank> for forked ranks). */
const char *dist_setup(ParOpts *p, const char *device);
/* Rank 0 at the end of a command: the workers leave dist_worker; then every rank finalizes. */
void dist_shutdown(void);
/* The shard hook for model_load_shard: plan_apply for this rank, after plan_check. */
void dist_shard(ModelConfig *c, void *par_opts);

/* Counted, timed collectives (no-ops when d is NULL or alone where that is exact). */
void dist_all_reduce(Dist *d, Backend *be, float *buf, size_t n);
void dist_all_gather(Dist *d, Backend *be, float *out, const float *in, size_t n);
/* The ops' all_to_all, counted as OP_ALL_TO_ALL with the bytes this rank sends to the others. */
void dist_all_to_all(Dist *d, Backend *be, const void *send, const size_t *send_bytes, void *recv,
                     const size_t *recv_bytes);
/* tp_rank, pp_rank, dp_rank, atp_rank of d->rank in d's layout (the implementations call it). */
void dist_place(Dist *d);
void dist_send(Dist *d, Backend *be, const void *buf, size_t bytes, int peer);
void dist_recv(Dist *d, Backend *be, void *buf, size_t bytes, int peer);
void dist_flush(Dist *d, Backend *be);
void dist_bcast_host(Dist *d, void *buf, size_t bytes);

/* A test hook at the start of every step: MOESERVE_TEST_FAULT=exit:R makes rank R fail there,
 * hang:R makes it stop answering (the others must then stop, not hang). */
void dist_fault_point(Dist *d);

/* Global rank of (pp stage, tp rank). */
static inline int dist_rank_of(const Dist *d, int stage, int tp_rank) { return stage * d->tp + tp_rank; }

/* The collectives of each implementation (comm_mpi.c, comm_nccl.c); the init functions fill d. */
int dist_under_mpirun(void);
void comm_mpi_init(Dist *d, int gpu);           /* gpu: only bootstrap and host messages via MPI */
void *comm_mpi_world(void);                     /* the MPI_Comm of all ranks (for comm_nccl) */
void comm_nccl_init(Dist *d, const void *unique_id, int device);
int comm_nccl_unique_id(void *out, size_t n);   /* rank 0: a new ncclUniqueId; -1 without NCCL */
void comm_mpi_bcast_host(Dist *d, void *buf, size_t bytes);
/* --device sim:GPU (comm_sim.c): the layout simulated in this one process, rank 0's shard timed,
 * collectives moving nothing and taking their modelled time; comm_sim_config learns the whole
 * model's stages (dist_shard calls it) to replay a pipeline's later stages. */
void comm_sim_init(Dist *d);
void comm_sim_config(Dist *d, const ModelConfig *c, const ParOpts *p);
int dist_simulated(const Dist *d);


#endif
