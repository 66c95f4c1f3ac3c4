/* kv_elem.h: one element of the paged KV cache in its dtype (model.h KVDtype), shared by the
 * CPU and CUDA twins so that both store and read the same bits: float32 as is; BF16 rounded to
 * nearest even; FP8 as float8_e4m3fn of x / scale (round to nearest even, saturating at +-448,
 * vLLM's scaled_fp8_conversion) read back as code * scale. The codecs are format/codec.h, the
 * ones quant.c uses. */
#ifndef MOESERVE_KV_ELEM_H
#define MOESERVE_KV_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "../format/codec.h"
#include "../format/config.h"

#define KV_FN CODEC_FN

/* bytes of one element */
KV_FN size_t kv_elem_size(KVDtype dt)
{
    return dt == KV_DTYPE_BF16 ? 2 : dt == KV_DTYPE_FP8 ? 1 : 4;
}

/* element i of cache as float32 (scale: FP8 only) */
KV_FN float kv_elem_load(const void *cache, KVDtype dt, int64_t i, float scale)
{
    switch (dt) {
    case KV_DTYPE_BF16: return codec_bf16_to_f32(((const uint16_t *)cache)[i]);
    case KV_DTYPE_FP8: return codec_e4m3_to_f32(((const uint8_t *)cache)[i]) * scale;
    default: return ((const float *)cache)[i];
    }
}

/* element i of cache = x rounded to the dtype (scale: FP8 only) */
KV_FN void kv_elem_store(void *cache, KVDtype dt, int64_t i, float x, float scale)
{
    switch (dt) {
    case KV_DTYPE_BF16: ((uint16_t *)cache)[i] = codec_f32_to_bf16(x); break;
    case KV_DTYPE_FP8: ((uint8_t *)cache)[i] = codec_f32_to_e4m3(x / scale); break;
    default: ((float *)cache)[i] = x; break;
    }
}

#endif
