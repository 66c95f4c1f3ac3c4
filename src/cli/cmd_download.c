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

#define DOWNLOAD_USAGE "moeserve download ORG/NAME[@REV] [--revision R] [--include GLOB]..."
#define DOWNLOAD_MAX_INCLUDE 64

int cmd_download(int argc, char **argv)
{
    const char *repo = NULL, *revision = NULL, *include[DOWNLOAD_MAX_INCLUDE];
    int n_include = 0, help = 0;
    for (int i = 1; i < argc; i++) {
        const char *g;
        if (opt_str(argc, argv, &i, "--include", &g)) {
            if (n_include == DOWNLOAD_MAX_INCLUDE)
                fatal("download: at most %d --include patterns", DOWNLOAD_MAX_INCLUDE);
            if (!*g) fatal("download: --include needs a pattern");
            include[n_include++] = g;
            continue;
        }
        if (opt_str(argc, argv, &i, "--revision", &revision) || opt_flag(argv, &i, "--help", &help)) continue;
        if (!strcmp(argv[i], "-h")) { help = 1; continue; }
        if (argv[i][0] != '-' && !repo) { repo = argv[i]; continue; }
        opt_unknown("download", argv[i], DOWNLOAD_USAGE);
    }
    if (help) { printf("usage: %s\n", DOWNLOAD_USAGE); return 0; }
    if (!repo) {
        fprintf(stderr, "error: download: a repository id (org/name) is required\nusage: %s\n", DOWNLOAD_USAGE);
        return 2;
    }
    HubRequest rq = {.revision = revision, .include = include, .n_include = n_include, .weights = 1, .progress = 1};
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
