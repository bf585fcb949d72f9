/* libFuzzer target for the safetensors reader: parses the input as a file image, and for
 * accepted files reads every tensor and checks the invariants that validation promises
 * (in the order mn_safetensors_name lists them, the tensors tile the data section; sizes
 * agree), so logic errors trap too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) __builtin_trap();
}

static void read_tensor(const mn_safetensors *st, const char *name, const uint8_t *expect_at,
                        const uint8_t **next) {
  const void *raw = NULL;
  size_t bytes = 0;
  const char *dtype = NULL;
  check(mn_safetensors_raw(st, name, &raw, &bytes, &dtype) == MN_OK);
  check(raw == expect_at);
  size_t esize = mn_st_dtype_size(dtype);
  check(esize > 0 && bytes % esize == 0);
  mn_safetensors_info info;
  if (mn_safetensors_info_of(st, name, &info) == MN_OK) {
    check(info.bytes == bytes && strcmp(info.dtype, dtype) == 0);
    check(info.rank >= 0 && info.rank <= MN_MAX_RANK);
  }
  size_t numel = bytes / esize;
  float *out = malloc((numel ? numel : 1) * sizeof *out);
  if (out) {
    mn_status s = mn_safetensors_read_f32(st, name, out, numel);
    check(s == MN_OK || s == MN_ERR_UNSUPPORTED);
    if (numel > 0) check(mn_safetensors_read_f32(st, name, out, numel - 1) != MN_OK);
    free(out);
  }
  *next = (const uint8_t *)raw + bytes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mn_safetensors *st = NULL;
  if (mn_safetensors_open_memory(data, size, "fuzz", &st) != MN_OK) {
    check(st == NULL);
    return 0;
  }
  uint64_t header = 0;
  for (int i = 7; i >= 0; i--)
    header = header << 8 | data[i];
  const uint8_t *at = data + 8 + header;
  size_t n = mn_safetensors_count(st);
  for (size_t i = 0; i < n; i++)
    read_tensor(st, mn_safetensors_name(st, i), at, &at);
  check(at == data + size);
  check(mn_safetensors_name(st, n) == NULL);
  check(mn_safetensors_info_of(st, "\x01not a tensor", &(mn_safetensors_info){0}) ==
        MN_ERR_NOT_FOUND);
  (void)mn_safetensors_metadata(st, "format");
  mn_safetensors_close(st);
  return 0;
}
