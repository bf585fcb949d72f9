/* libFuzzer target for the tokenizer.json reader: the input is the text of a tokenizer.json. The
 * loader must refuse it or accept it without crashes, leaks or undefined behavior; an accepted
 * tokenizer then encodes a few fixed texts and the input's own first bytes, and every id it gives
 * must be a token that decodes.
 *
 * Seeds (fuzz/corpus/tokenizer/) are the fixtures of tests/test_tokenizer.c, written by
 * fuzz/tokenizer_seeds.py; tests/test_fuzz_seeds.c checks that valid_* load and bad_* do not. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) __builtin_trap();
}

static void encode_decode(const mn_tokenizer *t, const char *text, size_t len) {
  size_t n = 0;
  mn_status st = mn_tokenizer_encode(t, text, len, NULL, 0, &n);
  if (st != MN_OK) return; /* a byte without a token, say */
  uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  if (!ids) return;
  size_t again = 0;
  check(mn_tokenizer_encode(t, text, len, ids, n, &again) == MN_OK && again == n);
  for (size_t i = 0; i < n; i++) {
    check(ids[i] < mn_tokenizer_vocab_size(t));
    check(mn_tokenizer_token(t, ids[i]) != NULL);
  }
  size_t need = 0, out_len = 0;
  check(mn_tokenizer_decode(t, ids, n, NULL, 0, &need) == MN_OK);
  char *out = malloc(need + 1);
  if (out) {
    check(mn_tokenizer_decode(t, ids, n, out, need + 1, &out_len) == MN_OK);
    check(out_len == need && out[out_len] == '\0');
    free(out);
  }
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  mn_tokenizer *t = NULL;
  mn_status st = mn_tok_parse(text, size, "fuzz.json", &t);
  check((st == MN_OK) == (t != NULL));
  check(st == MN_OK || st == MN_ERR_FORMAT || st == MN_ERR_UNSUPPORTED ||
        st == MN_ERR_OUT_OF_MEMORY);
  if (st == MN_OK) {
    static const char *const texts[] = {"hello world", "Hello, World! 123 don't\n\n  x",
                                        "<|endoftext|>a\xe4\xbd\xa0\xff", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
      encode_decode(t, texts[i], strlen(texts[i]));
    encode_decode(t, text, size < 64 ? size : 64);
    mn_tokenizer_free(t);
  }
  free(text);
  return 0;
}
