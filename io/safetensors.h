/* safetensors files inside the library: the writer (checkpoints and parameter saves use it),
 * raw access for bit-exact loads, parsing from memory (the fuzzer uses it), and the f32 <->
 * f16/bf16 conversions that both the reader and the session code need.
 *
 * The public reader (mn_safetensors_open and friends) is declared in meganeura.h. Its
 * tensor order, mn_safetensors_name(st, i), is the order of the data offsets in the file
 * (ties between empty tensors broken by header order): the order in which the reference
 * implementation iterates, and the order in which the bytes lie on disk. */
#ifndef MN_IO_SAFETENSORS_H
#define MN_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "meganeura.h"

/* The reference implementation refuses larger headers; the writer does too. */
#define MN_ST_MAX_HEADER 100000000u

/* ---------------------------------------------------------------- writer */

typedef struct mn_st_tensor {
  const char *name;
  const char *dtype; /* "F32", "BF16", ... as in the file */
  int rank;
  int64_t shape[MN_MAX_RANK];
  const void *data; /* little-endian element bytes, row-major */
  size_t bytes;     /* must equal numel x dtype size */
} mn_st_tensor;

typedef struct mn_st_meta {
  const char *key;
  const char *value;
} mn_st_meta;

/* Writes atomically: a temp file in the same folder, fsync, rename over path, fsync of the folder.
 * Tensors are laid out as the Python package lays them out (dtype alignment descending, then
 * name), so the same tensors and metadata give the same bytes; metadata keys keep the caller's
 * order, and nmeta == 0 writes no __metadata__ entry. On failure the temp file is removed and an
 * existing file at path is left as it was. */
mn_status mn_safetensors_write(const char *path, const mn_st_tensor *tensors, size_t n,
                               const mn_st_meta *meta, size_t nmeta);

/* ---------------------------------------------------------------- reader extras */

/* Parses a safetensors image that the caller keeps alive (and unchanged) until
 * mn_safetensors_close. label names the data in error messages (a file name). */
mn_status mn_safetensors_open_memory(const void *data, size_t size, const char *label,
                                     mn_safetensors **out);

/* The tensor's bytes exactly as stored (little-endian, possibly unaligned), their count and the
 * dtype string. Any argument but st and name may be NULL when not wanted. */
mn_status mn_safetensors_raw(const mn_safetensors *st, const char *name, const void **data,
                             size_t *bytes, const char **dtype);

/* ---------------------------------------------------------------- dtypes */

/* Bytes per element of a safetensors dtype string; 0 for names this library cannot hold
 * (unknown names, and the sub-byte F4/F6 types). */
size_t mn_st_dtype_size(const char *dtype);

/* The f32 <-> f16/bf16 conversions, for the readers and writers of this header. */
#include "host/half.h"

#endif
