/* dist: starting the ranks, the counted collectives, stopping everything when one rank fails
 * (dist.h). */
#include "dist.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../base/knobs.h"
#include "../base/test_hooks.h"
#include "../base/util.h"

static Dist g_dist;
static Dist *g_active;
static ParOpts g_par;

/* forked ranks (one node, GPU backends): rank 0's children and the pipes to them */
static pid_t g_children[1024];
static int g_n_children;
static int g_pipe_w[1024];  /* rank 0: write ends, [rank] */
static int g_pipe_r = -1;   /* a worker: its read end */

Dist *dist_get(void) { return g_active; }

/* ---- stopping every rank ---- */

static void kill_children(void)
{
    for (int i = 0; i < g_n_children; i++)
        if (g_children[i] > 0) kill(g_children[i], SIGTERM);
}

static void exit_hook(int code)
{
    if (!g_active) return;
    if (g_n_children) { /* rank 0 of forked ranks */
        signal(SIGCHLD, SIG_DFL);
        kill_children();
        _exit(code);
    }
    if (g_active->ops && g_active->ops->abort && dist_under_mpirun()) g_active->ops->abort(g_active, code);
    _exit(code);
}

#ifdef MOESERVE_CUDA
/* rank 0: a child that exits before dist_shutdown took every rank down with it */
static void on_sigchld(int sig)
{
    (void)sig;
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        int r = 0;
        for (int i = 0; i < g_n_children; i++)
            if (g_children[i] == pid) { r = i + 1; g_children[i] = 0; }
        if (!r) continue;
        char msg[160];
        int n;
        if (WIFSIGNALED(status))
            n = snprintf(msg, sizeof msg, "error: rank %d was killed by signal %d; stopping every rank\n", r, WTERMSIG(status));
        else
            n = snprintf(msg, sizeof msg, "error: rank %d exited with status %d; stopping every rank\n", r, WEXITSTATUS(status));
        if (write(2, msg, n) < 0) { /* nothing left to report it to */ }
        kill_children();
        _exit(1);
    }
}
#endif

/* ---- setup ---- */

static int is_cuda(const char *device) { return device && !strncmp(device, "cuda", 4); }

static void nccl_env(void)
{
    /* NVLink multicast off in every rank we start (device/KINDS.md: it can take a shared
     * host's GPUs out of service) */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
    setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
}

static void read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { /* rank 0 is gone */
            if (k == 0) _exit(0);
            fatal("reading from rank 0: %s", strerror(errno));
        }
        p += k;
        n -= k;
    }
}

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fatal("writing to a rank: %s", strerror(errno));
        p += k;
        n -= k;
    }
}

/* the host channel of forked ranks: rank 0 writes every worker's pipe */
static void pipe_bcast(Dist *d, void *buf, size_t bytes)
{
    if (d->rank == 0)
        for (int r = 1; r < d->world; r++) write_all(g_pipe_w[r], buf, bytes);
    else
        read_all(g_pipe_r, buf, bytes);
}

#ifdef MOESERVE_CUDA
static void fork_ranks(Dist *d)
{
    int world = d->world;
    CHECK(world <= 1024, "more than 1024 ranks");
    nccl_env();
    for (int r = 1; r < world; r++) {
        int fds[2];
        if (pipe(fds) < 0) fatal("pipe: %s", strerror(errno));
        pid_t pid = fork();
        if (pid < 0) fatal("fork: %s", strerror(errno));
        if (pid == 0) {
            sigset_t none; /* inherited blocks (serve's sigwait) would hold back the signal below */
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            prctl(PR_SET_PDEATHSIG, SIGTERM); /* rank 0 gone: so are we */
            if (getppid() == 1) _exit(1);
            close(fds[1]);
            for (int i = 1; i < r; i++) close(g_pipe_w[i]);
            g_pipe_r = fds[0];
            g_n_children = 0;
            d->rank = r;
            return;
        }
        close(fds[0]);
        g_pipe_w[r] = fds[1];
        g_children[g_n_children++] = pid;
    }
    d->rank = 0;
    struct sigaction sa = {.sa_handler = on_sigchld, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
#endif

void dist_shard(ModelConfig *c, void *par_opts)
{
    ParOpts *p = par_opts;
    char err[512];
    if (plan_check(c, p, err, sizeof err) < 0) fatal("%s", err);
    Dist *d = g_active;
    if (dist_simulated(d)) comm_sim_config(d, c, p);
    plan_apply(c, p, d ? d->rank : 0);
}

/* --device sim:GPU with several ranks: one process, rank 0's shard (comm_sim.c) */
static const char *dist_setup_sim(const ParOpts *p, const char *device)
{
    if (p->dp > 1) /* the exchange and the groups' own batches are not modelled */
        fatal("--device %s: --dp %d is not simulated (a modelled device runs --tp, --pp and --ep); plan models it",
              device, p->dp);
    Dist *d = &g_dist;
    *d = (Dist){.world = par_world(p), .tp = p->tp, .pp = p->pp, .ep = p->ep, .dp = 1, .microbatches = p->microbatches,
                .timeout_s = (double)knob_get(KNOB_COMM_TIMEOUT)};
    comm_sim_init(d);
    g_active = d;
    log_info("dist: %d simulated ranks (tp %d, pp %d, ep %d, %d micro-batches) in this process: rank 0's shard runs, "
             "collectives take their modelled time", d->world, d->tp, d->pp, d->ep, d->microbatches);
    return device;
}

const char *dist_setup(ParOpts *p, const char *device)
{
    char err[512];
    if (par_resolve(p, err, sizeof err) < 0) fatal("%s", err);
    g_par = *p;
    int world = par_world(p);
    int force_nccl = knob_get(KNOB_COMM) == 1; /* auto|nccl */
    if (world == 1 && !force_nccl && !dist_under_mpirun()) return device;
    if (device && !strncmp(device, "sim:", 4)) return dist_setup_sim(p, device);
    int comm_delay_us = test_hook_comm_delay_us();
    if (world == 1 && comm_delay_us) log_warn("MOESERVE_TEST_COMM_DELAY_US: one rank has no collectives to delay");
    Dist *d = &g_dist;
    *d = (Dist){.world = world, .tp = p->tp, .pp = p->pp, .ep = p->ep, .dp = p->dp > 1 ? p->dp : 1,
                .microbatches = p->microbatches,
                .comm_delay_us = comm_delay_us, .timeout_s = (double)knob_get(KNOB_COMM_TIMEOUT)};
    /* the default device without touching CUDA (forked ranks must start before any CUDA call) */
#ifdef MOESERVE_CUDA
    if (!device && access("/dev/nvidiactl", F_OK) == 0) device = "cuda";
#endif
    int gpu = is_cuda(device);
#ifdef MOESERVE_CUDA
    static char dev_buf[32];
#endif
    if (dist_under_mpirun()) {
        if (gpu) nccl_env();
        comm_mpi_init(d, gpu);
        if (gpu) {
#ifdef MOESERVE_CUDA
            const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
            int local = lr ? atoi(lr) : d->rank;
            char id[256];
            if (d->rank == 0 && comm_nccl_unique_id(id, sizeof id) < 0) fatal("NCCL is not available (libnccl.so.2)");
            comm_mpi_bcast_host(d, id, sizeof id);
            snprintf(dev_buf, sizeof dev_buf, "cuda:%d", local);
            comm_nccl_init(d, id, local);
            device = dev_buf;
#else
            fatal("--device %s: this moeserve was built without CUDA", device);
#endif
        }
    } else {
        if (!gpu)
            fatal("--tp %d --pp %d on the CPU backend: its collectives go through MPI, so start the ranks with mpirun: "
                  "mpirun -np %d moeserve ... (the GPU backends start their ranks themselves)", p->tp, p->pp, world);
#ifdef MOESERVE_CUDA
        int base = 0;
        if (device && device[4] == ':') base = atoi(device + 5);
        fork_ranks(d);
        dist_place(d);
        char id[256];
        if (d->rank == 0 && comm_nccl_unique_id(id, sizeof id) < 0) fatal("NCCL is not available (libnccl.so.2)");
        pipe_bcast(d, id, sizeof id);
        snprintf(dev_buf, sizeof dev_buf, "cuda:%d", base + d->rank);
        comm_nccl_init(d, id, base + d->rank);
        device = dev_buf;
#endif
    }
    g_active = d;
    util_exit_hook = exit_hook;
    if (d->world > 1) log_rank = d->rank;
    if (d->rank == 0)
        log_info("dist: %d rank%s (tp %d, pp %d, ep %d, dp %d, %d micro-batches), collectives through %s", d->world,
                 d->world > 1 ? "s" : "", d->tp, d->pp, d->ep, d->dp, d->microbatches, d->ops->name);
    return device;
}

void dist_place(Dist *d)
{
    if (d->dp < 1) d->dp = 1;
    d->atp = d->tp / d->dp;
    d->tp_rank = d->rank % d->tp;
    d->pp_rank = d->rank / d->tp;
    d->dp_rank = d->tp_rank / d->atp;
    d->atp_rank = d->tp_rank % d->atp;
}

void dist_bcast_host(Dist *d, void *buf, size_t bytes)
{
    if (!d || d->world == 1 || dist_simulated(d)) return; /* simulated ranks: no workers to tell */
    if (g_pipe_r >= 0 || g_n_children) pipe_bcast(d, buf, bytes);
    else comm_mpi_bcast_host(d, buf, bytes);
}

void dist_shutdown(void)
{
    Dist *d = g_active;
    if (!d) return;
    if (d->rank == 0 && d->world > 1) {
        DistMsg msg = {.op = DIST_MSG_STOP};
        dist_bcast_host(d, &msg, sizeof msg);
    }
    if (g_n_children) {
        signal(SIGCHLD, SIG_DFL);
        for (int i = 0; i < g_n_children; i++) {
            int status;
            if (g_children[i] > 0 && waitpid(g_children[i], &status, 0) > 0 &&
                (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
                log_error("rank %d ended with status %d", i + 1, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        g_n_children = 0;
    }
    if (d->ops && d->ops->finalize) d->ops->finalize(d);
    g_active = NULL;
    util_exit_hook = NULL;
}

void dist_fault_point(Dist *d)
{
    if (!d) return;
    TestFault f = test_hook_fault(d->rank);
    if (f == TEST_FAULT_EXIT) fatal("MOESERVE_TEST_FAULT: rank %d fails here (a test hook)", d->rank);
    if (f == TEST_FAULT_HANG) {
        log_warn("MOESERVE_TEST_FAULT: rank %d stops answering (a test hook)", d->rank);
        for (;;) pause();
    }
}

/* ---- the counted collectives ---- */

static void delay(Dist *d, Backend *be)
{
    if (!d->comm_delay_us) return;
#ifdef MOESERVE_CUDA
    extern void cuda_delay_us(Backend *be, int us);
    if (!be->host_memory) {
        cuda_delay_us(be, d->comm_delay_us);
        return;
    }
#endif
    (void)be;
    struct timespec ts = {d->comm_delay_us / 1000000, (long)(d->comm_delay_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

void dist_all_reduce(Dist *d, Backend *be, float *buf, size_t n)
{
    if (!d) return;
    be_op_begin(be);
    delay(d, be);
    if (d->atp > 1 || strcmp(d->ops->name, "mpi")) d->ops->all_reduce(d, be, buf, n); /* NCCL: even alone (tests) */
    /* ring all-reduce: each rank sends 2 (tp - 1) / tp of the buffer (tp: the group's ranks) */
    be_count(be, OP_ALL_REDUCE, (double)n * (d->atp - 1), 8.0 * n * (d->atp - 1) / d->atp);
}

void dist_all_gather(Dist *d, Backend *be, float *out, const float *in, size_t n)
{
    if (!d) return;
    be_op_begin(be);
    delay(d, be);
    d->ops->all_gather(d, be, out, in, n);
    be_count(be, OP_ALL_GATHER, 0, 4.0 * n * (d->atp - 1));
}

void dist_all_to_all(Dist *d, Backend *be, const void *send, const size_t *send_bytes, void *recv,
                     const size_t *recv_bytes)
{
    if (!d) return;
    be_op_begin(be);
    delay(d, be);
    d->ops->all_to_all(d, be, send, send_bytes, recv, recv_bytes);
    double moved = 0; /* what leaves this rank; its own share stays */
    for (int r = 0; r < d->tp; r++)
        if (r != d->tp_rank) moved += (double)send_bytes[r];
    be_count(be, OP_ALL_TO_ALL, 0, moved);
}

void dist_send(Dist *d, Backend *be, const void *buf, size_t bytes, int peer)
{
    be_op_begin(be);
    delay(d, be);
    d->ops->send(d, be, buf, bytes, peer);
    be_count(be, OP_PP_SEND, 0, (double)bytes);
}

void dist_recv(Dist *d, Backend *be, void *buf, size_t bytes, int peer)
{
    be_op_begin(be);
    d->ops->recv(d, be, buf, bytes, peer);
    be_count(be, OP_PP_RECV, 0, (double)bytes);
}

void dist_flush(Dist *d, Backend *be)
{
    if (d && d->ops->flush) d->ops->flush(d, be);
}
