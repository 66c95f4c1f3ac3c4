/* fill.h: the element function of the random fills (backend.h FillKind), shared by the CPU
 * and CUDA twins so that both write the same bits: a splitmix64 hash of (seed, i), four 16-bit
 * uniforms summed (Irwin-Hall) for a bell-shaped value of variance 1, exact in float. */
#ifndef MOESERVE_FILL_H
#define MOESERVE_FILL_H

#include <stdint.h>

#ifdef __CUDACC__
#define FILL_FN __host__ __device__ static inline
#else
#define FILL_FN static inline
#endif

FILL_FN uint64_t fill_hash(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* sum of four uniforms on [0, 1), centred and scaled to variance 1: (s - 2) * sqrt(3) */
FILL_FN float fill_normal(uint64_t seed, uint64_t i)
{
    uint64_t h = fill_hash(seed, i);
    float s = (float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) + (float)(h >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

FILL_FN uint8_t fill_e4m3_unit(uint64_t seed, uint64_t i)
{
    uint64_t h = fill_hash(seed, i);
    /* exponent field 6 or 7 (2^-1, 2^0), any mantissa: magnitudes in [0.5, 2) */
    return (uint8_t)((h & 0x80) | (6 + ((h >> 8) & 1)) << 3 | ((h >> 16) & 7));
}

#endif
