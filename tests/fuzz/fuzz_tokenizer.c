/* fuzz_tokenizer: a tokenizer.json through tokenizer_load; an accepted tokenizer then encodes a
 * fixed text (ASCII, accents, CJK, emoji, control characters, special-token lookalikes, invalid
 * UTF-8), with and without the post-processor's special tokens, and decodes the ids whole and one
 * at a time (the streaming decoder). Every id must lie in the vocabulary; decoding never fails. */
#include "fuzz.h"

#include "format/tokenizer.h"

static const char TEXT[] = "Hello, world!  It's 2026-12-05: 12345 caf\xc3\xa9 \xef\xac\x81 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
                           "\xf0\x9f\x99\x82\t\r\n\n  x<|endoftext|><|begin_of_text|><s></s>[UNK] \xff\xfe\xc3 done ";

static void check_ids(const Tokenizer *t, const int *ids, int n)
{
    int v = tokenizer_vocab_size(t);
    for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < v, "id %d outside [0, %d)", ids[i], v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    char err[1024];
    err[0] = 0;
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    if (!t) {
        FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "refused without a message");
        return 0;
    }
    for (int special = 0; special < 2; special++) {
        int *ids = NULL;
        err[0] = 0;
        int n = tokenizer_encode(t, TEXT, sizeof TEXT - 1, special, &ids, err, sizeof err);
        if (n < 0) {
            FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "encode failed without a message");
            free(ids);
            continue;
        }
        check_ids(t, ids, n);
        char *text = NULL;
        size_t len = 0;
        FUZZ_CHECK(tokenizer_decode(t, ids, n, special, &text, &len) == 0 && text && strlen(text) <= len, "decode failed");
        free(text);
        Detokenizer d;
        detok_init(&d, t, special);
        char piece[4096];
        for (int i = 0; i < n; i++) (void)detok_push(&d, ids[i], piece, sizeof piece);
        FUZZ_CHECK(detok_flush(&d, piece, sizeof piece) >= 0, "flush failed");
        for (int i = 0; i < n && i < 8; i++) {
            const char *s = tokenizer_token(t, ids[i]);
            if (s) (void)tokenizer_token_id(t, s);
            (void)tokenizer_is_special(t, ids[i]);
        }
        free(ids);
    }
    int bad[4] = {-1, tokenizer_vocab_size(t), tokenizer_bos_id(t), tokenizer_eos_id(t)};
    char *text = NULL;
    size_t len = 0;
    FUZZ_CHECK(tokenizer_decode(t, bad, 4, 0, &text, &len) == 0, "decode of unknown ids failed");
    free(text);
    tokenizer_free(t);
    return 0;
}
