/* elementwise: embedding, norms, RoPE, residual add, row gather, SwiGLU and the KV-cache write
 * on the CPU. Each matches Hugging Face transformers' float32 numerics in operation order (e.g.
 * GlmMoeDsaRMSNorm: mean of squares, times rsqrt(mean + eps), then times the weight). */
#include <math.h>
#include <string.h>

#include "../fill.h"
#include "cpu.h"

void embed_cpu(Backend *be, float *out, const int *tokens, int T, const QTensor *emb)
{
    int64_t D = emb->cols;
#pragma omp parallel for num_threads(be->n_threads) if (T > 16)
    for (int t = 0; t < T; t++) qtensor_decode(emb, tokens[t], 0, D, out + (int64_t)t * D);
}

/* HF GlmMoeDsaRMSNorm: x * rsqrt(mean(x^2) + eps), then weight * that. */
void rmsnorm_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                 int rows, int dim, float eps)
{
#pragma omp parallel for num_threads(be->n_threads) if ((int64_t)rows * dim > 65536)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * ldx;
        float *o = out + (int64_t)r * ldo;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* nn.LayerNorm: (x - mean) / sqrt(var + eps) * w + b, biased variance. */
void layernorm_cpu(Backend *be, float *out, int ldo, const float *x, int ldx, const float *w,
                   const float *b, int rows, int dim, float eps)
{
#pragma omp parallel for num_threads(be->n_threads) if ((int64_t)rows * dim > 65536)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * ldx;
        float *o = out + (int64_t)r * ldo;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        var /= dim;
        float inv = 1.0f / sqrtf((float)var + eps);
        for (int i = 0; i < dim; i++) o[i] = (float)(xr[i] - mean) * inv * w[i] + b[i];
    }
}

/* The angle is pos * inv_freq[i] in float32, as transformers computes it. */
void rope_cpu(Backend *be, float *x, int ld, int T, int n_heads, int head_stride, int rot_off,
              int rot_dim, const int *pos, const float *inv_freq, float scale, int interleave)
{
    int half = rot_dim / 2;
#pragma omp parallel for num_threads(be->n_threads) if (T > 16)
    for (int t = 0; t < T; t++) {
        float *cs = cpu_scratch(1, 2 * half * sizeof(float)), *sn = cs + half;
        for (int i = 0; i < half; i++) {
            float a = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(a) * scale;
            sn[i] = sinf(a) * scale;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (int64_t)t * ld + (int64_t)h * head_stride + rot_off;
            for (int i = 0; i < half; i++) {
                /* interleaved: the pair (2i, 2i+1); NeoX: (i, i + half) */
                int i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + half;
                float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * cs[i] - x1 * sn[i];
                v[i1] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
}

void add_cpu(Backend *be, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for num_threads(be->n_threads) if (n > 65536)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void get_rows_cpu(Backend *be, float *out, const float *x, int ld, const int *rows, int n, int dim)
{
    (void)be;
    for (int i = 0; i < n; i++) memmove(out + (int64_t)i * dim, x + (int64_t)rows[i] * ld, dim * sizeof(float));
}

/* silu(g) * u = g * sigmoid(g) * u */
void swiglu_cpu(Backend *be, float *out, const float *gate, const float *up, int ld, int T, int F)
{
    int64_t n = (int64_t)T * F;
#pragma omp parallel for num_threads(be->n_threads) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        int64_t at = ld == F ? i : i / F * ld + i % F;
        float g = gate[at];
        out[i] = g / (1.0f + expf(-g)) * up[at];
    }
}

void kv_write_cpu(Backend *be, void *cache, KVDtype dt, float scale, int width, int off,
                  const float *src, int ld, int n, const int *slot, int T)
{
    (void)be;
    for (int t = 0; t < T; t++) {
        if (slot[t] < 0) continue; /* padding */
        int64_t o = (int64_t)slot[t] * width + off;
        if (dt == KV_DTYPE_F32) {
            memcpy((float *)cache + o, src + (int64_t)t * ld, n * sizeof(float));
            continue;
        }
        for (int i = 0; i < n; i++) kv_elem_store(cache, dt, o + i, src[(int64_t)t * ld + i], scale);
    }
}

/* element i of the fill (backend/fill.h) */
void fill_cpu(Backend *be, void *p, size_t n, FillKind kind, float a, float b, uint64_t seed)
{
#pragma omp parallel for num_threads(be->n_threads) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case FILL_F32_NORMAL: ((float *)p)[i] = a + b * fill_normal(seed, i); break;
        case FILL_BF16_NORMAL: ((uint16_t *)p)[i] = f32_to_bf16(a + b * fill_normal(seed, i)); break;
        case FILL_U8_RANDOM: ((uint8_t *)p)[i] = (uint8_t)fill_hash(seed, i); break;
        case FILL_U8_CONST: ((uint8_t *)p)[i] = (uint8_t)a; break;
        case FILL_E4M3_UNIT: ((uint8_t *)p)[i] = fill_e4m3_unit(seed, i); break;
        }
    }
}

void argmax_cpu(Backend *be, int *out, const float *x, int rows, int n)
{
#pragma omp parallel for num_threads(be->n_threads) if (rows > 4)
    for (int r = 0; r < rows; r++) {
        const float *v = x + (int64_t)r * n;
        int best = 0;
        for (int i = 1; i < n; i++)
            if (v[i] > v[best]) best = i;
        out[r] = best;
    }
}
