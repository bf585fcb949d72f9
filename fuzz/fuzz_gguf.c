/* libFuzzer target for the GGUF reader: parses the input as a file image, and for accepted
 * files walks every metadata value and array element, and reads every tensor (as f32 when its
 * type converts, and in transformers' layout under both architectures' names), checking the
 * invariants that validation promises (tensors inside the image and aligned, lookups agree),
 * so logic errors trap too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) __builtin_trap();
}

/* Reads a string's last byte, so that AddressSanitizer sees a string that leaves the image. */
static void touch(const char *s, uint64_t len) {
  volatile char last = len ? s[len - 1] : 0;
  (void)last;
}

static void walk_kv(const mn_gguf *g, const mn_gguf_kv *kv) {
  check(mn_gguf_find(g, kv->key) != NULL);
  if (kv->type == MN_GGUF_STRING) touch(kv->v.str.ptr, kv->v.str.len);
  if (kv->type != MN_GGUF_ARRAY) return;
  for (uint64_t i = 0; i < kv->v.arr.count && i < 4096; i++) {
    const char *s;
    uint64_t len;
    int64_t v;
    if (kv->v.arr.type == MN_GGUF_STRING) {
      check(mn_gguf_array_string(g, kv, i, &s, &len));
      touch(s, len);
    } else
      (void)mn_gguf_array_int(g, kv, i, &v);
  }
}

static void read_tensor(const mn_gguf *g, const mn_gguf_tensor *t, const uint8_t *data,
                        size_t size) {
  check(mn_gguf_tensor_find(g, t->name) == t);
  check((const uint8_t *)t->data == data + t->offset && t->offset <= size &&
        t->bytes <= size - t->offset);
  check((t->offset - mn_gguf_data_offset(g)) % mn_gguf_alignment(g) == 0);
  if (!mn_ggml_type_convertible(t->type) || t->numel > (1u << 20)) return;
  float *out = malloc((t->numel ? t->numel : 1) * sizeof *out);
  if (!out) return;
  check(mn_gguf_read_f32(g, t, out, t->numel) == MN_OK);
  for (int a = 0; a < 2; a++) {
    mn_gguf_hf hf;
    bool known = false;
    if (mn_gguf_hf_tensor("fuzz", g, (mn_gguf_arch)a, t, &hf, &known) == MN_OK && known) {
      mn_status st = mn_gguf_read_hf_f32(g, t, &hf, out, t->numel);
      check(st == MN_OK || st == MN_ERR_OUT_OF_MEMORY);
    }
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mn_gguf *g = NULL;
  if (mn_gguf_open_memory(data, size, "fuzz", &g) != MN_OK) {
    check(g == NULL);
    return 0;
  }
  check(mn_gguf_version(g) == 2 || mn_gguf_version(g) == 3);
  check(mn_gguf_data_offset(g) % mn_gguf_alignment(g) == 0);
  for (size_t i = 0; i < mn_gguf_kv_count(g); i++)
    walk_kv(g, mn_gguf_kv_at(g, i));
  check(mn_gguf_kv_at(g, mn_gguf_kv_count(g)) == NULL);
  for (size_t i = 0; i < mn_gguf_tensor_count(g); i++)
    read_tensor(g, mn_gguf_tensor_at(g, i), data, size);
  check(mn_gguf_tensor_at(g, mn_gguf_tensor_count(g)) == NULL);
  (void)mn_gguf_output_tied(g);
  mn_gguf_arch arch;
  (void)mn_gguf_arch_of("fuzz", g, &arch);
  mn_gguf_close(g);
  return 0;
}
