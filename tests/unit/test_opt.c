/* test_opt: the table-driven option parser (src/base/opt.h): both `--name value` and
 * `--name=value`, other engines' spellings, flags and their --no- forms, lists, positional
 * arguments, ranges, the closest names for a misspelt one, and help from the same table. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/opt.h"
#include "test.h"

typedef struct {
    int tp, port, cache, trust;
    double frac;
    const char *model;
    OptStrs names;
} Args;

static Args A;
static const OptSpec model_specs[] = {
    {.names = "--model|--model-path", .type = OPT_STR, .dst = &A.model, .metavar = "DIR", .help = "the model directory or Hub id"},
    {.names = "--tensor-parallel-size|--tp|-tp", .type = OPT_INT, .dst = &A.tp, .metavar = "N", .help = "tensor-parallel ranks",
     .def = "1", .lo = 1, .hi = 64},
    {.names = "--trust-remote-code", .type = OPT_NOTE, .help = "moeserve runs its own code for the architectures it knows"},
};
static const OptSpec server_specs[] = {
    {.names = "--port", .type = OPT_INT, .dst = &A.port, .metavar = "N", .help = "the port", .def = "8000", .lo = 0, .hi = 65535},
    {.names = "--served-model-name", .type = OPT_STRS, .dst = &A.names, .metavar = "NAME...", .help = "names the API accepts"},
    {.names = "--gpu-memory-utilization|--mem-fraction-static", .type = OPT_DOUBLE, .dst = &A.frac, .metavar = "F",
     .help = "memory for the KV cache", .def = "0.9", .lo = 0.01, .hi = 1},
    {.names = "--enable-prefix-caching", .type = OPT_FLAG, .dst = &A.cache, .help = "share prompt prefixes", .def = "on",
     .negatable = 1},
    {.names = "--test-hook", .type = OPT_INT, .dst = &A.trust, .metavar = "N"},
};
static const OptGroup groups[] = {OPT_GROUP("model", model_specs), OPT_GROUP("server", server_specs)};
static const OptCommand cmd = {.cmd = "serve", .synopsis = "[MODEL] [options]", .groups = groups, .n_groups = 2,
                               .max_pos = 1, .pos_name = "MODEL"};

static void parse(const char *line, const char **pos, int *np)
{
    static char buf[1024];
    static char *argv[64];
    snprintf(buf, sizeof buf, "serve %s", line);
    int argc = 0;
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save)) argv[argc++] = t;
    memset(&A, 0, sizeof A);
    A.cache = 1;
    opt_parse(&cmd, argc, argv, pos, np);
}

/* what a parse that must fail prints, and its exit status */
static int parse_fails(const char *line, char *out, size_t n)
{
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t p = fork();
    if (p == 0) {
        dup2(fd[1], 2);
        dup2(fd[1], 1);
        close(fd[0]);
        const char *pos[1];
        int np;
        parse(line, pos, &np);
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], out + got, n - 1 - got)) > 0) got += (size_t)r;
    out[got] = 0;
    close(fd[0]);
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(opt_spellings_and_forms)
{
    const char *pos[1] = {NULL};
    int np = 0;
    parse("org/model -tp 2 --port=9000 --served-model-name a b --gpu-memory-utilization 0.5 --no-enable-prefix-caching", pos, &np);
    EXPECT_EQ_INT(np, 1);
    EXPECT(pos[0] && !strcmp(pos[0], "org/model"));
    EXPECT_EQ_INT(A.tp, 2);
    EXPECT_EQ_INT(A.port, 9000);
    EXPECT_EQ_INT(A.names.n, 2);
    EXPECT(A.names.n == 2 && !strcmp(A.names.v[0], "a") && !strcmp(A.names.v[1], "b"));
    EXPECT(A.frac == 0.5);
    EXPECT_EQ_INT(A.cache, 0);
    EXPECT(opt_given(&cmd, &A.port) && !opt_given(&cmd, &A.model));
    parse("--model-path=/m --tensor-parallel-size=4 --mem-fraction-static=0.8 --enable-prefix-caching=true --trust-remote-code "
          "--test-hook 3", pos, &np);
    EXPECT_EQ_INT(np, 0);
    EXPECT(A.model && !strcmp(A.model, "/m"));
    EXPECT_EQ_INT(A.tp, 4);
    EXPECT(A.frac == 0.8);
    EXPECT_EQ_INT(A.cache, 1);
    EXPECT_EQ_INT(A.trust, 3);
    parse("--tp 2 --tp 8", pos, &np); /* the last one holds, as everywhere */
    EXPECT_EQ_INT(A.tp, 8);
}

TEST(opt_errors_name_the_option)
{
    char out[2048];
    EXPECT_EQ_INT(parse_fails("--max-num-seq 4", out, sizeof out), 2);
    EXPECT(strstr(out, "unknown option '--max-num-seq'") && !strstr(out, "did you mean"), "%s", out);
    EXPECT_EQ_INT(parse_fails("--prot 9000", out, sizeof out), 2);
    EXPECT(strstr(out, "unknown option '--prot'; did you mean --port?"), "%s", out);
    EXPECT(strlen(out) < 300, "one line and the short usage, not the whole help: %s", out);
    EXPECT_EQ_INT(parse_fails("--tensor-paralel-size 2", out, sizeof out), 2);
    EXPECT(strstr(out, "did you mean --tensor-parallel-size?"), "%s", out);
    EXPECT_EQ_INT(parse_fails("--tp 0", out, sizeof out), 2);
    EXPECT(strstr(out, "option --tp: 0 is out of range [1, 64]"), "%s", out);
    EXPECT_EQ_INT(parse_fails("--port=abc", out, sizeof out), 2);
    EXPECT(strstr(out, "option --port: 'abc' is not an integer"), "%s", out);
    EXPECT_EQ_INT(parse_fails("--port", out, sizeof out), 2);
    EXPECT(strstr(out, "option --port needs a value (N)"), "%s", out);
    EXPECT_EQ_INT(parse_fails("a b", out, sizeof out), 2);
    EXPECT(strstr(out, "unexpected argument 'b' (it takes 1: MODEL)"), "%s", out);
    EXPECT_EQ_INT(parse_fails("--enable-prefix-caching=maybe", out, sizeof out), 2);
    EXPECT(strstr(out, "'maybe' is not true or false"), "%s", out);
    /* the test hook is parsed but never suggested or shown */
    EXPECT_EQ_INT(parse_fails("--test-hok 1", out, sizeof out), 2);
    EXPECT(!strstr(out, "--test-hook"), "%s", out);
}

TEST(opt_help_from_the_table)
{
    char out[4096];
    EXPECT_EQ_INT(parse_fails("--help", out, sizeof out), 0);
    EXPECT(strstr(out, "usage: moeserve serve [MODEL] [options]"), "%s", out);
    EXPECT(strstr(out, "--tensor-parallel-size N") && strstr(out, "tensor-parallel ranks (also --tp, -tp) (default: 1)"), "%s", out);
    EXPECT(strstr(out, "--gpu-memory-utilization F") && strstr(out, "(also --mem-fraction-static) (default: 0.9)"), "%s", out);
    EXPECT(strstr(out, "--enable-prefix-caching (--no-enable-prefix-caching)"), "%s", out);
    EXPECT(!strstr(out, "--test-hook"), "test hooks stay out of the help: %s", out);
    EXPECT(strstr(out, "with no effect here: --trust-remote-code"), "%s", out);
    EXPECT_EQ_INT(parse_fails("-h", out, sizeof out), 0);
    EXPECT(strstr(out, "usage: moeserve serve"), "%s", out);
}
