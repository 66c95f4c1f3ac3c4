/* test_cuda_graphs: decode steps replayed from captured CUDA graphs give bit-identical logits to
 * the same steps run eagerly (the same kernels on the same buffers), on both architectures; and
 * dummy weights are the same on the CPU and the GPU (one fill function), so their logits agree. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/runner.h"
#include "test.h"

static float *decode_logits(const char *dir, int graphs, int steps)
{
    Model m, dm;
    model_load(&m, dir);
    Backend be;
    backend_cuda_init(&be, 0);
    model_upload(&dm, &m, &be);
    Runner r;
    runner_init(&r, &dm, &be, 64, 16, 16);
    if (graphs) runner_enable_graphs(&r);
    int V = m.cfg.vocab, prompt[12] = {5, 9, 2, 7, 1, 3, 3, 8, 100, 41, 7, 2};
    float *out = malloc((size_t)(steps + 1) * V * sizeof(float));
    runner_feed(&r, prompt, 12, 0, out);
    for (int s = 0; s < steps; s++) {
        const float *l = out + (size_t)s * V;
        int best = 0;
        for (int v = 1; v < V; v++) best = l[v] > l[best] ? v : best;
        runner_feed(&r, &best, 1, 0, out + (size_t)(s + 1) * V);
    }
    runner_free(&r);
    model_upload_free(&dm, &be);
    backend_free(&be);
    model_free(&m);
    return out;
}

TEST(cuda_graph_decode_equals_eager)
{
    const char *names[] = {"golden/glm5-nvfp4", "golden/glm4moe-bf16"};
    for (int i = 0; i < 2; i++) {
        const char *dir = test_data(names[i]);
        float *a = decode_logits(dir, 0, 8), *b = decode_logits(dir, 1, 8);
        Model m;
        model_load(&m, dir);
        size_t n = (size_t)9 * m.cfg.vocab, diff = 0;
        model_free(&m);
        for (size_t k = 0; k < n; k++) diff += a[k] != b[k];
        EXPECT(diff == 0, "%s: %zu of %zu logits differ between graph and eager decode", names[i], diff, n);
        free(a);
        free(b);
    }
}

TEST(cuda_dummy_weights_match_cpu)
{
    char cmd[8192], *out = NULL;
    const char *dir = test_data("golden/glm5-bf16");
    for (int d = 0; d < 2; d++) {
        snprintf(cmd, sizeof cmd, "%s logits --model %s --dummy-weights --tokens 4,8,15,16,23,42 --device %s --out %s/dummy-%d.f32",
                 test_bin(), dir, d ? "cuda" : "cpu", test_tmpdir(), d);
        int rc = test_run(cmd, &out);
        EXPECT(rc == 0, "%s: %s", cmd, out);
        free(out);
    }
    char p0[600], p1[600];
    snprintf(p0, sizeof p0, "%s/dummy-0.f32", test_tmpdir());
    snprintf(p1, sizeof p1, "%s/dummy-1.f32", test_tmpdir());
    FILE *f0 = fopen(p0, "rb"), *f1 = fopen(p1, "rb");
    ASSERT(f0 && f1);
    float a[4096], b[4096];
    size_t na = fread(a, 4, 4096, f0), nb = fread(b, 4, 4096, f1);
    fclose(f0);
    fclose(f1);
    ASSERT(na == nb && na > 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < na; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += (double)a[i] * a[i]; }
    EXPECT(sqrt(num / den) < 1e-4, "dummy logits differ: rel err %g", sqrt(num / den));
}
