/* cmd_bench: `moeserve bench <what>`: model (offline prefill/decode throughput, no server),
 * moe (one FFN layer's time and collective bytes on every rank, the --dp exchange against the all-reduce),
 * kernels (the NVFP4 kernels against the GPU's measured roofs),
 * serve (the serving benchmark against an OpenAI-compatible server, comparable with
 * sglang.bench_serving and vllm bench serve), plot (an SVG of serve's results file). */
#include <stdio.h>
#include <string.h>

#include "../bench/bench_serve.h"
#include "cli.h"

int bench_model_main(int argc, char **argv);
int bench_kernels_main(int argc, char **argv);
int bench_moe_main(int argc, char **argv);

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "model")) return bench_model_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "kernels")) return bench_kernels_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "moe")) return bench_moe_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "serve")) return bench_serve_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "plot")) return bench_plot_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: moeserve bench model [options]   (offline prefill and decode throughput)\n"
                    "       moeserve bench moe [options]     (one FFN layer and its collectives, on every rank)\n"
                    "       moeserve bench kernels [options] (the NVFP4 kernels against the GPU's roofs)\n"
                    "       moeserve bench serve [options]   (serving benchmark against an OpenAI-compatible server)\n"
                    "       moeserve bench plot RESULTS.jsonl [options]   (SVG/PNG of bench serve results)\n");
    return 2;
}
