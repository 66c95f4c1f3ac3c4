/* test_cuda_dist: the NCCL path of src/dist on one GPU (issue #8: "the NCCL path runs on the
 * single-GPU machine with a one-rank communicator"): MOESERVE_COMM=nccl makes a one-rank
 * world whose collectives (the all-reduces of every block, under graphs too) go through NCCL
 * on the backend's stream; the logits must be those of the plain run. And a forked layout that
 * needs more GPUs than there are stops every rank with a message naming the one that failed. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "test.h"

static char *fixture_tokens(const char *dir)
{
    char path[800];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je);
    if (!g) return NULL;
    json_t *t = json_object_get(g, "tokens");
    char *s = malloc(8 * json_array_size(t) + 1), *p = s;
    *p = 0;
    for (size_t i = 0; i < json_array_size(t); i++)
        p += sprintf(p, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(t, i)));
    json_decref(g);
    return s;
}

TEST(cuda_nccl_one_rank)
{
    const char *names[] = {"glm4moe-bf16", "glm5-nvfp4"};
    for (size_t k = 0; k < 2; k++) {
        char dir[700], cmd[8192], a[700], b[700];
        snprintf(dir, sizeof dir, "%s/%s", test_data("golden"), names[k]);
        char *tokens = fixture_tokens(dir);
        ASSERT(tokens);
        for (int chunk1 = 0; chunk1 < 2; chunk1++) {
            const char *ch = chunk1 ? "--chunk 1" : "";
            snprintf(a, sizeof a, "%s/nccl-plain.f32", test_tmpdir());
            snprintf(b, sizeof b, "%s/nccl-one.f32", test_tmpdir());
            snprintf(cmd, sizeof cmd, "%s logits --device cuda --model %s --tokens %s %s --out %s", test_bin(), dir, tokens, ch, a);
            char *out = NULL;
            int rc = test_run(cmd, &out);
            EXPECT(rc == 0, "%s", out ? out : "");
            free(out);
            snprintf(cmd, sizeof cmd, "MOESERVE_COMM=nccl %s logits --device cuda --model %s --tokens %s %s --out %s", test_bin(),
                     dir, tokens, ch, b);
            out = NULL;
            rc = test_run(cmd, &out);
            EXPECT(rc == 0 && out && strstr(out, "collectives through nccl") && strstr(out, "communicators ready"),
                   "%s: %s", names[k], out ? out : "");
            free(out);
            size_t n, m;
            float *x = test_read_f32(a, &n), *y = test_read_f32(b, &m);
            ASSERT(x && y && n == m && n > 0);
            double d = 0;
            for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)x[i] - y[i]));
            /* one rank: NCCL's all-reduce is a copy, every kernel the same */
            EXPECT(d == 0, "%s %s: max|d| %g between the plain and the one-rank NCCL run", names[k], ch, d);
            free(x);
            free(y);
        }
        free(tokens);
    }
}

TEST(cuda_fork_rank_failure)
{
    /* 16 ranks (more GPUs than any machine here has): rank r opens cuda:r; those beyond the
       machine's GPUs fail, and rank 0 stops every rank */
    char dir[700], cmd[2048];
    snprintf(dir, sizeof dir, "%s/glm4moe-bf16", test_data("golden"));
    snprintf(cmd, sizeof cmd, "timeout 120 %s logits --device cuda --model %s --tokens 1,2,3 --tp 4 --pp 4 --out /dev/null", test_bin(), dir);
    char *out = NULL;
    double t0 = clock_now();
    int rc = test_run(cmd, &out);
    EXPECT(rc != 0 && rc != 124 && out && strstr(out, "stopping every rank"), "exit %d after %.1f s: %s", rc, clock_now() - t0,
           out ? out : "");
    free(out);
}
