/* cli.h: the commands of `moeserve <command>`, each in src/cli/cmd_<name>.c. */
#ifndef MOESERVE_CLI_H
#define MOESERVE_CLI_H

/* Each command: int cmd_NAME(int argc, char **argv) with argv[0] the command name; returns
 * the process exit status. */
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_diagnose(int argc, char **argv);
int cmd_download(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#include "../engine/engine.h"
#include "../model/model_opts.h"

#endif
