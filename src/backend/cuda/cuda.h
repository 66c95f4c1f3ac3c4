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
/* The kernel the MLA expanded form's next piece runs on for c's heads (tests): 0 v0, 1 v1 (64
 * queries a block), 2 v1 (48 queries, for 99-101 KB of shared memory), 3 v3. */
int cuda_mla_piece_kernel(Backend *be, const ModelConfig *c);
/* The rows up to which a SideKind runs beside (be_side_begin; tests: -1 the default, its
 * MOESERVE_SHARED_SIDE / MOESERVE_INDEXER_SIDE or 16; 0 never), and how many times anything
 * has run beside on this backend. */
void cuda_set_side_rows(int kind, int rows);
long cuda_side_calls(Backend *be);
/* Keep the stream busy for about us microseconds (--inject-comm-delay-us). */
void cuda_delay_us(Backend *be, int us);

#ifdef __cplusplus
}
#endif

#endif
