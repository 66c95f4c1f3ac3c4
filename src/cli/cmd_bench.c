/* cmd_bench: `moeserve bench <what>`: model (offline prefill/decode throughput, no server). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int bench_model_main(int argc, char **argv);

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "model")) return bench_model_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: moeserve bench model [options]   (offline prefill and decode throughput)\n");
    return 2;
}
