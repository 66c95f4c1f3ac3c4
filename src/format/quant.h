/* quant: number formats of checkpoints: dtypes, the BF16/F16/E4M3/E2M1
 * codecs, NVFP4 and FP8 quantize/dequantize, and QTensor, one linear weight in its stored
 * format, decoded row block by row block on the fly (never dequantized whole).
 * NVFP4 is ModelOpt's (NVIDIA/Model-Optimizer, modelopt/torch/quantization/qtensor/nvfp4_tensor.py:
 * NVFP4QTensor.quantize / dequantize, get_weights_scaling_factor(_2), _cast_fp4). */
#ifndef MOESERVE_QUANT_H
#define MOESERVE_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* safetensors dtypes ([ST] tensor.rs enum Dtype). */
typedef enum {
    DT_BOOL, DT_U8, DT_I8, DT_F8_E4M3, DT_F8_E5M2, DT_F8_E8M0, DT_F4,
    DT_I16, DT_U16, DT_F16, DT_BF16, DT_I32, DT_U32, DT_F32, DT_F64, DT_I64, DT_U64,
    DT_COUNT
} DType;

const char *dtype_name(DType t);         /* "BF16" */
int dtype_parse(const char *s, DType *t); /* 0 ok, -1 unknown */
int dtype_bits(DType t);                  /* 4 for F4, else 8 x bytes */

/* Scalar codecs. Loads go through memcpy so unaligned mmapped data is fine. */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);   /* round to nearest even; NaN stays NaN */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);    /* round to nearest even; overflow -> inf */
float e4m3_to_f32(uint8_t b);    /* float8_e4m3fn: bias 7, no inf, 0x7f/0xff NaN */
uint8_t f32_to_e4m3(float f);    /* round to nearest even, saturating at +-448; NaN -> 0x7f */
extern const float e2m1_value[16]; /* code -> value, bit 3 sign */
uint8_t f32_to_e2m1(float x);    /* round half to even, saturating at +-6 (_cast_fp4) */
float load_f32(const void *p);   /* unaligned little-endian loads */
uint16_t load_u16(const void *p);
/* Element i of a tensor of dtype t as float (BF16, F16, F32, F64, F8_E4M3, integers). */
float dtype_load(DType t, const void *base, size_t i);

/* Storage format of one linear weight W [N out, K in], applied as y = x W^T. */
typedef enum {
    QF_F32,       /* data: f32 [N, K] */
    QF_BF16,      /* data: bf16 [N, K] */
    QF_F16,       /* data: f16 [N, K] */
    QF_FP8,       /* data: e4m3 [N, K]; W = q * gscale (ModelOpt per-tensor weight_scale) */
    QF_FP8_BLOCK, /* data: e4m3 [N, K]; W = q * scale[n/128][k/128] (weight_scale_inv) */
    QF_NVFP4,     /* data: u8 [N, K/2] two E2M1 codes, low nibble first; scale: e4m3 [N, K/16];
                     W = e2m1 * scale * gscale (weight_scale_2), as ModelOpt's dequantize */
    QF_COUNT
} QFormat;

typedef struct {
    QFormat fmt;
    int64_t rows, cols;       /* N, K */
    const uint8_t *data;      /* borrowed: row-major codes, see QFormat */
    const uint8_t *scale;     /* borrowed: NVFP4 e4m3 [N, K/16]; FP8_BLOCK [ceil(N/128), ceil(K/128)] */
    DType scale_dtype;        /* FP8_BLOCK: F32 or BF16 */
    int64_t scale_row_off;    /* FP8_BLOCK: row of W's first row inside the scale grid (fused views) */
    float gscale;             /* NVFP4 weight_scale_2, FP8 weight_scale; 1 otherwise */
    int packed;               /* NVFP4 in backend memory only: data holds the W4P layout of the
                                 CUDA kernels (src/backend/cuda/w4_pack.cu: codes and scales together,
                                 same bytes), scale is NULL; never on the host */
    const char *name;         /* borrowed: checkpoint name, for messages */
} QTensor;

const char *qformat_name(QFormat f);    /* "nvfp4", "fp8", "fp8-block", "bf16", ... */
/* Decode W[row, k0:k1) to float. k0 and k1 must be multiples of 16 (NVFP4) or k1 == K. */
void qtensor_decode(const QTensor *w, int64_t row, int64_t k0, int64_t k1, float *out);
/* Bytes a kernel must read to use all of W (codes + scales). */
double qtensor_bytes(const QTensor *w);
/* Rows [r0, r0 + n) of W as a QTensor of their own (a slice, no copy). */
QTensor qtensor_rows(const QTensor *w, int64_t r0, int64_t n);
/* Columns [c0, c0 + n) of W copied into one new allocation (*owned, the caller frees it):
 * reads only those bytes of W. NVFP4 needs c0 and n multiples of 16, block FP8 of 128 (or the
 * slice ending at K); returns -1 (nothing allocated) when they are not. A skeleton (data NULL)
 * only changes its shape. */
int qtensor_cols_copy(const QTensor *w, int64_t c0, int64_t n, QTensor *out, void **owned);
/* The rows of parts[0..n) one after the other, copied into one new allocation (*owned, the
 * caller frees it; NULL for skeletons, whose data is NULL, which only add up their shapes): the
 * linears that read the same input as one GEMM (model/load.c fuse). The parts must share the
 * format, the columns and the global scale (NVFP4, FP8: one gscale for the whole), none be
 * packed, and with block FP8 each start on a scale block and all but the last end on one (the
 * grids stack); else returns -1 and allocates nothing. out->name is the first part's. */
int qtensor_rows_concat(const QTensor *const *parts, int n, QTensor *out, void **owned);
/* NVFP4 W [N, K] laid into [halves x rows_p, cols_p] with zeros (code 0, block scale 0) around
 * it: its rows cut into `halves` equal parts (2: a fused [gate; up]), each part followed by zero
 * rows up to rows_p, and each row by zero columns up to cols_p (a multiple of 16). codes holds
 * halves x rows_p x cols_p / 2 bytes, scales halves x rows_p x cols_p / 16. A padded tensor
 * multiplies like W where the extra inputs are finite, and gives 0 in the extra outputs.
 * Returns -1 (nothing written) for another format, a skeleton, or sizes that do not hold W. */
int qtensor_nvfp4_pad(const QTensor *w, int halves, int64_t rows_p, int64_t cols_p, uint8_t *codes, uint8_t *scales);

/* NVFP4 (ModelOpt's NVFP4QTensor.quantize). w is [N, K] float, K a multiple of 16.
 * gscale <= 0: computed as amax(|w|) / (6 * 448); > 0: used as given (gate and up of one
 * expert share one global scale, as ModelOpt's sync_moe_gate_up_amax makes them). Writes codes
 * [N, K/2], scales [N, K/16]; returns gscale. */
float nvfp4_quantize(const float *w, int64_t N, int64_t K, float gscale, uint8_t *codes, uint8_t *scales);
float nvfp4_global_scale(const float *w, size_t n);
/* FP8 per-tensor (ModelOpt): scale = amax / 448, q = e4m3(w / scale); returns scale. */
float fp8_quantize(const float *w, size_t n, uint8_t *q);
/* FP8 128x128 blocks: scale_inv[bn][bk] = amax_block / 448 (f32 grid [ceil(N/128), ceil(K/128)]). */
void fp8_block_quantize(const float *w, int64_t N, int64_t K, uint8_t *q, float *scale_inv);

#endif
