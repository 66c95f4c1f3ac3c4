/* cuda: the CUDA backend's state, memory and op table (cuda.h). One stream per backend; every
 * op is asynchronous on it; copies to the host synchronise. Device memory comes from
 * cudaMalloc at start-up (weights, KV pool, activations) plus grow-only scratch buffers that
 * reach their size on the first steps. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "w4.h"

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: clear the sticky error */
        return 0;
    }
    return n;
}

extern "C" void cuda_device_name(int device, char *buf, size_t n)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        snprintf(buf, n, "CUDA device %d (unavailable)", device);
        return;
    }
    snprintf(buf, n, "%s, %d SMs, %.1f GiB, sm_%d%d", p.name, p.multiProcessorCount,
             p.totalGlobalMem / (1024.0 * 1024 * 1024), p.major, p.minor);
}

void cuda_launch_check(const char *kernel, const char *file, int line)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) util_die(file, line, "CUDA: launch of %s: %s", kernel, cudaGetErrorString(e));
    if (knob_get(KNOB_SYNC)) {
        e = cudaDeviceSynchronize();
        if (e != cudaSuccess) util_die(file, line, "CUDA: %s failed: %s", kernel, cudaGetErrorString(e));
    }
}

/* slot of scratch set `set` (0 the stream's, 1 the side's), grown to at least bytes */
static void *scratch_of_set(CudaState *s, int set, int slot, size_t bytes)
{
    if (bytes > s->scratch_cap[set][slot]) {
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        CUDA_CHECK(cudaStreamSynchronize(s->stream3));
        if (s->scratch[set][slot]) CUDA_CHECK(cudaFree(s->scratch[set][slot]));
        size_t cap = bytes + bytes / 4 + 256;
        CUDA_CHECK(cudaMalloc(&s->scratch[set][slot], cap));
        s->scratch_cap[set][slot] = cap;
        s->scratch_epoch++; /* graphs captured on the old buffer must not run */
    }
    return s->scratch[set][slot];
}

void *cuda_scratch(Backend *be, int slot, size_t bytes) { return scratch_of_set(cuda_state(be), cuda_state(be)->on_side, slot, bytes); }

static void *cuda_alloc(Backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        die("CUDA: out of device memory allocating %.2f GiB (%.2f GiB free of %.2f GiB)", bytes / 1073741824.0,
            fr / 1073741824.0, tot / 1073741824.0);
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream(be)));
    return p;
}

static void cuda_free(Backend *be, void *p)
{
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
    CUDA_CHECK(cudaFree(p));
}

static void cuda_to_host(Backend *be, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}

static void cuda_to_device(Backend *be, void *dst, const void *src, size_t bytes)
{
    /* host memory is pageable: the copy is complete for the source when this returns */
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream(be)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}

static void cuda_destroy(Backend *be)
{
    CudaState *s = cuda_state(be);
    if (!s) return;
    cudaStreamSynchronize(s->stream);
    cudaStreamSynchronize(s->stream3);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++)
            if (s->scratch[k][i]) cudaFree(s->scratch[k][i]);
        if (s->lt_ws[k]) cudaFree(s->lt_ws[k]);
    }
    if (s->lt) cublasLtDestroy(s->lt);
    cudaStreamDestroy(s->stream);
    cudaStreamDestroy(s->stream3);
    cudaEventDestroy(s->fork3);
    cudaEventDestroy(s->join3);
    cudaStreamDestroy(s->side);
    cudaStreamDestroy(s->side2);
    cudaEventDestroy(s->fork);
    cudaEventDestroy(s->join);
    cudaEventDestroy(s->join2);
    free(s);
    be->impl = NULL;
}

static void cuda_reserve(Backend *be, const ModelConfig *c, int T, int max_out, int max_ctx);
static void cuda_graph_begin(Backend *be);
static void *cuda_graph_end(Backend *be);
static int cuda_graph_launch(Backend *be, void *graph);
static void cuda_graph_free(Backend *be, void *graph);

static size_t cuda_mem_free(Backend *be)
{
    (void)be;
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    return fr;
}

static void cuda_bind_thread(Backend *be) { CUDA_CHECK(cudaSetDevice(cuda_state(be)->device)); }

extern "C" void *cuda_stream_of(Backend *be) { return (void *)cuda_stream(be); }

/* the GPUs this process sees and whether each pair can reach the other directly (P2P) */
extern "C" void cuda_p2p_summary(char *buf, size_t n)
{
    int count = cuda_device_count(), pairs = 0, p2p = 0;
    for (int a = 0; a < count; a++)
        for (int b = 0; b < count; b++) {
            if (a == b) continue;
            int ok = 0;
            if (cudaDeviceCanAccessPeer(&ok, a, b) == cudaSuccess) p2p += ok != 0;
            pairs++;
        }
    cudaGetLastError();
    if (count < 2) snprintf(buf, n, "%d GPU: no peer to reach", count);
    else snprintf(buf, n, "%d GPUs, P2P between %d of %d ordered pairs%s", count, p2p, pairs,
                  p2p == pairs ? " (all)" : p2p == 0 ? " (none: through host memory)" : "");
}

static __global__ void delay_kernel(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

/* a kernel that keeps the stream busy for about us microseconds (the test hook MOESERVE_TEST_COMM_DELAY_US) */
extern "C" void cuda_delay_us(Backend *be, int us)
{
    int khz = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, cuda_state(be)->device));
    delay_kernel<<<1, 1, 0, cuda_stream(be)>>>((long long)us * (khz > 0 ? khz : 1500000) / 1000);
    LAUNCH_CHECK("delay_kernel");
}

static void *cuda_event_create(Backend *be)
{
    (void)be;
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return (void *)e;
}

static void cuda_event_record(Backend *be, void *e) { CUDA_CHECK(cudaEventRecord((cudaEvent_t)e, cuda_stream(be))); }

static double cuda_event_elapsed(Backend *be, void *from, void *to)
{
    (void)be;
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)to));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to));
    return ms;
}

static void cuda_event_destroy(Backend *be, void *e)
{
    (void)be;
    cudaEventDestroy((cudaEvent_t)e);
}

/* ---- the model's side (be_side_begin) ----
 * At decode sizes some pieces of a layer are a chain of small launches and first loads that the
 * layer's other work can hide, as SGLang runs the shared experts on an alternate stream: the MoE
 * layers' shared expert beside the router and the routed experts (on GLM-5 7 + 3.5 MB that a
 * chain reads in ~13 us on the H200 where its bytes take ~3), and GLM-5's indexer (three small
 * GEMMs, two ropes, a norm, its cache write and its scores) beside the query and latent path.
 * Each up to its rows a step (MOESERVE_SHARED_SIDE, MOESERVE_INDEXER_SIDE; 0: never; at most
 * 1024, so that the side's scratch stays small); above them the ops run in order. */
static int cuda_side_rows(int kind)
{
    return (int)knob_get(kind == SIDE_SHARED_EXPERT ? KNOB_SHARED_SIDE : KNOB_INDEXER_SIDE);
}

extern "C" long cuda_side_calls(Backend *be) { return cuda_state(be)->side_calls; }

static int cuda_side_begin(Backend *be, int T, int kind)
{
    CudaState *s = cuda_state(be);
    if (s->on_side || kind < 0 || kind >= SIDE_KINDS || T < 1 || T > cuda_side_rows(kind)) return 0;
    CUDA_CHECK(cudaEventRecord(s->fork3, s->stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->stream3, s->fork3, 0));
    s->on_side = 1;
    s->side_calls++;
    return 1;
}

static void cuda_side_end(Backend *be)
{
    CudaState *s = cuda_state(be);
    CHECK(s->on_side, "cuda: side_end without side_begin");
    CUDA_CHECK(cudaEventRecord(s->join3, s->stream3));
    s->on_side = 0;
}

static void cuda_side_join(Backend *be)
{
    CudaState *s = cuda_state(be);
    CHECK(!s->on_side, "cuda: side_join before side_end");
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->join3, 0));
}

static const BackendOps cuda_ops = {
    cuda_alloc, cuda_free, cuda_destroy, fill_cuda, embed_cuda, rmsnorm_cuda, layernorm_cuda, rope_cuda, add_cuda,
    get_rows_cuda, cuda_to_host, cuda_to_device, swiglu_cuda, kv_write_cuda, matmul_cuda, router_cuda,
    moe_cuda, attention_gqa_cuda, attention_mla_cuda, kv_gather_cuda, attention_mla_piece_cuda, indexer_cuda,
    argmax_cuda, sample_cuda, cuda_reserve, cuda_graph_begin, cuda_graph_end, cuda_graph_launch, cuda_graph_free,
    cuda_mem_free, w4_pack_cuda, cuda_bind_thread,
    cuda_event_create, cuda_event_record, cuda_event_elapsed, cuda_event_destroy,
    cuda_side_begin, cuda_side_end, cuda_side_join,
};

extern "C" void backend_cuda_init(Backend *be, int device)
{
    int n = cuda_device_count();
    if (n == 0) fatal("--device cuda: no CUDA device is available (no driver, or no GPU)");
    if (device < 0 || device >= n) fatal("--device cuda: device %d does not exist (%d found)", device, n);
    CUDA_CHECK(cudaSetDevice(device));
    CudaState *s = (CudaState *)xcalloc(1, sizeof *s);
    s->device = device;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->side2, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->join2, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream3, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->fork3, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->join3, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasLtCreate(&s->lt));
    s->lt_ws_size = 32u << 20;
    for (int k = 0; k < 2; k++) CUDA_CHECK(cudaMalloc(&s->lt_ws[k], s->lt_ws_size));
    *be = (Backend){};
    be->name = "cuda";
    be->host_memory = 0;
    be->ops = &cuda_ops;
    be->n_threads = 1;
    be->impl = s;
    s->sync = knob_get(KNOB_SYNC) != 0;
    w4_load_cached(device);
    w4_wg_supported(device); /* its probe launch and copy now, never first inside a graph capture */
}

/* ---- graphs and scratch reservation ---- */

static void cuda_graph_begin(Backend *be)
{
    CUDA_CHECK(cudaStreamBeginCapture(cuda_stream(be), cudaStreamCaptureModeThreadLocal));
}

typedef struct {
    cudaGraphExec_t x;
    unsigned epoch;        /* the scratch epoch it was captured in */
} CudaGraph;

static void *cuda_graph_end(Backend *be)
{
    cudaGraph_t g;
    CudaGraph *cg = (CudaGraph *)xcalloc(1, sizeof *cg);
    CUDA_CHECK(cudaStreamEndCapture(cuda_stream(be), &g));
    CUDA_CHECK(cudaGraphInstantiate(&cg->x, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    cg->epoch = cuda_state(be)->scratch_epoch;
    return cg;
}

static int cuda_graph_launch(Backend *be, void *graph)
{
    CudaGraph *cg = (CudaGraph *)graph;
    if (cg->epoch != cuda_state(be)->scratch_epoch) return -1;
    CUDA_CHECK(cudaGraphLaunch(cg->x, cuda_stream(be)));
    if (cuda_state(be)->sync) CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
    return 0;
}

static void cuda_graph_free(Backend *be, void *graph)
{
    CudaGraph *cg = (CudaGraph *)graph;
    cudaStreamSynchronize(cuda_stream(be));
    cudaGraphExecDestroy(cg->x);
    free(cg);
}

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }
static int64_t lmax(int64_t a, int64_t b) { return a > b ? a : b; }
/* the W4A16 split-K partials: w4_mma_splits keeps splits x T x N under 2 x 16 x SMs x 512 floats */
static size_t w4_part_bytes(int sms) { return (size_t)2 * 16 * sms * 512 * sizeof(float); }

/* The side's scratch set (cuda_side_begin), at up to each kind's rows: the shared expert's
 * GEMMs (K and N up to D and 2 Fs), the indexer's (up to D, the q LoRA rank and its heads x head
 * dimension) and its scores. */
static void cuda_reserve_side(Backend *be, const ModelConfig *c, int T, int max_ctx, int sms)
{
    int64_t D = c->hidden, Fs = (int64_t)c->moe_intermediate * c->n_shared_experts, kn = 0, wb = 0;
    int se = c->n_shared_experts > 0 ? imin(T, cuda_side_rows(SIDE_SHARED_EXPERT)) : 0;
    int ix = c->index_n_heads > 0 ? imin(T, cuda_side_rows(SIDE_INDEXER)) : 0, sr = imax(se, ix);
    if (sr <= 0) return;
    if (se > 0) kn = lmax(D, 2 * Fs);
    if (ix > 0) kn = lmax(kn, lmax(lmax(D, c->q_lora_rank), (int64_t)c->index_n_heads * c->index_head_dim));
    const int lt = w4_lt_rows(0, cuda_state(be)->device); /* the cuBLASLt route's BF16 weight, from lt rows */
    if (lt > 0 && se >= lt) wb = 2 * Fs * D;
    if (lt > 0 && ix >= lt) wb = lmax(wb, lmax((int64_t)c->index_n_heads * c->index_head_dim * c->q_lora_rank, (int64_t)c->index_head_dim * D));
    CudaState *s = cuda_state(be);
    scratch_of_set(s, 1, SCR_MM_X, (size_t)2 * sr * kn * 2);
    scratch_of_set(s, 1, SCR_MM_Y, (size_t)2 * sr * kn * 4);
    scratch_of_set(s, 1, SCR_W4_X, (size_t)2 * sr * kn * 2);
    scratch_of_set(s, 1, SCR_W4_PART, w4_part_bytes(sms));
    if (wb > 0) scratch_of_set(s, 1, SCR_W4_WB, (size_t)wb * 2);
    if (ix > 0) scratch_of_set(s, 1, SCR_IDX_SCORES, (size_t)ix * max_ctx * 4);
}

/* The scratch each op needs at these limits (see the cuda_scratch calls of the op files). */
static void cuda_reserve(Backend *be, const ModelConfig *c, int T, int max_out, int max_ctx)
{
    int kmax = imax(imax(c->hidden, c->n_heads * imax(c->head_dim, c->v_head_dim)),
                    imax(imax(c->intermediate, c->moe_intermediate * imax(c->n_shared_experts, 1)),
                         imax(c->q_lora_rank, c->kv_lora_rank)));
    int nmax = imax(imax(c->n_heads * imax(c->head_dim, c->qk_nope_dim + c->qk_rope_dim), c->intermediate),
                    imax(c->n_heads * (c->qk_nope_dim + c->v_head_dim), imax(c->hidden, c->n_experts)));
    /* the expanded MLA form's GEMM (model/mla.c): a piece of up to be_mla_piece cached
     * positions through kv_b_proj, more rows than a step's tokens when the chunks are short */
    int piece = c->kv_lora_rank > 0 ? be_mla_piece(c) : 0;
    int gm = imax(T, piece < max_ctx ? piece : max_ctx); /* GEMM rows other than lm_head's */
    int rows = imax(gm, max_out);
    cuda_scratch(be, SCR_MM_X, (size_t)2 * rows * kmax * 2);
    cuda_scratch(be, SCR_MM_Y, (size_t)2 * max_out * c->vocab * 4 > (size_t)2 * gm * nmax * 4
                                   ? (size_t)2 * max_out * c->vocab * 4 : (size_t)2 * gm * nmax * 4);
    if (c->n_experts > 0) {
        int E = c->n_experts, P = T * c->n_experts_per_tok;
        cuda_scratch(be, SCR_MOE_COUNT, (size_t)(4 * E + 3 * (3 + 2 * (P + E))) * 4); /* w4: three classes' lists */
        cuda_scratch(be, SCR_MOE_ROWS, (size_t)P * 4);
        cuda_scratch(be, SCR_MOE_H, (size_t)P * c->moe_intermediate * 4);
        cuda_scratch(be, SCR_MOE_U, (size_t)P * c->moe_intermediate * 4);
        cuda_scratch(be, SCR_MOE_Y, (size_t)P * c->hidden * 4);
    }
    /* the W4A16 kernels: BF16 activations, and split-K partials (w4_mma_splits keeps
     * splits x T x N under 2 x 16 x SMs x 512 floats) */
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cuda_state(be)->device));
    cuda_scratch(be, SCR_W4_X, (size_t)2 * rows * imax(kmax, c->hidden) * 2); /* hi and lo halves */
    cuda_scratch(be, SCR_W4_PART, w4_part_bytes(sms));
    /* the MoE's hot class beside an mma.sync tile and its small class beside a wgmma tile (w4_moe.cu): the
     * activations again, in the other order, for calls of up to 2048 tokens */
    if (c->n_experts > 0) cuda_scratch(be, SCR_W4_XP, (size_t)2 * (T < 2048 ? T : 2048) * c->hidden * 2);
    if (c->index_n_heads > 0) cuda_scratch(be, SCR_IDX_SCORES, (size_t)T * max_ctx * 4);
    mla_decode_reserve(be, c, T); /* the absorbed MLA kernels' q, latent output and split partials */
    if (c->n_kv_heads > 0 && c->kv_lora_rank <= 0) gqa_reserve(be, c, T); /* GQA's split partials */
    /* the expanded form's top-k mask of a piece: a bit a (query, cached position) */
    if (piece > 0 && c->index_n_heads > 0) cuda_scratch(be, SCR_MLA_MASK, (size_t)T * cdiv(piece, 32) * 4);
    /* and its keys and values as BF16 halves (mla_prefill_tc128_staged: as large as the expanded piece) */
    if (piece > 0) mla_prefill_reserve(be, c, piece < max_ctx ? piece : max_ctx);
    cuda_reserve_side(be, c, T, max_ctx, sms);
    /* prefill's BF16 copy of the largest dense weight (w4_matmul_lt), when a step can be that long */
    if (w4_lt_rows(0, cuda_state(be)->device) > 0 && gm >= w4_lt_rows(0, cuda_state(be)->device)) {
        int64_t D = c->hidden, Fs = (int64_t)c->moe_intermediate * c->n_shared_experts, H = c->n_heads;
        int64_t shapes[][2] = {{c->intermediate, D}, {Fs, D}, {H * (c->qk_nope_dim + c->qk_rope_dim), imax(c->q_lora_rank, 1)},
                               {D, H * imax(c->v_head_dim, c->head_dim)}, {H * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank},
                               {c->kv_lora_rank + c->qk_rope_dim, D}, {c->q_lora_rank, D}, {H * c->head_dim, D}};
        int64_t nk = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            if (shapes[i][0] * shapes[i][1] > nk) nk = shapes[i][0] * shapes[i][1];
        cuda_scratch(be, SCR_W4_WB, (size_t)nk * 2);
    }
}
