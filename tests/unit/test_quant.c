/* test_quant: src/format/quant.c against independent references written here from the
 * definitions (the E2M1 and float8_e4m3fn bit layouts; ModelOpt's NVFP4QTensor.quantize):
 * codecs decoded with ldexp formulas and encoded by nearest-value search (ties to the even
 * code), NVFP4 quantization re-implemented step by step, QTensor decoding of every format, row
 * slices and unaligned buffers.
 * Run: make test FILTER=quant. Random cases use fixed seeds, printed with any failure. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "format/quant.h"
#include "../test.h"

/* ---- independent references ---- */

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static int same_float(float a, float b) { return bits_of(a) == bits_of(b) || (isnan(a) && isnan(b)); }

/* Magnitudes of the non-negative codes of each format, from the format's definition. */
static double ref_e2m1_mag(unsigned c)  /* exponent bits b2b1 bias 1, mantissa b0 */
{
    unsigned e = (c >> 1) & 3, m = c & 1;
    return e == 0 ? 0.5 * m : ldexp(1.0 + m / 2.0, (int)e - 1);
}
static double ref_e4m3_mag(unsigned c)  /* bias 7, subnormal 2^-6 m/8 */
{
    unsigned e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, (int)e - 7);
}
static double ref_f16_mag(unsigned c)   /* 0x7c00 stands for 2^16, the rounding limit of inf */
{
    unsigned e = (c >> 10) & 31, m = c & 1023;
    return e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, (int)e - 15);
}
static double ref_bf16_mag(unsigned c)  /* 0x7f80 stands for 2^128 */
{
    unsigned e = (c >> 7) & 255, m = c & 127;
    return e == 0 ? ldexp(m, -133) : ldexp(1.0 + m / 128.0, (int)e - 127);
}

/* Nearest non-negative code in [0, maxcode] to a >= 0 for a format whose magnitude grows with
 * the code; a tie goes to the even code (= even mantissa); a >= mag(maxcode) gives maxcode. */
static unsigned ref_nearest(double a, unsigned maxcode, double (*mag)(unsigned))
{
    unsigned lo = 0, hi = maxcode; /* largest code with mag <= a */
    if (a >= mag(maxcode)) return maxcode;
    while (lo < hi) {
        unsigned mid = (lo + hi + 1) / 2;
        if (mag(mid) <= a) lo = mid; else hi = mid - 1;
    }
    double d0 = a - mag(lo), d1 = mag(lo + 1) - a;
    if (d0 < d1) return lo;
    if (d1 < d0) return lo + 1;
    return (lo & 1) ? lo + 1 : lo;
}

static double ref_e4m3_decode(uint8_t b)
{
    if ((b & 0x7f) == 0x7f) return NAN;
    double v = ref_e4m3_mag(b & 0x7f);
    return (b & 0x80) ? -v : v;
}
static uint8_t ref_e4m3_encode(float x)  /* saturating, sign kept (also for -0) */
{
    if (isnan(x)) return 0x7f;
    return (uint8_t)((signbit(x) ? 0x80 : 0) | ref_nearest(fabs(x), 0x7e, ref_e4m3_mag));
}
static uint8_t ref_e2m1_encode(float x)  /* sign = (x < 0), as ModelOpt's _cast_fp4 */
{
    return (uint8_t)((x < 0 ? 8 : 0) | ref_nearest(fabs(x), 7, ref_e2m1_mag));
}
static uint16_t ref_f16_encode(float x)
{
    return (uint16_t)((signbit(x) ? 0x8000 : 0) | ref_nearest(fabs(x), 0x7c00, ref_f16_mag));
}
static uint16_t ref_bf16_encode(float x)
{
    return (uint16_t)((signbit(x) ? 0x8000 : 0) | ref_nearest(fabs(x), 0x7f80, ref_bf16_mag));
}

/* A float with a random sign, mantissa and an exponent in [emin, emax]. */
static float rand_float(Rng *r, int emin, int emax)
{
    uint64_t u = rng_u64(r);
    int e = emin + (int)(u % (uint64_t)(emax - emin + 1));
    float v = ldexpf(1.0f + (float)((u >> 16) & 0x7fffff) * 0x1p-23f, e);
    return (u >> 63) ? -v : v;
}

/* ---- dtypes and names ---- */

TEST(quant_dtype_names)
{
    static const char *names[] = {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "I16",
                                  "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"};
    static const int bits[] = {8, 8, 8, 8, 8, 8, 4, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64};
    EXPECT_EQ_INT(sizeof names / sizeof names[0], DT_COUNT);
    for (int i = 0; i < DT_COUNT; i++) {
        DType t = DT_COUNT;
        EXPECT(strcmp(dtype_name((DType)i), names[i]) == 0, "dtype %d is %s, want %s", i, dtype_name((DType)i), names[i]);
        EXPECT(dtype_parse(names[i], &t) == 0 && t == (DType)i, "parse %s", names[i]);
        EXPECT(dtype_bits((DType)i) == bits[i], "bits of %s: %d", names[i], dtype_bits((DType)i));
    }
    DType t = DT_F32;
    EXPECT(dtype_parse("bf16", &t) == -1, "lower case is not a safetensors dtype");
    EXPECT(dtype_parse("F8_E4M3FN", &t) == -1, "unknown name");
    EXPECT(dtype_parse("", &t) == -1, "empty name");
    EXPECT(t == DT_F32, "failed parse leaves *t alone");

    static const char *qf[] = {"f32", "bf16", "f16", "fp8", "fp8-block", "nvfp4"};
    EXPECT_EQ_INT(sizeof qf / sizeof qf[0], QF_COUNT);
    for (int i = 0; i < QF_COUNT; i++)
        EXPECT(strcmp(qformat_name((QFormat)i), qf[i]) == 0, "qformat %d is %s", i, qformat_name((QFormat)i));
}

/* ---- E2M1 ---- */

TEST(quant_e2m1_table)
{
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) {
        double formula = (c & 8 ? -1 : 1) * ref_e2m1_mag(c & 7);
        EXPECT(e2m1_value[c] == want[c] && e2m1_value[c] == formula, "code %d: %g", c, e2m1_value[c]);
        EXPECT(!!signbit(e2m1_value[c]) == !!(c & 8), "code %d: sign bit", c);
        EXPECT(f32_to_e2m1(want[c]) == (c == 8 ? 0 : c), "value %g encodes to %d", want[c], f32_to_e2m1(want[c]));
    }
}

TEST(quant_e2m1_rounding)
{
    /* each boundary, the code it maps to (ties to the even mantissa), and its neighbours */
    static const struct { float x; int code; } ties[] = {
        {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        float x = ties[i].x;
        EXPECT(f32_to_e2m1(x) == ties[i].code, "tie %g -> %d, want %d", x, f32_to_e2m1(x), ties[i].code);
        EXPECT(f32_to_e2m1(-x) == (8 | ties[i].code), "tie %g -> %d", -x, f32_to_e2m1(-x));
        float below = nextafterf(x, 0), above = nextafterf(x, 100);
        int lo = (int)ref_nearest(below, 7, ref_e2m1_mag), hi = (int)ref_nearest(above, 7, ref_e2m1_mag);
        EXPECT(hi == lo + 1, "boundary %g separates codes %d and %d", x, lo, hi);
        EXPECT(f32_to_e2m1(below) == lo, "%.9g -> %d, want %d", below, f32_to_e2m1(below), lo);
        EXPECT(f32_to_e2m1(above) == hi, "%.9g -> %d, want %d", above, f32_to_e2m1(above), hi);
    }
    /* saturation and specials */
    EXPECT(f32_to_e2m1(6.0f) == 7 && f32_to_e2m1(6.5f) == 7 && f32_to_e2m1(1e30f) == 7, "saturate at 6");
    EXPECT(f32_to_e2m1(INFINITY) == 7 && f32_to_e2m1(-INFINITY) == 15, "inf saturates");
    EXPECT(f32_to_e2m1(-7.0f) == 15, "saturate at -6");
    EXPECT(f32_to_e2m1(0.0f) == 0 && f32_to_e2m1(-0.0f) == 0, "zeros -> code 0 (sign = x < 0)");
    EXPECT(f32_to_e2m1(-0.1f) == 8, "small negative -> -0 (code 8), as ModelOpt");
    EXPECT(f32_to_e2m1(NAN) == 7, "NaN -> 7 (searchsorted puts NaN last)");
    /* random values against the nearest-value reference */
    const uint64_t seed = 11;
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < 200000; i++) {
        float x = (rng_uniform(&r) * 2 - 1) * 8;
        uint8_t got = f32_to_e2m1(x), want = ref_e2m1_encode(x);
        ASSERT(got == want, "seed %llu i %d: x %.9g -> %d, want %d", (unsigned long long)seed, i, x, got, want);
    }
}

/* ---- E4M3 ---- */

TEST(quant_e4m3_decode)
{
    for (int b = 0; b < 256; b++) {
        float got = e4m3_to_f32((uint8_t)b);
        double want = ref_e4m3_decode((uint8_t)b);
        if ((b & 0x7f) == 0x7f) { EXPECT(isnan(got), "code 0x%02x is NaN, got %g", b, got); continue; }
        EXPECT(got == want && !!signbit(got) == !!(b & 0x80), "code 0x%02x: %.9g, want %.9g", b, got, want);
    }
    EXPECT(e4m3_to_f32(0x01) == 0x1p-9f, "min subnormal 2^-9");
    EXPECT(e4m3_to_f32(0x07) == 7 * 0x1p-9f, "max subnormal 7 * 2^-9");
    EXPECT(e4m3_to_f32(0x08) == 0x1p-6f, "min normal 2^-6");
    EXPECT(e4m3_to_f32(0x38) == 1.0f, "1.0 is 0x38");
    EXPECT(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0xfe) == -448.0f, "max 448");
    EXPECT(e4m3_to_f32(0x80) == 0.0f && signbit(e4m3_to_f32(0x80)), "0x80 is -0");
    EXPECT(e4m3_to_f32(0x78) == 256.0f, "0x78 is 256, no inf in e4m3fn");
}

TEST(quant_e4m3_encode)
{
    /* every finite code round-trips */
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        float v = e4m3_to_f32((uint8_t)b);
        EXPECT(f32_to_e4m3(v) == b, "code 0x%02x (%g) re-encodes to 0x%02x", b, v, f32_to_e4m3(v));
    }
    /* ties between neighbours (all in float exactly) go to the even code; off-tie goes nearest */
    for (int b = 0; b < 0x7e; b++) {
        float lo = e4m3_to_f32((uint8_t)b), hi = e4m3_to_f32((uint8_t)(b + 1)), mid = (lo + hi) / 2;
        int even = (b & 1) ? b + 1 : b;
        EXPECT(f32_to_e4m3(mid) == even, "tie %.9g between 0x%02x and 0x%02x -> 0x%02x", mid, b, b + 1, f32_to_e4m3(mid));
        EXPECT(f32_to_e4m3(-mid) == (0x80 | even), "tie %.9g -> 0x%02x", -mid, f32_to_e4m3(-mid));
        EXPECT(f32_to_e4m3(nextafterf(mid, 0)) == b, "just below tie %.9g", mid);
        EXPECT(f32_to_e4m3(nextafterf(mid, 1000)) == b + 1, "just above tie %.9g", mid);
    }
    EXPECT(f32_to_e4m3(0x1p-10f) == 0x00, "2^-10, half the min subnormal, ties to 0");
    EXPECT(f32_to_e4m3(3 * 0x1p-10f) == 0x02, "1.5 * 2^-9 ties to 2 * 2^-9");
    EXPECT(f32_to_e4m3(1e-30f) == 0x00 && f32_to_e4m3(-1e-30f) == 0x80, "underflow to signed zero");
    EXPECT(f32_to_e4m3(15 * 0x1p-10f) == 0x08, "7.5 * 2^-9 rounds up to the min normal");
    /* saturation */
    EXPECT(f32_to_e4m3(448.0f) == 0x7e && f32_to_e4m3(464.0f) == 0x7e && f32_to_e4m3(1e9f) == 0x7e, "saturate");
    EXPECT(f32_to_e4m3(-1e9f) == 0xfe && f32_to_e4m3(-500.0f) == 0xfe, "saturate negative");
    EXPECT(f32_to_e4m3(INFINITY) == 0x7e && f32_to_e4m3(-INFINITY) == 0xfe, "inf saturates (satfinite)");
    EXPECT(f32_to_e4m3(NAN) == 0x7f && f32_to_e4m3(-NAN) == 0x7f, "NaN -> 0x7f");
    /* random floats over the whole useful range against the nearest-value reference */
    const uint64_t seed = 12;
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < 200000; i++) {
        float x = rand_float(&r, -14, 10);
        uint8_t got = f32_to_e4m3(x), want = ref_e4m3_encode(x);
        ASSERT(got == want, "seed %llu i %d: %.9g -> 0x%02x, want 0x%02x", (unsigned long long)seed, i, x, got, want);
    }
}

/* ---- BF16 and F16 ---- */

TEST(quant_bf16)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        ASSERT(bits_of(f) == h << 16, "decode 0x%04x", h);
        uint16_t back = f32_to_bf16(f);
        if (isnan(f)) ASSERT(isnan(bf16_to_f32(back)) && (back & 0x40), "NaN 0x%04x -> 0x%04x quiet NaN", h, back);
        else ASSERT(back == h, "round trip 0x%04x -> 0x%04x", h, back);
    }
    EXPECT(f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "tie to even (down)");
    EXPECT(f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "tie to even (up)");
    EXPECT(f32_to_bf16(nextafterf(1.0f + 0x1p-8f, 2)) == 0x3f81, "above the tie rounds up");
    EXPECT(f32_to_bf16(FLT_MAX) == 0x7f80, "FLT_MAX rounds to inf");
    EXPECT(f32_to_bf16(INFINITY) == 0x7f80 && f32_to_bf16(-INFINITY) == 0xff80, "inf");
    EXPECT(isnan(bf16_to_f32(f32_to_bf16(NAN))), "NaN stays NaN");
    EXPECT(isnan(bf16_to_f32(f32_to_bf16(float_of(0x7f800001u)))), "NaN with low payload only stays NaN");
    EXPECT(f32_to_bf16(-0.0f) == 0x8000, "-0");
    const uint64_t seed = 13;
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < 100000; i++) {
        float x = rand_float(&r, -140, 127);
        if (i % 7 == 0) x = float_of((bits_of(x) & 0xffff0000u) | 0x8000u); /* exact ties */
        if (i % 11 == 0) x = float_of((uint32_t)rng_u64(&r) & 0x7fffffu); /* float subnormals */
        uint16_t got = f32_to_bf16(x), want = ref_bf16_encode(x);
        ASSERT(got == want, "seed %llu i %d: %.9g -> 0x%04x, want 0x%04x", (unsigned long long)seed, i, x, got, want);
    }
}

TEST(quant_f16)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        unsigned mag = h & 0x7fff;
        if (mag > 0x7c00) { ASSERT(isnan(f), "0x%04x is NaN", h); ASSERT(isnan(f16_to_f32(f32_to_f16(f))), "NaN"); continue; }
        double want = mag == 0x7c00 ? INFINITY : ref_f16_mag(mag);
        if (h & 0x8000) want = -want;
        ASSERT(f == want && !!signbit(f) == !!(h & 0x8000), "decode 0x%04x: %.9g, want %.9g", h, f, want);
        ASSERT(f32_to_f16(f) == h, "round trip 0x%04x -> 0x%04x", h, f32_to_f16(f));
    }
    EXPECT(f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even (down)");
    EXPECT(f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie to even (up)");
    EXPECT(f32_to_f16(0x1p-25f) == 0x0000, "half the min subnormal ties to 0");
    EXPECT(f32_to_f16(3 * 0x1p-25f) == 0x0002, "subnormal tie to even");
    EXPECT(f32_to_f16(nextafterf(0x1p-25f, 1)) == 0x0001, "above the tie rounds up");
    EXPECT(f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400, "rounds up into the normals");
    EXPECT(f32_to_f16(65504.0f) == 0x7bff && f32_to_f16(nextafterf(65520.0f, 0)) == 0x7bff, "max finite");
    EXPECT(f32_to_f16(65520.0f) == 0x7c00 && f32_to_f16(-1e10f) == 0xfc00, "overflow -> inf");
    EXPECT(f32_to_f16(INFINITY) == 0x7c00 && f32_to_f16(-INFINITY) == 0xfc00, "inf");
    EXPECT(isnan(f16_to_f32(f32_to_f16(NAN))) && isnan(f16_to_f32(f32_to_f16(float_of(0x7f800001u)))), "NaN");
    EXPECT(f32_to_f16(1e-30f) == 0 && f32_to_f16(-1e-30f) == 0x8000, "underflow to signed zero");
    const uint64_t seed = 14;
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < 100000; i++) {
        float x = rand_float(&r, -26, 16);
        if (i % 5 == 0) x = float_of(bits_of(x) & ~0xfffu); /* many exact ties */
        uint16_t got = f32_to_f16(x), want = ref_f16_encode(x);
        ASSERT(got == want, "seed %llu i %d: %.9g -> 0x%04x, want 0x%04x", (unsigned long long)seed, i, x, got, want);
    }
}

TEST(quant_load_unaligned)
{
    uint8_t buf[64];
    for (int i = 0; i < 64; i++) buf[i] = (uint8_t)(i * 37 + 5);
    float f = -3.25f;
    uint16_t h = 0xbeef;
    memcpy(buf + 1, &f, 4);
    memcpy(buf + 7, &h, 2);
    EXPECT(load_f32(buf + 1) == -3.25f, "load_f32 unaligned");
    EXPECT(load_u16(buf + 7) == 0xbeef, "load_u16 unaligned");

    /* element 1 of each dtype, stored little-endian at an odd address */
    uint8_t *p = buf + 1;
    memset(buf, 0, sizeof buf);
    int16_t i16 = -1234; uint16_t u16 = 54321; int32_t i32 = -123456; uint32_t u32 = 3000000000u;
    double f64 = -2.5; int64_t i64 = -(1ll << 40); uint64_t u64 = 1ull << 50;
    uint16_t bf = f32_to_bf16(1.5f), hf = f32_to_f16(-0.75f);
    memcpy(p + 2, &i16, 2);
    EXPECT(dtype_load(DT_I16, p, 1) == -1234.0f, "I16");
    memcpy(p + 2, &u16, 2);
    EXPECT(dtype_load(DT_U16, p, 1) == 54321.0f, "U16");
    memcpy(p + 2, &bf, 2);
    EXPECT(dtype_load(DT_BF16, p, 1) == 1.5f, "BF16");
    memcpy(p + 2, &hf, 2);
    EXPECT(dtype_load(DT_F16, p, 1) == -0.75f, "F16");
    memcpy(p + 4, &i32, 4);
    EXPECT(dtype_load(DT_I32, p, 1) == -123456.0f, "I32");
    memcpy(p + 4, &u32, 4);
    EXPECT(dtype_load(DT_U32, p, 1) == 3000000000.0f, "U32");
    memcpy(p + 4, &f, 4);
    EXPECT(dtype_load(DT_F32, p, 1) == -3.25f, "F32");
    memcpy(p + 8, &f64, 8);
    EXPECT(dtype_load(DT_F64, p, 1) == -2.5f, "F64");
    memcpy(p + 8, &i64, 8);
    EXPECT(dtype_load(DT_I64, p, 1) == -0x1p40f, "I64");
    memcpy(p + 8, &u64, 8);
    EXPECT(dtype_load(DT_U64, p, 1) == 0x1p50f, "U64");
    p[1] = 0xc4; /* e4m3: sign, e = 8, m = 4: -1.5 * 2 */
    EXPECT(dtype_load(DT_F8_E4M3, p, 1) == -3.0f, "F8_E4M3");
    p[1] = 0x3e; /* e5m2: e = 15, m = 2: 1.5 */
    EXPECT(dtype_load(DT_F8_E5M2, p, 1) == 1.5f, "F8_E5M2");
    p[1] = 130;
    EXPECT(dtype_load(DT_F8_E8M0, p, 1) == 8.0f, "F8_E8M0");
    p[1] = 0xfe;
    EXPECT(dtype_load(DT_I8, p, 1) == -2.0f && dtype_load(DT_U8, p, 1) == 254.0f && dtype_load(DT_BOOL, p, 1) == 1.0f, "8-bit ints");
    p[0] = 0x7a;
    EXPECT(dtype_load(DT_F4, p, 0) == -1.0f && dtype_load(DT_F4, p, 1) == 6.0f, "F4 low nibble first");
}

/* ---- NVFP4 ---- */

TEST(quant_nvfp4_nibble_order)
{
    /* K = 32: two scale blocks. Byte 0 = 0x7A: element 0 = code 0xA = -1, element 1 = code 7 = 6. */
    uint8_t mem[1 + 16 + 2];
    uint8_t *data = mem + 1, *scale = mem + 17; /* odd addresses */
    memset(mem, 0, sizeof mem);
    data[0] = 0x7a;
    data[8] = 0x21; /* block 1: element 16 = code 1 = 0.5, element 17 = code 2 = 1 */
    scale[0] = 0x40; /* 2.0 */
    scale[1] = 0x30; /* 0.5 */
    QTensor w = {.fmt = QF_NVFP4, .rows = 1, .cols = 32, .data = data, .scale = scale, .gscale = 0.25f, .name = "nibbles"};
    float out[32];
    qtensor_decode(&w, 0, 0, 32, out);
    EXPECT(out[0] == -1.0f * 2.0f * 0.25f, "element 0 = %g", out[0]);
    EXPECT(out[1] == 6.0f * 2.0f * 0.25f, "element 1 = %g", out[1]);
    EXPECT(out[16] == 0.5f * 0.5f * 0.25f, "element 16 = %g", out[16]);
    EXPECT(out[17] == 1.0f * 0.5f * 0.25f, "element 17 = %g", out[17]);
    for (int k = 2; k < 32; k++)
        if (k != 16 && k != 17) EXPECT(out[k] == 0.0f, "element %d = %g", k, out[k]);
    float part[16];
    qtensor_decode(&w, 0, 16, 32, part);
    EXPECT(memcmp(part, out + 16, sizeof part) == 0, "decode of [16, 32) equals the tail");
}

/* ModelOpt's NVFP4 recipe step by step, with the reference encoders above: weight_scale_2 =
 * amax / (6 * 448); block scale = e4m3(amax_block / (6 * weight_scale_2)), 0 -> 1, clamped to
 * [2^-9, 448]; code = e2m1(w / (scale * weight_scale_2)). Mirrors the documented choice for an
 * all-zero tensor (global scale 1). */
static float ref_nvfp4_quantize(const float *w, int64_t N, int64_t K, float gscale, uint8_t *codes, uint8_t *scales)
{
    float amax = 0;
    for (int64_t i = 0; i < N * K; i++) amax = fmaxf(amax, fabsf(w[i]));
    float g = gscale > 0 ? gscale : amax / (6.0f * 448.0f);
    if (g == 0) g = 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < K / 16; b++) {
            float bmax = 0;
            for (int i = 0; i < 16; i++) bmax = fmaxf(bmax, fabsf(w[n * K + b * 16 + i]));
            float s = bmax / (6.0f * g);
            if (s == 0) s = 1.0f;
            s = fminf(fmaxf(s, 0x1p-9f), 448.0f);
            uint8_t sc = ref_e4m3_encode(s);
            scales[n * (K / 16) + b] = sc;
            float d = (float)ref_e4m3_decode(sc) * g;
            for (int i = 0; i < 16; i++) {
                int64_t k = b * 16 + i;
                uint8_t c = ref_e2m1_encode(w[n * K + k] / d);
                uint8_t *q = &codes[n * (K / 2) + k / 2];
                *q = (k & 1) ? (uint8_t)((*q & 0x0f) | c << 4) : (uint8_t)((*q & 0xf0) | c);
            }
        }
    return g;
}

/* Quantize with both implementations and compare byte for byte; 1 if equal. */
static int check_nvfp4(const char *what, uint64_t seed, const float *w, int64_t N, int64_t K, float gscale)
{
    uint8_t *c1 = calloc((size_t)(N * K / 2), 1), *c2 = calloc((size_t)(N * K / 2), 1);
    uint8_t *s1 = calloc((size_t)(N * K / 16), 1), *s2 = calloc((size_t)(N * K / 16), 1);
    float g1 = nvfp4_quantize(w, N, K, gscale, c1, s1);
    float g2 = ref_nvfp4_quantize(w, N, K, gscale, c2, s2);
    int ok = 1;
    if (g1 != g2) { test_fail(__FILE__, __LINE__, "%s seed %llu: gscale %.9g, want %.9g", what, (unsigned long long)seed, g1, g2); ok = 0; }
    for (int64_t i = 0; ok && i < N * K / 16; i++)
        if (s1[i] != s2[i]) {
            test_fail(__FILE__, __LINE__, "%s seed %llu N %lld K %lld: scale[%lld] 0x%02x, want 0x%02x", what,
                      (unsigned long long)seed, (long long)N, (long long)K, (long long)i, s1[i], s2[i]);
            ok = 0;
        }
    for (int64_t i = 0; ok && i < N * K / 2; i++)
        if (c1[i] != c2[i]) {
            test_fail(__FILE__, __LINE__, "%s seed %llu N %lld K %lld: code byte %lld (row %lld col %lld) 0x%02x, want 0x%02x",
                      what, (unsigned long long)seed, (long long)N, (long long)K, (long long)i, (long long)(i / (K / 2)),
                      (long long)(2 * (i % (K / 2))), c1[i], c2[i]);
            ok = 0;
        }
    free(c1); free(c2); free(s1); free(s2);
    return ok;
}

TEST(quant_nvfp4_quantize_reference)
{
    static const int64_t shapes[][2] = {{1, 16}, {3, 48}, {17, 160}, {64, 256}, {5, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int dist = 0; dist < 4; dist++) {
            const uint64_t seed = 100 + si * 10 + (uint64_t)dist;
            const int64_t N = shapes[si][0], K = shapes[si][1];
            Rng r;
            rng_seed(&r, seed);
            float *w = malloc((size_t)(N * K) * sizeof *w);
            for (int64_t i = 0; i < N * K; i++) {
                float x = rng_normal(&r) * 0.02f;
                if (dist == 1 && rng_uniform(&r) < 0.001f) x *= 300;          /* outliers: tiny scales, clamps */
                if (dist == 2) x = ldexpf(x, (int)(i / 16 % 40) - 20);        /* per-block magnitudes 2^-20..2^19 */
                if (dist == 3 && (i / 16) % 3 == 0) x = 0;                    /* all-zero blocks */
                if (dist == 3 && i % 5 == 0) x = e2m1_value[rng_u64(&r) & 15]; /* exact grid points and ties */
                w[i] = x;
            }
            if (!check_nvfp4("random", seed, w, N, K, 0)) { free(w); return; }
            if (!check_nvfp4("shared gscale", seed, w, N, K, 0.01f)) { free(w); return; }
            free(w);
        }
    }
}

TEST(quant_nvfp4_quantize_cases)
{
    float w[2 * 32];
    uint8_t codes[2 * 16], scales[2 * 2];
    /* all-zero tensor: gscale 1, every block scale 1.0 (0x38), every code 0 */
    memset(w, 0, sizeof w);
    EXPECT(nvfp4_quantize(w, 2, 32, 0, codes, scales) == 1.0f, "all-zero tensor: gscale 1");
    for (int i = 0; i < 4; i++) EXPECT(scales[i] == 0x38, "zero block scale 0x%02x, want 1.0 (0x38)", scales[i]);
    for (int i = 0; i < 32; i++) EXPECT(codes[i] == 0, "zero block code byte %d = 0x%02x", i, codes[i]);
    EXPECT(nvfp4_global_scale(w, 64) == 1.0f, "global scale of zeros");

    /* a single maximum: gscale = amax/2688, its block scale is 448 and its code 6 */
    w[21] = -5.0f; /* row 0, block 1, element 5 */
    float g = nvfp4_quantize(w, 2, 32, 0, codes, scales);
    EXPECT(g == 5.0f / 2688.0f && g == nvfp4_global_scale(w, 64), "gscale %.9g", g);
    EXPECT(scales[0] == 0x38 && scales[2] == 0x38 && scales[3] == 0x38, "the zero blocks keep scale 1.0");
    EXPECT(scales[1] == 0x7e, "max block scale 0x%02x, want 448 (0x7e)", scales[1]);
    EXPECT((codes[10] >> 4) == 0xf && (codes[10] & 0xf) == 0, "element 21 is -6 (high nibble of byte 10): 0x%02x", codes[10]);
    QTensor t = {.fmt = QF_NVFP4, .rows = 2, .cols = 32, .data = codes, .scale = scales, .gscale = g, .name = "one"};
    float out[32];
    qtensor_decode(&t, 0, 0, 32, out);
    EXPECT_NEAR(out[21], -5.0f, 0, 1e-6);

    /* shared gscale given by the caller is used as is and returned */
    for (int i = 0; i < 64; i++) w[i] = (float)(i % 7) - 3.0f;
    g = nvfp4_quantize(w, 2, 32, 0.5f, codes, scales);
    EXPECT(g == 0.5f, "given gscale returned: %g", g);
    if (!check_nvfp4("shared", 0, w, 2, 32, 0.5f)) return;
    /* 3 / (6 * 0.5) = 1.0 per block: codes are the values themselves */
    for (int i = 0; i < 4; i++) EXPECT(scales[i] == 0x38, "block %d scale 0x%02x, want 1.0", i, scales[i]);
    t.gscale = 0.5f;
    qtensor_decode(&t, 1, 0, 32, out);
    for (int k = 0; k < 32; k++) EXPECT(out[k] == w[32 + k], "row 1 col %d: %g, want %g", k, out[k], w[32 + k]);

    /* clamps: a huge shared gscale drives block scales below 2^-9 (clamped up, codes 0 or tiny);
     * a tiny one above 448 (clamped down, codes saturate at 6) */
    for (int i = 0; i < 64; i++) w[i] = 1.0f;
    nvfp4_quantize(w, 2, 32, 1000.0f, codes, scales);
    EXPECT(scales[0] == 0x01, "scale clamped to 2^-9: 0x%02x", scales[0]);
    if (!check_nvfp4("clamp low", 0, w, 2, 32, 1000.0f)) return;
    nvfp4_quantize(w, 2, 32, 1e-6f, codes, scales);
    EXPECT(scales[0] == 0x7e && codes[0] == 0x77, "clamped to 448, codes saturate: 0x%02x 0x%02x", scales[0], codes[0]);
    if (!check_nvfp4("clamp high", 0, w, 2, 32, 1e-6f)) return;
}

TEST(quant_nvfp4_dequant_error)
{
    const uint64_t seed = 21;
    const int64_t N = 32, K = 512;
    Rng r;
    rng_seed(&r, seed);
    float *w = malloc(N * K * sizeof *w), *out = malloc(K * sizeof *out);
    uint8_t *codes = malloc(N * K / 2), *scales = malloc(N * K / 16);
    for (int64_t i = 0; i < N * K; i++) w[i] = rng_normal(&r) * 0.05f * (1 + (float)(i / K) / 4);
    float g = nvfp4_quantize(w, N, K, 0, codes, scales);
    QTensor t = {.fmt = QF_NVFP4, .rows = N, .cols = K, .data = codes, .scale = scales, .gscale = g, .name = "err"};
    double se = 0, sw = 0;
    for (int64_t n = 0; n < N; n++) {
        qtensor_decode(&t, n, 0, K, out);
        for (int64_t k = 0; k < K; k++) {
            /* within a block the step is d = float(s_b) * g; the grid's half gap is 0.25 d below 2,
             * 0.5 d below 4 and d above; beyond 6 d (scale rounded down) the error is at most
             * 6 d * 2^-4 / (1 - 2^-4) < 0.4 d */
            double d = e4m3_to_f32(scales[n * (K / 16) + k / 16]) * g, a = fabs(w[n * K + k]) / d;
            double half = a <= 2 ? 0.25 : a <= 4 ? 0.5 : 1.0, err = fabs(out[k] - w[n * K + k]);
            if (!(err <= half * d * (1 + 1e-6))) {
                test_fail(__FILE__, __LINE__, "seed %llu row %lld col %lld: w %.9g decoded %.9g, step %.9g",
                          (unsigned long long)seed, (long long)n, (long long)k, w[n * K + k], out[k], d);
                goto done;
            }
            se += err * err;
            sw += (double)w[n * K + k] * w[n * K + k];
        }
    }
    /* NVFP4 on Gaussian data: relative RMS error about 0.1 */
    EXPECT(sqrt(se / sw) < 0.12, "seed %llu: relative rms error %.4f", (unsigned long long)seed, sqrt(se / sw));
done:
    free(w); free(out); free(codes); free(scales);
}

/* ---- QTensor decode, slices, bytes ---- */

/* The element value by the scalar codecs: the definition qtensor_decode must equal bit for bit. */
static float ref_element(const QTensor *w, int64_t n, int64_t k)
{
    const int64_t K = w->cols;
    switch (w->fmt) {
    case QF_F32: return load_f32(w->data + 4 * (n * K + k));
    case QF_BF16: return bf16_to_f32(load_u16(w->data + 2 * (n * K + k)));
    case QF_F16: return f16_to_f32(load_u16(w->data + 2 * (n * K + k)));
    case QF_FP8: return e4m3_to_f32(w->data[n * K + k]) * w->gscale;
    case QF_FP8_BLOCK: {
        int64_t gk = (K + 127) / 128, sr = (w->scale_row_off + n) / 128;
        float s = w->scale_dtype == DT_F32 ? load_f32(w->scale + 4 * (sr * gk + k / 128))
                                           : bf16_to_f32(load_u16(w->scale + 2 * (sr * gk + k / 128)));
        return e4m3_to_f32(w->data[n * K + k]) * s;
    }
    case QF_NVFP4: {
        uint8_t b = w->data[n * (K / 2) + k / 2];
        float s = e4m3_to_f32(w->scale[n * (K / 16) + k / 16]);
        return e2m1_value[(k & 1) ? b >> 4 : b & 15] * (s * w->gscale);
    }
    default: return NAN;
    }
}

/* Decode every row whole and in pieces [k0, k1) and compare with ref_element. */
static int check_decode(const QTensor *w, const char *what, uint64_t seed)
{
    const int64_t K = w->cols, step = w->fmt == QF_NVFP4 ? 16 : 1;
    float *out = malloc((size_t)(K + 1) * sizeof *out);
    Rng r;
    rng_seed(&r, seed ^ 0xdec0de);
    for (int64_t n = 0; n < w->rows; n++) {
        for (int pass = 0; pass < 3; pass++) {
            int64_t k0 = 0, k1 = K;
            if (pass > 0) { /* random piece, aligned as the format requires */
                k0 = (int64_t)(rng_u64(&r) % (uint64_t)(K / step + 1)) * step;
                k1 = k0 + (int64_t)(rng_u64(&r) % (uint64_t)((K - k0) / step + 1)) * step;
            }
            out[k1 - k0] = 12345.0f; /* guard: nothing past k1 - k0 is written */
            qtensor_decode(w, n, k0, k1, out);
            for (int64_t k = k0; k < k1; k++) {
                float want = ref_element(w, n, k);
                if (!same_float(out[k - k0], want)) {
                    test_fail(__FILE__, __LINE__, "%s %s seed %llu: row %lld col %lld (decode [%lld, %lld)): %.9g, want %.9g",
                              qformat_name(w->fmt), what, (unsigned long long)seed, (long long)n, (long long)k,
                              (long long)k0, (long long)k1, out[k - k0], want);
                    free(out);
                    return 0;
                }
            }
            if (out[k1 - k0] != 12345.0f) {
                test_fail(__FILE__, __LINE__, "%s %s: decode [%lld, %lld) wrote past its end", qformat_name(w->fmt), what,
                          (long long)k0, (long long)k1);
                free(out);
                return 0;
            }
        }
    }
    free(out);
    return 1;
}

/* Random codes for format f, N x K, stored at an odd address; scales likewise. Returns the
 * QTensor; *mem receives the buffer to free. */
static QTensor make_random(QFormat f, int64_t N, int64_t K, DType sdt, Rng *r, uint8_t **mem)
{
    int64_t code_bytes = f == QF_F32 ? 4 * N * K : f == QF_BF16 || f == QF_F16 ? 2 * N * K : f == QF_NVFP4 ? N * K / 2 : N * K;
    int64_t gn = (N + 127) / 128, gk = (K + 127) / 128;
    int64_t scale_bytes = f == QF_NVFP4 ? N * K / 16 : f == QF_FP8_BLOCK ? gn * gk * (dtype_bits(sdt) / 8) : 0;
    uint8_t *m = malloc((size_t)(code_bytes + scale_bytes + 2));
    QTensor w = {.fmt = f, .rows = N, .cols = K, .data = m + 1, .scale = m + 2 + code_bytes, .scale_dtype = sdt,
                 .gscale = 1.0f, .name = "random"};
    uint8_t *d = m + 1, *s = m + 2 + code_bytes;
    for (int64_t i = 0; i < N * K; i++) {
        float x = rng_normal(r);
        switch (f) {
        case QF_F32: memcpy(d + 4 * i, &x, 4); break;
        case QF_BF16: { uint16_t h = f32_to_bf16(x); memcpy(d + 2 * i, &h, 2); break; }
        case QF_F16: { uint16_t h = f32_to_f16(x); memcpy(d + 2 * i, &h, 2); break; }
        default: break;
        }
    }
    if (f == QF_FP8 || f == QF_FP8_BLOCK || f == QF_NVFP4)
        for (int64_t i = 0; i < code_bytes; i++) {
            uint8_t b = (uint8_t)rng_u64(r);
            d[i] = (f != QF_NVFP4 && (b & 0x7f) == 0x7f) ? 0x3f : b; /* no NaN codes */
        }
    if (f == QF_NVFP4)
        for (int64_t i = 0; i < scale_bytes; i++) s[i] = (uint8_t)(rng_u64(r) % 0x7f); /* non-negative, no NaN */
    if (f == QF_FP8_BLOCK)
        for (int64_t i = 0; i < gn * gk; i++) {
            float v = ldexpf(1.0f + rng_uniform(r), -(int)(rng_u64(r) % 12));
            if (sdt == DT_F32) memcpy(s + 4 * i, &v, 4);
            else { uint16_t h = f32_to_bf16(v); memcpy(s + 2 * i, &h, 2); }
        }
    if (f == QF_FP8) w.gscale = 0.0123f;
    if (f == QF_NVFP4) w.gscale = 0.00071f;
    *mem = m;
    return w;
}

TEST(quant_decode_formats)
{
    static const struct { QFormat f; DType sdt; int64_t N, K; } cases[] = {
        {QF_F32, DT_F32, 3, 37},       {QF_BF16, DT_F32, 4, 33},      {QF_F16, DT_F32, 2, 29},
        {QF_FP8, DT_F32, 5, 200},      {QF_FP8_BLOCK, DT_F32, 130, 300}, {QF_FP8_BLOCK, DT_BF16, 257, 129},
        {QF_NVFP4, DT_F8_E4M3, 7, 96}, {QF_NVFP4, DT_F8_E4M3, 2, 1024},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint64_t seed = 300 + i;
        Rng r;
        rng_seed(&r, seed);
        uint8_t *mem;
        QTensor w = make_random(cases[i].f, cases[i].N, cases[i].K, cases[i].sdt, &r, &mem);
        int ok = check_decode(&w, "whole", seed);
        free(mem);
        if (!ok) return;
    }
}

TEST(quant_rows_slice)
{
    static const struct { QFormat f; DType sdt; int64_t N, K, r0, n; } cases[] = {
        {QF_F32, DT_F32, 9, 20, 3, 4},           {QF_BF16, DT_F32, 9, 21, 8, 1},
        {QF_F16, DT_F32, 9, 22, 0, 9},           {QF_FP8, DT_F32, 9, 23, 2, 5},
        {QF_FP8_BLOCK, DT_F32, 300, 260, 100, 150}, {QF_FP8_BLOCK, DT_BF16, 300, 130, 129, 171},
        {QF_NVFP4, DT_F8_E4M3, 9, 64, 5, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint64_t seed = 400 + i;
        Rng r;
        rng_seed(&r, seed);
        uint8_t *mem;
        QTensor w = make_random(cases[i].f, cases[i].N, cases[i].K, cases[i].sdt, &r, &mem);
        QTensor s = qtensor_rows(&w, cases[i].r0, cases[i].n);
        int64_t K = w.cols;
        float *a = malloc(K * sizeof *a), *b = malloc(K * sizeof *b);
        EXPECT(s.rows == cases[i].n && s.cols == K && s.fmt == w.fmt && s.gscale == w.gscale, "slice header");
        for (int64_t n = 0; n < s.rows && !test_failed_now(); n++) {
            qtensor_decode(&s, n, 0, K, a);
            qtensor_decode(&w, cases[i].r0 + n, 0, K, b);
            EXPECT(memcmp(a, b, K * sizeof *a) == 0, "%s seed %llu: slice row %lld differs from row %lld",
                   qformat_name(w.fmt), (unsigned long long)seed, (long long)n, (long long)(cases[i].r0 + n));
        }
        /* a slice of a slice */
        if (s.rows >= 2) {
            QTensor ss = qtensor_rows(&s, 1, s.rows - 1);
            qtensor_decode(&ss, 0, 0, K, a);
            qtensor_decode(&w, cases[i].r0 + 1, 0, K, b);
            EXPECT(memcmp(a, b, K * sizeof *a) == 0, "%s: slice of a slice", qformat_name(w.fmt));
        }
        int ok = !test_failed_now() && check_decode(&s, "slice", seed);
        free(a); free(b); free(mem);
        if (!ok) return;
    }
}

/* qtensor_rows_concat (model/load.c fuse): the parts' rows one after the other, each decoding as
 * it did in its part (slices too, as TP shards are); refused, with nothing allocated, where one
 * GEMM could not compute both (another format, columns or global scale, block FP8, packed) */
TEST(quant_rows_concat)
{
    static const QFormat fmts[] = {QF_F32, QF_BF16, QF_F16, QF_FP8, QF_NVFP4};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        Rng r;
        rng_seed(&r, 900 + i);
        uint8_t *ma, *mb;
        QTensor a = make_random(fmts[i], 7, 64, DT_F8_E4M3, &r, &ma), big = make_random(fmts[i], 12, 64, DT_F8_E4M3, &r, &mb);
        if (fmts[i] == QF_FP8 || fmts[i] == QF_NVFP4) a.gscale = 0.37f; /* one global scale for both */
        QTensor b = qtensor_rows(&big, 3, 5); /* a slice, as a TP shard is */
        b.gscale = a.gscale;
        const QTensor *parts[2] = {&a, &b};
        QTensor f;
        void *own = NULL;
        ASSERT(qtensor_rows_concat(parts, 2, &f, &own) == 0, "%s: refused", qformat_name(a.fmt));
        EXPECT(own && f.data == own && f.rows == 12 && f.cols == 64 && f.fmt == a.fmt && f.gscale == a.gscale && !f.packed,
               "%s: header", qformat_name(a.fmt));
        float *x = malloc(64 * sizeof *x), *y = malloc(64 * sizeof *y);
        for (int64_t n = 0; n < f.rows && !test_failed_now(); n++) {
            qtensor_decode(&f, n, 0, 64, x);
            qtensor_decode(n < 7 ? &a : &b, n < 7 ? n : n - 7, 0, 64, y);
            EXPECT(memcmp(x, y, 64 * sizeof *x) == 0, "%s: fused row %lld differs from its part's", qformat_name(a.fmt),
                   (long long)n);
        }
        free(x); free(y); free(own);
        /* refusals */
        QTensor c = b;
        c.gscale = a.gscale * 2;
        own = (void *)1;
        parts[1] = &c;
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "%s: another global scale", qformat_name(a.fmt));
        QTensor narrow = qtensor_rows(&big, 0, 4);
        narrow.cols = 32;
        narrow.gscale = a.gscale;
        parts[1] = &narrow;
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "%s: other columns", qformat_name(a.fmt));
        c = b;
        c.packed = 1;
        parts[1] = &c;
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "%s: packed", qformat_name(a.fmt));
        c = b;
        c.data = NULL;
        c.scale = NULL;
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "%s: a skeleton beside data", qformat_name(a.fmt));
        /* skeletons (dummy weights) add up their shapes */
        QTensor sa = a, sb = b;
        sa.data = sb.data = NULL;
        sa.scale = sb.scale = NULL;
        parts[0] = &sa;
        parts[1] = &sb;
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == 0 && !own && !f.data && f.rows == 12, "%s: skeletons",
               qformat_name(a.fmt));
        free(ma); free(mb);
    }
    /* another format; block FP8: the grids stack where the parts' rows keep to whole scale blocks */
    Rng r;
    rng_seed(&r, 950);
    uint8_t *ma, *mb;
    QTensor a = make_random(QF_BF16, 4, 64, DT_F32, &r, &ma), b = make_random(QF_F16, 4, 64, DT_F32, &r, &mb);
    const QTensor *parts[2] = {&a, &b};
    QTensor f;
    void *own;
    EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "bf16 beside f16");
    free(ma); free(mb);
    for (int sdt = 0; sdt < 2; sdt++) {
        QTensor whole = make_random(QF_FP8_BLOCK, 256, 300, sdt ? DT_BF16 : DT_F32, &r, &ma),
                big = make_random(QF_FP8_BLOCK, 400, 300, sdt ? DT_BF16 : DT_F32, &r, &mb);
        a = qtensor_rows(&whole, 128, 128);
        b = qtensor_rows(&big, 256, 100); /* the last part may end inside a block */
        ASSERT(qtensor_rows_concat(parts, 2, &f, &own) == 0 && own, "block fp8 refused");
        EXPECT(f.rows == 228 && f.scale_row_off == 0 && f.scale_dtype == a.scale_dtype, "block fp8 header");
        float *x = malloc(300 * sizeof *x), *y = malloc(300 * sizeof *y);
        for (int64_t n = 0; n < f.rows && !test_failed_now(); n++) {
            qtensor_decode(&f, n, 0, 300, x);
            qtensor_decode(n < 128 ? &a : &b, n < 128 ? n : n - 128, 0, 300, y);
            EXPECT(memcmp(x, y, 300 * sizeof *x) == 0, "block fp8: fused row %lld differs from its part's", (long long)n);
        }
        free(x); free(y); free(own);
        a = qtensor_rows(&whole, 0, 100); /* a part before the last ending inside a block */
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "block fp8: a seam inside a block");
        a = qtensor_rows(&whole, 28, 128); /* a part starting inside one */
        EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "block fp8: a part starting inside a block");
        free(ma); free(mb);
    }
    a = make_random(QF_FP8_BLOCK, 128, 128, DT_F32, &r, &ma);
    b = make_random(QF_FP8_BLOCK, 128, 128, DT_BF16, &r, &mb);
    EXPECT(qtensor_rows_concat(parts, 2, &f, &own) == -1 && !own, "block fp8: another scale dtype");
    free(ma); free(mb);
}

TEST(quant_bytes)
{
    static uint8_t dummy[300 * 300]; /* the pointers below stay inside it */
    QTensor w = {.fmt = QF_NVFP4, .rows = 32, .cols = 64, .data = dummy, .scale = dummy, .gscale = 1, .name = "b"};
    EXPECT(qtensor_bytes(&w) == 32 * 32 + 32 * 4, "nvfp4 %g", qtensor_bytes(&w));
    QTensor s = qtensor_rows(&w, 8, 4);
    EXPECT(qtensor_bytes(&s) == 4 * 32 + 4 * 4, "nvfp4 slice %g", qtensor_bytes(&s));
    EXPECT(s.data == dummy + 8 * 32 && s.scale == dummy + 8 * 4, "nvfp4 slice pointers");
    w.fmt = QF_BF16;
    EXPECT(qtensor_bytes(&w) == 32 * 64 * 2, "bf16 %g", qtensor_bytes(&w));
    w.fmt = QF_F16;
    EXPECT(qtensor_bytes(&w) == 32 * 64 * 2, "f16 %g", qtensor_bytes(&w));
    w.fmt = QF_F32;
    EXPECT(qtensor_bytes(&w) == 32 * 64 * 4, "f32 %g", qtensor_bytes(&w));
    w.fmt = QF_FP8;
    EXPECT(qtensor_bytes(&w) == 32 * 64, "fp8 %g", qtensor_bytes(&w));
    w = (QTensor){.fmt = QF_FP8_BLOCK, .rows = 300, .cols = 300, .data = dummy, .scale = dummy,
                  .scale_dtype = DT_F32, .gscale = 1, .name = "b"};
    EXPECT(qtensor_bytes(&w) == 300 * 300 + 3 * 3 * 4, "fp8-block %g", qtensor_bytes(&w));
    s = qtensor_rows(&w, 100, 150); /* grid rows 0 and 1 */
    EXPECT(s.scale == dummy && s.scale_row_off == 100 && s.data == dummy + 100 * 300, "fp8-block slice");
    EXPECT(qtensor_bytes(&s) == 150 * 300 + 2 * 3 * 4, "fp8-block slice %g", qtensor_bytes(&s));
    w.scale_dtype = DT_BF16;
    s = qtensor_rows(&w, 256, 44); /* grid row 2 only */
    EXPECT(qtensor_bytes(&s) == 44 * 300 + 1 * 3 * 2, "fp8-block bf16 slice %g", qtensor_bytes(&s));
}

/* ---- FP8 quantizers ---- */

TEST(quant_fp8_roundtrip)
{
    const uint64_t seed = 31;
    const int64_t N = 8, K = 100;
    Rng r;
    rng_seed(&r, seed);
    float w[8 * 100], out[100];
    uint8_t mem[8 * 100 + 1], *q = mem + 1;
    for (int i = 0; i < N * K; i++) w[i] = rng_normal(&r) * 0.3f;
    w[17] = -2.0f; /* the amax */
    float scale = fp8_quantize(w, (size_t)(N * K), q);
    EXPECT(scale == 2.0f / 448.0f, "scale %.9g", scale);
    EXPECT(q[17] == 0xfe, "the amax maps to -448: 0x%02x", q[17]);
    QTensor t = {.fmt = QF_FP8, .rows = N, .cols = K, .data = q, .gscale = scale, .name = "fp8"};
    for (int64_t n = 0; n < N; n++) {
        qtensor_decode(&t, n, 0, K, out);
        for (int64_t k = 0; k < K; k++) {
            float x = w[n * K + k];
            /* e4m3: relative half-ulp 2^-4 for normals, absolute 2^-10 for subnormals */
            EXPECT(q[n * K + k] == ref_e4m3_encode(x / scale), "seed %llu: code at %lld", (unsigned long long)seed, (long long)(n * K + k));
            EXPECT_NEAR(out[k], x, 0x1p-10 * scale * 1.0001, 0x1p-4);
            if (test_failed_now()) return;
        }
    }
    float z[5] = {0};
    EXPECT(fp8_quantize(z, 5, q) == 1.0f && q[0] == 0 && q[4] == 0, "all-zero tensor: scale 1, codes 0");
}

TEST(quant_fp8_block_roundtrip)
{
    const uint64_t seed = 32;
    const int64_t N = 200, K = 300, gn = 2, gk = 3;
    Rng r;
    rng_seed(&r, seed);
    float *w = malloc(N * K * sizeof *w), *out = malloc(K * sizeof *out), scale[2 * 3];
    uint8_t *mem = malloc(N * K + 1), *q = mem + 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int64_t b = (n / 128) * gk + k / 128;
            w[n * K + k] = b == 4 ? 0.0f : rng_normal(&r) * ldexpf(1, (int)b - 3); /* block (1,1) all zero */
        }
    fp8_block_quantize(w, N, K, q, scale);
    for (int64_t bn = 0; bn < gn; bn++)
        for (int64_t bk = 0; bk < gk; bk++) {
            float amax = 0;
            for (int64_t n = bn * 128; n < N && n < (bn + 1) * 128; n++)
                for (int64_t k = bk * 128; k < K && k < (bk + 1) * 128; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
            float want = amax > 0 ? amax / 448.0f : 1.0f;
            EXPECT(scale[bn * gk + bk] == want, "seed %llu: block (%lld,%lld) scale %.9g, want %.9g",
                   (unsigned long long)seed, (long long)bn, (long long)bk, scale[bn * gk + bk], want);
        }
    EXPECT(scale[4] == 1.0f, "zero block scale 1");
    QTensor t = {.fmt = QF_FP8_BLOCK, .rows = N, .cols = K, .data = q, .scale = (const uint8_t *)scale,
                 .scale_dtype = DT_F32, .gscale = 1, .name = "fp8b"};
    for (int64_t n = 0; n < N && !test_failed_now(); n++) {
        qtensor_decode(&t, n, 0, K, out);
        for (int64_t k = 0; k < K; k++) {
            float s = scale[(n / 128) * gk + k / 128], x = w[n * K + k];
            EXPECT(q[n * K + k] == ref_e4m3_encode(x / s), "seed %llu: code at row %lld col %lld", (unsigned long long)seed, (long long)n, (long long)k);
            EXPECT_NEAR(out[k], x, 0x1p-10 * s * 1.0001, 0x1p-4);
            if (test_failed_now()) break;
        }
    }
    free(w); free(out); free(mem);
}

/* an NVFP4 width padded for the packed kernels (model/upload.c up_widths): W where it was, zeros
 * in the new rows (per half of a fused [gate; up]) and columns */
TEST(quant_nvfp4_pad)
{
    Rng r;
    rng_seed(&r, 77);
    const int64_t N = 2 * 24, K = 48, Np = 32, Kp = 256; /* two halves of 24 rows -> 32 each; 48 -> 256 columns */
    float *w = malloc((size_t)N * K * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) w[i] = rng_normal(&r);
    uint8_t *codes = malloc((size_t)N * K / 2), *scales = malloc((size_t)N * K / 16);
    float g = nvfp4_quantize(w, N, K, nvfp4_global_scale(w, (size_t)N * K), codes, scales);
    QTensor q = {.fmt = QF_NVFP4, .rows = N, .cols = K, .data = codes, .scale = scales, .gscale = g};
    uint8_t *pc = malloc((size_t)2 * Np * Kp / 2), *ps = malloc((size_t)2 * Np * Kp / 16);
    memset(pc, 0xAB, (size_t)2 * Np * Kp / 2);   /* every byte must be written */
    memset(ps, 0xAB, (size_t)2 * Np * Kp / 16);
    ASSERT(qtensor_nvfp4_pad(&q, 2, Np, Kp, pc, ps) == 0);
    QTensor p = {.fmt = QF_NVFP4, .rows = 2 * Np, .cols = Kp, .data = pc, .scale = ps, .gscale = g};
    float *a = malloc(K * sizeof(float)), *b = malloc(Kp * sizeof(float));
    int bad = 0;
    for (int64_t row = 0; row < 2 * Np; row++) {
        int64_t half = row / Np, rr = row % Np;
        qtensor_decode(&p, row, 0, Kp, b);
        if (rr < N / 2) {
            qtensor_decode(&q, half * (N / 2) + rr, 0, K, a);
            for (int64_t k = 0; k < K; k++) bad += a[k] != b[k];
            for (int64_t k = K; k < Kp; k++) bad += b[k] != 0.0f;
        } else {
            for (int64_t k = 0; k < Kp; k++) bad += b[k] != 0.0f;
        }
    }
    EXPECT_EQ_INT(bad, 0);
    /* what cannot hold W is refused, writing nothing */
    EXPECT_EQ_INT(qtensor_nvfp4_pad(&q, 2, 16, Kp, pc, ps), -1);
    EXPECT_EQ_INT(qtensor_nvfp4_pad(&q, 1, N, 40, pc, ps), -1);
    EXPECT_EQ_INT(qtensor_nvfp4_pad(&q, 5, Np, Kp, pc, ps), -1);
    QTensor bf = q;
    bf.fmt = QF_BF16;
    EXPECT_EQ_INT(qtensor_nvfp4_pad(&bf, 1, N, Kp, pc, ps), -1);
    free(w); free(codes); free(scales); free(pc); free(ps); free(a); free(b);
}
