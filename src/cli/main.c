/* moeserve: the command-line entry point. `moeserve <command> [options]`; `moeserve help`
 * lists the commands. Each command lives in src/cli/cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "../base/knobs.h"
#include "cli.h"
#include "version.h" /* build/gen/version.h: the Makefile writes it */

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} Command;

static const Command commands[] = {
    {"generate", cmd_generate, "generate text from a prompt or a chat message, streamed"},
    {"perplexity", cmd_perplexity, "held-out perplexity of a text file"},
    {"serve", cmd_serve, "run the OpenAI-compatible HTTP server (completions, chat, streaming, metrics)"},
    {"logits", cmd_logits, "run a forward pass and write float32 logits for every position"},
    {"bench", cmd_bench, "benchmarks: model (offline throughput), kernels (NVFP4 vs the roofs), serve, plot"},
    {"tune", cmd_tune, "tune the NVFP4 kernels' tiles to this GPU (shared memory checked first) and cache them"},
    {"info", cmd_info, "describe a model directory: architecture, parameters, precisions"},
    {"synth", cmd_synth, "write a random-weight checkpoint in the real Hugging Face layout"},
    {"quantize", cmd_quantize, "write a ModelOpt NVFP4 checkpoint from a BF16 one"},
    {"download", cmd_download, "fetch a model of the Hugging Face Hub into its cache (HF_HOME), as `hf download`"},
    {"tokenize", cmd_tokenize, "print the token ids of a text (Hugging Face tokenizer.json)"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"calibrate", cmd_calibrate, "measure and cache this machine's ceilings (bandwidth, tensor rate, collectives)"},
    {"version", NULL, "the version, git commit and CUDA architectures of this build (also --version)"},
    {"plan", cmd_plan, "predict a deployment before it exists: layouts, memory, TPOT, TTFT, throughput"},
    {"diagnose", cmd_diagnose, "where a deployment's step time goes and what to change (a server's, or a built-in load's)"},
};

/* `moeserve --version`: what was built, from what */
static int version(void)
{
    printf("moeserve %s\ngit commit: %s\nCUDA: %s\n", MOESERVE_VERSION, MOESERVE_GIT_COMMIT, MOESERVE_CUDA_ARCHS);
    return fflush(stdout) ? 1 : 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: moeserve <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`moeserve <command> --help` shows a command's options; `moeserve help env` the MOESERVE_*\n"
               "environment variables; `moeserve --version` the build.\n");
}

/* `moeserve help env [--values]`: the knob table (knobs.h) as docs/USAGE.md lists it, or each
 * knob's value in this process and where it came from. */
static int help_env(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--values")) {
        for (int k = 0; k < KNOB_COUNT; k++)
            printf("%s=%s (%s)\n", knob_info(k)->var, knob_str(k), knob_is_set(k) ? "set" : "default");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "error: help env: unknown option '%s'\nusage: moeserve help env [--values]\n", argv[1]);
        return 2;
    }
    knobs_print(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    backend_omp_passive(argv);
    knobs_init();
    backend_sim_set_resolver(cli_sim_timer);
    if (argc >= 3 && !strcmp(argv[1], "help") && !strcmp(argv[2], "env")) return help_env(argc - 2, argv + 2);
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1],
    "version"))) return version();
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
