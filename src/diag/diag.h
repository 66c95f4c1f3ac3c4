/* diag: a running engine's diagnosis (issue #9): its profile sums and state, the layout, the
 * GPU's power and clocks (NVML, opened at run time when present), through verdict.h. Used by
 * the server (GET /v1/diagnosis, /metrics) and by `moeserve diagnose`. */
#ifndef MOESERVE_DIAG_H
#define MOESERVE_DIAG_H

#include "../engine/engine.h"
#include "calibrate.h"
#include "verdict.h"

/* layout: tp, pp, ep, micro-batches of the deployment (the rest is filled from the engine) */
void diag_engine(Engine *e, const Ceilings *c, const Deployment *layout, Diagnosis *g, Deployment *d);
/* GPU device's power draw and limit (W) and SM clocks (MHz) through NVML; 0 when unknown */
void diag_gpu_power(int device, double *power_w, double *limit_w, int *sm_mhz, int *sm_max_mhz);
/* NVLink links up on GPU device (NVML), 0 without NVML or NVLink */
int diag_nvlinks(int device);

#endif
