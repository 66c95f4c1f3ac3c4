/* attention.cuh: what the attention files share: the GQA decode (attention_gqa.cu), the MLA
 * absorbed decode (attention_mla_decode.cu) and the MLA expanded prefill (attention_mla_prefill.cu).
 * Each file's entry chooses its own kernel (from the shapes, the device and MOESERVE_MLA_KERNEL or
 * MOESERVE_MLA_PIECE_KERNEL); model/mla.c chooses between the MLA forms. */
#ifndef MOESERVE_ATTENTION_CUH
#define MOESERVE_ATTENTION_CUH

#include "w4_common.cuh" /* mma_bf16, cp.async, the W4P decode of a packed kv_b_proj */

#define ATT_THREADS 256
#define MLA_MAX_C 1024
#define MLA_MAX_DQ 1024  /* Dn + Dr of the expanded form's queries */
#define MLA_MAX_DV 1024  /* Dv: ATT_THREADS threads own MLA_MAX_DV / ATT_THREADS dims each */

#endif
