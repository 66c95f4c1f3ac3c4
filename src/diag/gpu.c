/* gpu: NVML readings for the diagnosis (gpu.h). */
#include "gpu.h"

#include <dlfcn.h>
#include <string.h>


void diag_gpu_power(int device, double *power_w, double *limit_w, int *sm_mhz, int *sm_max_mhz)
{
    *power_w = *limit_w = 0;
    *sm_mhz = *sm_max_mhz = 0;
    static void *lib;
    static int tried;
    static int (*init)(void), (*by_index)(unsigned, void **), (*power)(void *, unsigned *), (*limit)(void *, unsigned *),
        (*clock)(void *, int, unsigned *), (*maxclock)(void *, int, unsigned *);
    if (!tried) {
        tried = 1;
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (lib) {
            *(void **)&init = dlsym(lib, "nvmlInit_v2");
            *(void **)&by_index = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
            *(void **)&power = dlsym(lib, "nvmlDeviceGetPowerUsage");
            *(void **)&limit = dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
            *(void **)&clock = dlsym(lib, "nvmlDeviceGetClockInfo");
            *(void **)&maxclock = dlsym(lib, "nvmlDeviceGetMaxClockInfo");
            if (!init || !by_index || !power || !limit || !clock || !maxclock || init() != 0) lib = NULL;
        }
    }
    if (!lib) return;
    void *h;
    unsigned v;
    if (by_index((unsigned)device, &h) != 0) return;
    if (power(h, &v) == 0) *power_w = v / 1000.0;     /* milliwatts */
    if (limit(h, &v) == 0) *limit_w = v / 1000.0;
    if (clock(h, 1 /* NVML_CLOCK_SM */, &v) == 0) *sm_mhz = (int)v;
    if (maxclock(h, 1, &v) == 0) *sm_max_mhz = (int)v;
}

int diag_nvlinks(int device)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return 0;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*state)(void *, unsigned, int *) = (int (*)(void *, unsigned, int *))dlsym(lib, "nvmlDeviceGetNvLinkState");
    void *h;
    int up = 0;
    if (init && by_index && state && init() == 0 && by_index((unsigned)device, &h) == 0)
        for (unsigned l = 0; l < 18; l++) {
            int on = 0;
            if (state(h, l, &on) == 0 && on) up++;
        }
    return up;
}
