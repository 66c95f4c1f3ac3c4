/* backend: the be_* wrappers of backend.h. Each dispatches to the backend's implementation and
 * adds the FLOPs and bytes of the op, computed from its shapes, to be->stats. One place for
 * every backend, so that CPU and CUDA report the same counts. */
#include "backend.h"

#include <math.h>
#include <sched.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/knobs.h"
#include "../base/test_hooks.h"
#include "../base/util.h"
#ifdef MOESERVE_CUDA
#include "cuda/cuda.h"
#endif
#include "kv_elem.h"
#include "sim/sim.h"

static const struct { const char *name; OpCategory cat; } op_info[OP_COUNT] = {
    [OP_EMBED] = {"embed", CAT_ELEMENTWISE},
    [OP_RMSNORM] = {"rmsnorm", CAT_ELEMENTWISE},
    [OP_LAYERNORM] = {"layernorm", CAT_ELEMENTWISE},
    [OP_ROPE] = {"rope", CAT_ELEMENTWISE},
    [OP_ADD] = {"add", CAT_ELEMENTWISE},
    [OP_GET_ROWS] = {"get_rows", CAT_ELEMENTWISE},
    [OP_SWIGLU] = {"swiglu", CAT_ELEMENTWISE},
    [OP_KV_WRITE] = {"kv_write", CAT_ELEMENTWISE},
    [OP_GEMM_ATTN] = {"gemm_attn", CAT_GEMM},
    [OP_GEMM_MLP] = {"gemm_mlp", CAT_GEMM},
    [OP_GEMM_LM_HEAD] = {"gemm_lm_head", CAT_GEMM},
    [OP_GEMM_INDEXER] = {"gemm_indexer", CAT_INDEXER},
    [OP_GEMM_ROUTER] = {"gemm_router", CAT_ROUTER},
    [OP_ROUTER] = {"router", CAT_ROUTER},
    [OP_MOE] = {"moe", CAT_MOE},
    [OP_ATTENTION] = {"attention", CAT_ATTENTION},
    [OP_INDEXER] = {"indexer", CAT_INDEXER},
    [OP_SAMPLE] = {"sample", CAT_SAMPLE},
    [OP_ALL_REDUCE] = {"all_reduce", CAT_ALL_REDUCE},
    [OP_ALL_GATHER] = {"all_gather", CAT_ALL_REDUCE},
    [OP_ALL_TO_ALL] = {"all_to_all", CAT_ALL_TO_ALL},
    [OP_PP_SEND] = {"pp_send", CAT_PP},
    [OP_PP_RECV] = {"pp_recv", CAT_PP},
};

static const char *cat_names[CAT_COUNT] = {
    [CAT_GEMM] = "dense GEMM", [CAT_MOE] = "MoE GEMM", [CAT_ATTENTION] = "attention",
    [CAT_INDEXER] = "indexer", [CAT_ELEMENTWISE] = "norms and elementwise",
    [CAT_ROUTER] = "router and dispatch", [CAT_SAMPLE] = "sampling",
    [CAT_ALL_REDUCE] = "all-reduce", [CAT_ALL_TO_ALL] = "all-to-all", [CAT_PP] = "pipeline send/receive",
};

const char *op_name(OpId op) { return op_info[op].name; }
OpCategory op_category(OpId op) { return op_info[op].cat; }
const char *op_category_name(OpCategory c) { return cat_names[c]; }

/* MOESERVE_TEST_GEMM_REPEAT: a copy of the backend's op table whose GEMM and MoE entries run the
 * backend's own N times. Swapping the table once, when the backend opens, keeps the hook out of
 * the ops themselves: without it be_matmul and be_moe call the backend straight, with no check of
 * a repeat count per op, and every backend (and every op that reaches the table) gets the same
 * repetition. The table is the first member, so be->ops leads back to the wrapper. */
typedef struct {
    BackendOps ops;
    const BackendOps *inner;
    int n;
} RepeatOps;

static void repeat_matmul(Backend *be, float *out, int ldo, const float *x, int ldx, int T, const QTensor *w,
                          const float *bias)
{
    const RepeatOps *r = (const RepeatOps *)be->ops;
    for (int i = 0; i < r->n; i++) r->inner->matmul(be, out, ldo, x, ldx, T, w, bias);
}

static int repeat_moe(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
                      const MoeExperts *ex, const ModelConfig *c)
{
    const RepeatOps *r = (const RepeatOps *)be->ops;
    int touched = -1;
    for (int i = 0; i < r->n; i++) touched = r->inner->moe(be, out, x, idx, wts, T, ex, c);
    return touched;
}

static RepeatOps *repeat_ops(const Backend *be)
{
    return be->ops && be->ops->matmul == repeat_matmul ? (RepeatOps *)be->ops : NULL;
}

void backend_repeat_gemms(Backend *be, int n)
{
    RepeatOps *r = repeat_ops(be);
    if (r) { /* already wrapped: a new count, or back to the backend's own table */
        if (n > 1) {
            r->n = n;
            return;
        }
        be->ops = r->inner;
        free(r);
        return;
    }
    if (n <= 1) return;
    r = xcalloc(1, sizeof *r);
    r->ops = *be->ops;
    r->inner = be->ops;
    r->n = n;
    r->ops.matmul = repeat_matmul;
    if (r->ops.moe) r->ops.moe = repeat_moe;
    be->ops = &r->ops;
}

void backend_reset_stats(Backend *be) { memset(be->stats, 0, sizeof be->stats); }

static void count(Backend *be, OpId op, double flops, double bytes)
{
    if (be->ops->op_done) be->ops->op_done(be, op, flops, bytes);
    if (be->hook) be->hook->end(be->hook->ctx, op, flops, bytes);
    be->stats[op].flops += flops;
    be->stats[op].bytes += bytes;
    be->stats[op].calls++;
}

void be_op_begin(Backend *be)
{
    if (be->hook) be->hook->begin(be->hook->ctx);
}

void be_count(Backend *be, OpId op, double flops, double bytes) { count(be, op, flops, bytes); }

/* not while profiling: the profiler times the ops one after another on one stream */
int be_side_begin(Backend *be, int T, SideKind kind) { return be->hook || !be->ops->side_begin ? 0 : be->ops->side_begin(be, T, (int)kind); }
void be_side_end(Backend *be) { be->ops->side_end(be); }
void be_side_join(Backend *be) { be->ops->side_join(be); }

void *be_alloc(Backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }

size_t be_mem_free(Backend *be) { return be->ops->mem_free(be); }

void be_fill(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed)
{
    be->ops->fill(be, p, n, kind, a, b, seed);
}

void be_free(Backend *be, void *p)
{
    if (p) be->ops->free(be, p);
}

void be_embed(Backend *be, float *out, const int *tokens, int T, const QTensor *emb)
{
    be_op_begin(be);
    be->ops->embed(be, out, tokens, T, emb);
    double row = qtensor_bytes(emb) / (double)emb->rows;
    count(be, OP_EMBED, 0, T * (row + 4.0 * emb->cols));
}

void be_rmsnorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                int rows, int dim, float eps)
{
    be_op_begin(be);
    be->ops->rmsnorm(be, out, ldo, x, ldx, w, rows, dim, eps);
    count(be, OP_RMSNORM, 4.0 * rows * dim, 8.0 * rows * dim + 4.0 * dim);
}

void be_layernorm(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                  const float *b, int rows, int dim, float eps)
{
    be_op_begin(be);
    be->ops->layernorm(be, out, ldo, x, ldx, w, b, rows, dim, eps);
    count(be, OP_LAYERNORM, 7.0 * rows * dim, 8.0 * rows * dim + 8.0 * dim);
}

void be_rope(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off,
             int rot_dim, const int *pos, const float *inv_freq, float scale, int interleave)
{
    be_op_begin(be);
    be->ops->rope(be, x, ld, T, n_heads, head_stride, rot_off, rot_dim, pos, inv_freq, scale, interleave);
    double n = (double)T * n_heads * rot_dim;
    count(be, OP_ROPE, 3.0 * n, 8.0 * n);
}

void be_add(Backend *be, float *out, const float *a, const float *b, size_t n)
{
    be_op_begin(be);
    be->ops->add(be, out, a, b, n);
    count(be, OP_ADD, (double)n, 12.0 * n);
}

void be_get_rows(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim)
{
    be_op_begin(be);
    be->ops->get_rows(be, out, x, ld, rows, n, dim);
    count(be, OP_GET_ROWS, 0, 8.0 * n * dim);
}

void be_to_host(Backend *be, void *dst, const void *src, size_t bytes)
{
    be->ops->to_host(be, dst, src, bytes);
}

void be_to_device(Backend *be, void *dst, const void *src, size_t bytes)
{
    be->ops->to_device(be, dst, src, bytes);
}

void be_swiglu(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F)
{
    be_op_begin(be);
    be->ops->swiglu(be, out, gate, up, ld, T, F);
    count(be, OP_SWIGLU, 6.0 * T * F, 12.0 * T * F);
}

void be_kv_write(Backend *be, void *cache, KVDtype dt, float scale, int width, int off,
                 const float *src, int ld, int n, const int *slot, int T)
{
    be_op_begin(be);
    be->ops->kv_write(be, cache, dt, scale, width, off, src, ld, n, slot, T);
    count(be, OP_KV_WRITE, 0, (4.0 + kv_elem_size(dt)) * T * n);
}

void be_matmul(Backend *be, OpId op, float *out, int ldo, const float *x, int ldx, int T,
               const QTensor *w, const float *bias)
{
    be_op_begin(be);
    be->ops->matmul(be, out, ldo, x, ldx, T, w, bias);
    count(be, op, 2.0 * T * w->rows * w->cols,
          qtensor_bytes(w) + 4.0 * T * (w->cols + w->rows) + (bias ? 4.0 * w->rows : 0));
}

void be_router(Backend *be, int *idx, float *wts, const float *logits, const float *bias, int T,
               const ModelConfig *c)
{
    be_op_begin(be);
    be->ops->router(be, idx, wts, logits, bias, T, c);
    count(be, OP_ROUTER, 8.0 * T * c->n_experts, 4.0 * T * c->n_experts + 8.0 * T * c->n_experts_per_tok);
}

void be_moe(Backend *be, float *out, const float *x, const int *idx, const float *wts, int T,
            const MoeExperts *ex, const ModelConfig *c)
{
    be_op_begin(be);
    int touched = be->ops->moe(be, out, x, idx, wts, T, ex, c);
    double E = c->n_experts, K = c->n_experts_per_tok, share = 1;
    if (c->ep > 1) { /* c holds this rank's experts: about K / ep of each token's pairs land here */
        share = 1.0 / c->ep;
        E *= c->ep;
    }
    /* expected distinct experts under uniform routing when the backend cannot say */
    double n_exp = touched >= 0 ? touched : share * E * (1.0 - pow(1.0 - K / E, T));
    K *= share;
    double expert_bytes = qtensor_bytes(&ex->gate[0]) + qtensor_bytes(&ex->up[0]) +
                          qtensor_bytes(&ex->down[0]);
    double F = c->moe_intermediate, D = c->hidden;
    count(be, OP_MOE, 2.0 * T * K * 3.0 * F * D + 3.0 * T * K * F,
          n_exp * expert_bytes + 4.0 * T * D * 2 + 8.0 * T * K);
}

/* Keys token t may attend to, summed over the batch (causal, or the indexer's selection). */
static double batch_keys(const Batch *b, int cap)
{
    double n = 0;
    for (int t = 0; t < b->n_tokens; t++) n += (cap > 0 && b->pos[t] + 1 > cap) ? cap : b->pos[t] + 1;
    return n;
}

/* Cache rows each sequence must read once: its whole context. */
static double batch_ctx(const Batch *b)
{
    double n = 0;
    for (int s = 0; s < b->n_seqs; s++) n += b->ctx_len[s];
    return n;
}

void be_attention_gqa(Backend *be, float *out, const float *q, const KVLayer *kv, const Batch *b,
                      const Batch *db, const ModelConfig *c)
{
    be_op_begin(be);
    be->ops->attention_gqa(be, out, q, kv, db, c);
    double keys = batch_keys(b, 0), H = c->n_heads, Dh = c->head_dim;
    count(be, OP_ATTENTION, 4.0 * H * Dh * keys + 5.0 * H * keys,
          (double)kv_elem_size(kv->dtype) * batch_ctx(b) * kv->kv_width + 8.0 * b->n_tokens * H * Dh);
}

void be_attention_mla(Backend *be, float *out, const float *q, const KVLayer *kv,
                      const QTensor *wkv_b, const int *topk, int ktop, const Batch *b,
                      const Batch *db, const ModelConfig *c)
{
    be_op_begin(be);
    be->ops->attention_mla(be, out, q, kv, wkv_b, topk, ktop, db, c);
    double H = c->n_heads, C = c->kv_lora_rank, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim,
           Dv = c->v_head_dim, T = b->n_tokens;
    double keys = batch_keys(b, topk ? ktop : 0);
    double flops = 2.0 * T * H * (Dn + Dv) * C            /* absorb q, expand the output */
                   + 2.0 * H * keys * (C + Dr) + 2.0 * H * keys * C + 5.0 * H * keys;
    count(be, OP_ATTENTION, flops,
          qtensor_bytes(wkv_b) + (double)kv_elem_size(kv->dtype) * batch_ctx(b) * kv->kv_width +
              4.0 * T * H * (Dn + Dr + Dv));
}

int be_mla_piece(const ModelConfig *c)
{
    const int set = (int)knob_get(KNOB_MLA_PIECE); /* 0: from the model's shape */
    if (set > 0) return set;
    double row = 4.0 * ((double)c->n_heads * (c->qk_nope_dim + c->v_head_dim) + c->kv_lora_rank + c->qk_rope_dim);
    int kc = (int)((128.0 * 1024 * 1024) / (row > 0 ? row : 1)) / 256 * 256;
    return kc < 256 ? 256 : kc > 4096 ? 4096 : kc;
}

void be_kv_gather(Backend *be, float *out, const void *cache, KVDtype dt, float scale, int width, int n,
                  const int *bt, int block_size, int j0, int rows)
{
    be_op_begin(be);
    be->ops->kv_gather(be, out, cache, dt, scale, width, n, bt, block_size, j0, rows);
    count(be, OP_ATTENTION, 0, (4.0 + kv_elem_size(dt)) * rows * n);
}

void be_attention_mla_piece(Backend *be, float *out, float *st, const float *q, const float *kv,
                            const float *kpe, int ldk, int j0, int n, int t0, int nt, const int *topk,
                            int ktop, int first, int last, const Batch *b, const Batch *db,
                            const ModelConfig *c)
{
    be_op_begin(be);
    be->ops->attention_mla_piece(be, out, st, q, kv, kpe, ldk, j0, n, t0, nt, topk, ktop, first, last, db, c);
    double H = c->n_heads, Dn = c->qk_nope_dim, Dr = c->qk_rope_dim, Dv = c->v_head_dim, keys = 0;
    /* the causal keys of each query in the piece; the indexer's selection takes its share of
     * them (its positions are on the device: the count assumes they spread evenly) */
    for (int t = t0; t < t0 + nt; t++) {
        double k = b->pos[t] + 1 - j0;
        k = k < 0 ? 0 : k > n ? n : k;
        if (topk && b->pos[t] + 1 > ktop) k *= (double)ktop / (b->pos[t] + 1);
        keys += k;
    }
    count(be, OP_ATTENTION, 2.0 * H * keys * (Dn + Dr + Dv) + 5.0 * H * keys,
          4.0 * n * (H * (Dn + Dv) + Dr) + 4.0 * nt * H * (Dn + Dr + 2.0 * Dv + 4.0));
}

void be_indexer(Backend *be, int *topk, const float *q, const float *w, const KVLayer *kv,
                const Batch *b, const Batch *db, const ModelConfig *c)
{
    be_op_begin(be);
    be->ops->indexer(be, topk, q, w, kv, db, c);
    double keys = batch_keys(b, 0), Hi = c->index_n_heads, Di = c->index_head_dim;
    count(be, OP_INDEXER, 2.0 * Hi * Di * keys + 3.0 * Hi * keys,
          (double)kv_elem_size(kv->dtype) * batch_ctx(b) * Di + 4.0 * b->n_tokens * (Hi * Di + Hi) +
              4.0 * b->n_tokens * c->index_topk);
}

void backend_free(Backend *be)
{
    RepeatOps *r = repeat_ops(be);
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    free(r);
    *be = (Backend){0};
}

void be_argmax(Backend *be, int *out, const float *x, int rows, int n)
{
    be_op_begin(be);
    be->ops->argmax(be, out, x, rows, n);
    count(be, OP_SAMPLE, (double)rows * n, 4.0 * rows * n + 4.0 * rows);
}

void be_sample(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params)
{
    be_op_begin(be);
    be->ops->sample(be, out, logits, rows, V, params);
    /* a max, an exponential and a compare an element; the logits read once, the ids written */
    count(be, OP_SAMPLE, 4.0 * rows * V, 4.0 * rows * V + (sizeof(SampleRow) + 4.0) * rows);
}

/* ---- opening a backend ---- */

const char *backend_default(void)
{
#ifdef MOESERVE_CUDA
    if (cuda_device_count() > 0) return "cuda";
#endif
    return "cpu";
}

int backend_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void backend_omp_passive(char **argv)
{
    /* libgomp reads its environment when it is loaded, before main: the policy takes effect
     * only in a fresh image of this program, so set it and start again (once: it is set then) */
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* no /proc: the spinning default stays */
}

OptGroup device_opt_group(DeviceOpts *o)
{
    OPT_GROUP_RETURN("device",
        {.names = "--device", .type = OPT_STR, .dst = &o->device, .metavar = "cpu|cuda|cuda:N|sim:GPU",
         .help = "where the model runs; sim:GPU (h100, h200) a modelled GPU: nothing computed, each op "
                 "takes its modelled time",
         .def = "cuda when a GPU is present, else cpu"},
        {.names = "--threads", .type = OPT_INT, .dst = &o->threads, .metavar = "N",
         .help = "CPU threads of the cpu backend",
         .def = "the CPUs this process may use, shared by the ranks of a machine", .lo = 1, .hi = 4096});
}

void backend_open(Backend *be, const char *device, int threads)
{
    if (!device) device = backend_default();
    if (!strcmp(device, "cpu")) {
        if (threads <= 0) {
            threads = backend_cpu_count(); /* the CPUs this process may run on (taskset, cgroups' cpusets) */
            /* several ranks on this node share its cores, or they starve each other */
            const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
            if (local && atoi(local) > 1) threads = threads / atoi(local) > 1 ? threads / atoi(local) : 1;
        }
        backend_cpu_init(be, threads);
        backend_repeat_gemms(be, test_hook_gemm_repeat());
        return;
    }
    if (!strncmp(device, "cuda", 4)) {
        int index = 0;
        if (device[4] == ':') index = atoi(device + 5);
        else if (device[4]) fatal("--device '%s': expected cpu, cuda, cuda:N or sim:GPU", device);
#ifdef MOESERVE_CUDA
        backend_cuda_init(be, index);
        char name[256];
        cuda_device_name(index, name, sizeof name);
        log_info("device: %s", name);
        backend_repeat_gemms(be, test_hook_gemm_repeat());
        return;
#else
        (void)index;
        fatal("--device %s: this moeserve was built without CUDA (nvcc was not found at build time)", device);
#endif
    }
    if (!strncmp(device, "sim:", 4)) {
        backend_sim_open(be, device + 4);
        return;
    }
    fatal("--device '%s': expected cpu, cuda, cuda:N or sim:GPU", device);
}

void backend_describe(const Backend *be, const char *device, char *buf, size_t n)
{
    if (!strcmp(be->name, "cpu")) {
        snprintf(buf, n, "cpu (%d threads)", be->n_threads);
        return;
    }
    if (backend_is_sim(be)) {
        snprintf(buf, n, "%s (modelled: nothing computed)", device ? device : "sim");
        return;
    }
#ifdef MOESERVE_CUDA
    int index = device && device[4] == ':' ? atoi(device + 5) : 0;
    cuda_device_name(index, buf, n);
#else
    (void)device;
    snprintf(buf, n, "%s", be->name);
#endif
}
