/* cmd_download: `moeserve download ORG/NAME[@REV] [--revision R] [--include GLOB]...` puts a model
 * of the Hugging Face Hub into huggingface_hub's cache (src/hub/hub.h: HF_HOME, HF_HUB_CACHE,
 * HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE) and prints its snapshot directory, which --model takes
 * as it is; `--model ORG/NAME` of any command does the same itself (cli_model_dir). Without
 * --include only the files a model needs come (config, tokenizer, chat template, safetensors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../hub/hub.h"
#include "cli.h"

int cmd_download(int argc, char **argv)
{
    const char *repo = NULL, *revision = NULL;
    OptStrs include = {0};
    const OptSpec specs[] = {
        {.names = "--revision", .type = OPT_STR, .dst = &revision, .metavar = "REV",
         .help = "a branch, tag or commit (also ORG/NAME@REV)", .def = "main"},
        {.names = "--include", .type = OPT_STRS, .dst = &include, .metavar = "GLOB...",
         .help = "only the files matching these patterns (repeatable)",
         .def = "config, tokenizer, chat template, safetensors"},
    };
    const OptGroup groups[] = {OPT_GROUP("download", specs)};
    const OptCommand cmd = {.cmd = "download", .synopsis = "ORG/NAME[@REV] [options]",
                            .about = "Fetch a model of the Hugging Face Hub into its cache (HF_HOME) and print its "
                                     "directory.",
                            .groups = groups, .n_groups = 1, .max_pos = 1, .pos_name = "ORG/NAME"};
    int n_pos = 0;
    opt_parse(&cmd, argc, argv, &repo, &n_pos);
    for (int i = 0; i < include.n; i++)
        if (!*include.v[i]) fatal("download: --include needs a pattern");
    if (!n_pos) {
        fprintf(stderr, "error: download: a repository id (org/name) is required\n");
        return 2;
    }
    HubRequest rq = {.revision = revision, .include = include.v, .n_include = include.n, .weights = 1, .progress = 1};
    char dir[4096], err[4096];
    HubResult res;
    if (hub_fetch(repo, &rq, dir, sizeof dir, &res, err, sizeof err)) {
        fprintf(stderr, "error: download: %s\n", err);
        return 1;
    }
    if (res.n_fetched == 0 && !res.offline)
        log_info("download: %s: all %d files were in the cache already", repo, res.n_files);
    printf("%s\n", dir);
    return fflush(stdout) ? 1 : 0;
}
