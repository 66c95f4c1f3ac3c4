/* opt: the option parser shared by the commands (cli.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/util.h"
#include "cli.h"

static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    if (strcmp(argv[*i], name) != 0) return NULL;
    if (*i + 1 >= argc) fatal("option %s needs a value", name);
    *i += 1;
    return argv[*i];
}

int opt_str(int argc, char **argv, int *i, const char *name, const char **out)
{
    const char *v = opt_value(argc, argv, i, name);
    if (!v) return 0;
    *out = v;
    return 1;
}

int opt_int(int argc, char **argv, int *i, const char *name, long lo, long hi, int *out)
{
    const char *v = opt_value(argc, argv, i, name);
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end) fatal("option %s: '%s' is not an integer", name, v);
    if (x < lo || x > hi) fatal("option %s: %ld is out of range [%ld, %ld]", name, x, lo, hi);
    *out = (int)x;
    return 1;
}

int opt_double(int argc, char **argv, int *i, const char *name, double lo, double hi, double *out)
{
    const char *v = opt_value(argc, argv, i, name);
    if (!v) return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || x != x) fatal("option %s: '%s' is not a number", name, v);
    if (x < lo || x > hi) fatal("option %s: %g is out of range [%g, %g]", name, x, lo, hi);
    *out = x;
    return 1;
}

int opt_flag(char **argv, int *i, const char *name, int *out)
{
    if (strcmp(argv[*i], name) != 0) return 0;
    *out = 1;
    return 1;
}

void opt_unknown(const char *cmd, const char *arg, const char *usage)
{
    fprintf(stderr, "error: %s: unknown option '%s'\nusage: %s\n", cmd, arg, usage);
    exit(2);
}
