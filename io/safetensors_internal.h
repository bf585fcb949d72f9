/* Shared by the io/safetensors_*.c files only: the dtype table, UTF-8 checking, and the parsed
 * and validated form of a header. */
#ifndef MN_IO_SAFETENSORS_INTERNAL_H
#define MN_IO_SAFETENSORS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and is read in place");

typedef struct mn_st_dtype_desc {
  const char *name;
  unsigned size; /* bytes per element; 0 for the sub-byte types we refuse */
  int order;     /* position in the reference's dtype enum: the writer sorts by it */
} mn_st_dtype_desc;

/* NULL when the name is not a safetensors dtype at all. */
const mn_st_dtype_desc *mn_st_dtype_find(const char *name);

/* Length of the well-formed UTF-8 sequence that starts at s (at most avail bytes), or 0 when
 * there is none (stray continuation byte, overlong form, surrogate, beyond U+10FFFF,
 * truncated). */
size_t mn_st_utf8_seq(const unsigned char *s, size_t avail);
bool mn_st_utf8_valid(const char *s);

typedef struct mn_st_entry {
  char *name;
  const mn_st_dtype_desc *dtype;
  int rank;                   /* the file's rank, which may exceed MN_MAX_RANK */
  int64_t shape[MN_MAX_RANK]; /* the first MN_MAX_RANK dimensions */
  bool shape_fits;            /* rank <= MN_MAX_RANK and every dimension <= INT64_MAX */
  uint64_t numel;
  uint64_t begin, end; /* relative to the data section */
  size_t header_index; /* position among the header's tensor entries */
} mn_st_entry;

typedef struct mn_st_kv {
  char *key;
  char *value;
} mn_st_kv;

typedef struct mn_st_header {
  mn_st_entry *tensors; /* in data-offset order */
  size_t count;
  mn_st_kv *meta; /* sorted by key */
  size_t nmeta;
  uint64_t data_start; /* 8 + header length: where offset 0 of the data section lies */
} mn_st_header;

/* Parses and validates a whole file image against every rule of the format; on failure sets
 * the last error ("mn_safetensors_open: <label>: ...") and leaves *out empty. */
mn_status mn_st_parse(const unsigned char *file, size_t size, const char *label, mn_st_header *out);
void mn_st_header_free(mn_st_header *h);

#endif
