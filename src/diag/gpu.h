/* gpu: what the diagnosis reads of a GPU through NVML (libnvidia-ml, opened at run time when
 * present): its power draw and clocks, its NVLink links. */
#ifndef MOESERVE_DIAG_GPU_H
#define MOESERVE_DIAG_GPU_H

/* GPU device's power draw and limit (W) and SM clocks (MHz) through NVML; 0 when unknown */
void diag_gpu_power(int device, double *power_w, double *limit_w, int *sm_mhz, int *sm_max_mhz);
/* NVLink links up on GPU device (NVML), 0 without NVML or NVLink */
int diag_nvlinks(int device);

#endif
