/* GGUF files (llama.cpp's format, versions 2 and 3) inside the library:
 *   io/gguf_read.c    the file: header, metadata, tensor infos, every count and offset checked
 *   io/gguf_quant.c   the tensor types: block sizes, names, f32 from F32/F16/BF16/Q8_0/Q4_0/Q4_1
 *   io/gguf_names.c   llama.cpp's tensor names -> transformers' names and layouts (Llama, GPT-2)
 * A file is validated once, when it is opened: afterwards every metadata value and tensor lies
 * inside the image, so the accessors only look up. Messages: "mn_gguf_open: LABEL: at byte N:
 * problem" for a malformed file (MN_ERR_FORMAT), naming the tensor and its type for a type this
 * library cannot convert (MN_ERR_UNSUPPORTED). Little-endian files only: a big-endian file's
 * version reads as a huge number and is refused as an unknown version. */
#ifndef MN_IO_GGUF_H
#define MN_IO_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/quant.h"
#include "meganeura.h"

#define MN_GGUF_MAX_DIMS          4 /* GGML_MAX_DIMS */
#define MN_GGUF_DEFAULT_ALIGNMENT 32

/* gguf_type: the metadata value types. */
typedef enum mn_gguf_vtype {
  MN_GGUF_U8 = 0,
  MN_GGUF_I8 = 1,
  MN_GGUF_U16 = 2,
  MN_GGUF_I16 = 3,
  MN_GGUF_U32 = 4,
  MN_GGUF_I32 = 5,
  MN_GGUF_F32V = 6,
  MN_GGUF_BOOL = 7,
  MN_GGUF_STRING = 8,
  MN_GGUF_ARRAY = 9,
  MN_GGUF_U64 = 10,
  MN_GGUF_I64 = 11,
  MN_GGUF_F64 = 12,
} mn_gguf_vtype;

/* ggml_type values of the tensors this library converts (others are named, not converted). */
enum {
  MN_GGML_F32 = 0,
  MN_GGML_F16 = 1,
  MN_GGML_Q4_0 = 2,
  MN_GGML_Q4_1 = 3,
  MN_GGML_Q8_0 = 8,
  MN_GGML_BF16 = 30,
};

/* GGML's block layouts (mn_block_q8_0, ...) are host/quant.h's. */

typedef struct mn_gguf mn_gguf;

/* One metadata value. Strings point into the image and are not NUL-terminated. An array's
 * elements are read with the mn_gguf_array_* functions. */
typedef struct mn_gguf_kv {
  const char *key; /* NUL-terminated copy */
  mn_gguf_vtype type;
  union {
    uint64_t u; /* unsigned integers, bool */
    int64_t i;  /* signed integers */
    double f;   /* F32V, F64 */
    struct {
      const char *ptr;
      uint64_t len;
    } str;
    struct {
      mn_gguf_vtype type;
      uint64_t count;
      uint64_t offset; /* of the first element in the image */
    } arr;
  } v;
} mn_gguf_kv;

typedef struct mn_gguf_tensor {
  const char *name; /* NUL-terminated copy */
  uint32_t type;    /* ggml_type */
  int rank;
  int64_t ne[MN_GGUF_MAX_DIMS];    /* ggml order: ne[0] is the fastest-moving dimension */
  int64_t shape[MN_GGUF_MAX_DIMS]; /* row-major (PyTorch) order: ne reversed */
  uint64_t numel;
  uint64_t offset; /* in the image (data section start + the file's offset) */
  uint64_t bytes;  /* 0 when the type's size is unknown to this library */
  const void *data;
} mn_gguf_tensor;

/* Maps and validates a file; MN_ERR_IO when it cannot be opened, MN_ERR_FORMAT naming the byte
 * offset of the first problem. */
mn_status mn_gguf_open(const char *path, mn_gguf **out);
/* The same over an image the caller keeps alive until mn_gguf_close (the fuzz target). */
mn_status mn_gguf_open_memory(const void *data, size_t size, const char *label, mn_gguf **out);
void mn_gguf_close(mn_gguf *g);
/* True when the file starts with the magic "GGUF" (whatever its name). */
bool mn_gguf_is_gguf(const char *path);

const char *mn_gguf_label(const mn_gguf *g);
uint32_t mn_gguf_version(const mn_gguf *g);
uint64_t mn_gguf_alignment(const mn_gguf *g);
/* Where the data section starts in the image. */
uint64_t mn_gguf_data_offset(const mn_gguf *g);

size_t mn_gguf_kv_count(const mn_gguf *g);
const mn_gguf_kv *mn_gguf_kv_at(const mn_gguf *g, size_t i);
/* The first value with this key, or NULL. */
const mn_gguf_kv *mn_gguf_find(const mn_gguf *g, const char *key);

/* A scalar integer value (any integer type) as int64 (a u64 above INT64_MAX fails). False
 * when the value is not an integer. */
bool mn_gguf_kv_int(const mn_gguf_kv *kv, int64_t *out);
/* A scalar float value (F32V or F64), or an integer. */
bool mn_gguf_kv_float(const mn_gguf_kv *kv, double *out);
/* Element i (< count) of an array of strings, or of integers. False on another type. */
bool mn_gguf_array_string(const mn_gguf *g, const mn_gguf_kv *kv, uint64_t i, const char **ptr,
                          uint64_t *len);
bool mn_gguf_array_int(const mn_gguf *g, const mn_gguf_kv *kv, uint64_t i, int64_t *out);

size_t mn_gguf_tensor_count(const mn_gguf *g);
const mn_gguf_tensor *mn_gguf_tensor_at(const mn_gguf *g, size_t i);
const mn_gguf_tensor *mn_gguf_tensor_find(const mn_gguf *g, const char *name);

/* ---------------------------------------------------------------- tensor types (gguf_quant.c) */

/* "F32", "Q4_K", ... for every ggml_type llama.cpp defines; "type N" past them. */
const char *mn_ggml_type_name(uint32_t type);
/* Values per block and bytes per block; false for types this library does not know the size of
 * (a removed or future type). */
bool mn_ggml_type_size(uint32_t type, uint64_t *block, uint64_t *bytes);
/* One of the types read_f32 converts. */
bool mn_ggml_type_convertible(uint32_t type);
/* n values (a multiple of the type's block) from src to f32, exactly as gguf-py's
 * dequantize computes them. The type must be convertible. */
void mn_ggml_to_f32(uint32_t type, const void *src, float *dst, uint64_t n);

/* The tensor as f32 in its own (ggml) layout; n must equal its numel. MN_ERR_UNSUPPORTED
 * naming the tensor and its type when it is not convertible. */
mn_status mn_gguf_read_f32(const mn_gguf *g, const mn_gguf_tensor *t, float *out, uint64_t n);
/* MN_OK when the tensor can be read as f32, else the MN_ERR_UNSUPPORTED of read_f32. */
mn_status mn_gguf_check_convertible(const mn_gguf *g, const mn_gguf_tensor *t);

/* ---------------------------------------------------------------- model names (gguf_names.c) */

typedef enum mn_gguf_arch { MN_GGUF_ARCH_LLAMA, MN_GGUF_ARCH_GPT2 } mn_gguf_arch;

/* general.architecture: "llama" or "gpt2"; MN_ERR_UNSUPPORTED naming another, MN_ERR_FORMAT
 * when it is missing or not a string. fn names the public function in messages. */
mn_status mn_gguf_arch_of(const char *fn, const mn_gguf *g, mn_gguf_arch *out);

/* Whether the output head is the token embedding: no output.weight, or one that holds the same
 * type, shape and bytes as token_embd.weight (GPT-2's converter writes the tied head twice). */
bool mn_gguf_output_tied(const mn_gguf *g);

/* How a GGUF tensor becomes its transformers tensor. */
typedef enum mn_gguf_layout {
  MN_GGUF_SAME,      /* the same row-major values */
  MN_GGUF_TRANSPOSE, /* GPT-2's Conv1D weights: GGUF holds [out, in], transformers [in, out] */
  MN_GGUF_UNPERMUTE, /* Llama's q_proj/k_proj: the converter's RoPE row permutation, undone */
} mn_gguf_layout;

typedef struct mn_gguf_hf {
  char name[96]; /* transformers' name */
  mn_gguf_layout layout;
  int rank;
  int64_t shape[MN_GGUF_MAX_DIMS]; /* transformers' shape */
  int heads;                       /* MN_GGUF_UNPERMUTE: the head count the rows were permuted by */
} mn_gguf_hf;

/* The transformers name, layout and shape of a GGUF tensor; false for names the architecture
 * does not have (they are skipped). For Llama's Q and K the head counts come from the
 * metadata; MN_ERR_FORMAT when they are missing or do not divide the rows. */
mn_status mn_gguf_hf_tensor(const char *fn, const mn_gguf *g, mn_gguf_arch arch,
                            const mn_gguf_tensor *t, mn_gguf_hf *out, bool *known);
/* The tensor as f32 in transformers' layout (n must equal its numel). */
mn_status mn_gguf_read_hf_f32(const mn_gguf *g, const mn_gguf_tensor *t, const mn_gguf_hf *hf,
                              float *out, uint64_t n);
/* Undoes llama.cpp's Q/K permutation over rows of row_bytes each (f32 rows or GGML blocks):
 * within each of `heads` groups of rows, GGUF row 2j + p is transformers' row p * half + j. */
bool mn_gguf_unpermute_rows(const void *src, void *dst, uint64_t rows, uint64_t row_bytes,
                            int heads);

#endif
