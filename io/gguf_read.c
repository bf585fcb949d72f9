/* The GGUF reader: maps the file and validates all of it at open, so that later lookups cannot
 * step outside the image. Every count is checked against the bytes left before anything is
 * allocated for it, every length and offset with overflow-safe arithmetic, and the tensors must
 * lie inside the data section without overlapping. Like every mmap reader, it assumes nobody
 * truncates the file while it is open. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/error.h"
#include "io/gguf.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF data is read in place");

#define FN "mn_gguf_open"
/* Keys and tensor names longer than this are refused (llama.cpp keeps names below 64 bytes). */
#define MAX_NAME 65535u

typedef struct kv_entry {
  mn_gguf_kv kv;         /* first: mn_gguf_kv_at hands out &entry->kv */
  uint64_t *str_offsets; /* arrays of strings: where each element (its length) starts */
} kv_entry;

struct mn_gguf {
  char *label;
  const unsigned char *file;
  uint64_t size;
  void *map;
  size_t map_size;
  uint32_t version;
  uint64_t alignment, data_offset;
  kv_entry *kvs;
  size_t nkv;
  mn_gguf_tensor *tensors;
  size_t ntensors;
  const mn_gguf_tensor **by_name; /* sorted by name */
};

typedef struct cursor {
  const mn_gguf *g;
  uint64_t pos;
} cursor;

static mn_status __attribute__((format(printf, 4, 5)))
bad(const mn_gguf *g, mn_status st, uint64_t at, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mn_fail(st, "%s: %s: at byte %llu: %s", FN, g->label, (unsigned long long)at, msg);
}

static mn_status oom(const mn_gguf *g) {
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, g->label);
}

static uint64_t left(const cursor *c) { return c->g->size - c->pos; }

static mn_status take(cursor *c, void *dst, uint64_t n, const char *what) {
  if (left(c) < n)
    return bad(c->g, MN_ERR_FORMAT, c->pos,
               "the file ends inside %s (%llu bytes needed, %llu left)", what,
               (unsigned long long)n, (unsigned long long)left(c));
  if (dst) memcpy(dst, c->g->file + c->pos, n);
  c->pos += n;
  return MN_OK;
}

static mn_status take_u32(cursor *c, uint32_t *v, const char *what) { return take(c, v, 4, what); }
static mn_status take_u64(cursor *c, uint64_t *v, const char *what) { return take(c, v, 8, what); }

/* A string: u64 length, then its bytes (left in the image). */
static mn_status take_string(cursor *c, const char **ptr, uint64_t *len, const char *what) {
  uint64_t at = c->pos;
  mn_status st = take_u64(c, len, what);
  if (st != MN_OK) return st;
  if (*len > left(c))
    return bad(c->g, MN_ERR_FORMAT, at, "%s has length %llu, past the end of the file (%llu left)",
               what, (unsigned long long)*len, (unsigned long long)left(c));
  *ptr = (const char *)c->g->file + c->pos;
  c->pos += *len;
  return MN_OK;
}

/* A name (key or tensor name): a string without NUL bytes, copied with a NUL. */
static mn_status take_name(cursor *c, char **out, const char *what) {
  uint64_t at = c->pos, len = 0;
  const char *p = NULL;
  mn_status st = take_string(c, &p, &len, what);
  if (st != MN_OK) return st;
  if (len == 0 || len > MAX_NAME || memchr(p, '\0', len))
    return bad(c->g, MN_ERR_FORMAT, at, "%s is empty, longer than %u bytes or holds a NUL byte",
               what, MAX_NAME);
  if (!(*out = malloc(len + 1))) return oom(c->g);
  memcpy(*out, p, len);
  (*out)[len] = '\0';
  return MN_OK;
}

static uint64_t scalar_size(uint32_t type) {
  switch (type) {
  case MN_GGUF_U8:
  case MN_GGUF_I8:
  case MN_GGUF_BOOL: return 1;
  case MN_GGUF_U16:
  case MN_GGUF_I16: return 2;
  case MN_GGUF_U32:
  case MN_GGUF_I32:
  case MN_GGUF_F32V: return 4;
  case MN_GGUF_U64:
  case MN_GGUF_I64:
  case MN_GGUF_F64: return 8;
  default: return 0;
  }
}

/* A scalar of a fixed-size type at c, into kv->v. */
static mn_status take_scalar(cursor *c, uint32_t type, mn_gguf_kv *kv) {
  uint64_t at = c->pos;
  unsigned char b[8] = {0};
  mn_status st = take(c, b, scalar_size(type), "a value");
  if (st != MN_OK) return st;
  switch (type) {
  case MN_GGUF_U8: kv->v.u = b[0]; break;
  case MN_GGUF_I8: kv->v.i = (int8_t)b[0]; break;
  case MN_GGUF_BOOL:
    if (b[0] > 1) return bad(c->g, MN_ERR_FORMAT, at, "a bool is %u, not 0 or 1", b[0]);
    kv->v.u = b[0];
    break;
  case MN_GGUF_U16: {
    uint16_t v;
    memcpy(&v, b, 2);
    kv->v.u = v;
  } break;
  case MN_GGUF_I16: {
    int16_t v;
    memcpy(&v, b, 2);
    kv->v.i = v;
  } break;
  case MN_GGUF_U32: {
    uint32_t v;
    memcpy(&v, b, 4);
    kv->v.u = v;
  } break;
  case MN_GGUF_I32: {
    int32_t v;
    memcpy(&v, b, 4);
    kv->v.i = v;
  } break;
  case MN_GGUF_F32V: {
    float v;
    memcpy(&v, b, 4);
    kv->v.f = v;
  } break;
  case MN_GGUF_U64: memcpy(&kv->v.u, b, 8); break;
  case MN_GGUF_I64: memcpy(&kv->v.i, b, 8); break;
  default: memcpy(&kv->v.f, b, 8); break;
  }
  return MN_OK;
}

static mn_status take_array(cursor *c, kv_entry *e) {
  mn_gguf_kv *kv = &e->kv;
  uint64_t at = c->pos;
  uint32_t type = 0;
  mn_status st = take_u32(c, &type, "an array's element type");
  if (st == MN_OK) st = take_u64(c, &kv->v.arr.count, "an array's length");
  if (st != MN_OK) return st;
  kv->v.arr.type = (mn_gguf_vtype)type;
  kv->v.arr.offset = c->pos;
  uint64_t n = kv->v.arr.count, size = scalar_size(type);
  if (type == MN_GGUF_ARRAY)
    return bad(c->g, MN_ERR_UNSUPPORTED, at, "\"%s\" is an array of arrays", kv->key);
  if (size) {
    if (n > left(c) / size)
      return bad(c->g, MN_ERR_FORMAT, at,
                 "\"%s\" has %llu elements of %llu bytes, past the end of the file", kv->key,
                 (unsigned long long)n, (unsigned long long)size);
    c->pos += n * size;
    return MN_OK;
  }
  if (type != MN_GGUF_STRING)
    return bad(c->g, MN_ERR_FORMAT, at, "\"%s\": unknown array element type %u", kv->key, type);
  if (n > left(c) / 8) /* every string takes at least its 8-byte length */
    return bad(c->g, MN_ERR_FORMAT, at, "\"%s\" has %llu strings, more than the file can hold",
               kv->key, (unsigned long long)n);
  if (!(e->str_offsets = malloc((n ? n : 1) * sizeof *e->str_offsets))) return oom(c->g);
  for (uint64_t i = 0; i < n; i++) {
    const char *p;
    uint64_t len;
    e->str_offsets[i] = c->pos;
    if ((st = take_string(c, &p, &len, "an array's string")) != MN_OK) return st;
  }
  return MN_OK;
}

static mn_status take_kv(cursor *c, kv_entry *e) {
  mn_gguf_kv *kv = &e->kv;
  mn_status st = take_name(c, (char **)&kv->key, "a metadata key");
  if (st != MN_OK) return st;
  uint64_t at = c->pos;
  uint32_t type = 0;
  if ((st = take_u32(c, &type, "a value type")) != MN_OK) return st;
  kv->type = (mn_gguf_vtype)type;
  if (type == MN_GGUF_STRING) return take_string(c, &kv->v.str.ptr, &kv->v.str.len, "a string");
  if (type == MN_GGUF_ARRAY) return take_array(c, e);
  if (!scalar_size(type))
    return bad(c->g, MN_ERR_FORMAT, at, "\"%s\": unknown value type %u", kv->key, type);
  return take_scalar(c, type, kv);
}

static int cmp_kv_key(const void *a, const void *b) {
  return strcmp(((const kv_entry *)a)->kv.key, ((const kv_entry *)b)->kv.key);
}

/* Duplicate keys and general.alignment (a power of two in a u32, as llama.cpp requires). */
static mn_status check_kvs(mn_gguf *g, uint64_t kv_start) {
  kv_entry *sorted = malloc((g->nkv ? g->nkv : 1) * sizeof *sorted);
  if (!sorted) return oom(g);
  memcpy(sorted, g->kvs, g->nkv * sizeof *sorted);
  qsort(sorted, g->nkv, sizeof *sorted, cmp_kv_key);
  for (size_t i = 1; i < g->nkv; i++)
    if (strcmp(sorted[i].kv.key, sorted[i - 1].kv.key) == 0) {
      mn_status st =
          bad(g, MN_ERR_FORMAT, kv_start, "the key \"%s\" appears twice", sorted[i].kv.key);
      free(sorted);
      return st;
    }
  free(sorted);
  g->alignment = MN_GGUF_DEFAULT_ALIGNMENT;
  const mn_gguf_kv *a = mn_gguf_find(g, "general.alignment");
  if (!a) return MN_OK;
  if (a->type != MN_GGUF_U32 || a->v.u == 0 || (a->v.u & (a->v.u - 1)))
    return bad(g, MN_ERR_FORMAT, kv_start,
               "general.alignment must be a u32 power of two (type %d, value %llu)", (int)a->type,
               (unsigned long long)a->v.u);
  g->alignment = a->v.u;
  return MN_OK;
}

static mn_status take_tensor(cursor *c, mn_gguf_tensor *t) {
  mn_status st = take_name(c, (char **)&t->name, "a tensor name");
  if (st != MN_OK) return st;
  uint64_t at = c->pos;
  uint32_t rank = 0;
  if ((st = take_u32(c, &rank, "a tensor's rank")) != MN_OK) return st;
  if (rank < 1 || rank > MN_GGUF_MAX_DIMS)
    return bad(c->g, MN_ERR_FORMAT, at, "tensor \"%s\" has rank %u (1 to %d)", t->name, rank,
               MN_GGUF_MAX_DIMS);
  t->rank = (int)rank;
  uint64_t numel = 1;
  for (uint32_t d = 0; d < rank; d++) {
    uint64_t ne = 0;
    at = c->pos;
    if ((st = take_u64(c, &ne, "a tensor's dimension")) != MN_OK) return st;
    if (ne > (uint64_t)INT64_MAX || (ne && numel > (uint64_t)INT64_MAX / ne))
      return bad(c->g, MN_ERR_FORMAT, at, "tensor \"%s\": dimension %u (%llu) overflows", t->name,
                 d, (unsigned long long)ne);
    t->ne[d] = (int64_t)ne;
    t->shape[rank - 1 - d] = (int64_t)ne;
    numel *= ne;
  }
  t->numel = numel;
  at = c->pos;
  if ((st = take_u32(c, &t->type, "a tensor's type")) != MN_OK ||
      (st = take_u64(c, &t->offset, "a tensor's offset")) != MN_OK)
    return st;
  uint64_t block = 0, bsize = 0;
  if (!mn_ggml_type_size(t->type, &block, &bsize))
    return bad(c->g, MN_ERR_FORMAT, at, "tensor \"%s\" has type %u, which is no ggml type", t->name,
               t->type);
  if (t->ne[0] % (int64_t)block)
    return bad(c->g, MN_ERR_FORMAT, at,
               "tensor \"%s\": %s needs rows of a multiple of %llu values, ne[0] is %lld", t->name,
               mn_ggml_type_name(t->type), (unsigned long long)block, (long long)t->ne[0]);
  if (numel / block > UINT64_MAX / bsize)
    return bad(c->g, MN_ERR_FORMAT, at, "tensor \"%s\": its size overflows", t->name);
  t->bytes = numel / block * bsize;
  return MN_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
  const mn_gguf_tensor *x = *(const mn_gguf_tensor *const *)a,
                       *y = *(const mn_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_by_name(const void *a, const void *b) {
  return strcmp((*(const mn_gguf_tensor *const *)a)->name,
                (*(const mn_gguf_tensor *const *)b)->name);
}

/* Every tensor inside the data section, aligned, without overlaps; names unique. info_at: where
 * the tensor infos start (the offsets in messages point at the infos, which hold the problem). */
static mn_status place_tensors(mn_gguf *g, uint64_t info_end) {
  uint64_t pad = (g->alignment - info_end % g->alignment) % g->alignment;
  g->data_offset = info_end + pad;
  if (!(g->by_name = malloc((g->ntensors ? g->ntensors : 1) * sizeof *g->by_name))) return oom(g);
  if (g->ntensors && g->data_offset > g->size)
    return bad(g, MN_ERR_FORMAT, info_end, "the file ends before its data section (at byte %llu)",
               (unsigned long long)g->data_offset);
  for (size_t i = 0; i < g->ntensors; i++) {
    mn_gguf_tensor *t = &g->tensors[i];
    if (t->offset % g->alignment)
      return bad(g, MN_ERR_FORMAT, g->data_offset,
                 "tensor \"%s\": offset %llu is not a multiple of the alignment %llu", t->name,
                 (unsigned long long)t->offset, (unsigned long long)g->alignment);
    uint64_t room = g->size - g->data_offset;
    if (t->offset > room || t->bytes > room - t->offset)
      return bad(g, MN_ERR_FORMAT, g->data_offset + (t->offset < room ? t->offset : room),
                 "tensor \"%s\" (%llu bytes at data offset %llu) ends past the end of the file "
                 "(%llu bytes of data)",
                 t->name, (unsigned long long)t->bytes, (unsigned long long)t->offset,
                 (unsigned long long)room);
    t->offset += g->data_offset;
    t->data = g->file + t->offset;
    g->by_name[i] = t;
  }
  qsort(g->by_name, g->ntensors, sizeof *g->by_name, cmp_by_offset);
  for (size_t i = 1; i < g->ntensors; i++) {
    const mn_gguf_tensor *p = g->by_name[i - 1], *t = g->by_name[i];
    if (p->bytes && t->bytes && t->offset < p->offset + p->bytes)
      return bad(g, MN_ERR_FORMAT, t->offset, "tensors \"%s\" and \"%s\" overlap", p->name,
                 t->name);
  }
  qsort(g->by_name, g->ntensors, sizeof *g->by_name, cmp_by_name);
  for (size_t i = 1; i < g->ntensors; i++)
    if (strcmp(g->by_name[i]->name, g->by_name[i - 1]->name) == 0)
      return bad(g, MN_ERR_FORMAT, g->data_offset, "the tensor name \"%s\" appears twice",
                 g->by_name[i]->name);
  return MN_OK;
}

static mn_status parse(mn_gguf *g) {
  cursor c = {g, 0};
  char magic[4];
  mn_status st = take(&c, magic, 4, "the magic");
  if (st != MN_OK) return st;
  if (memcmp(magic, "GGUF", 4) != 0)
    return bad(g, MN_ERR_FORMAT, 0, "not a GGUF file (the magic is not \"GGUF\")");
  if ((st = take_u32(&c, &g->version, "the version")) != MN_OK) return st;
  if (g->version == 1)
    return bad(g, MN_ERR_UNSUPPORTED, 4, "GGUF version 1 is not supported (2 and 3 are)");
  if (g->version != 2 && g->version != 3)
    return bad(g, MN_ERR_FORMAT, 4, "unknown GGUF version %u (2 and 3 are known)", g->version);
  uint64_t nt = 0, nkv = 0;
  if ((st = take_u64(&c, &nt, "the tensor count")) != MN_OK ||
      (st = take_u64(&c, &nkv, "the metadata count")) != MN_OK)
    return st;
  /* a key/value takes at least 13 bytes, a tensor info at least 32 */
  if (nkv > left(&c) / 13)
    return bad(g, MN_ERR_FORMAT, 16, "%llu metadata entries cannot fit in the file",
               (unsigned long long)nkv);
  if (nt > left(&c) / 32)
    return bad(g, MN_ERR_FORMAT, 8, "%llu tensors cannot fit in the file", (unsigned long long)nt);
  if (!(g->kvs = calloc(nkv ? nkv : 1, sizeof *g->kvs))) return oom(g);
  uint64_t kv_start = c.pos;
  for (; g->nkv < nkv; g->nkv++)
    if ((st = take_kv(&c, &g->kvs[g->nkv])) != MN_OK) {
      g->nkv++; /* freed with the others */
      return st;
    }
  if ((st = check_kvs(g, kv_start)) != MN_OK) return st;
  if (nt > left(&c) / 32)
    return bad(g, MN_ERR_FORMAT, 8, "%llu tensors cannot fit in the file", (unsigned long long)nt);
  if (!(g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors))) return oom(g);
  for (; g->ntensors < nt; g->ntensors++)
    if ((st = take_tensor(&c, &g->tensors[g->ntensors])) != MN_OK) {
      g->ntensors++;
      return st;
    }
  return place_tensors(g, c.pos);
}

void mn_gguf_close(mn_gguf *g) {
  if (!g) return;
  for (size_t i = 0; i < g->nkv; i++) {
    free((char *)g->kvs[i].kv.key);
    free(g->kvs[i].str_offsets);
  }
  for (size_t i = 0; i < g->ntensors; i++)
    free((char *)g->tensors[i].name);
  free(g->kvs);
  free(g->tensors);
  free(g->by_name);
  free(g->label);
  if (g->map) munmap(g->map, g->map_size);
  free(g);
}

static mn_status open_image(const void *data, size_t size, const char *label, void *map,
                            size_t map_size, mn_gguf **out) {
  *out = NULL;
  mn_gguf *g = calloc(1, sizeof *g);
  if (!g || !(g->label = strdup(label))) {
    free(g);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, label);
  }
  g->file = data;
  g->size = size;
  mn_status st = parse(g);
  if (st != MN_OK) {
    mn_gguf_close(g);
    return st;
  }
  g->map = map;
  g->map_size = map_size;
  *out = g;
  return MN_OK;
}

mn_status mn_gguf_open_memory(const void *data, size_t size, const char *label, mn_gguf **out) {
  if (!out || (!data && size) || !label)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: NULL argument", FN);
  return open_image(data, size, label, NULL, 0, out);
}

mn_status mn_gguf_open(const char *path, mn_gguf **out) {
  if (!path || !out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: NULL argument", FN);
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mn_fail(MN_ERR_IO, "%s: %s: cannot open: %s", FN, path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return mn_fail(MN_ERR_IO, "%s: %s: not a regular file", FN, path);
  }
  size_t size = (size_t)sb.st_size;
  void *map = NULL;
  if (size) {
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int err = errno;
      close(fd);
      return mn_fail(MN_ERR_IO, "%s: %s: cannot map: %s", FN, path, strerror(err));
    }
  }
  close(fd);
  mn_status st = open_image(map, size, path, map, size, out);
  if (st != MN_OK && map) munmap(map, size);
  return st;
}

bool mn_gguf_is_gguf(const char *path) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return false;
  char magic[4];
  bool yes = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  fclose(f);
  return yes;
}

const char *mn_gguf_label(const mn_gguf *g) { return g->label; }
uint32_t mn_gguf_version(const mn_gguf *g) { return g->version; }
uint64_t mn_gguf_alignment(const mn_gguf *g) { return g->alignment; }
uint64_t mn_gguf_data_offset(const mn_gguf *g) { return g->data_offset; }
size_t mn_gguf_kv_count(const mn_gguf *g) { return g->nkv; }
size_t mn_gguf_tensor_count(const mn_gguf *g) { return g->ntensors; }

const mn_gguf_kv *mn_gguf_kv_at(const mn_gguf *g, size_t i) {
  return i < g->nkv ? &g->kvs[i].kv : NULL;
}

const mn_gguf_kv *mn_gguf_find(const mn_gguf *g, const char *key) {
  for (size_t i = 0; i < g->nkv; i++)
    if (strcmp(g->kvs[i].kv.key, key) == 0) return &g->kvs[i].kv;
  return NULL;
}

const mn_gguf_tensor *mn_gguf_tensor_at(const mn_gguf *g, size_t i) {
  return i < g->ntensors ? &g->tensors[i] : NULL;
}

const mn_gguf_tensor *mn_gguf_tensor_find(const mn_gguf *g, const char *name) {
  size_t lo = 0, hi = g->ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(name, g->by_name[mid]->name);
    if (c == 0) return g->by_name[mid];
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

static bool is_signed(mn_gguf_vtype t) {
  return t == MN_GGUF_I8 || t == MN_GGUF_I16 || t == MN_GGUF_I32 || t == MN_GGUF_I64;
}

static bool is_unsigned(mn_gguf_vtype t) {
  return t == MN_GGUF_U8 || t == MN_GGUF_U16 || t == MN_GGUF_U32 || t == MN_GGUF_U64;
}

bool mn_gguf_kv_int(const mn_gguf_kv *kv, int64_t *out) {
  if (!kv) return false;
  if (is_signed(kv->type)) return (*out = kv->v.i), true;
  if (!is_unsigned(kv->type) || kv->v.u > (uint64_t)INT64_MAX) return false;
  *out = (int64_t)kv->v.u;
  return true;
}

bool mn_gguf_kv_float(const mn_gguf_kv *kv, double *out) {
  int64_t i;
  if (kv && (kv->type == MN_GGUF_F32V || kv->type == MN_GGUF_F64)) return (*out = kv->v.f), true;
  if (!mn_gguf_kv_int(kv, &i)) return false;
  *out = (double)i;
  return true;
}

bool mn_gguf_array_string(const mn_gguf *g, const mn_gguf_kv *kv, uint64_t i, const char **ptr,
                          uint64_t *len) {
  if (!kv || kv->type != MN_GGUF_ARRAY || kv->v.arr.type != MN_GGUF_STRING || i >= kv->v.arr.count)
    return false;
  uint64_t at = ((const kv_entry *)kv)->str_offsets[i];
  memcpy(len, g->file + at, 8);
  *ptr = (const char *)g->file + at + 8;
  return true;
}

bool mn_gguf_array_int(const mn_gguf *g, const mn_gguf_kv *kv, uint64_t i, int64_t *out) {
  if (!kv || kv->type != MN_GGUF_ARRAY || i >= kv->v.arr.count) return false;
  mn_gguf_vtype t = kv->v.arr.type;
  if (!is_signed(t) && !is_unsigned(t)) return false;
  mn_gguf_kv one = {.type = t};
  cursor c = {g, kv->v.arr.offset + i * scalar_size(t)};
  return take_scalar(&c, t, &one) == MN_OK && mn_gguf_kv_int(&one, out);
}
