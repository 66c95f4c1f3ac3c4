/* fuzz_safetensors: a .safetensors file (8-byte header length, JSON header, data) through
 * safetensors_open_file. Accepted: every tensor's bytes lie inside the file after the header,
 * its byte count is its dtype x shape, no two non-empty tensors share a byte, each is found by
 * name; opening the same file again into the same set is refused (the names are taken).
 * Refused: a message. */
#include "fuzz.h"

#include "format/safetensors.h"

static int cmp_data(const void *a, const void *b)
{
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    SafeTensors st = {0};
    char err[1024];
    err[0] = 0;
    if (safetensors_open_file(&st, path, err, sizeof err) != 0) {
        FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "refused without a message");
        FUZZ_CHECK(st.n_files == 0 && st.n_tensors == 0, "a refused file was kept");
        safetensors_free(&st);
        return 0;
    }
    FUZZ_CHECK(st.n_files == 1, "%d files", st.n_files);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    const uint8_t *map = st.files[0].map, *begin = map + 8 + hlen, *end = map + st.files[0].size;
    FUZZ_CHECK(st.files[0].size == size, "mapped %zu of %zu bytes", st.files[0].size, size);
    const StTensor **by_data = malloc((size_t)(st.n_tensors ? st.n_tensors : 1) * sizeof *by_data);
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "'%s': %d dims", t->name, t->ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        FUZZ_CHECK(numel == t->numel, "'%s': numel %lld, shape says %lld", t->name, (long long)t->numel, (long long)numel);
        FUZZ_CHECK(t->nbytes == ((uint64_t)t->numel * (uint64_t)dtype_bits(t->dtype) + 7) / 8, "'%s': %zu bytes", t->name, t->nbytes);
        FUZZ_CHECK(t->data >= begin && t->data <= end && t->nbytes <= (size_t)(end - t->data), "'%s': data outside the file", t->name);
        if (t->nbytes) {
            volatile uint8_t touch = t->data[0] ^ t->data[t->nbytes - 1];
            (void)touch;
        }
        FUZZ_CHECK(safetensors_find(&st, t->name) == t, "'%s' not found by name", t->name);
        FUZZ_CHECK(i == 0 || strcmp(st.tensors[i - 1].name, t->name) < 0, "names not sorted and unique at '%s'", t->name);
        by_data[i] = t;
    }
    qsort(by_data, (size_t)st.n_tensors, sizeof *by_data, cmp_data);
    const uint8_t *far = NULL;
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = by_data[i];
        if (!t->nbytes) continue;
        FUZZ_CHECK(!far || t->data >= far, "'%s' overlaps an earlier tensor", t->name);
        if (!far || t->data + t->nbytes > far) far = t->data + t->nbytes;
    }
    free(by_data);
    if (st.n_tensors > 0) {
        err[0] = 0;
        FUZZ_CHECK(safetensors_open_file(&st, path, err, sizeof err) != 0 && fuzz_msg_ok(err, sizeof err),
                   "the same tensors accepted twice");
        FUZZ_CHECK(st.n_files == 1, "the refused second file was kept");
    }
    safetensors_free(&st);
    return 0;
}
