/* fuzz.h: what the libFuzzer harnesses of tests/fuzz/ share. Each harness is one file whose
 * LLVMFuzzerTestOneInput feeds the input to one parser of untrusted bytes and checks the parser's
 * own contract (0 with a usable result, or -1 with a message: never a crash, an exit, a hang or a
 * leak); `make fuzz` builds them with clang's libFuzzer, ASan and UBSan and runs each. */
#ifndef MOESERVE_FUZZ_H
#define MOESERVE_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken contract is a finding: say which, then abort so that libFuzzer saves the input. */
#define FUZZ_CHECK(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "fuzz: %s:%d: contract broken: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); abort(); } } while (0)

/* The input as a NUL-terminated string (malloc'ed; the parsers that take C strings stop at an
 * embedded NUL, as they would on such a file). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* The input as the content of a regular file, without touching a disk: one memfd per process,
 * rewritten for each input; its path (/proc/self/fd/N) is what the parsers open. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", 0);
        if (fd < 0) { perror("fuzz: memfd_create"); abort(); }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    for (size_t off = 0; off < size;) {
        ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
        if (w <= 0) { perror("fuzz: pwrite"); abort(); }
        off += (size_t)w;
    }
    return path;
}

/* A message set by a parser that failed: non-empty and NUL-terminated within its buffer. */
static inline int fuzz_msg_ok(const char *err, size_t errlen)
{
    return err[0] != 0 && memchr(err, 0, errlen) != NULL;
}

#endif
