/* hub: models from the Hugging Face Hub, kept in huggingface_hub's own cache layout so that
 * either tool reuses the other's downloads:
 *
 *   $HF_HUB_CACHE/models--org--name/
 *       blobs/<etag>                 the files' bytes, named by their ETag (the SHA-256 of a large
 *                                    LFS file, the git blob SHA-1 of a small one)
 *       blobs/<etag>.incomplete      a download under way (or cut), continued by the next one
 *       snapshots/<commit>/<path>    relative symlinks ../../blobs/<etag>, one per file
 *       refs/<revision>              the commit a branch or tag named when it was last fetched
 *   $HF_HUB_CACHE/.locks/models--org--name/<etag>.lock   taken (flock) around a blob's download
 *
 * The cache is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. The Hub is $HF_ENDPOINT
 * (default https://huggingface.co); $HF_TOKEN (else the file $HF_TOKEN_PATH or $HF_HOME/token) is
 * sent as "Authorization: Bearer" to it, never to the hosts it redirects large files to;
 * HF_HUB_OFFLINE=1 answers from the cache alone. */
#ifndef MOESERVE_HUB_H
#define MOESERVE_HUB_H

#include <stddef.h>

typedef struct {
    const char *revision;          /* branch, tag or commit; NULL: the id's "@rev", else "main" */
    const char *const *include;    /* globs over the repository's paths ('*' crosses '/'); none: */
    int n_include;                 /* the files a model needs (below) */
    int weights;                   /* without include: 1 the *.safetensors too, 0 config and tokenizer only */
    int progress;                  /* 1: progress on stderr (a terminal: a line kept up to date; else
                                      a line when it starts and one when it ends) */
} HubRequest;

typedef struct {
    char commit[41];
    int n_files;                   /* files of the snapshot this request wanted */
    int n_fetched;                 /* of them downloaded now (whole or the rest of a cut one) */
    int n_linked;                  /* of them whose blob was in the cache already (another revision's) */
    long long bytes;               /* bytes received */
    int offline;                   /* answered from the cache without the Hub */
} HubResult;

/* Without include, a model's files are those at the repository's top level named config.json,
 * generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
 * chat_template.json, special_tokens_map.json, hf_quant_config.json, and with weights *.safetensors
 * and *.safetensors.index.json (never pytorch *.bin: moeserve reads safetensors). */

/* The snapshot directory of repo ("org/name", "org/name@rev") with the requested files in it,
 * downloading what the cache lacks (nothing under HF_HUB_OFFLINE; and when the Hub cannot be
 * reached or refuses, a complete cached snapshot is used with a warning). Returns 0 with the
 * directory in dir, or -1 with err naming the cause: the token refused (401), the repository,
 * revision or file not found (404), a gated repository, a full disk, a SHA-256 mismatch, what an
 * offline cache lacks. res may be NULL. */
int hub_fetch(const char *repo, const HubRequest *rq, char *dir, size_t dirlen, HubResult *res, char *err,
              size_t errlen);

/* For a command's --model (or --tokenizer) argument: an existing path, or anything that is not
 * "org/name[@rev]", is copied to dir_out as it is (returns 0); a repository id is fetched as
 * hub_fetch does, with a progress line (returns 1, dir_out its snapshot); -1 with err on failure.
 * revision: --revision, or NULL. */
int hub_resolve(const char *arg, const char *revision, int weights, char *dir_out, size_t n, char *err, size_t errlen);

/* "org/name" or "name" as the Hub allows them (letters, digits, '-', '_', '.'; no "--" or "..";
 * neither starting nor ending with '-' or '.'; at most 96 characters each). */
int hub_repo_id_valid(const char *id);
/* The cache directory (above) into out. */
void hub_cache_dir(char *out, size_t n);

#endif
