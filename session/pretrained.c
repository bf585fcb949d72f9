/* Pretrained weights: parameters by name from a safetensors file or a sharded checkpoint
 * (model.safetensors.index.json, whose weight_map names the shard of every tensor), F16, BF16
 * and F64 converted to f32; and the parameters saved back under their own names, F32, in a
 * file that transformers loads.
 *
 * Like checkpoints, a load checks every parameter's tensor (presence when strict, dtype, shape)
 * before it writes any, so a file that does not fit changes nothing: MN_ERR_SHAPE for another
 * shape (never transposed or reshaped), MN_ERR_FORMAT for a dtype that is not F32, F16, BF16 or
 * F64 and for a bad index, MN_ERR_NOT_FOUND for a parameter a strict load does not find,
 * MN_ERR_IO for a file or shard that cannot be opened, and MN_ERR_FORMAT naming the tensor for a
 * NaN or infinity (also one that F64 overflows to) unless the caller allows them: a broken
 * checkpoint would otherwise load and then train or sample garbage. On success mn_last_error()
 * names the tensors skipped because the graph has no parameter for them (GPT-2's attn.bias masks, a
 * tied lm_head) and, for non-strict loads, the parameters that kept their values; it is "" when
 * there are none. Parameters that the optimizer concatenated into a derived one
 * (optimizer/siblings.h, placed by the plan's table) are loaded and saved under their own names;
 * the derived name never appears in files or messages. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/error.h"
#include "io/safetensors.h"
#include "session/session_params.h"

#define MAX_INDEX_BYTES ((size_t)64 << 20)

/* ---------------------------------------------------------------- names -> indices
 *
 * A 1,000-layer checkpoint has ~10,000 tensors, and looking each parameter up by a scan made
 * loading quadratic. Open addressing over index + 1 (0: empty); equal names share a probe
 * chain in insertion order, so a lookup finds the first of them, as a scan would. */
typedef struct name_index {
  const char **names; /* borrowed */
  size_t *slots, cap;
} name_index;

static size_t name_slot(const char *s, size_t cap) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return (size_t)h & (cap - 1);
}

static bool name_index_build(name_index *x, const char **names, size_t n) {
  x->names = names;
  for (x->cap = 16; x->cap < 2 * n;)
    x->cap *= 2;
  if (!(x->slots = calloc(x->cap, sizeof *x->slots))) return false;
  for (size_t i = 0; i < n; i++) {
    size_t at = name_slot(names[i], x->cap);
    while (x->slots[at])
      at = (at + 1) & (x->cap - 1);
    x->slots[at] = i + 1;
  }
  return true;
}

static long name_index_find(const name_index *x, const char *name) {
  for (size_t at = name_slot(name, x->cap); x->slots[at]; at = (at + 1) & (x->cap - 1))
    if (strcmp(x->names[x->slots[at] - 1], name) == 0) return (long)(x->slots[at] - 1);
  return -1;
}

/* A tensor of the source and the open file that holds it. */
typedef struct source_entry {
  const char *name; /* owned by the file handle or the parsed index */
  size_t file;
} source_entry;

typedef struct source {
  const char *fn, *path;
  mn_safetensors **files;
  const char **shards; /* file name of each open file (sharded sources) */
  size_t num_files;
  source_entry *entries; /* in file order (single file) or weight_map order (sharded) */
  size_t num_entries;
  cJSON *index;       /* keeps the weight_map's names alive */
  const char **names; /* entries[i].name, for by_name */
  name_index by_name;
} source;

static void source_free(source *src) {
  for (size_t i = 0; i < src->num_files; i++)
    mn_safetensors_close(src->files[i]);
  free(src->files);
  free(src->shards);
  free(src->entries);
  free(src->names);
  free(src->by_name.slots);
  cJSON_Delete(src->index);
}

static mn_status open_single(source *src) {
  if (!(src->files = calloc(1, sizeof *src->files)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  mn_status st = mn_safetensors_open(src->path, &src->files[0]);
  if (st != MN_OK) return mn_io_rewrap(st, src->fn);
  src->num_files = 1;
  size_t n = mn_safetensors_count(src->files[0]);
  if (!(src->entries = calloc(n ? n : 1, sizeof *src->entries)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  for (size_t i = 0; i < n; i++)
    src->entries[i] = (source_entry){mn_safetensors_name(src->files[0], i), 0};
  src->num_entries = n;
  return MN_OK;
}

static mn_status read_text(const source *src, char **text, size_t *len) {
  FILE *fp = fopen(src->path, "rb");
  if (!fp)
    return mn_fail(MN_ERR_IO, "%s: %s: cannot open: %s", src->fn, src->path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > MAX_INDEX_BYTES) {
    fclose(fp);
    return mn_fail(MN_ERR_IO, "%s: %s: not a regular file of at most %zu bytes", src->fn, src->path,
                   MAX_INDEX_BYTES);
  }
  char *buf = malloc((size_t)sb.st_size + 1);
  size_t got = buf ? fread(buf, 1, (size_t)sb.st_size, fp) : 0;
  fclose(fp);
  if (!buf) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", src->fn, src->path);
  buf[got] = '\0';
  *text = buf;
  *len = got;
  return MN_OK;
}

/* A shard is a plain file name next to the index: no folders, so that an index cannot point
 * anywhere else on the disk. */
static bool plain_file_name(const char *s) {
  return s && *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* The open file for shard `name`, opened on first use. */
static mn_status shard_file(source *src, const char *name, size_t *index) {
  for (size_t i = 0; i < src->num_files; i++)
    if (strcmp(src->shards[i], name) == 0) {
      *index = i;
      return MN_OK;
    }
  const char *slash = strrchr(src->path, '/');
  int dir_len = slash ? (int)(slash - src->path) + 1 : 0;
  size_t size = (size_t)dir_len + strlen(name) + 1;
  char *full = malloc(size);
  if (!full) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  snprintf(full, size, "%.*s%s", dir_len, src->path, name);
  mn_status st = mn_safetensors_open(full, &src->files[src->num_files]);
  free(full);
  if (st != MN_OK) {
    char inner[1024];
    snprintf(inner, sizeof inner, "%s", mn_last_error());
    return mn_fail(st, "%s: %s: shard \"%s\": %s", src->fn, src->path, name, inner);
  }
  src->shards[src->num_files] = name;
  *index = src->num_files++;
  return MN_OK;
}

static mn_status open_index(source *src) {
  char *text = NULL;
  size_t len = 0;
  mn_status st = read_text(src, &text, &len);
  if (st != MN_OK) return st;
  src->index = cJSON_ParseWithLength(text, len);
  free(text);
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(src->index, "weight_map");
  if (!cJSON_IsObject(map))
    return mn_fail(MN_ERR_FORMAT, "%s: %s: not a safetensors index (no \"weight_map\" object)",
                   src->fn, src->path);
  size_t n = (size_t)cJSON_GetArraySize(map);
  src->files = calloc(n ? n : 1, sizeof *src->files);
  src->shards = calloc(n ? n : 1, sizeof *src->shards);
  src->entries = calloc(n ? n : 1, sizeof *src->entries);
  if (!src->files || !src->shards || !src->entries)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  const cJSON *item;
  cJSON_ArrayForEach(item, map) {
    const char *shard = cJSON_GetStringValue(item);
    if (!plain_file_name(shard))
      return mn_fail(MN_ERR_FORMAT,
                     "%s: %s: weight_map entry \"%s\" is not a file name in the index's folder",
                     src->fn, src->path, item->string);
    size_t file = 0;
    if ((st = shard_file(src, shard, &file)) != MN_OK) return st;
    if (mn_safetensors_raw(src->files[file], item->string, NULL, NULL, NULL) != MN_OK)
      return mn_fail(MN_ERR_FORMAT,
                     "%s: %s: weight_map puts \"%s\" in %s, which has no such tensor", src->fn,
                     src->path, item->string, shard);
    src->entries[src->num_entries++] = (source_entry){item->string, file};
  }
  return MN_OK;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The index of the source's tensor names (src->names and src->by_name). */
static mn_status index_entries(source *src) {
  size_t n = src->num_entries;
  if (!(src->names = malloc((n ? n : 1) * sizeof *src->names)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  for (size_t i = 0; i < n; i++)
    src->names[i] = src->entries[i].name;
  if (!name_index_build(&src->by_name, src->names, n))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  return MN_OK;
}

static long find_entry(const source *src, const char *name) {
  return name_index_find(&src->by_name, name);
}

static bool convertible(const char *dtype) {
  return strcmp(dtype, "F32") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0 ||
         strcmp(dtype, "F64") == 0;
}

/* Matches every parameter with its tensor (entry[i], -1 when the source lacks it) and checks
 * dtype and shape; parameters the source lacks go to `missing`. */
static mn_status match(const source *src, const mn_io_param *params, size_t np, long *entry,
                       mn_io_name_list *missing, mn_io_name_list *missing_frozen) {
  for (size_t i = 0; i < np; i++) {
    const mn_io_param *p = &params[i];
    entry[i] = find_entry(src, p->name);
    if (entry[i] < 0) {
      mn_io_name_list_add(missing, p->name);
      if (p->frozen) mn_io_name_list_add(missing_frozen, p->name);
      continue;
    }
    const mn_safetensors *file = src->files[src->entries[entry[i]].file];
    mn_safetensors_info info;
    if (mn_safetensors_info_of(file, p->name, &info) != MN_OK)
      return mn_io_rewrap(MN_ERR_SHAPE, src->fn);
    if (!convertible(info.dtype))
      return mn_fail(MN_ERR_FORMAT,
                     "%s: %s: tensor \"%s\" is %s; parameters load from F32, F16, BF16 or F64",
                     src->fn, src->path, p->name, info.dtype);
    if (!mn_io_same_shape(p->type, info.rank, info.shape)) {
      char have[96], want[96];
      return mn_fail(MN_ERR_SHAPE, "%s: %s: tensor \"%s\" is %s in the file, the parameter is %s",
                     src->fn, src->path, p->name,
                     mn_io_shape_str(info.rank, info.shape, have, sizeof have),
                     mn_shape_str(p->type, want, sizeof want));
    }
  }
  return MN_OK;
}

/* Reads every matched tensor, as f32, and refuses the first one holding a NaN or infinity. */
static mn_status check_finite(const source *src, const mn_io_param *params, size_t np,
                              const long *entry, float *stage) {
  for (size_t i = 0; i < np; i++) {
    if (entry[i] < 0) continue;
    const mn_safetensors *file = src->files[src->entries[entry[i]].file];
    mn_status st = mn_safetensors_read_f32(file, params[i].name, stage, params[i].numel);
    if (st != MN_OK) return mn_io_rewrap(st, src->fn);
    for (size_t k = 0; k < params[i].numel; k++)
      if (!isfinite(stage[k]))
        return mn_fail(MN_ERR_FORMAT,
                       "%s: %s: tensor \"%s\" holds a non-finite value (%g at element %zu); "
                       "nothing was loaded (MN_LOAD_ALLOW_NONFINITE loads it anyway)",
                       src->fn, src->path, params[i].name, (double)stage[k], k);
  }
  return MN_OK;
}

static mn_status apply(const source *src, mn_session *s, const mn_io_param *params, size_t np,
                       const long *entry, float *stage) {
  for (size_t i = 0; i < np; i++) {
    if (entry[i] < 0) continue;
    const mn_safetensors *file = src->files[src->entries[entry[i]].file];
    mn_status st = mn_safetensors_read_f32(file, params[i].name, stage, params[i].numel);
    if (st == MN_OK) st = mn_io_param_write(s, &params[i], stage);
    if (st != MN_OK) return st;
  }
  return MN_OK;
}

/* The success message: what was skipped and what kept its value ("" when neither). */
static mn_status report(const source *src, const mn_io_param *params, size_t np,
                        mn_io_name_list *missing) {
  mn_io_name_list skipped = {0};
  const char **names = malloc((np ? np : 1) * sizeof *names);
  name_index param_names = {0};
  for (size_t i = 0; names && i < np; i++)
    names[i] = params[i].name;
  if (!names || !name_index_build(&param_names, names, np)) {
    free(names);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", src->fn);
  }
  for (size_t i = 0; i < src->num_entries; i++)
    if (name_index_find(&param_names, src->entries[i].name) < 0 &&
        find_entry(src, src->entries[i].name) == (long)i) /* a name listed twice counts once */
      mn_io_name_list_add(&skipped, src->entries[i].name);
  free(param_names.slots);
  free(names);
  return mn_io_load_report(src->fn, src->path, &skipped, missing);
}

static mn_status load(const char *fn, mn_session *s, const char *path, unsigned flags) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
  source src = {.fn = fn, .path = path};
  mn_io_param *params = NULL;
  size_t np = 0;
  long *entry = NULL;
  float *stage = NULL;
  mn_io_name_list missing = {0}, missing_frozen = {0};
  mn_status st = ends_with(path, ".json") ? open_index(&src) : open_single(&src);
  if (st == MN_OK) st = index_entries(&src);
  if (st == MN_OK) st = mn_io_params(fn, s, &params, &np);
  if (st == MN_OK && !(entry = malloc((np ? np : 1) * sizeof *entry)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  if (st == MN_OK) st = match(&src, params, np, entry, &missing, &missing_frozen);
  if (st == MN_OK) st = mn_io_refuse_missing(fn, path, flags, &missing, &missing_frozen);
  if (st == MN_OK && !(stage = malloc(mn_io_params_max_numel(params, np) * sizeof *stage)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", fn, path);
  if (st == MN_OK && !(flags & MN_LOAD_ALLOW_NONFINITE))
    st = check_finite(&src, params, np, entry, stage);
  if (st == MN_OK) st = apply(&src, s, params, np, entry, stage);
  if (st == MN_OK) st = report(&src, params, np, &missing);
  free(stage);
  free(entry);
  free(params);
  source_free(&src);
  return st;
}

mn_status mn_session_load_safetensors(mn_session *s, const char *path, bool strict) {
  return load("mn_session_load_safetensors", s, path, strict ? MN_LOAD_STRICT : 0);
}

mn_status mn_session_load_safetensors_flags(mn_session *s, const char *path, unsigned flags) {
  const char *fn = "mn_session_load_safetensors_flags";
  const unsigned known = MN_LOAD_STRICT | MN_LOAD_ALLOW_NONFINITE | MN_LOAD_STRICT_FROZEN;
  if (flags & ~known)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags & ~known);
  return load(fn, s, path, flags);
}

/* Writes params[pick[i]] under keys[i] (NULL: their names), i < n. */
static mn_status save_some(const char *fn, mn_session *s, const char *path,
                           const mn_io_param *params, const size_t *pick, const char *const *keys,
                           size_t n) {
  size_t floats = 0;
  for (size_t i = 0; i < n; i++)
    floats += params[pick[i]].numel;
  mn_st_tensor *tensors = calloc(n ? n : 1, sizeof *tensors);
  float *data = malloc((floats ? floats : 1) * sizeof *data);
  mn_status st = MN_OK;
  if (!tensors || !data)
    st =
        mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory staging %zu floats", fn, path, floats);
  float *dst = data;
  for (size_t i = 0; st == MN_OK && i < n; i++) {
    const mn_io_param *p = &params[pick[i]];
    st = mn_io_param_read(s, p, dst);
    tensors[i] = (mn_st_tensor){.name = keys ? keys[i] : p->name,
                                .dtype = "F32",
                                .rank = p->type->rank,
                                .data = dst,
                                .bytes = p->numel * sizeof(float)};
    memcpy(tensors[i].shape, p->type->shape, sizeof tensors[i].shape);
    dst += p->numel;
  }
  /* transformers refuses safetensors files without format "pt" in their metadata. */
  const mn_st_meta meta[] = {{"format", "pt"}};
  if (st == MN_OK && (st = mn_safetensors_write(path, tensors, n, meta, 1)) != MN_OK)
    st = mn_io_rewrap(st, fn);
  free(tensors);
  free(data);
  return st;
}

mn_status mn_session_save_safetensors(mn_session *s, const char *path) {
  const char *fn = "mn_session_save_safetensors";
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
  mn_io_param *params = NULL;
  size_t np = 0, *pick = NULL;
  mn_status st = mn_io_params(fn, s, &params, &np);
  if (st == MN_OK && !(pick = malloc((np ? np : 1) * sizeof *pick)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; st == MN_OK && i < np; i++)
    pick[i] = i;
  if (st == MN_OK) st = save_some(fn, s, path, params, pick, NULL, np);
  free(pick);
  free(params);
  return st;
}

mn_status mn_session_save_parameters(mn_session *s, const char *path, const char *const *names,
                                     const char *const *keys, size_t n) {
  const char *fn = "mn_session_save_parameters";
  if (!s || !path || (n && !names))
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                   !s      ? "session"
                   : !path ? "path"
                           : "names");
  mn_io_param *params = NULL;
  size_t np = 0, *pick = NULL;
  mn_status st = mn_io_params(fn, s, &params, &np);
  if (st == MN_OK && !(pick = malloc((n ? n : 1) * sizeof *pick)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t i = 0; st == MN_OK && i < n; i++) {
    long k = names[i] ? mn_io_param_index(params, np, names[i]) : -1;
    const char *key = keys ? keys[i] : names[i];
    if (k < 0)
      st = mn_fail(MN_ERR_NOT_FOUND, "%s: the session has no parameter \"%s\"", fn,
                   names[i] ? names[i] : "(NULL)");
    else if (!key || !key[0])
      st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: the key of \"%s\" is empty", fn, names[i]);
    for (size_t j = 0; st == MN_OK && j < i; j++)
      if (strcmp(keys ? keys[j] : names[j], key) == 0)
        st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: the key \"%s\" is given twice", fn, key);
    pick[i] = (size_t)k;
  }
  if (st == MN_OK) st = save_some(fn, s, path, params, pick, keys, n);
  free(pick);
  free(params);
  return st;
}
