/* comm_mpi: the collectives of the CPU backend through MPI (Open MPI), and MPI as the bootstrap
 * and the host message channel of GPU ranks started by mpirun (dist.h). Blocking calls are
 * written as non-blocking ones polled against a deadline, so that a peer that never arrives
 * stops every rank with a message instead of hanging. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/util.h"
#include "dist.h"

typedef struct {
    MPI_Comm world, tp;        /* all ranks; this rank's tensor-parallel group (its stage; under --dp its
                                  attention group) */
    MPI_Comm stage;            /* the tensor ranks of this rank's stage (the all-to-all's) */
    int *a2a;                  /* [4 tp] the all-to-all's counts and displacements */
    MPI_Request *sends;        /* outstanding point-to-point sends */
    int n_sends, cap_sends;
} Mpi;

int dist_under_mpirun(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL; }

static void mpi_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    fatal("MPI %s failed: %s", what, msg);
}

/* Wait for r; after timeout_s (> 0) stop every rank. Polls with short sleeps once the first
 * millisecond has passed, so that an idle rank does not burn a core. */
static void mpi_wait(Dist *d, MPI_Request *r, const char *what, double timeout_s)
{
    double t0 = clock_now();
    long spins = 0;
    for (;;) {
        int done = 0;
        mpi_check(MPI_Test(r, &done, MPI_STATUS_IGNORE), what);
        if (done) return;
        double el = clock_now() - t0;
        if (timeout_s > 0 && el > timeout_s)
            fatal("%s did not complete in %.0f s (a rank is stuck or gone); stopping every rank "
                  "(MOESERVE_COMM_TIMEOUT)", what, timeout_s);
        if (++spins > 1000 && el > 1e-3) {
            struct timespec ts = {0, el < 0.1 ? 20000 : 200000};
            nanosleep(&ts, NULL);
        }
    }
    (void)d;
}

static void mpi_all_reduce(Dist *d, Backend *be, float *buf, size_t n)
{
    (void)be;
    Mpi *m = d->impl;
    MPI_Request r;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, m->tp, &r), "all-reduce");
    mpi_wait(d, &r, "all-reduce", d->timeout_s);
}

static void mpi_all_gather(Dist *d, Backend *be, float *out, const float *in, size_t n)
{
    (void)be;
    Mpi *m = d->impl;
    MPI_Request r;
    mpi_check(MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, m->tp, &r), "all-gather");
    mpi_wait(d, &r, "all-gather", d->timeout_s);
}

static void mpi_all_to_all(Dist *d, Backend *be, const void *send, const size_t *send_bytes, void *recv,
                           const size_t *recv_bytes)
{
    (void)be;
    Mpi *m = d->impl;
    int n = d->tp, *sc = m->a2a, *sd = sc + n, *rc = sd + n, *rd = rc + n;
    size_t so = 0, ro = 0;
    for (int r = 0; r < n; r++) {
        CHECK(so + send_bytes[r] < (size_t)1 << 31 && ro + recv_bytes[r] < (size_t)1 << 31,
              "MPI all-to-all of more than 2 GiB");
        sc[r] = (int)send_bytes[r];
        sd[r] = (int)so;
        rc[r] = (int)recv_bytes[r];
        rd[r] = (int)ro;
        so += send_bytes[r];
        ro += recv_bytes[r];
    }
    MPI_Request q;
    mpi_check(MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, m->stage, &q), "all-to-all");
    mpi_wait(d, &q, "all-to-all", d->timeout_s);
}

static void mpi_send(Dist *d, Backend *be, const void *buf, size_t bytes, int peer)
{
    (void)be;
    Mpi *m = d->impl;
    if (m->n_sends == m->cap_sends) {
        m->cap_sends = m->cap_sends ? 2 * m->cap_sends : 16;
        m->sends = xrealloc(m->sends, m->cap_sends * sizeof(MPI_Request));
    }
    CHECK(bytes < (size_t)1 << 31, "MPI send of %zu bytes", bytes);
    mpi_check(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, 7, m->world, &m->sends[m->n_sends++]), "send");
}

static void mpi_recv(Dist *d, Backend *be, void *buf, size_t bytes, int peer)
{
    (void)be;
    Mpi *m = d->impl;
    MPI_Request r;
    CHECK(bytes < (size_t)1 << 31, "MPI recv of %zu bytes", bytes);
    mpi_check(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, 7, m->world, &r), "receive");
    char what[64];
    snprintf(what, sizeof what, "a receive from rank %d", peer);
    mpi_wait(d, &r, what, d->timeout_s);
}

static void mpi_flush(Dist *d, Backend *be)
{
    (void)be;
    Mpi *m = d->impl;
    for (int i = 0; i < m->n_sends; i++) mpi_wait(d, &m->sends[i], "a send", d->timeout_s);
    m->n_sends = 0;
}

static Mpi *g_mpi;

void comm_mpi_bcast_host(Dist *d, void *buf, size_t bytes)
{
    Mpi *m = g_mpi; /* also under NCCL, whose impl replaced MPI's in d */
    MPI_Request r;
    CHECK(bytes < (size_t)1 << 31, "MPI broadcast of %zu bytes", bytes);
    mpi_check(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, m->world, &r), "broadcast");
    mpi_wait(d, &r, "a broadcast from rank 0", 0); /* workers wait for the next step as long as it takes */
}

static void mpi_abort(Dist *d, int code)
{
    Mpi *m = d->impl;
    MPI_Abort(m ? m->world : MPI_COMM_WORLD, code);
}

void comm_mpi_finalize_only(void);

static void mpi_finalize(Dist *d)
{
    comm_mpi_finalize_only();
    d->impl = NULL;
}

static const DistOps mpi_ops = {
    .name = "mpi", .all_reduce = mpi_all_reduce, .all_gather = mpi_all_gather, .all_to_all = mpi_all_to_all,
    .send = mpi_send,
    .recv = mpi_recv, .flush = mpi_flush, .bcast_host = comm_mpi_bcast_host, .abort = mpi_abort,
    .finalize = mpi_finalize,
};

void comm_mpi_finalize_only(void)
{
    if (!g_mpi) return;
    MPI_Comm_free(&g_mpi->tp);
    MPI_Comm_free(&g_mpi->stage);
    free(g_mpi->sends);
    free(g_mpi->a2a);
    free(g_mpi);
    g_mpi = NULL;
    MPI_Finalize();
}

void *comm_mpi_world(void) { return g_mpi ? (void *)g_mpi->world : NULL; }

void comm_mpi_init(Dist *d, int gpu)
{
    int provided = 0, argc = 0;
    char **argv = NULL;
    mpi_check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "init");
    if (provided < MPI_THREAD_SERIALIZED)
        fatal("MPI provides thread level %d; moeserve calls it from its engine thread and needs MPI_THREAD_SERIALIZED",
              provided);
    Mpi *m = xcalloc(1, sizeof *m);
    m->world = MPI_COMM_WORLD;
    MPI_Comm_size(m->world, &d->world);
    MPI_Comm_rank(m->world, &d->rank);
    g_mpi = m;
    d->impl = m;
    d->ops = &mpi_ops;
    if (d->world != d->tp * d->pp) {
        if (d->rank == 0)
            log_error("mpirun started %d ranks but --tp %d --pp %d needs %d (mpirun -np %d)", d->world, d->tp, d->pp,
                      d->tp * d->pp, d->tp * d->pp);
        MPI_Barrier(m->world);
        MPI_Finalize();
        exit(1);
    }
    dist_place(d);
    mpi_check(MPI_Comm_split(m->world, d->pp_rank, d->tp_rank, &m->stage), "split");
    mpi_check(MPI_Comm_split(m->world, d->pp_rank * d->dp + d->dp_rank, d->atp_rank, &m->tp), "split");
    m->a2a = xcalloc(4 * (size_t)d->tp, sizeof(int));
    (void)gpu;
}
