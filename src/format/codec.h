/* codec.h: the scalar BF16 and E4M3 (float8_e4m3fn: bias 7, no inf, 0x7f/0xff NaN) codecs as
 * inline functions that compile for the host and, under nvcc, for the device, so that a CUDA
 * kernel rounds exactly as the CPU does: quant.c's f32_to_bf16 and f32_to_e4m3 are these, and
 * the KV cache's element codec (backend/kv_elem.h) uses them on both backends. */
#ifndef MOESERVE_CODEC_H
#define MOESERVE_CODEC_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CODEC_FN __host__ __device__ static inline
#else
#define CODEC_FN static inline
#endif

CODEC_FN uint32_t codec_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

CODEC_FN float codec_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

CODEC_FN float codec_bf16_to_f32(uint16_t h) { return codec_f32_from_bits((uint32_t)h << 16); }

/* round to nearest even; NaN stays NaN */
CODEC_FN uint16_t codec_f32_to_bf16(float f)
{
    uint32_t u = codec_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)     /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1);           /* round to nearest even; carries into the exponent */
    return (uint16_t)(u >> 16);
}

/* float8_e4m3fn: e = 0 -> m * 2^-9; else (1 + m/8) * 2^(e-7), built from its bits (exact);
 * 0x7f and 0xff are NaN; no infinities. */
CODEC_FN float codec_e4m3_to_f32(uint8_t b)
{
    uint32_t s = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return codec_f32_from_bits(s | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0.001953125f; /* 2^-9 */
        return s ? -v : v;
    }
    return codec_f32_from_bits(s | (e + 120) << 23 | m << 20); /* rebias 7 -> 127 */
}

/* round to nearest even, saturating at +-448 (inf too, as __NV_SATFINITE); NaN -> 0x7f */
CODEC_FN uint8_t codec_f32_to_e4m3(float f)
{
    uint32_t u = codec_f32_bits(f), s = (u >> 24) & 0x80u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f;                   /* NaN */
    if (u >= 0x43e00000u) return (uint8_t)(s | 0x7e);   /* >= 448, inf too: saturate (satfinite) */
    if (u >= 0x3c800000u) {                             /* >= 2^-6: normal */
        u += 0x7ffffu + ((u >> 20) & 1);                /* RNE to 3 mantissa bits; < 448 stays <= 448 */
        return (uint8_t)(s | (u - 0x3c000000u) >> 20);  /* rebias 127 -> 7 (120 << 23) */
    }
    /* Subnormal m * 2^-9: 16384 has ulp 2^-9, so the addition rounds to nearest even; m = 8
     * becomes code 0x08, the smallest normal. */
    return (uint8_t)(s | (codec_f32_bits(codec_f32_from_bits(u) + 16384.0f) - 0x46800000u));
}

#endif
