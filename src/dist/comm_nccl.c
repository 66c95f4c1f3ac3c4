/* comm_nccl: the collectives of GPU ranks through NCCL, on the backend's stream (so that they
 * are captured into the decode graphs with the kernels around them). libnccl.so.2 is opened
 * at run time: the binary starts (and runs on the CPU) where NCCL is not installed, and says
 * so only when a GPU layout asks for it. The communicators are made at the first collective,
 * when every rank has its device (ranks are forked before any CUDA call). A step that does
 * not complete within the timeout aborts the communicators and stops every rank. */
#ifdef MOESERVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../backend/cuda/cuda.h"
#include "../base/knobs.h"
#include "../base/util.h"
#include "dist.h"

static struct {
    void *lib;
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*GetVersion)(int *);
} N;

typedef struct {
    ncclUniqueId id;
    int device;
    ncclComm_t world, tp;      /* NULL until the first collective; tp: the attention group under --dp */
    ncclComm_t stage;          /* the tensor ranks of this rank's stage (the all-to-all's) */
    pthread_t watchdog;
    volatile double busy_since; /* > 0 while a collective is queued and not known complete */
} Nccl;

static int nccl_open(void)
{
    if (N.lib) return 0;
    const char *lib = knob_str(KNOB_NCCL_LIB); /* "" when unset */
    const char *names[] = {*lib ? lib : NULL, "libnccl.so.2", "libnccl.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !N.lib; i++)
        if (names[i]) N.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!N.lib) return -1;
#define SYM(f) if (!(*(void **)&N.f = dlsym(N.lib, "nccl" #f))) fatal("libnccl: symbol nccl%s is missing", #f)
    SYM(GetUniqueId);
    SYM(CommInitRank);
    SYM(CommSplit);
    SYM(AllReduce);
    SYM(AllGather);
    SYM(Send);
    SYM(Recv);
    SYM(GroupStart);
    SYM(GroupEnd);
    SYM(CommAbort);
    SYM(CommDestroy);
    SYM(GetErrorString);
    SYM(GetVersion);
#undef SYM
    return 0;
}

static void nccl_check(ncclResult_t r, const char *what)
{
    if (r != ncclSuccess) fatal("NCCL %s failed: %s", what, N.GetErrorString(r));
}

int comm_nccl_unique_id(void *out, size_t n)
{
    if (nccl_open() < 0) return -1;
    CHECK(n >= sizeof(ncclUniqueId), "ncclUniqueId buffer of %zu bytes", n);
    memset(out, 0, n);
    nccl_check(N.GetUniqueId((ncclUniqueId *)out), "GetUniqueId");
    return 0;
}

/* stops every rank when a collective stays incomplete longer than the timeout */
static void *watchdog_main(void *arg)
{
    Dist *d = arg;
    Nccl *c = d->impl;
    for (;;) {
        sleep(1);
        double t = c->busy_since;
        if (t > 0 && clock_now() - t > d->timeout_s) {
            log_error("a collective did not complete in %.0f s (a rank is stuck or gone); stopping every rank", d->timeout_s);
            if (c->tp) N.CommAbort(c->tp);
            if (c->stage) N.CommAbort(c->stage);
            if (c->world) N.CommAbort(c->world);
            _exit(1);
        }
    }
    return NULL;
}

static void nccl_ready(Dist *d, Backend *be)
{
    Nccl *c = d->impl;
    if (c->world) return;
    CHECK(!be->host_memory, "NCCL collectives on the %s backend", be->name);
    if (be->ops->bind_thread) be->ops->bind_thread(be);
    nccl_check(N.CommInitRank(&c->world, d->world, c->id, d->rank), "CommInitRank");
    if (d->dp > 1) nccl_check(N.CommSplit(c->world, d->pp_rank, d->tp_rank, &c->stage, NULL), "CommSplit");
    nccl_check(N.CommSplit(c->world, d->pp_rank * d->dp + d->dp_rank, d->atp_rank, &c->tp, NULL), "CommSplit");
    int v = 0;
    N.GetVersion(&v);
    if (d->rank == 0) log_info("dist: NCCL %d communicators ready (%d ranks)", v, d->world);
    pthread_create(&c->watchdog, NULL, watchdog_main, d);
}

/* the step is queued; mark it busy until the stream drains (checked by the next sync) */
static void busy(Nccl *c)
{
    if (c->busy_since <= 0) c->busy_since = clock_now();
}

static void nccl_all_reduce(Dist *d, Backend *be, float *buf, size_t n)
{
    nccl_ready(d, be);
    Nccl *c = d->impl;
    busy(c);
    nccl_check(N.AllReduce(buf, buf, n, ncclFloat32, ncclSum, c->tp, (cudaStream_t)cuda_stream_of(be)), "AllReduce");
}

static void nccl_all_gather(Dist *d, Backend *be, float *out, const float *in, size_t n)
{
    nccl_ready(d, be);
    Nccl *c = d->impl;
    busy(c);
    nccl_check(N.AllGather(in, out, n, ncclFloat32, c->tp, (cudaStream_t)cuda_stream_of(be)), "AllGather");
}

/* grouped point-to-point over the stage: one send and one receive per peer, the empty ones left out */
static void nccl_all_to_all(Dist *d, Backend *be, const void *send, const size_t *send_bytes, void *recv,
                            const size_t *recv_bytes)
{
    nccl_ready(d, be);
    Nccl *c = d->impl;
    busy(c);
    cudaStream_t st = (cudaStream_t)cuda_stream_of(be);
    ncclComm_t comm = c->stage ? c->stage : c->tp; /* without --dp the stage is the tensor group */
    size_t so = 0, ro = 0;
    nccl_check(N.GroupStart(), "GroupStart");
    for (int r = 0; r < d->tp; r++) {
        if (send_bytes[r])
            nccl_check(N.Send((const char *)send + so, send_bytes[r], ncclUint8, r, comm, st), "Send");
        if (recv_bytes[r]) nccl_check(N.Recv((char *)recv + ro, recv_bytes[r], ncclUint8, r, comm, st), "Recv");
        so += send_bytes[r];
        ro += recv_bytes[r];
    }
    nccl_check(N.GroupEnd(), "GroupEnd");
}

static void nccl_send(Dist *d, Backend *be, const void *buf, size_t bytes, int peer)
{
    nccl_ready(d, be);
    Nccl *c = d->impl;
    busy(c);
    nccl_check(N.Send(buf, bytes, ncclUint8, peer, c->world, (cudaStream_t)cuda_stream_of(be)), "Send");
}

static void nccl_recv(Dist *d, Backend *be, void *buf, size_t bytes, int peer)
{
    nccl_ready(d, be);
    Nccl *c = d->impl;
    busy(c);
    nccl_check(N.Recv(buf, bytes, ncclUint8, peer, c->world, (cudaStream_t)cuda_stream_of(be)), "Recv");
}

/* the end of a step: the stream drains (the watchdog fires if it never does) */
static void nccl_flush(Dist *d, Backend *be)
{
    Nccl *c = d->impl;
    if (c->busy_since <= 0) return;
    cudaStreamSynchronize((cudaStream_t)cuda_stream_of(be));
    c->busy_since = 0;
}

static void nccl_bcast_host(Dist *d, void *buf, size_t bytes)
{
    (void)d;
    (void)buf;
    (void)bytes;
    die("nccl_bcast_host: host messages go through the pipes or MPI"); /* dist_bcast_host picks */
}

static void nccl_abort(Dist *d, int code)
{
    Nccl *c = d->impl;
    if (c && c->tp) N.CommAbort(c->tp);
    if (c && c->stage) N.CommAbort(c->stage);
    if (c && c->world) N.CommAbort(c->world);
    _exit(code);
}

static void nccl_finalize(Dist *d)
{
    Nccl *c = d->impl;
    if (!c) return;
    if (c->tp) N.CommDestroy(c->tp);
    if (c->stage) N.CommDestroy(c->stage);
    if (c->world) N.CommDestroy(c->world);
    /* the watchdog thread dies with the process */
    if (dist_under_mpirun()) {
        extern void comm_mpi_finalize_only(void);
        comm_mpi_finalize_only();
    }
    d->impl = NULL;
}

static const DistOps nccl_ops = {
    .name = "nccl", .all_reduce = nccl_all_reduce, .all_gather = nccl_all_gather, .all_to_all = nccl_all_to_all,
    .send = nccl_send,
    .recv = nccl_recv, .flush = nccl_flush, .bcast_host = nccl_bcast_host, .abort = nccl_abort,
    .finalize = nccl_finalize,
};

void comm_nccl_init(Dist *d, const void *unique_id, int device)
{
    if (nccl_open() < 0) fatal("NCCL is not available: libnccl.so.2 was not found (set MOESERVE_NCCL_LIB to its path)");
    Nccl *c = calloc(1, sizeof *c);
    memcpy(&c->id, unique_id, sizeof c->id);
    c->device = device;
    d->impl = c;
    d->ops = &nccl_ops;
}

#else
/* built without CUDA: no NCCL */
#include "dist.h"
int comm_nccl_unique_id(void *out, size_t n) { (void)out; (void)n; return -1; }
void comm_nccl_init(Dist *d, const void *unique_id, int device) { (void)d; (void)unique_id; (void)device; }
#endif
