/* The safetensors reader: maps the file, validates it once at open (io/safetensors_header.c),
 * then answers lookups and converts floating-point tensors to f32 straight from the mapping.
 * Like every mmap reader, it assumes nobody truncates the file while it is open (reads of the
 * lost pages would fault); writers that replace files by rename, as ours does, are safe. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/error.h"
#include "io/safetensors_internal.h"

struct mn_safetensors {
  char *label;
  const unsigned char *file;
  size_t size;
  void *map; /* owned mapping; NULL when the caller owns the image */
  size_t map_size;
  mn_st_header h;
  const mn_st_entry **by_name; /* h.tensors sorted by name, for lookups */
};

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(const mn_st_entry *const *)a)->name, (*(const mn_st_entry *const *)b)->name);
}

static const mn_st_entry *find(const mn_safetensors *st, const char *name) {
  size_t lo = 0, hi = st->h.count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const mn_st_entry *e = st->by_name[mid];
    int c = strcmp(name, e->name);
    if (c == 0) return e;
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

static const char *kv_find(const mn_st_header *h, const char *key) {
  size_t lo = 0, hi = h->nmeta;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(key, h->meta[mid].key);
    if (c == 0) return h->meta[mid].value;
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

void mn_safetensors_close(mn_safetensors *st) {
  if (!st) return;
  mn_st_header_free(&st->h);
  free(st->by_name);
  free(st->label);
  if (st->map) munmap(st->map, st->map_size);
  free(st);
}

/* Builds the handle around a file image; takes ownership of `map` only on success. */
static mn_status open_image(const unsigned char *file, size_t size, const char *label, void *map,
                            size_t map_size, mn_safetensors **out) {
  mn_safetensors *st = calloc(1, sizeof *st);
  if (!st || !(st->label = strdup(label))) {
    free(st);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_safetensors_open: %s: out of memory", label);
  }
  mn_status s = mn_st_parse(file, size, label, &st->h);
  if (s == MN_OK && !(st->by_name = malloc((st->h.count ? st->h.count : 1) * sizeof *st->by_name)))
    s = mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_safetensors_open: %s: out of memory", label);
  if (s != MN_OK) {
    mn_safetensors_close(st);
    return s;
  }
  for (size_t i = 0; i < st->h.count; i++)
    st->by_name[i] = &st->h.tensors[i];
  qsort(st->by_name, st->h.count, sizeof *st->by_name, cmp_by_name);
  st->file = file;
  st->size = size;
  st->map = map;
  st->map_size = map_size;
  *out = st;
  return MN_OK;
}

mn_status mn_safetensors_open_memory(const void *data, size_t size, const char *label,
                                     mn_safetensors **out) {
  if (out) *out = NULL;
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_safetensors_open_memory: out is NULL");
  if (!data && size > 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_safetensors_open_memory: data is NULL");
  static const unsigned char empty[1];
  return open_image(data ? data : empty, size, label ? label : "<memory>", NULL, 0, out);
}

static mn_status io_error(const char *path, const char *what, int err) {
  char msg[256];
  if (strerror_r(err, msg, sizeof msg) != 0) msg[0] = '\0';
  return mn_fail(MN_ERR_IO, "mn_safetensors_open: %s: %s: %s", path, what, msg);
}

/* Maps the whole file read-only; an empty file has nothing to map and gets a static image. */
static mn_status map_file(const char *path, void **map, size_t *size) {
  /* O_NONBLOCK: opening a FIFO by mistake must fail below, not wait for a writer. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error(path, "cannot open", errno);
  struct stat sb;
  mn_status s = MN_OK;
  if (fstat(fd, &sb) != 0) {
    s = io_error(path, "cannot stat", errno);
  } else if (!S_ISREG(sb.st_mode)) {
    s = mn_fail(MN_ERR_IO, "mn_safetensors_open: %s: not a regular file", path);
  } else {
    *size = (size_t)sb.st_size;
    *map = NULL;
    if (*size > 0) {
      void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED)
        s = io_error(path, "cannot map", errno);
      else
        *map = m;
    }
  }
  close(fd);
  return s;
}

mn_status mn_safetensors_open(const char *path, mn_safetensors **out) {
  if (out) *out = NULL;
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_safetensors_open: path is NULL");
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_safetensors_open: %s: out is NULL", path);
  void *map = NULL;
  size_t size = 0;
  mn_status s = map_file(path, &map, &size);
  if (s != MN_OK) return s;
  static const unsigned char empty[1];
  s = open_image(map ? map : empty, size, path, map, size, out);
  if (s != MN_OK && map) munmap(map, size);
  return s;
}

size_t mn_safetensors_count(const mn_safetensors *st) { return st ? st->h.count : 0; }

const char *mn_safetensors_name(const mn_safetensors *st, size_t i) {
  return st && i < st->h.count ? st->h.tensors[i].name : NULL;
}

const char *mn_safetensors_metadata(const mn_safetensors *st, const char *key) {
  return st && key ? kv_find(&st->h, key) : NULL;
}

/* The common argument checks and lookup of the per-tensor functions. */
static mn_status lookup(const char *fn, const mn_safetensors *st, const char *name,
                        const mn_st_entry **out) {
  if (!st) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: st is NULL", fn);
  if (!name) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s: name is NULL", fn, st->label);
  if (!(*out = find(st, name)))
    return mn_fail(MN_ERR_NOT_FOUND, "%s: %s: no tensor named '%s'", fn, st->label, name);
  return MN_OK;
}

mn_status mn_safetensors_info_of(const mn_safetensors *st, const char *name,
                                 mn_safetensors_info *out) {
  const char *fn = "mn_safetensors_info_of";
  const mn_st_entry *e;
  mn_status s = lookup(fn, st, name, &e);
  if (s != MN_OK) return s;
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s: out is NULL", fn, st->label);
  if (!e->shape_fits)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: tensor '%s': shape of rank %d does not fit mn_safetensors_info "
                   "(rank at most %d, dimensions at most INT64_MAX)",
                   fn, st->label, name, e->rank, MN_MAX_RANK);
  mn_safetensors_info info;
  memset(&info, 0, sizeof info);
  info.dtype = e->dtype->name;
  info.rank = e->rank;
  memcpy(info.shape, e->shape, (size_t)e->rank * sizeof info.shape[0]);
  info.bytes = (size_t)(e->end - e->begin);
  *out = info;
  return MN_OK;
}

mn_status mn_safetensors_raw(const mn_safetensors *st, const char *name, const void **data,
                             size_t *bytes, const char **dtype) {
  const mn_st_entry *e;
  mn_status s = lookup("mn_safetensors_raw", st, name, &e);
  if (s != MN_OK) return s;
  if (data) *data = st->file + st->h.data_start + e->begin;
  if (bytes) *bytes = (size_t)(e->end - e->begin);
  if (dtype) *dtype = e->dtype->name;
  return MN_OK;
}

/* ---------------------------------------------------------------- conversion to f32 */

/* Elements are copied out with memcpy: nothing makes tensor data aligned in the file. */
static void f32_from_f32(const unsigned char *src, float *out, size_t n) {
  memcpy(out, src, n * sizeof *out);
}

static void f32_from_f64(const unsigned char *src, float *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double d;
    memcpy(&d, src + 8 * i, sizeof d);
    out[i] = (float)d;
  }
}

static void f32_from_f16(const unsigned char *src, float *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, src + 2 * i, sizeof h);
    out[i] = mn_f16_to_f32(h);
  }
}

static void f32_from_bf16(const unsigned char *src, float *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, src + 2 * i, sizeof h);
    out[i] = mn_bf16_to_f32(h);
  }
}

typedef void (*to_f32_fn)(const unsigned char *, float *, size_t);

static to_f32_fn converter(const char *dtype) {
  if (strcmp(dtype, "F32") == 0) return f32_from_f32;
  if (strcmp(dtype, "F64") == 0) return f32_from_f64;
  if (strcmp(dtype, "F16") == 0) return f32_from_f16;
  if (strcmp(dtype, "BF16") == 0) return f32_from_bf16;
  return NULL;
}

mn_status mn_safetensors_read_f32(const mn_safetensors *st, const char *name, float *out,
                                  size_t n) {
  const char *fn = "mn_safetensors_read_f32";
  const mn_st_entry *e;
  mn_status s = lookup(fn, st, name, &e);
  if (s != MN_OK) return s;
  to_f32_fn convert = converter(e->dtype->name);
  if (!convert)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: %s: tensor '%s' is %s; only F32, F64, F16 and BF16 convert to f32", fn,
                   st->label, name, e->dtype->name);
  if (n != e->numel)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s: tensor '%s' has %llu elements, n is %zu", fn,
                   st->label, name, (unsigned long long)e->numel, n);
  if (!out && n > 0) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s: out is NULL", fn, st->label);
  if (n > 0) convert(st->file + st->h.data_start + e->begin, out, n);
  return MN_OK;
}
