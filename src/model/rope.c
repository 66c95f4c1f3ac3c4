/* rope: RoPE frequency tables (forward.h rope_init). Default RoPE: inv_freq[i] =
 * 1 / theta^(2i/d) in float32, exactly as transformers computes it. YaRN (DeepSeek-V3 style
 * rope_scaling): frequencies blend interpolation (inv_freq / factor) and extrapolation along a
 * linear ramp between the correction dims of beta_fast and beta_slow; cos/sin are multiplied by
 * mscale(factor, mscale) / mscale(factor, mscale_all_dim) (transformers _compute_yarn_parameters). */
#include <math.h>
#include <string.h>

#include "forward.h"

static double yarn_mscale(double scale, double mscale)
{
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, int dim, double base, double max_pos)
{
    return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

void rope_init(const ModelConfig *c, float *inv_freq, float *scale)
{
    int d = c->rotary_dim, half = d / 2;
    float theta = (float)c->rope_theta;
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)d);
    *scale = 1.0f;
    if (strcmp(c->rope_type, "yarn") != 0) return;
    double factor = c->yarn_factor > 0 ? c->yarn_factor : 1.0;
    double fast = c->yarn_beta_fast > 0 ? c->yarn_beta_fast : 32, slow = c->yarn_beta_slow > 0 ? c->yarn_beta_slow : 1;
    double orig = c->yarn_original_max_pos > 0 ? c->yarn_original_max_pos : c->max_position;
    double lo = floor(yarn_correction_dim(fast, d, c->rope_theta, orig));
    double hi = ceil(yarn_correction_dim(slow, d, c->rope_theta, orig));
    if (lo < 0) lo = 0;
    if (hi > d - 1) hi = d - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        float pos_freq = powf(theta, (float)(2 * i) / (float)d);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)((i - lo) / (hi - lo));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ext_factor = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - ext_factor) + extra * ext_factor;
    }
    if (c->yarn_mscale > 0 && c->yarn_mscale_all_dim > 0)
        *scale = (float)(yarn_mscale(factor, c->yarn_mscale) / yarn_mscale(factor, c->yarn_mscale_all_dim));
    else
        *scale = (float)yarn_mscale(factor, 1.0);
}
