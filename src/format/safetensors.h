/* safetensors: the mmap reader (single file, or a sharded checkpoint through
 * model.safetensors.index.json) and a streaming writer. Format (https://github.com/huggingface/safetensors,
 * README "Format"): an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
 * {dtype, shape, data_offsets [begin, end) relative to the data buffer} (plus an optional "__metadata__"
 * string map), then the buffer, little-endian and row-major. The index maps names to shard files under
 * "weight_map".
 * Nothing is read whole into memory: tensors point into the mapping. Every malformed input
 * (truncated file, header past the end, bad JSON, offsets out of range or overlapping, size
 * that disagrees with dtype x shape) returns -1 with a one-line message naming file and tensor. */
#ifndef MOESERVE_SAFETENSORS_H
#define MOESERVE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "quant.h"

#define ST_MAX_DIMS 8

typedef struct {
    char *name;                    /* owned */
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;           /* borrowed: into the file mapping */
    size_t nbytes;
    int file;                      /* index into SafeTensors.files */
} StTensor;

typedef struct {
    char *path;                    /* owned */
    void *map;                     /* mmapped whole file, PROT_READ */
    size_t size;
} StFile;

typedef struct {
    StFile *files;    int n_files;
    StTensor *tensors; int n_tensors; /* sorted by name */
} SafeTensors;

/* Add one .safetensors file. 0 ok, -1 with err set. */
int safetensors_open_file(SafeTensors *st, const char *path, char *err, size_t errlen);
/* Open a checkpoint directory: model.safetensors.index.json if present (every listed tensor
 * must be found in its shard), else model.safetensors, else every *.safetensors file. */
int safetensors_open_dir(SafeTensors *st, const char *dir, char *err, size_t errlen);
const StTensor *safetensors_find(const SafeTensors *st, const char *name);
const char *safetensors_file_of(const SafeTensors *st, const StTensor *t);
void safetensors_free(SafeTensors *st); /* safe on a zeroed struct */

/* Streaming writer: the header (names, dtypes, shapes) is given up front, then the data of
 * each tensor in the same order through stw_write (any number of calls per tensor). The
 * header is padded with spaces to a multiple of 8 bytes. */
typedef struct {
    const char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
} StSpec;

typedef struct {
    FILE *f;
    char *path;
    size_t expected;     /* total data bytes announced in the header */
    size_t written;
} StWriter;

int stw_open(StWriter *w, const char *path, const StSpec *specs, int n,
             const char *metadata_format /* "pt" or NULL */, char *err, size_t errlen);
int stw_write(StWriter *w, const void *data, size_t nbytes, char *err, size_t errlen);
int stw_close(StWriter *w, char *err, size_t errlen); /* fails unless every byte was written */
size_t stspec_nbytes(const StSpec *s);

/* model.safetensors.index.json for shards: names[i] lives in file shard_of[i]. */
int st_index_write(const char *dir, const char *const *names, const char *const *shard_of, int n,
                   uint64_t total_size, char *err, size_t errlen);

#endif
