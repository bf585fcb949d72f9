/* The safetensors writer: validates the tensors, lays them out exactly as the reference
 * implementation does, and replaces the target file atomically. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/error.h"
#include "io/safetensors_internal.h"

#define FN "mn_safetensors_write"

/* ---------------------------------------------------------------- argument checks */

static mn_status check_tensor(const char *path, const mn_st_tensor *t, size_t i) {
  if (!t->name)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor %zu: name is NULL", path, i);
  const char *name = t->name;
  if (!mn_st_utf8_valid(name))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor %zu: name is not valid UTF-8", path,
                   i);
  if (strcmp(name, "__metadata__") == 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor name '__metadata__' is reserved",
                   path);
  const mn_st_dtype_desc *d = mn_st_dtype_find(t->dtype);
  if (!d || d->size == 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor '%s': unsupported dtype '%s'", path,
                   name, t->dtype ? t->dtype : "(null)");
  if (t->rank < 0 || t->rank > MN_MAX_RANK)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor '%s': rank %d is outside [0, %d]",
                   path, name, t->rank, MN_MAX_RANK);
  size_t numel = 1;
  bool overflow = false;
  for (int k = 0; k < t->rank; k++) {
    if (t->shape[k] < 0)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor '%s': shape[%d] is negative (%lld)",
                     path, name, k, (long long)t->shape[k]);
    size_t dim = (size_t)t->shape[k];
    if (dim != 0 && numel > SIZE_MAX / dim) overflow = true;
    numel *= dim;
  }
  if (overflow || numel > SIZE_MAX / d->size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor '%s': byte size overflows", path,
                   name);
  if (t->bytes != numel * d->size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   FN ": %s: tensor '%s': bytes is %zu but %zu elements of %s need %zu", path, name,
                   t->bytes, numel, d->name, numel * d->size);
  if (!t->data && t->bytes > 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensor '%s': data is NULL", path, name);
  return MN_OK;
}

static mn_status check_meta(const char *path, const mn_st_meta *meta, size_t nmeta) {
  for (size_t i = 0; i < nmeta; i++) {
    if (!meta[i].key || !meta[i].value)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: metadata %zu: %s is NULL", path, i,
                     meta[i].key ? "value" : "key");
    if (!mn_st_utf8_valid(meta[i].key) || !mn_st_utf8_valid(meta[i].value))
      return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: metadata %zu: not valid UTF-8", path, i);
    /* Metadata is a handful of entries; a quadratic check is simplest. */
    for (size_t j = 0; j < i; j++)
      if (strcmp(meta[i].key, meta[j].key) == 0)
        return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: duplicate metadata key '%s'", path,
                       meta[i].key);
  }
  return MN_OK;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(const mn_st_tensor *const *)a)->name, (*(const mn_st_tensor *const *)b)->name);
}

/* The reference's order: dtype descending in its enum order (which puts wider types first,
 * keeping every tensor aligned when the header is padded to 8), then name. */
static int cmp_layout(const void *a, const void *b) {
  const mn_st_tensor *x = *(const mn_st_tensor *const *)a, *y = *(const mn_st_tensor *const *)b;
  int ox = mn_st_dtype_find(x->dtype)->order, oy = mn_st_dtype_find(y->dtype)->order;
  if (ox != oy) return oy - ox;
  return strcmp(x->name, y->name);
}

static mn_status check_args(const char *path, const mn_st_tensor *tensors, size_t n,
                            const mn_st_meta *meta, size_t nmeta, const mn_st_tensor **order) {
  for (size_t i = 0; i < n; i++) {
    mn_status st = check_tensor(path, &tensors[i], i);
    if (st != MN_OK) return st;
  }
  mn_status st = check_meta(path, meta, nmeta);
  if (st != MN_OK) return st;
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (tensors[i].bytes > UINT64_MAX - total)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: total size overflows 64 bits", path);
    total += tensors[i].bytes;
  }
  for (size_t i = 0; i < n; i++)
    order[i] = &tensors[i];
  qsort(order, n, sizeof *order, cmp_name);
  for (size_t i = 1; i < n; i++)
    if (strcmp(order[i - 1]->name, order[i]->name) == 0)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: duplicate tensor name '%s'", path,
                     order[i]->name);
  qsort(order, n, sizeof *order, cmp_layout);
  return MN_OK;
}

/* ---------------------------------------------------------------- the header */

typedef struct text {
  char *p;
  size_t len, cap;
  bool oom;
} text;

static void put(text *t, const char *s, size_t n) {
  if (t->oom) return;
  if (t->len + n > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n)
      cap *= 2;
    char *grown = realloc(t->p, cap);
    if (!grown) {
      t->oom = true;
      return;
    }
    t->p = grown;
    t->cap = cap;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
}

static void put_str(text *t, const char *s) { put(t, s, strlen(s)); }

static void put_u64(text *t, uint64_t v) {
  char b[24];
  int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  put(t, b, (size_t)n);
}

/* Escapes as serde_json does, so that headers match the Python package byte for byte: the
 * short escapes where JSON has them, \u00xx (lower-case hex) for other control characters,
 * everything else (DEL and non-ASCII included) as is. */
static void put_json_string(text *t, const char *s) {
  put(t, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    const char *e = NULL;
    switch (*c) {
    case '"': e = "\\\""; break;
    case '\\': e = "\\\\"; break;
    case '\b': e = "\\b"; break;
    case '\f': e = "\\f"; break;
    case '\n': e = "\\n"; break;
    case '\r': e = "\\r"; break;
    case '\t': e = "\\t"; break;
    default:
      if (*c < 0x20) {
        snprintf(esc, sizeof esc, "\\u%04x", *c);
        e = esc;
      }
    }
    if (e)
      put_str(t, e);
    else
      put(t, (const char *)c, 1);
  }
  put(t, "\"", 1);
}

static void put_tensor(text *t, const mn_st_tensor *x, uint64_t begin) {
  put_json_string(t, x->name);
  put_str(t, ":{\"dtype\":");
  put_json_string(t, x->dtype);
  put_str(t, ",\"shape\":[");
  for (int k = 0; k < x->rank; k++) {
    if (k) put(t, ",", 1);
    put_u64(t, (uint64_t)x->shape[k]);
  }
  put_str(t, "],\"data_offsets\":[");
  put_u64(t, begin);
  put(t, ",", 1);
  put_u64(t, begin + x->bytes);
  put_str(t, "]}");
}

static mn_status build_header(const char *path, const mn_st_tensor *const *order, size_t n,
                              const mn_st_meta *meta, size_t nmeta, text *t) {
  put(t, "{", 1);
  if (nmeta > 0) {
    put_str(t, "\"__metadata__\":{");
    for (size_t i = 0; i < nmeta; i++) {
      if (i) put(t, ",", 1);
      put_json_string(t, meta[i].key);
      put(t, ":", 1);
      put_json_string(t, meta[i].value);
    }
    put(t, "}", 1);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    if (i || nmeta) put(t, ",", 1);
    put_tensor(t, order[i], offset);
    offset += order[i]->bytes;
  }
  put(t, "}", 1);
  /* Padding to 8 bytes keeps the data section, and with the layout order every tensor,
   * aligned for readers that cast the mapping in place. */
  while (!t->oom && t->len % 8)
    put(t, " ", 1);
  if (t->oom) return mn_fail(MN_ERR_OUT_OF_MEMORY, FN ": %s: out of memory for the header", path);
  if (t->len > MN_ST_MAX_HEADER)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   FN ": %s: header would be %zu bytes, above the format's limit of %u", path,
                   t->len, MN_ST_MAX_HEADER);
  return MN_OK;
}

/* ---------------------------------------------------------------- the file */

static mn_status io_fail(const char *path, const char *what, const char *name, int err) {
  char msg[256];
  if (strerror_r(err, msg, sizeof msg) != 0) msg[0] = '\0';
  return mn_fail(MN_ERR_IO, FN ": %s: %s '%s': %s", path, what, name, msg);
}

static bool write_all(int fd, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = EIO;
      return false;
    }
    p += w;
    n -= (size_t)w;
  }
  return true;
}

static mn_status write_contents(int fd, const char *path, const char *tmp, const text *header,
                                const mn_st_tensor *const *order, size_t n) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++)
    len[i] = (unsigned char)((uint64_t)header->len >> (8 * i));
  bool ok = write_all(fd, len, sizeof len) && write_all(fd, header->p, header->len);
  for (size_t i = 0; ok && i < n; i++)
    ok = write_all(fd, order[i]->data, order[i]->bytes);
  if (!ok) return io_fail(path, "cannot write", tmp, errno);
  if (fsync(fd) != 0) return io_fail(path, "cannot sync", tmp, errno);
  return MN_OK;
}

/* The folder's entry for the renamed file is only durable once the folder is synced. */
static mn_status sync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return mn_fail(MN_ERR_OUT_OF_MEMORY, FN ": %s: out of memory", path);
  mn_status st = MN_OK;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0)
    st = io_fail(path, "written, but cannot sync the folder", dir, errno);
  if (fd >= 0) close(fd);
  free(dir);
  return st;
}

static mn_status write_atomically(const char *path, const text *header,
                                  const mn_st_tensor *const *order, size_t n) {
  static atomic_ulong counter;
  unsigned long k = atomic_fetch_add(&counter, 1);
  size_t cap = strlen(path) + 64;
  char *tmp = malloc(cap);
  if (!tmp) return mn_fail(MN_ERR_OUT_OF_MEMORY, FN ": %s: out of memory", path);
  snprintf(tmp, cap, "%s.tmp.%ld.%lu", path, (long)getpid(), k);
  mn_status st = MN_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    st = io_fail(path, "cannot create", tmp, errno);
  } else {
    st = write_contents(fd, path, tmp, header, order, n);
    if (close(fd) != 0 && st == MN_OK) st = io_fail(path, "cannot close", tmp, errno);
    if (st == MN_OK && rename(tmp, path) != 0) st = io_fail(path, "cannot rename", tmp, errno);
    if (st != MN_OK) unlink(tmp);
  }
  free(tmp);
  return st == MN_OK ? sync_parent(path) : st;
}

mn_status mn_safetensors_write(const char *path, const mn_st_tensor *tensors, size_t n,
                               const mn_st_meta *meta, size_t nmeta) {
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": path is NULL");
  if (n > 0 && !tensors) return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: tensors is NULL", path);
  if (nmeta > 0 && !meta) return mn_fail(MN_ERR_INVALID_ARGUMENT, FN ": %s: meta is NULL", path);
  const mn_st_tensor **order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return mn_fail(MN_ERR_OUT_OF_MEMORY, FN ": %s: out of memory", path);
  text header = {0};
  mn_status st = check_args(path, tensors, n, meta, nmeta, order);
  if (st == MN_OK) st = build_header(path, order, n, meta, nmeta, &header);
  if (st == MN_OK) st = write_atomically(path, &header, order, n);
  free(header.p);
  free(order);
  return st;
}
