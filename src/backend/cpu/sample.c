/* sample: the cpu's sample op, each row drawn by the definition sample_row (../sample.c). */
#include "cpu.h"

void sample_cpu(Backend *be, int *out, const float *logits, int rows, int V, const SampleRow *params)
{
#pragma omp parallel for num_threads(be->n_threads) if (rows > 1)
    for (int r = 0; r < rows; r++)
        out[r] = sample_row(logits + (int64_t)r * V, V, &params[r], cpu_scratch(7, sample_row_work(V)));
}
