/* cmd_quantize: placeholder while the command is being written. */
#include <stdio.h>
#include "cli.h"
int cmd_quantize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "error: quantize: not written yet\n"); return 1; }
