/* cuda.h: the CUDA backend, seen from C. The only GPU header C code includes. Built when nvcc
 * is found (MOESERVE_CUDA defined); the binary links the CUDA runtime statically and cuBLASLt,
 * never libcuda, so it runs on machines without a GPU, where cuda_device_count() is 0. */
#ifndef MOESERVE_CUDA_H
#define MOESERVE_CUDA_H

#include "../backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable GPUs; 0 without a driver or a device (never fails). */
int cuda_device_count(void);
/* The backend on GPU `device`; stops with a clear error when there is none. */
void backend_cuda_init(Backend *be, int device);
/* Describe the device in one line ("NVIDIA H200, 132 SMs, 139.8 GiB, sm_90"). */
void cuda_device_name(int device, char *buf, size_t n);
/* The backend's cudaStream_t (for NCCL, src/dist/comm_nccl.c). */
void *cuda_stream_of(Backend *be);
/* "8 GPUs, P2P between 56 of 56 ordered pairs (all)" */
void cuda_p2p_summary(char *buf, size_t n);
/* The kernel the MLA expanded form's next piece runs on for c's heads (tests; attention_mla_prefill.cu). */
typedef enum {
    MLA_PREFILL_F32,           /* a thread per key, float32: head shapes without a tensor-core instance */
    MLA_PREFILL_TC64,          /* tensor cores, 64 queries a block */
    MLA_PREFILL_TC48,          /* the same, 48 queries (the GPUs of 99-101 KB of shared memory) */
    MLA_PREFILL_TC128_STAGED,  /* tensor cores, 128 queries, the keys staged as BF16 halves by cp.async */
} MlaPrefillKernel;
int cuda_mla_piece_kernel(Backend *be, const ModelConfig *c);
/* How many times anything has run beside on this backend (be_side_begin; up to the rows of
 * MOESERVE_SHARED_SIDE and MOESERVE_INDEXER_SIDE). */
long cuda_side_calls(Backend *be);
/* Keep the stream busy for about us microseconds (the test hook MOESERVE_TEST_COMM_DELAY_US). */
void cuda_delay_us(Backend *be, int us);

#ifdef __cplusplus
}
#endif

#endif
