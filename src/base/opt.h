/* opt: the command line of every command, parsed in one place from a table of its options.
 *
 * A command declares its options as OptSpec rows, in groups (the model's, the server's, ...)
 * that several commands share, and calls opt_parse. Accepted: `--name value` and
 * `--name=value`; other spellings of a name (vLLM's `--tensor-parallel-size`, SGLang's `--tp`,
 * a one-dash `-tp`); flags, with `--no-name` where a flag says so; options taking several values
 * (`--served-model-name a b`); positional arguments. A name that is none of them is answered
 * with the closest names (at most three), not the whole usage. `-h`/`--help` prints, from the
 * same table, one line per option with its meaning and `(default: X)`; options without a help
 * line (test hooks) are parsed but not shown.
 *
 * Errors in options are the user's: one line on stderr naming the option and the rule, exit
 * status 2. */
#ifndef MOESERVE_OPT_H
#define MOESERVE_OPT_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef enum {
    OPT_FLAG,     /* int *: 1 (and 0 for its --no- form when `negatable`) */
    OPT_INT,      /* int *, within [lo, hi] */
    OPT_DOUBLE,   /* double *, within [lo, hi] */
    OPT_FLOAT,    /* float *, within [lo, hi] */
    OPT_STR,      /* const char **: the argument itself (not copied) */
    OPT_STRS,     /* OptStrs *: one or more values, up to the next option; repeatable */
    OPT_FN,       /* fn(value, dst, err, errlen) takes it (returns -1 with err to refuse) */
    OPT_NOTE,     /* accepted and ignored: one log line says why (takes a value when metavar is set) */
} OptType;

#define OPT_STRS_MAX 64
typedef struct {
    const char *v[OPT_STRS_MAX];
    int n;
} OptStrs;

typedef struct {
    const char *names;         /* "--tp|--tensor-parallel-size|-tp": '|' between spellings; help shows the first */
    OptType type;
    void *dst;
    const char *metavar;       /* the value's name in help ("N", "DIR"); NULL for flags */
    const char *help;          /* one line; NULL: parsed, not shown (a test hook) */
    const char *def;           /* the default as help shows it, or NULL */
    double lo, hi;             /* OPT_INT / OPT_DOUBLE range */
    int negatable;             /* OPT_FLAG: --no-NAME sets 0 */
    int inverse;               /* OPT_FLAG: the option sets 0 (--disable-radix-cache beside --enable-prefix-caching) */
    int (*fn)(const char *value, void *dst, char *err, size_t errlen);
} OptSpec;

typedef struct {
    const char *title;         /* help's heading for the group ("model", "server") */
    const OptSpec *specs;
    int n;
} OptGroup;

#define OPT_GROUP(title, specs) {(title), (specs), (int)(sizeof(specs) / sizeof((specs)[0]))}

/* The body of a function that returns a group whose rows point into a struct the caller passes
 * (a command's EngineOptions, ModelOpts): the rows are copied into storage of the function that
 * lives as long as the process, so each such group serves one command line at a time. */
#define OPT_GROUP_RETURN(title, ...)                                                 \
    do {                                                                             \
        const OptSpec rows_[] = {__VA_ARGS__};                                       \
        static OptSpec kept_[sizeof rows_ / sizeof rows_[0]];                        \
        memcpy(kept_, rows_, sizeof rows_);                                          \
        return (OptGroup){(title), kept_, (int)(sizeof rows_ / sizeof rows_[0])};    \
    } while (0)

typedef struct {
    const char *cmd;           /* "serve", "bench serve" */
    const char *synopsis;      /* after the command name: "[MODEL] [options]" */
    const char *about;         /* a line or two under the synopsis, or NULL */
    const OptGroup *groups;
    int n_groups;
    int max_pos;               /* positional arguments taken (0: none) */
    const char *pos_name;      /* what they are, for the error past max_pos ("MODEL") */
} OptCommand;

/* Parse argv[1..argc) (argv[0] is the command's name). Positional arguments go to pos[0..max_pos)
 * and their count to *n_pos (pos may be NULL when max_pos is 0). -h/--help prints the help and
 * exits 0; a bad option or value exits 2 with one line. */
void opt_parse(const OptCommand *c, int argc, char **argv, const char **pos, int *n_pos);
/* The help of c (what -h prints). */
void opt_help(const OptCommand *c, FILE *f);
/* Did the command line give this option (by any spelling)? For options whose default depends
 * on other options. dst is the option's dst. */
int opt_given(const OptCommand *c, const void *dst);
/* The closest spellings to a wrong one among c's, for tests: up to 3 into out, returns how many. */
int opt_suggest(const OptCommand *c, const char *wrong, const char *out[3]);

/* How many of argv[i..argc) the option at argv[i] takes (its values included; 1 for a positional
 * argument) and its spec (NULL for a positional argument or a name that is none of c's), for a
 * command that passes some of its options on to another run (diagnose --sweep). Call it on a
 * command line opt_parse has accepted. */
int opt_span(const OptCommand *c, int argc, char **argv, int i, const OptSpec **spec);
/* A default for help computed at run time ("%d" of a struct's default): printf into a buffer that
 * lives as long as the process. */
const char *opt_def(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
