/* sample: the sample op on the GPU (be_sample, backend.h), the twin of sample_cpu and of its
 * definition sample_row (cpu/sample.c). One block per row of logits [rows, V] (float32, rows V
 * apart); params [rows] and the ids out [rows] in device memory; no scratch memory, no copy.
 *  - greedy: a block argmax (ties to the lowest id, NaN never wins);
 *  - no filter: thread t sums the softmax weights of the ids of its contiguous slice in double,
 *    thread 0 scans the slice sums in id order, and the thread whose slice holds u * sum walks it
 *    again to the first id whose running weight exceeds it;
 *  - filters: the order (logit desc, id asc) is that of a 64-bit key, the logit's order-keeping
 *    bits above the complemented id, so every cut is a radix select over the keys (8-bit digits
 *    from the top, a shared-memory histogram a digit, done when the chosen digit holds one key):
 *    by count for top-k, by probability mass for top-p and for the draw itself, the first kept
 *    key whose running mass exceeds u times the kept mass. Nothing is sorted, and V (154880 for
 *    GLM) need not fit in shared memory.
 * Masses on the filtered path are fixed point, weight * 2^S with S such that V weights <= 1 fit
 * 64 bits: their sums are exact whatever the order, so a row draws the same token on every run.
 * They differ from sample_row's double sums by less than V * 2^-S of the candidates' total
 * (2^-46 * 154880 = 2e-9 for GLM), which decides a token only when u * mass lies that close to a
 * boundary between two tokens. Speed: not measured yet (no GPU where this was written). */
#include "common.cuh"

#define SAMPLE_THREADS 512      /* a block, one row */
#define SAMPLE_DIGITS 256       /* 8-bit digits of the radix select */

typedef struct {
    float best;                 /* the largest logit (not NaN) */
    int best_id;                /* its lowest id, -1 if every logit is NaN */
    int n;                      /* logits not NaN */
    int any_nan;
    int last;                   /* the highest id whose logit is not NaN, -1 if none */
} SampleStats;

typedef struct {
    unsigned cnt[SAMPLE_DIGITS];                /* keys a digit value */
    unsigned long long mass[SAMPLE_DIGITS];     /* their fixed-point mass */
    unsigned long long key[SAMPLE_DIGITS];      /* one of their keys (the key when cnt is 1) */
    double part[SAMPLE_THREADS + 1];            /* no filter: slice sums, then their prefix sums */
    SampleStats ws[32];                         /* a warp's partial stats */
    unsigned long long wu[32];                  /* a warp's partial sum */
    SampleStats stats;
    unsigned long long prefix, mask, acc, found, total;
    int done;
} SampleSmem;

/* What the weight of a logit and the filters depend on, for one row. */
typedef struct {
    const float *x;             /* [V] the row */
    int V;
    double mx;                  /* the largest logit */
    double T;                   /* temperature */
    double scale;               /* 2^S, the fixed point of masses */
    unsigned long long lo;      /* top-k: candidates are the keys >= lo */
    unsigned long long lo_p;    /* top-p: kept keys are >= lo_p too */
    int use_min_p;
    double sum;                 /* the candidates' total weight (min-p) */
    double min_lim;             /* min-p: kept when weight / sum is not below this */
} SampleCut;

/* The logit's bits, ordered as the floats are; -0 as +0 (equal logits tie by id). */
__device__ __forceinline__ unsigned sample_fbits(float v)
{
    unsigned b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* larger key = earlier in (logit desc, id asc) */
__device__ __forceinline__ unsigned long long sample_key(float v, int i)
{
    return ((unsigned long long)sample_fbits(v) << 32) | (unsigned)~(unsigned)i;
}

__device__ __forceinline__ int sample_key_id(unsigned long long k) { return (int)~(unsigned)k; }

/* a candidate's weight, as sample_row rounds it: float(exp((x - max) / T)) */
__device__ __forceinline__ float sample_weight(const SampleCut &c, float v)
{
    return (float)exp(((double)v - c.mx) / c.T);
}

__device__ __forceinline__ SampleStats sample_stats_join(SampleStats a, SampleStats b)
{
    if (b.best_id >= 0 && (a.best_id < 0 || b.best > a.best || (b.best == a.best && b.best_id < a.best_id))) {
        a.best = b.best;
        a.best_id = b.best_id;
    }
    a.n += b.n;
    a.any_nan |= b.any_nan;
    a.last = max(a.last, b.last);
    return a;
}

/* The row's stats, in every thread. */
__device__ SampleStats sample_stats(const float *x, int V, SampleSmem &sh)
{
    SampleStats s = {-INFINITY, -1, 0, 0, -1};
    for (int i = threadIdx.x; i < V; i += blockDim.x) { /* thread t: ids t, t + blockDim, ... */
        float v = x[i];
        if (v != v) { s.any_nan = 1; continue; }
        if (s.best_id < 0 || v > s.best) { s.best = v; s.best_id = i; }
        s.n++;
        s.last = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        SampleStats t = {__shfl_xor_sync(0xffffffff, s.best, o), __shfl_xor_sync(0xffffffff, s.best_id, o),
                         __shfl_xor_sync(0xffffffff, s.n, o), __shfl_xor_sync(0xffffffff, s.any_nan, o),
                         __shfl_xor_sync(0xffffffff, s.last, o)};
        s = sample_stats_join(s, t);
    }
    if ((threadIdx.x & 31) == 0) sh.ws[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) s = sample_stats_join(s, sh.ws[w]);
        sh.stats = s;
    }
    __syncthreads();
    return sh.stats;
}

/* Block-wide sum of an integer, in every thread (exact: the order does not matter). */
__device__ unsigned long long sample_sum(unsigned long long v, SampleSmem &sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if ((threadIdx.x & 31) == 0) sh.wu[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) v += sh.wu[w];
        sh.total = v;
    }
    __syncthreads();
    unsigned long long r = sh.total;
    __syncthreads();
    return r;
}

/* The key of logit i if it takes part (-> 1), with its fixed-point mass in *q when by_mass:
 * a candidate (not NaN, key >= lo), and when kept is set also kept by top-p and min-p. */
__device__ __forceinline__ int sample_take(const SampleCut &c, int i, int kept, int by_mass, unsigned long long *key,
                                           unsigned long long *q)
{
    float v = c.x[i];
    if (v != v) return 0;
    unsigned long long k = sample_key(v, i);
    if (k < c.lo || (kept && k < c.lo_p)) return 0;
    *key = k;
    if (by_mass || (kept && c.use_min_p)) {
        float e = sample_weight(c, v);
        /* min-p as sample_row writes it: prob < min_p * (largest prob) drops the token */
        if (kept && c.use_min_p && (double)e / c.sum < c.min_lim) return 0;
        *q = __double2ull_rn((double)e * c.scale);
    }
    return 1;
}

/* Radix select: among the keys sample_take admits, walked in descending order, the first at
 * which the running weight (1 a key, or its mass when by_mass) reaches target (1 <= target <=
 * the total weight). Returns its key, in every thread. */
__device__ unsigned long long sample_select(const SampleCut &c, int kept, int by_mass, unsigned long long target,
                                            SampleSmem &sh)
{
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.mask = 0;
        sh.acc = 0;          /* weight of the keys above the prefix's range */
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < SAMPLE_DIGITS; d += blockDim.x) { /* thread d: digit d */
            sh.cnt[d] = 0;
            sh.mass[d] = 0;
        }
        __syncthreads();
        unsigned long long prefix = sh.prefix, mask = sh.mask;
        for (int i = threadIdx.x; i < c.V; i += blockDim.x) { /* thread t: ids t, t + blockDim, ... */
            unsigned long long k, q = 0;
            if (!sample_take(c, i, kept, by_mass, &k, &q) || (k & mask) != prefix) continue;
            int d = (int)(k >> shift) & (SAMPLE_DIGITS - 1);
            atomicAdd(&sh.cnt[d], 1u);
            if (by_mass) atomicAdd(&sh.mass[d], q);
            sh.key[d] = k;
        }
        __syncthreads();
        if (threadIdx.x == 0) { /* the digit, from the top, at which the running weight reaches target */
            unsigned long long acc = sh.acc;
            int d, lowest = -1;
            for (d = SAMPLE_DIGITS - 1; d >= 0; d--) {
                if (!sh.cnt[d]) continue;
                lowest = d;
                unsigned long long w = by_mass ? sh.mass[d] : sh.cnt[d];
                if (acc + w >= target) break;
                acc += w;
            }
            if (d < 0) d = lowest < 0 ? 0 : lowest; /* target above the total: not reached by the callers */
            sh.acc = acc;
            sh.prefix |= (unsigned long long)d << shift;
            sh.mask |= (unsigned long long)(SAMPLE_DIGITS - 1) << shift;
            sh.found = sh.key[d];
            sh.done = sh.cnt[d] <= 1; /* keys are distinct: one key left is the answer */
        }
        __syncthreads();
        if (sh.done) break;
    }
    unsigned long long r = sh.found;
    __syncthreads();
    return r;
}

/* block r: out[r] = the token sample_row draws from logits[r, :V] with params[r] */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(int *out, const float *logits, int V, const SampleRow *params)
{
    __shared__ SampleSmem sh;
    const float *x = logits + (int64_t)blockIdx.x * V;
    const SampleRow p = params[blockIdx.x];
    SampleStats st = sample_stats(x, V, sh);
    if (p.temperature == 0) { /* greedy; sample_row gives the last id when every logit is NaN */
        if (threadIdx.x == 0) out[blockIdx.x] = st.n ? st.best_id : V - 1;
        return;
    }
    if (st.n == 0) {
        if (threadIdx.x == 0) out[blockIdx.x] = 0;
        return;
    }
    double T = p.temperature, mx = st.best;
    if ((p.top_k <= 0 || p.top_k >= V) && p.top_p >= 1 && p.min_p <= 0) {
        /* no filter. A NaN logit or an infinite largest one makes sample_row's sum NaN, and its
         * walk then ends on the last id that is not NaN. */
        if (st.any_nan || isinf(st.best)) {
            if (threadIdx.x == 0) out[blockIdx.x] = st.last;
            return;
        }
        int per = (V + blockDim.x - 1) / blockDim.x;
        int i0 = min((int)threadIdx.x * per, V), i1 = min(i0 + per, V); /* thread t: ids [t*per, (t+1)*per) */
        double part = 0;
        for (int i = i0; i < i1; i++) part += exp(((double)x[i] - mx) / T);
        sh.part[threadIdx.x] = part;
        __syncthreads();
        if (threadIdx.x == 0) { /* in order, so that part[t + 1] is exactly part[t] + slice t's sum */
            double run = 0;
            for (int t = 0; t < (int)blockDim.x; t++) {
                double s = sh.part[t];
                sh.part[t] = run;
                run = run + s;
            }
            sh.part[blockDim.x] = run;
        }
        __syncthreads();
        double u = (double)p.u * sh.part[blockDim.x], base = sh.part[threadIdx.x];
        /* exactly one slice has base <= u < next base (u < the total as p.u < 1); its walk ends
         * by its last id at the latest, where base + acc is that next base */
        if (base <= u && u < sh.part[threadIdx.x + 1]) {
            double acc = 0;
            for (int i = i0; i < i1; i++) {
                acc += exp(((double)x[i] - mx) / T);
                if (u < base + acc) {
                    out[blockIdx.x] = i;
                    break;
                }
            }
        }
        return;
    }
    int k = p.top_k > 0 && p.top_k < V ? p.top_k : V, n = min(k, st.n);
    int bits = 0;
    while ((1ll << bits) < V) bits++;
    SampleCut c = {x, V, mx, T, ldexp(1.0, 63 - bits), 0, 0, 0, 0, 0};
    if (isinf(st.best)) { /* sample_row's weights are NaN: its walk ends on the n-th candidate */
        unsigned long long key = sample_select(c, 0, 0, (unsigned long long)n, sh);
        if (threadIdx.x == 0) out[blockIdx.x] = sample_key_id(key);
        return;
    }
    if (n < st.n) c.lo = sample_select(c, 0, 0, (unsigned long long)n, sh); /* top-k: the n-th key */
    unsigned long long q = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        unsigned long long key, qi;
        if (sample_take(c, i, 0, 1, &key, &qi)) q += qi;
    }
    unsigned long long total = sample_sum(q, sh);
    if (p.top_p < 1) { /* the first key at which the running mass reaches top_p of the total */
        double want = ceil((double)p.top_p * (double)total);
        unsigned long long t = want < 1 ? 1 : want >= (double)total ? total : (unsigned long long)want;
        c.lo_p = sample_select(c, 0, 1, t, sh);
    }
    if (p.min_p > 0) {
        c.use_min_p = 1;
        c.sum = (double)total / c.scale;
        c.min_lim = (double)p.min_p * (1.0 / c.sum); /* the largest weight is exp(0) = 1 */
    }
    q = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        unsigned long long key, qi;
        if (sample_take(c, i, 1, 1, &key, &qi)) q += qi;
    }
    unsigned long long kept = sample_sum(q, sh);
    /* the first kept key whose running mass exceeds u * kept, i.e. reaches floor(u * kept) + 1 */
    double want = floor((double)p.u * (double)kept) + 1;
    unsigned long long t = want >= (double)kept ? kept : (unsigned long long)want;
    unsigned long long key = sample_select(c, 1, 1, t, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = sample_key_id(key);
}

void sample_cuda(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params)
{
    if (!rows) return;
    sample_kernel<<<rows, SAMPLE_THREADS, 0, cuda_stream(be)>>>(out, logits, V, params);
    LAUNCH_CHECK("sample_kernel");
}
