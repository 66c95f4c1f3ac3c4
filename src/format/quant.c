/* quant: number formats of checkpoints (quant.h names the sources). The dtype names of safetensors, the
 * scalar codecs (BF16, F16, E4M3, E2M1), QTensor decoding (the inner loop of every CPU matmul:
 * one row block at a time, never a whole dequantized copy), and the NVFP4 / FP8 quantizers that
 * reproduce ModelOpt's and DeepSeek's recipes. Tested by tests/unit/test_quant.c
 * (`make test FILTER=quant`). */
#include "format/quant.h"

#include <math.h>
#include <string.h>

#include "base/util.h"
#include "format/codec.h"

/* Checkpoints are little-endian and the loads below are plain memcpy's into host integers. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "quant.c assumes a little-endian host (load_f32, load_u16, dtype_load)"
#endif

/* ---- tables ---- */

static const struct { const char *name; int bits; } dtype_info[DT_COUNT] = {
    [DT_BOOL] = {"BOOL", 8},       [DT_U8] = {"U8", 8},           [DT_I8] = {"I8", 8},
    [DT_F8_E4M3] = {"F8_E4M3", 8}, [DT_F8_E5M2] = {"F8_E5M2", 8}, [DT_F8_E8M0] = {"F8_E8M0", 8},
    [DT_F4] = {"F4", 4},           [DT_I16] = {"I16", 16},        [DT_U16] = {"U16", 16},
    [DT_F16] = {"F16", 16},        [DT_BF16] = {"BF16", 16},      [DT_I32] = {"I32", 32},
    [DT_U32] = {"U32", 32},        [DT_F32] = {"F32", 32},        [DT_F64] = {"F64", 64},
    [DT_I64] = {"I64", 64},        [DT_U64] = {"U64", 64},
};

static const char *const qformat_names[QF_COUNT] = {
    [QF_F32] = "f32", [QF_BF16] = "bf16", [QF_F16] = "f16",
    [QF_FP8] = "fp8", [QF_FP8_BLOCK] = "fp8-block", [QF_NVFP4] = "nvfp4",
};

/* The code tables are built by the preprocessor so they are plain constant data: no init call,
 * nothing to race on. R256(F) expands F(0) ... F(255). */
#define R4(F, b) F(b), F(b + 1), F(b + 2), F(b + 3)
#define R16(F, b) R4(F, b), R4(F, b + 4), R4(F, b + 8), R4(F, b + 12)
#define R64(F, b) R16(F, b), R16(F, b + 16), R16(F, b + 32), R16(F, b + 48)
#define R256(F) R64(F, 0), R64(F, 64), R64(F, 128), R64(F, 192)

/* E2M1: b3 sign, b2b1 exponent with bias 1, b0 mantissa; e = 0 is subnormal 0.5*m. */
#define E2M1_MAG(m) ((m) == 0 ? 0.0f : (m) == 1 ? 0.5f : (m) == 2 ? 1.0f : (m) == 3 ? 1.5f : \
                     (m) == 4 ? 2.0f : (m) == 5 ? 3.0f : (m) == 6 ? 4.0f : 6.0f)
#define E2M1_VAL(c) (((c) & 8) ? -E2M1_MAG((c) & 7) : E2M1_MAG((c) & 7))

const float e2m1_value[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* One NVFP4 byte -> its two elements, low nibble first (as ModelOpt packs them): 2 KiB, stays in L1. */
#define NVFP4_PAIR(b) {E2M1_VAL((b) & 15), E2M1_VAL(((b) >> 4) & 15)}
static const float nvfp4_pair[256][2] = {R256(NVFP4_PAIR)};

/* float8_e4m3fn: e = 0 -> 2^-6 * m/8 = m/512; else 2^(e-7) * (1 + m/8) = (8+m) * 2^e / 1024;
 * 0x7f and 0xff are NaN; no infinities. */
#define E4M3_MAG(b) ((((b) & 0x7f) == 0x7f) ? NAN                                   \
                     : ((((b) >> 3) & 15) == 0) ? (float)((b) & 7) / 512.0f          \
                     : (float)(8 + ((b) & 7)) * (float)(1 << (((b) >> 3) & 15)) / 1024.0f)
#define E4M3_VAL(b) (((b) & 0x80) ? -(E4M3_MAG(b)) : E4M3_MAG(b))
static const float e4m3_table[256] = {R256(E4M3_VAL)};

/* ---- helpers ---- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Bytes of one row of codes (scales not included). */
static int64_t qformat_row_bytes(QFormat f, int64_t K)
{
    switch (f) {
    case QF_F32: return 4 * K;
    case QF_BF16: case QF_F16: return 2 * K;
    case QF_FP8: case QF_FP8_BLOCK: return K;
    case QF_NVFP4: return K / 2;
    default: die("qformat_row_bytes: bad format %d", (int)f);
    }
}

/* ---- dtypes ---- */

const char *dtype_name(DType t)
{
    return (unsigned)t < DT_COUNT ? dtype_info[t].name : "?";
}

int dtype_parse(const char *s, DType *t)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) { *t = (DType)i; return 0; }
    return -1;
}

int dtype_bits(DType t)
{
    return (unsigned)t < DT_COUNT ? dtype_info[t].bits : 0;
}

/* ---- scalar codecs ---- */

float load_f32(const void *p) { float f; memcpy(&f, p, 4); return f; }
uint16_t load_u16(const void *p) { uint16_t h; memcpy(&h, p, 2); return h; }

float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) { return codec_f32_to_bf16(f); }

float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ffu;
    if (e == 31) return f32_from_bits(s | 0x7f800000u | m << 13); /* inf, NaN (payload kept) */
    if (e == 0) {                                                 /* zero, subnormal m * 2^-24 */
        float v = (float)m * 0x1p-24f;
        return s ? -v : v;
    }
    return f32_from_bits(s | (e + 112) << 23 | m << 13);          /* rebias 15 -> 127 */
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f), s = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((u >> 13) & 0x3ffu)); /* quiet NaN */
    if (u >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* >= 65520, the tie above 65504: inf */
    if (u >= 0x38800000u) {                               /* >= 2^-14: normal */
        u += 0x0fffu + ((u >> 13) & 1);
        return (uint16_t)(s | (u - 0x38000000u) >> 13);   /* rebias 127 -> 15 (112 << 23) */
    }
    /* Subnormal k * 2^-24: adding 0.5 (ulp 2^-24) makes the FPU round a to that grid, nearest
     * even; k = 1024 lands exactly on the smallest normal's code. */
    return (uint16_t)(s | (f32_bits(f32_from_bits(u) + 0.5f) - 0x3f000000u));
}

float e4m3_to_f32(uint8_t b) { return e4m3_table[b]; }

uint8_t f32_to_e4m3(float f) { return codec_f32_to_e4m3(f); }

/* Round to E2M1 exactly as ModelOpt's _cast_fp4: searchsorted over the boundaries
 * 0.25 0.75 1.25 1.75 2.5 3.5 5, a value equal to 0.75, 1.75 or 3.5 goes up; i.e. round half to
 * the even code, saturate at 6. Sign bit = (x < 0), so -0.0 gives code 0 and a small negative
 * that rounds to zero gives code 8 (-0), as ModelOpt does. NaN compares false everywhere: code 7. */
uint8_t f32_to_e2m1(float x)
{
    float a = fabsf(x);
    uint8_t m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
              : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return (uint8_t)((x < 0 ? 8 : 0) | m);
}

float dtype_load(DType t, const void *base, size_t i)
{
    const uint8_t *p = base;
    switch (t) {
    case DT_BOOL: return p[i] != 0;
    case DT_U8: return p[i];
    case DT_I8: return (int8_t)p[i];
    case DT_F8_E4M3: return e4m3_table[p[i]];
    case DT_F8_E5M2: return f16_to_f32((uint16_t)(p[i] << 8)); /* E5M2 is the top byte of F16 */
    case DT_F8_E8M0: return p[i] == 0xff ? NAN : ldexpf(1.0f, (int)p[i] - 127);
    case DT_F4: return e2m1_value[(i & 1) ? p[i / 2] >> 4 : p[i / 2] & 15];
    case DT_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case DT_U16: return load_u16(p + 2 * i);
    case DT_F16: return f16_to_f32(load_u16(p + 2 * i));
    case DT_BF16: return bf16_to_f32(load_u16(p + 2 * i));
    case DT_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return (float)v; }
    case DT_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return (float)v; }
    case DT_F32: return load_f32(p + 4 * i);
    case DT_F64: { double v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    case DT_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    case DT_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    default: die("dtype_load: bad dtype %d", (int)t);
    }
}

/* ---- QTensor decode ---- */

/* NVFP4 row segment, 16 elements (one scale block) per step. The factor is formed first and in
 * float, value = e2m1 * (float(scale) * gscale), the order of ModelOpt's dequantize, so
 * the CPU result is reproducible bit for bit by a GPU kernel that does the same. */
static void decode_nvfp4(const QTensor *w, int64_t row, int64_t k0, int64_t k1, float *restrict out)
{
    const int64_t K = w->cols;
    const uint8_t *q = w->data + row * (K / 2) + k0 / 2;
    const uint8_t *sc = w->scale + row * (K / 16) + k0 / 16;
    const float g = w->gscale;
    for (int64_t b = 0, nb = (k1 - k0) / 16; b < nb; b++, q += 8, out += 16) {
        const float s = e4m3_table[sc[b]] * g;
        for (int j = 0; j < 8; j++) {
            const float *v = nvfp4_pair[q[j]];
            out[2 * j] = v[0] * s;
            out[2 * j + 1] = v[1] * s;
        }
    }
}

/* FP8 128x128 blocks: the scale changes every 128 columns; row's grid row is shifted by
 * scale_row_off when w is a slice of a fused tensor. */
static void decode_fp8_block(const QTensor *w, int64_t row, int64_t k0, int64_t k1, float *restrict out)
{
    const int64_t K = w->cols, gk = (K + 127) / 128;
    const uint8_t *q = w->data + row * K;
    const int64_t srow = (w->scale_row_off + row) / 128;
    for (int64_t k = k0; k < k1;) {
        const int64_t kb = k / 128, kend = (kb + 1) * 128 < k1 ? (kb + 1) * 128 : k1;
        const float s = dtype_load(w->scale_dtype, w->scale, (size_t)(srow * gk + kb));
        for (; k < kend; k++) out[k - k0] = e4m3_table[q[k]] * s;
    }
}

void qtensor_decode(const QTensor *w, int64_t row, int64_t k0, int64_t k1, float *out)
{
    CHECK(row >= 0 && row < w->rows && k0 >= 0 && k0 <= k1 && k1 <= w->cols,
          "qtensor_decode %s: row %lld cols [%lld, %lld) outside [%lld, %lld]",
          w->name ? w->name : "?", (long long)row, (long long)k0, (long long)k1,
          (long long)w->rows, (long long)w->cols);
    const int64_t n = k1 - k0;
    const uint8_t *p = w->data + row * qformat_row_bytes(w->fmt, w->cols);
    switch (w->fmt) {
    case QF_F32:
        memcpy(out, p + 4 * k0, (size_t)n * 4);
        break;
    case QF_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(load_u16(p + 2 * (k0 + i)));
        break;
    case QF_F16:
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(load_u16(p + 2 * (k0 + i)));
        break;
    case QF_FP8: {
        const float g = w->gscale;
        for (int64_t i = 0; i < n; i++) out[i] = e4m3_table[p[k0 + i]] * g;
        break;
    }
    case QF_FP8_BLOCK:
        decode_fp8_block(w, row, k0, k1, out);
        break;
    case QF_NVFP4:
        CHECK(!w->packed, "qtensor_decode %s: a packed (device) tensor", w->name ? w->name : "?");
        CHECK(k0 % 16 == 0 && k1 % 16 == 0, "qtensor_decode %s: nvfp4 cols [%lld, %lld) not multiples of 16",
              w->name ? w->name : "?", (long long)k0, (long long)k1);
        decode_nvfp4(w, row, k0, k1, out);
        break;
    default:
        die("qtensor_decode %s: bad format %d", w->name ? w->name : "?", (int)w->fmt);
    }
}

double qtensor_bytes(const QTensor *w)
{
    const int64_t N = w->rows, K = w->cols;
    double bytes = (double)N * (double)qformat_row_bytes(w->fmt, K);
    if (w->fmt == QF_NVFP4) bytes += (double)N * (double)(K / 16);
    if (w->fmt == QF_FP8_BLOCK && N > 0) {
        /* only the grid rows this (possibly sliced) tensor touches */
        int64_t r0 = w->scale_row_off / 128, r1 = (w->scale_row_off + N - 1) / 128;
        bytes += (double)(r1 - r0 + 1) * (double)((K + 127) / 128) * (dtype_bits(w->scale_dtype) / 8);
    }
    return bytes;
}

QTensor qtensor_rows(const QTensor *w, int64_t r0, int64_t n)
{
    CHECK(r0 >= 0 && n >= 0 && r0 + n <= w->rows, "qtensor_rows %s: rows [%lld, %lld) outside [0, %lld)",
          w->name ? w->name : "?", (long long)r0, (long long)(r0 + n), (long long)w->rows);
    QTensor s = *w;
    s.rows = n;
    s.data = w->data + r0 * qformat_row_bytes(w->fmt, w->cols);
    if (w->fmt == QF_NVFP4) s.scale = w->scale + r0 * (w->cols / 16);
    if (w->fmt == QF_FP8_BLOCK) s.scale_row_off = w->scale_row_off + r0;
    return s;
}

int qtensor_cols_copy(const QTensor *src, int64_t c0, int64_t n, QTensor *out, void **owned)
{
    const QTensor copy = *src, *w = &copy; /* out may be src */
    CHECK(c0 >= 0 && n > 0 && c0 + n <= w->cols && !w->packed, "qtensor_cols_copy %s: columns [%lld, %lld) of %lld",
          w->name ? w->name : "?", (long long)c0, (long long)(c0 + n), (long long)w->cols);
    *owned = NULL;
    if (w->fmt == QF_NVFP4 && (c0 % 16 || n % 16)) return -1;
    if (w->fmt == QF_FP8_BLOCK && (c0 % 128 || (n % 128 && c0 + n != w->cols))) return -1;
    *out = *w;
    out->cols = n;
    if (!w->data) return 0;
    int64_t N = w->rows, rb = qformat_row_bytes(w->fmt, w->cols), nb = qformat_row_bytes(w->fmt, n),
            cb = qformat_row_bytes(w->fmt, c0);
    size_t sb = 0, sgk = 0, sel = w->scale_dtype == DT_BF16 ? 2 : 4, srows = 0;
    if (w->fmt == QF_NVFP4) sb = (size_t)N * (n / 16);
    if (w->fmt == QF_FP8_BLOCK) {
        srows = (size_t)((w->scale_row_off + N - 1) / 128 + 1);
        sgk = (size_t)((n + 127) / 128);
        sb = srows * sgk * sel;
    }
    uint8_t *buf = xmalloc((size_t)N * nb + sb);
    for (int64_t r = 0; r < N; r++) memcpy(buf + r * nb, w->data + r * rb + cb, nb);
    out->data = buf;
    if (w->fmt == QF_NVFP4) {
        uint8_t *sc = buf + (size_t)N * nb;
        for (int64_t r = 0; r < N; r++) memcpy(sc + r * (n / 16), w->scale + r * (w->cols / 16) + c0 / 16, n / 16);
        out->scale = sc;
    } else if (w->fmt == QF_FP8_BLOCK) { /* the grid's rows up to the slice's last, its columns */
        uint8_t *sc = buf + (size_t)N * nb;
        size_t gk = (size_t)((w->cols + 127) / 128);
        for (size_t r = 0; r < srows; r++) memcpy(sc + r * sgk * sel, w->scale + (r * gk + c0 / 128) * sel, sgk * sel);
        out->scale = sc;
    }
    *owned = buf;
    return 0;
}

int qtensor_nvfp4_pad(const QTensor *w, int halves, int64_t rows_p, int64_t cols_p, uint8_t *codes, uint8_t *scales)
{
    if (w->fmt != QF_NVFP4 || !w->data || w->packed || halves < 1 || w->rows % halves || cols_p % 16 ||
        w->rows / halves > rows_p || w->cols > cols_p)
        return -1;
    int64_t part = w->rows / halves, cb = w->cols / 2, sb = w->cols / 16, cbp = cols_p / 2, sbp = cols_p / 16;
    memset(codes, 0, (size_t)(halves * rows_p * cbp));
    memset(scales, 0, (size_t)(halves * rows_p * sbp));
    for (int h = 0; h < halves; h++)
        for (int64_t r = 0; r < part; r++) {
            int64_t from = h * part + r, to = h * rows_p + r;
            memcpy(codes + to * cbp, w->data + from * cb, (size_t)cb);
            memcpy(scales + to * sbp, w->scale + from * sb, (size_t)sb);
        }
    return 0;
}

int qtensor_rows_concat(const QTensor *const *parts, int n, QTensor *out, void **owned)
{
    *owned = NULL;
    if (n < 1) return -1;
    const QTensor *p0 = parts[0];
    const size_t sel = p0->scale_dtype == DT_BF16 ? 2 : 4, gk = (size_t)((p0->cols + 127) / 128);
    int64_t rows = 0;
    size_t codes = 0, scales = 0;
    for (int i = 0; i < n; i++) {
        const QTensor *w = parts[i];
        if (w->fmt != p0->fmt || w->cols != p0->cols || w->rows <= 0 || w->packed || w->gscale != p0->gscale ||
            !w->data != !p0->data)
            return -1;
        /* block FP8: each part's scale rows whole blocks of 128, so that the grids stack */
        if (w->fmt == QF_FP8_BLOCK &&
            (w->scale_dtype != p0->scale_dtype || w->scale_row_off % 128 || (i < n - 1 && w->rows % 128)))
            return -1;
        rows += w->rows;
        codes += (size_t)w->rows * qformat_row_bytes(w->fmt, w->cols);
        if (w->fmt == QF_NVFP4) scales += (size_t)w->rows * (w->cols / 16);
        if (w->fmt == QF_FP8_BLOCK) scales += (size_t)((w->rows + 127) / 128) * gk * sel;
    }
    QTensor f = *p0;
    f.rows = rows;
    f.scale_row_off = 0;
    if (p0->data) {
        uint8_t *buf = xmalloc(codes + scales), *c = buf, *s = buf + codes;
        for (int i = 0; i < n; i++) {
            const QTensor *w = parts[i];
            size_t cb = (size_t)w->rows * qformat_row_bytes(w->fmt, w->cols), sb = 0;
            memcpy(c, w->data, cb);
            c += cb;
            if (w->fmt == QF_NVFP4) {
                sb = (size_t)w->rows * (w->cols / 16);
                memcpy(s, w->scale, sb);
            } else if (w->fmt == QF_FP8_BLOCK) { /* its grid rows from the one its first row is in */
                sb = (size_t)((w->rows + 127) / 128) * gk * sel;
                memcpy(s, w->scale + (size_t)(w->scale_row_off / 128) * gk * sel, sb);
            }
            s += sb;
        }
        f.data = buf;
        f.scale = scales ? buf + codes : NULL;
        *owned = buf;
    }
    *out = f;
    return 0;
}

const char *qformat_name(QFormat f)
{
    return (unsigned)f < QF_COUNT ? qformat_names[f] : "?";
}

/* ---- quantizers ---- */

static float amax_f32(const float *w, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(w[i]);
        if (a > m) m = a;
    }
    return m;
}

/* amax / (6 * 448) as ModelOpt's get_weights_scaling_factor_2, in float. ModelOpt
 * returns 0 for an all-zero tensor and then divides by it; we return 1 instead, which makes
 * every block scale 1.0 and every code 0 (the tensor still decodes to zeros). */
float nvfp4_global_scale(const float *w, size_t n)
{
    float g = amax_f32(w, n) / 2688.0f;
    return g > 0.0f ? g : 1.0f;
}

/* ModelOpt NVFP4QTensor.quantize, every step in float as torch does it:
 *   s_b  = amax_block / (6 * g);  0 -> 1.0;  clamp [2^-9, 448];  cast to e4m3 (RNE)
 *   code = round_to_e2m1(w / (float(s_b) * g)) */
float nvfp4_quantize(const float *w, int64_t N, int64_t K, float gscale, uint8_t *codes, uint8_t *scales)
{
    CHECK(K % 16 == 0, "nvfp4_quantize: K = %lld is not a multiple of 16", (long long)K);
    const float g = gscale > 0.0f ? gscale : nvfp4_global_scale(w, (size_t)(N * K));
    const float g6 = 6.0f * g;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t b = 0; b < K / 16; b++) {
            const float *x = w + n * K + b * 16;
            uint8_t *q = codes + n * (K / 2) + b * 8;
            float s = amax_f32(x, 16) / g6;
            if (s == 0.0f) s = 1.0f;
            s = s < 0x1p-9f ? 0x1p-9f : s > 448.0f ? 448.0f : s;
            const uint8_t sc = f32_to_e4m3(s);
            scales[n * (K / 16) + b] = sc;
            const float d = e4m3_table[sc] * g;
            for (int j = 0; j < 8; j++)
                q[j] = (uint8_t)(f32_to_e2m1(x[2 * j] / d) | f32_to_e2m1(x[2 * j + 1] / d) << 4);
        }
    }
    return g;
}

/* ModelOpt FP8 per tensor: scale = amax / 448, q = e4m3(w / scale). An all-zero tensor gets
 * scale 1 (ModelOpt would divide by zero). */
float fp8_quantize(const float *w, size_t n, uint8_t *q)
{
    float scale = amax_f32(w, n) / 448.0f;
    if (!(scale > 0.0f)) scale = 1.0f;
    for (size_t i = 0; i < n; i++) q[i] = f32_to_e4m3(w[i] / scale);
    return scale;
}

/* DeepSeek/Z.ai block FP8: per 128x128 block scale_inv = amax_block / 448 (all-zero block: 1),
 * q = e4m3(w / scale_inv); edge blocks are partial. */
void fp8_block_quantize(const float *w, int64_t N, int64_t K, uint8_t *q, float *scale_inv)
{
    const int64_t gn = (N + 127) / 128, gk = (K + 127) / 128;
    for (int64_t bn = 0; bn < gn; bn++) {
        const int64_t n0 = bn * 128, n1 = n0 + 128 < N ? n0 + 128 : N;
        for (int64_t bk = 0; bk < gk; bk++) {
            const int64_t c0 = bk * 128, c1 = c0 + 128 < K ? c0 + 128 : K;
            float amax = 0.0f;
            for (int64_t n = n0; n < n1; n++) {
                float a = amax_f32(w + n * K + c0, (size_t)(c1 - c0));
                if (a > amax) amax = a;
            }
            float s = amax / 448.0f;
            if (!(s > 0.0f)) s = 1.0f;
            scale_inv[bn * gk + bk] = s;
            for (int64_t n = n0; n < n1; n++)
                for (int64_t k = c0; k < c1; k++) q[n * K + k] = f32_to_e4m3(w[n * K + k] / s);
        }
    }
}
