/* sha256: SHA-256 (FIPS 180-4), streamed. The Hub names a large (LFS) file by the SHA-256 of its
 * bytes, so a download is checked against its name before it goes into the cache. */
#ifndef MOESERVE_SHA256_H
#define MOESERVE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t len;          /* bytes hashed so far */
    uint8_t buf[64];       /* a block not yet full */
    size_t nbuf;
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const void *data, size_t n);
/* The digest as 32 bytes; the state is spent (sha256_init again to reuse it). */
void sha256_final(Sha256 *s, uint8_t out[32]);
/* The digest of data as 64 lowercase hex digits and a NUL. */
void sha256_hex(const void *data, size_t n, char out[65]);
void sha256_to_hex(const uint8_t d[32], char out[65]);

#endif
