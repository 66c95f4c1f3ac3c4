/* cmd_tokenize: `moeserve tokenize` prints the token ids of a text (exactly Hugging Face's
 * encode(text, add_special_tokens=False), or with the post-processor's special tokens under
 * --add-special); `moeserve detokenize` prints the text of comma-separated ids.
 *   moeserve tokenize --tokenizer DIR_OR_FILE --text "Hello world"      ->  9707 1879
 *   moeserve detokenize --tokenizer DIR_OR_FILE --ids 9707,1879         ->  Hello world
 * Any error is one line on stderr and exit status 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "../format/tokenizer.h"
#include "cli.h"

static Tokenizer *load_or_fail(const char *cmd, const char *path)
{
    path = model_dir_resolve(cmd, path, NULL, 0); /* a Hub id: its config and tokenizer files */
    char err[1024];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) fprintf(stderr, "error: %s: %s\n", cmd, err);
    return t;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *text = NULL, *text_file = NULL;
    int add_special = 0;
    const OptSpec specs[] = {
        {.names = "--tokenizer", .type = OPT_STR, .dst = &path, .metavar = "FILE|DIR|ORG/NAME",
         .help = "tokenizer.json, a model directory or a Hub id (required)"},
        {.names = "--text", .type = OPT_STR, .dst = &text, .metavar = "TEXT", .help = "the text to encode"},
        {.names = "--text-file", .type = OPT_STR, .dst = &text_file, .metavar = "FILE",
         .help = "the text to encode, from a file"},
        {.names = "--add-special", .type = OPT_FLAG, .dst = &add_special,
         .help = "add the post-processor's special tokens (BOS, ...)", .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("tokenize", specs)};
    const OptCommand cmd = {.cmd = "tokenize",
    .synopsis = "--tokenizer PATH (--text TEXT | --text-file FILE) [options]",
                            .about = "The token ids of a text, as Hugging Face's encode(text, "
                                     "add_special_tokens=False).",
                            .groups = groups, .n_groups = 1};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    if (!path || (!text == !text_file)) {
        fprintf(stderr, "error: tokenize: needs --tokenizer and one of --text, --text-file\n");
        return 1;
    }
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0;
    if (text_file) {
        buf = file_read_all(text_file, &len);      /* byte for byte: no newline translation */
        if (!buf) {
            fprintf(stderr, "error: tokenize: cannot read %s: %s\n", text_file, file_read_error(errno));
            return 1;
        }
        text = buf;
    }
    Tokenizer *t = load_or_fail("tokenize", path);
    if (!t) { free(buf); return 1; }
    char err[512];
    int *ids;
    int n = tokenizer_encode(t, text, len, add_special, &ids, err, sizeof err);
    free(buf);
    if (n < 0) {
        fprintf(stderr, "error: tokenize: %s\n", err);
        tokenizer_free(t);
        return 1;
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    tokenizer_free(t);
    return fflush(stdout) ? 1 : 0;
}

/* "1,2,3" (commas and/or spaces) into ids; -1 with a message on a bad one. */
static int parse_ids(const char *s, const Tokenizer *t, int **ids)
{
    int n = 0, cap = 64;
    *ids = xmalloc((size_t)cap * sizeof **ids);
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            fprintf(stderr, "error: detokenize: --ids: '%.*s' is not a token id\n", (int)strcspn(p, ", \t\n"), p);
            return -1;
        }
        if (v < 0 || v >= tokenizer_vocab_size(t)) {
            fprintf(stderr, "error: detokenize: --ids: %ld is out of range [0, %d)\n", v, tokenizer_vocab_size(t));
            return -1;
        }
        if (n == cap) *ids = xrealloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
        (*ids)[n++] = (int)v;
        p = end;
    }
    return n;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *path = NULL, *ids_s = NULL;
    int skip = 0;
    const OptSpec specs[] = {
        {.names = "--tokenizer", .type = OPT_STR, .dst = &path, .metavar = "FILE|DIR|ORG/NAME",
         .help = "tokenizer.json, a model directory or a Hub id (required)"},
        {.names = "--ids", .type = OPT_STR, .dst = &ids_s, .metavar = "ID,ID,...", .help = "the token ids (required)"},
        {.names = "--skip-special", .type = OPT_FLAG, .dst = &skip, .help = "leave special tokens out of the text",
         .def = "off"},
    };
    const OptGroup groups[] = {OPT_GROUP("detokenize", specs)};
    const OptCommand cmd = {.cmd = "detokenize", .synopsis = "--tokenizer PATH --ids ID,ID,... [options]",
                            .about = "The text of token ids.", .groups = groups, .n_groups = 1};
    opt_parse(&cmd, argc, argv, NULL, NULL);
    if (!path || !ids_s) {
        fprintf(stderr, "error: detokenize: needs --tokenizer and --ids\n");
        return 1;
    }
    Tokenizer *t = load_or_fail("detokenize", path);
    if (!t) return 1;
    int *ids;
    int n = parse_ids(ids_s, t, &ids);
    int rc = 1;
    if (n >= 0) {
        char *text;
        size_t len;
        tokenizer_decode(t, ids, n, skip, &text, &len);
        fwrite(text, 1, len, stdout);
        printf("\n");
        free(text);
        rc = fflush(stdout) ? 1 : 0;
    }
    free(ids);
    tokenizer_free(t);
    return rc;
}
