/* w4_pack: NVFP4 weights repacked at upload into the W4P layout the W4A16 kernels stream
 * (w4_common.cuh describes it): codes and block scales of each 16 x 256 record rearranged so
 * that a lane reads its mma.sync fragments with one 16-byte load a 64-column chunk. */
#include "w4_common.cuh"

/* w4_elem's flattened bit positions (common.cuh) say what W4_BITS says */
static constexpr bool w4_bits_flat_ok()
{
    constexpr int b[4][2][2] = W4_BITS;
    for (int r = 0; r < 4; r++)
        for (int h = 0; h < 2; h++) {
            int f = 5 * (2 * r + h);
            if ((int)((W4_BITS_MAG >> f) & 31) != b[r][h][0] || (int)((W4_BITS_SIGN >> f) & 31) != b[r][h][1]) return false;
        }
    return true;
}
static_assert(w4_bits_flat_ok(), "W4_BITS_MAG / W4_BITS_SIGN out of step with W4_BITS");

/* E4M3 scale byte -> the unsigned E5M3 byte of the W4P layout (0 for zero). NaN saturates. */
__device__ __forceinline__ uint8_t w4_scale_enc(uint8_t s)
{
    int e = (s >> 3) & 15, m = s & 7, E, mant;
    if (e == 15 && m == 7) return (uint8_t)((18 << 3) | 7);
    if (e == 0) {
        if (!m) return 0;
        int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;
        E = p - 9;
        mant = (m << (3 - p)) & 7;
    } else {
        E = e - 7;
        mant = m;
    }
    return (uint8_t)(((E + 10) << 3) | mant);
}

/* thread (record, lane): its 64 code bytes and 8 scale bytes */
static __global__ void w4_pack_kernel(uint8_t *dst, const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K)
{
    int64_t ng = K / W4_KG, items = (N / 16) * ng * 32;
    for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < items; it += (int64_t)gridDim.x * blockDim.x) {
        int lane = (int)(it & 31), g = lane >> 2, t = lane & 3;
        int64_t rec = it >> 5, G = rec % ng, i = rec / ng;
        uint8_t *out = dst + rec * W4_REC;
        for (int c = 0; c < 4; c++) {
            int64_t k0 = G * W4_KG + c * 64 + t * 16;
            int zero[2], neg[2];
            for (int hi = 0; hi < 2; hi++) {
                uint8_t s = scales[(16 * i + g + 8 * hi) * (K / 16) + k0 / 16];
                uint8_t b = w4_scale_enc(s & 0x7f);
                zero[hi] = b == 0;
                neg[hi] = (s & 0x80) != 0;
                out[2048 + lane * 8 + 2 * c + hi] = b;
            }
            const int bits[4][2][2] = W4_BITS; /* [register][half]: magnitude, sign bit */
            uint32_t words[4];
            for (int j = 0; j < 4; j++) {
                uint32_t w = 0;
                for (int q = 0; q < 4; q++)
                    for (int hi = 0; hi < 2; hi++) {
                        int64_t k = k0 + 4 * j + q, row = 16 * i + g + 8 * hi;
                        uint8_t byte = codes[row * (K / 2) + k / 2];
                        uint32_t code = (k & 1) ? byte >> 4 : byte & 15;
                        if (zero[hi]) code = 0;
                        if (neg[hi]) code ^= 8;
                        const int *b = bits[2 * (q >> 1) + hi][q & 1];
                        w |= (code & 7) << b[0] | (code >> 3) << b[1];
                    }
                words[j] = w;
            }
            *(uint4 *)(out + c * 512 + lane * 16) = make_uint4(words[0], words[1], words[2], words[3]);
        }
    }
}

extern "C" int w4_packable(const QTensor *w)
{
    return w->fmt == QF_NVFP4 && !w->packed && w->rows > 0 && w->rows % 16 == 0 && w->cols % W4_KG == 0;
}

void w4_pack_cuda(Backend *be, uint8_t *dst, const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K)
{
    int64_t items = (N / 16) * (K / W4_KG) * 32;
    int nb = cdiv(items, 256) < 65535 ? cdiv(items, 256) : 65535;
    w4_pack_kernel<<<nb, 256, 0, cuda_stream(be)>>>(dst, codes, scales, N, K);
    LAUNCH_CHECK("w4_pack_kernel");
}
