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
#include "../format/model_text.h"
#include "../model/model_opts.h"
#include "../backend/sim/sim.h"

/* --device sim:GPU (sim_device.c): the modelled devices' timers (registered in main with
 * backend_sim_set_resolver), and the ids a simulated draw gives, from the model's tokenizer (on
 * any other backend nothing happens). */
int cli_sim_timer(const char *spec, SimTimer *t, char *err, size_t errlen);
void cli_sim_tokens(Backend *be, const ModelText *mt, int vocab);

#endif
