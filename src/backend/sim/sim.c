/* sim: the modelled device's op table, clock and memory (sim.h). */
#include "sim.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../../base/util.h"

/* What a real device loses before the first allocation: the CUDA context, cuBLAS workspaces, the
 * allocator's slack. Counted as in use from the start, so that what is free is what a GPU reports. */
#define SIM_RUNTIME_RESERVE ((double)(1u << 30))
#define RESERVE(s) ((s)->t.reserve_bytes > 0 ? (s)->t.reserve_bytes : SIM_RUNTIME_RESERVE)
/* Host <-> device copies: PCIe 5 x16 in practice, and a copy's fixed cost. */
#define SIM_PCIE_BPS 25e9
#define SIM_COPY_S 10e-6
/* A logits row the host asked for (penalties, log-probabilities): this value at the drawn id, 0
 * elsewhere; exp(-100) leaves the rest of the vocabulary nothing, at any sensible temperature. */
#define SIM_LOGIT_PEAK 100.0f

typedef struct {
    SimTimer t;
    double clock;        /* when the stream is done with everything issued so far */
    double busy;         /* modelled seconds of a stage's own work since sim_take_busy (not PP send/recv) */
    int rows, ranks;     /* of the op being counted: set by the op, read by sim_op_done */
    QFormat wfmt;
    long draw;           /* draws so far (argmax, sample, a logits download) */
    int *pool, n_pool, eos, eos_every, vocab;
    pthread_mutex_t mu;  /* the allocation list (the HTTP threads never allocate, but be safe) */
    struct { void *p; size_t n; int mapped; } *allocs;
    int n_allocs, cap_allocs;
    double used;
    double uploaded;     /* bytes of every be_to_device */
    double busy_ops, busy_copies, t_open; /* modelled seconds of ops and of copies; when it opened */
    char name[64];
} Sim;

static SimResolver g_resolver;

void backend_sim_set_resolver(SimResolver fn) { g_resolver = fn; }

static Sim *S(const Backend *be) { return (Sim *)be->impl; }

/* ---- the clock ---- */

static void sleep_until(double t)
{
    for (;;) {
        double left = t - clock_now();
        if (left <= 0) return;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        if (nanosleep(&ts, NULL) == 0) return;
        if (errno != EINTR) return;
    }
}

/* work of dt seconds issued now: it starts when the stream is free, or now if it is idle */
static void advance(Sim *s, double dt)
{
    double now = clock_now();
    if (s->clock < now) s->clock = now;
    s->clock += dt;
}

static int is_comm(OpId op) { return op >= OP_ALL_REDUCE && op <= OP_PP_RECV; }

/* BackendOps op_done: the counts of the op just issued give its time */
static void sim_op_done(Backend *be, OpId op, double flops, double bytes)
{
    Sim *s = S(be);
    double dt;
    if (is_comm(op)) /* one rank alone (a pipeline without tensor parallelism) reduces nothing */
        dt = s->ranks == 1 ? 0 : s->t.comm_seconds(s->t.ctx, op, bytes, s->ranks > 0 ? s->ranks : 2);
    else
        dt = s->t.op_seconds(s->t.ctx, op, flops, bytes, s->rows, s->wfmt);
    if (op != OP_PP_SEND && op != OP_PP_RECV) s->busy += dt; /* a stage's own work, its collectives included */
    s->busy_ops += dt > 0 ? dt : 0;
    advance(s, dt > 0 ? dt : 0);
    s->rows = s->ranks = 0;
    s->wfmt = QF_COUNT;
}

double sim_clock(const Backend *be) { return S(be)->clock; }

void sim_wait_until(Backend *be, double t)
{
    Sim *s = S(be);
    if (s->clock < t) s->clock = t;
}

void sim_comm_ranks(Backend *be, int ranks) { S(be)->ranks = ranks; }

double sim_take_busy(Backend *be)
{
    Sim *s = S(be);
    double b = s->busy;
    s->busy = 0;
    return b;
}

const SimTimer *sim_timer(const Backend *be) { return &S(be)->t; }

size_t sim_mem_used(const Backend *be) { return (size_t)S(be)->used; }

double sim_uploaded(const Backend *be) { return S(be)->uploaded; }

/* ---- draws ---- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void sim_set_tokens(Backend *be, const int *ids, int n, int eos, int vocab)
{
    Sim *s = S(be);
    s->vocab = vocab;
    free(s->pool);
    s->pool = NULL;
    s->n_pool = 0;
    if (n > 0) {
        s->pool = xmalloc((size_t)n * sizeof(int));
        memcpy(s->pool, ids, (size_t)n * sizeof(int));
        s->n_pool = n;
    }
    s->eos = eos;
}

int sim_token(const Backend *be, long draw, int r, int vocab)
{
    const Sim *s = S(be);
    uint64_t h = mix(((uint64_t)draw << 20) ^ (uint64_t)r);
    if (s->eos_every > 0 && s->eos >= 0 && mix(h) % (uint64_t)s->eos_every == 0) return s->eos;
    if (s->n_pool > 0) return s->pool[h % (uint64_t)s->n_pool];
    int lo = vocab / 8, hi = vocab / 2;
    return hi > lo ? lo + (int)(h % (uint64_t)(hi - lo)) : 0;
}

/* ---- memory ---- */

/* Big buffers are reserved address space (MAP_NORESERVE): the weights and the KV pool are never
 * written, so they never take host memory; activations and the batch are, and they are small. */
#define SIM_MAP_MIN ((size_t)64 << 10)

static void *sim_alloc(Backend *be, size_t bytes)
{
    Sim *s = S(be);
    pthread_mutex_lock(&s->mu);
    double left = s->t.mem_bytes - RESERVE(s) - s->used;
    if ((double)bytes > left) {
        pthread_mutex_unlock(&s->mu);
        fatal("%s: out of device memory: %.2f GiB asked, %.2f GiB free of %.2f GB (as a GPU's allocation would fail)",
              s->name, bytes / 1073741824.0, (left > 0 ? left : 0) / 1073741824.0, s->t.mem_bytes / 1e9);
    }
    int mapped = bytes >= SIM_MAP_MIN;
    void *p;
    if (mapped) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) die("%s: reserving %zu bytes of address space: %s", s->name, bytes, strerror(errno));
    } else {
        p = xcalloc(1, bytes ? bytes : 1);
    }
    if (s->n_allocs == s->cap_allocs)
        s->allocs = xrealloc(s->allocs, (s->cap_allocs = s->cap_allocs ? 2 * s->cap_allocs : 64) * sizeof *s->allocs);
    s->allocs[s->n_allocs].p = p;
    s->allocs[s->n_allocs].n = bytes;
    s->allocs[s->n_allocs++].mapped = mapped;
    s->used += (double)bytes;
    pthread_mutex_unlock(&s->mu);
    return p;
}

static void sim_free(Backend *be, void *p)
{
    Sim *s = S(be);
    if (!p) return;
    pthread_mutex_lock(&s->mu);
    for (int i = s->n_allocs - 1; i >= 0; i--)
        if (s->allocs[i].p == p) {
            if (s->allocs[i].mapped) munmap(p, s->allocs[i].n);
            else free(p);
            s->used -= (double)s->allocs[i].n;
            s->allocs[i] = s->allocs[--s->n_allocs];
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

static size_t sim_mem_free(Backend *be)
{
    Sim *s = S(be);
    double left = s->t.mem_bytes - RESERVE(s) - s->used;
    return left > 0 ? (size_t)left : 0;
}

/* ---- copies: the synchronisation points ---- */

/* A copy's fixed cost: with a step cost in the timer (the profile's: a decode graph's launch, the
 * batch's upload, the ids' copy back, as `plan` counts it once a step), a download pays it and
 * an upload only its bytes; without one, SIM_COPY_S each. */
static double copy_fixed(const Sim *s, int down)
{
    if (s->t.step_seconds > 0) return down ? s->t.step_seconds : 0;
    return SIM_COPY_S;
}

/* A download waits for the stream (the host sleeps until the modelled device is done), then the
 * copy. A download of whole logits rows (the host sampler's path) gets each row's draw as a peak. */
static void sim_to_host(Backend *be, void *dst, const void *src, size_t bytes)
{
    Sim *s = S(be);
    double dt = copy_fixed(s, 1) + (double)bytes / SIM_PCIE_BPS;
    s->busy_copies += dt;
    advance(s, dt);
    sleep_until(s->clock);
    size_t row = (size_t)s->vocab * sizeof(float);
    if (s->vocab > 0 && bytes >= row && bytes % row == 0) {
        int rows = (int)(bytes / row);
        float *out = dst;
        memset(out, 0, bytes);
        for (int r = 0; r < rows; r++) out[(size_t)r * s->vocab + sim_token(be, s->draw, r, s->vocab)] = SIM_LOGIT_PEAK;
        s->draw++;
        return;
    }
    if (dst != src) memcpy(dst, src, bytes);
}

/* an upload is queued on the stream: the host goes on */
static void sim_to_device(Backend *be, void *dst, const void *src, size_t bytes)
{
    Sim *s = S(be);
    double dt = copy_fixed(s, 0) + (double)bytes / SIM_PCIE_BPS;
    s->uploaded += (double)bytes;
    s->busy_copies += dt;
    advance(s, dt);
    if (dst != src) memcpy(dst, src, bytes);
}

/* ---- the ops: nothing computed, the shape kept for the timer ---- */

static void note(Backend *be, int rows, QFormat wfmt)
{
    S(be)->rows = rows;
    S(be)->wfmt = wfmt;
}

static void sim_fill(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed)
{
    (void)be, (void)p, (void)n, (void)kind, (void)a, (void)b, (void)seed; /* dummy weights: never written */
}

static void sim_embed(Backend *be, float *out, const int *tokens, int T, const QTensor *emb)
{
    (void)out, (void)tokens;
    note(be, T, emb->fmt);
}

static void sim_rmsnorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, int rows, int dim,
                        float eps)
{
    (void)out, (void)ldo, (void)x, (void)ldx, (void)w, (void)dim, (void)eps;
    note(be, rows, QF_COUNT);
}

static void sim_layernorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w, const float *b,
                          int rows, int dim, float eps)
{
    (void)out, (void)ldo, (void)x, (void)ldx, (void)w, (void)b, (void)dim, (void)eps;
    note(be, rows, QF_COUNT);
}

static void sim_rope(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off, int rot_dim,
                     const int *pos, const float *inv_freq, float scale, int interleave)
{
    (void)x, (void)ld, (void)n_heads, (void)head_stride, (void)rot_off, (void)rot_dim, (void)pos, (void)inv_freq,
        (void)scale, (void)interleave;
    note(be, T, QF_COUNT);
}

static void sim_add(Backend *be, float *out, const float *a, const float *b, size_t n)
{
    (void)out, (void)a, (void)b, (void)n;
    note(be, 0, QF_COUNT);
}

static void sim_get_rows(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim)
{
    (void)out, (void)x, (void)ld, (void)rows, (void)dim;
    note(be, n, QF_COUNT);
}

static void sim_swiglu(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F)
{
    (void)out, (void)gate, (void)up, (void)ld, (void)F;
    note(be, T, QF_COUNT);
}

static void sim_kv_write(Backend *be, void *cache, KVDtype dt, float scale, int width, int off, const float *src,
                         int ld, int n, const int *slot, int T)
{
    (void)cache, (void)dt, (void)scale, (void)width, (void)off, (void)src, (void)ld, (void)n, (void)slot;
    note(be, T, QF_COUNT);
}

static void sim_matmul(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                       const float *bias)
{
    (void)out, (void)ldo, (void)x, (void)ldx, (void)bias;
    note(be, T, w->fmt);
}

static void sim_router(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T,
                       const ModelConfig *c)
{
    (void)idx, (void)wts, (void)logits, (void)bias, (void)c;
    note(be, T, QF_COUNT);
}

/* the distinct experts are left to the byte count's expectation under uniform routing (-1) */
static int sim_moe(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
                   const MoeExperts *ex, const ModelConfig *c)
{
    (void)out, (void)x, (void)idx, (void)wts, (void)c;
    note(be, T, ex->gate[0].fmt);
    return -1;
}

static void sim_attention_gqa(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                              const ModelConfig *c)
{
    (void)out, (void)q, (void)kv, (void)c;
    note(be, b->n_tokens, QF_COUNT);
}

static void sim_attention_mla(Backend *be, float *out, const float *q, const KVLayer *kv, const QTensor *wkv_b,
                              const int *topk, int ktop, const Batch *b, const ModelConfig *c)
{
    (void)out, (void)q, (void)kv, (void)topk, (void)ktop, (void)c;
    note(be, b->n_tokens, wkv_b->fmt);
}

static void sim_kv_gather(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                          const int *bt, int block_size, int j0, int rows)
{
    (void)out, (void)cache, (void)dt, (void)scale, (void)width, (void)n, (void)bt, (void)block_size, (void)j0;
    note(be, rows, QF_COUNT);
}

static void sim_attention_mla_piece(Backend *be, float *out, float *st, const float *q, const float *kv,
                                    const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                                    int ktop, int first, int last, const Batch *b, const ModelConfig *c)
{
    (void)out, (void)st, (void)q, (void)kv, (void)kpe, (void)ldk, (void)j0, (void)n, (void)t0, (void)topk,
        (void)ktop, (void)first, (void)last, (void)b, (void)c;
    note(be, nt, QF_COUNT);
}

static void sim_indexer(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv, const Batch *b,
                        const ModelConfig *c)
{
    (void)topk, (void)q, (void)w, (void)kv, (void)c;
    note(be, b->n_tokens, QF_COUNT);
}

static void sim_argmax(Backend *be, int *out, const float *x, int rows, int n)
{
    (void)x;
    Sim *s = S(be);
    for (int r = 0; r < rows; r++) out[r] = sim_token(be, s->draw, r, n);
    s->draw++;
    note(be, rows, QF_COUNT);
}

static void sim_sample(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params)
{
    (void)params;
    sim_argmax(be, out, logits, rows, V);
}

/* events (diag/profile, calibrate): the time the stream reaches them */
static void *sim_event_create(Backend *be)
{
    (void)be;
    return xcalloc(1, sizeof(double));
}

static void sim_event_record(Backend *be, void *e)
{
    Sim *s = S(be);
    double now = clock_now();
    *(double *)e = s->clock > now ? s->clock : now;
}

static double sim_event_elapsed(Backend *be, void *from, void *to)
{
    (void)be;
    sleep_until(*(double *)to); /* as cudaEventElapsedTime after a synchronise: the later one is done */
    return (*(double *)to - *(double *)from) * 1e3;
}

static void sim_event_destroy(Backend *be, void *e)
{
    (void)be;
    free(e);
}

static void sim_destroy(Backend *be)
{
    Sim *s = S(be);
    if (!s) return;
    /* how much of its life the modelled device worked: the rest it waited for the host (or idled) */
    double life = clock_now() - s->t_open;
    log_info("%s: the device was busy %.3f s of %.3f s (ops %.3f s, copies %.3f s)", s->name, s->busy_ops + s->busy_copies,
             life, s->busy_ops, s->busy_copies);
    for (int i = 0; i < s->n_allocs; i++) {
        if (s->allocs[i].mapped) munmap(s->allocs[i].p, s->allocs[i].n);
        else free(s->allocs[i].p);
    }
    free(s->allocs);
    free(s->pool);
    pthread_mutex_destroy(&s->mu);
    free(s);
    be->impl = NULL;
}

static const BackendOps sim_ops = {
    .alloc = sim_alloc,
    .free = sim_free,
    .destroy = sim_destroy,
    .fill = sim_fill,
    .embed = sim_embed,
    .rmsnorm = sim_rmsnorm,
    .layernorm = sim_layernorm,
    .rope = sim_rope,
    .add = sim_add,
    .get_rows = sim_get_rows,
    .to_host = sim_to_host,
    .to_device = sim_to_device,
    .swiglu = sim_swiglu,
    .kv_write = sim_kv_write,
    .matmul = sim_matmul,
    .router = sim_router,
    .moe = sim_moe,
    .attention_gqa = sim_attention_gqa,
    .attention_mla = sim_attention_mla,
    .kv_gather = sim_kv_gather,
    .attention_mla_piece = sim_attention_mla_piece,
    .indexer = sim_indexer,
    .argmax = sim_argmax,
    .sample = sim_sample,
    .mem_free = sim_mem_free,
    .event_create = sim_event_create,
    .event_record = sim_event_record,
    .event_elapsed = sim_event_elapsed,
    .event_destroy = sim_event_destroy,
    .op_done = sim_op_done,
};

void backend_sim_init(Backend *be, const SimTimer *t)
{
    Sim *s = xcalloc(1, sizeof *s);
    s->t = *t;
    s->wfmt = QF_COUNT;
    s->eos = -1;
    s->t_open = clock_now();
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->name, sizeof s->name, "sim:%s", t->name ? t->name : "?");
    *be = (Backend){0};
    be->name = s->name;
    be->host_memory = 0;
    be->ops = &sim_ops;
    be->n_threads = 1;
    be->impl = s;
}

int backend_is_sim(const Backend *be) { return be->ops == &sim_ops; }

void backend_sim_open(Backend *be, const char *spec)
{
    char name[512];
    snprintf(name, sizeof name, "%s", spec);
    int eos_every = 0;
    char *opt = strchr(name, ',');
    if (opt) {
        *opt++ = 0;
        char *end = NULL;
        if (strncmp(opt, "eos=", 4) || (eos_every = (int)strtol(opt + 4, &end, 10)) < 1 || *end)
            fatal("--device sim:%s: ',%s': the one option is ',eos=N' (one draw in N ends the sequence, N >= 1)", spec,
                  opt);
    }
    if (!g_resolver) fatal("--device sim:%s: this command has no device models", spec);
    SimTimer t;
    char err[512];
    if (g_resolver(name, &t, err, sizeof err) < 0) fatal("--device sim:%s: %s", spec, err);
    backend_sim_init(be, &t);
    S(be)->eos_every = eos_every;
    snprintf(S(be)->name, sizeof S(be)->name, "sim:%.59s", name); /* as the command line says it */
    log_info("device: sim:%s, a modelled %s (%.0f GB); nothing is computed", name, t.name, t.mem_bytes / 1e9);
}
