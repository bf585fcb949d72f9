/* mn_session_load_gguf: parameters from a llama.cpp GGUF file, under transformers' names and
 * layouts (io/gguf_names.c maps them and undoes the converter's permutation and transposes),
 * converted to f32 from F32, F16, BF16, Q8_0, Q4_0 or Q4_1. The same contract as
 * mn_session_load_safetensors_flags: every parameter's tensor is checked (presence when
 * strict, type, shape, finiteness) before any is written, so a file that does not fit changes
 * nothing, and on success mn_last_error() names what was skipped and what kept its value.
 * A session built without the base prefix ("model.", "transformer.") matches too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "io/gguf.h"
#include "session/session_params.h"

#define FN "mn_session_load_gguf"

typedef struct entry {
  const mn_gguf_tensor *t;
  mn_gguf_hf hf;
  bool used;
} entry;

typedef struct source {
  const char *path;
  mn_gguf *g;
  mn_gguf_arch arch;
  entry *entries; /* the tensors with a transformers name, sorted by it */
  size_t n;
  mn_io_name_list unknown; /* tensors without one */
} source;

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const entry *)a)->hf.name, ((const entry *)b)->hf.name);
}

static entry *find(const source *src, const char *name) {
  size_t lo = 0, hi = src->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(name, src->entries[mid].hf.name);
    if (c == 0) return &src->entries[mid];
    if (c < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

/* The tensor of a parameter: by its name, else by the base prefix and its name. */
static entry *find_param(const source *src, const char *name) {
  entry *e = find(src, name);
  if (e) return e;
  char full[256];
  snprintf(full, sizeof full, "%s%s", src->arch == MN_GGUF_ARCH_LLAMA ? "model." : "transformer.",
           name);
  return find(src, full);
}

static mn_status open_source(source *src) {
  mn_status st = mn_gguf_open(src->path, &src->g);
  if (st != MN_OK) return mn_io_rewrap(st, FN);
  if ((st = mn_gguf_arch_of(FN, src->g, &src->arch)) != MN_OK) return st;
  size_t nt = mn_gguf_tensor_count(src->g);
  if (!(src->entries = calloc(nt ? nt : 1, sizeof *src->entries)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", FN);
  for (size_t i = 0; i < nt; i++) {
    entry *e = &src->entries[src->n];
    bool known = false;
    e->t = mn_gguf_tensor_at(src->g, i);
    if ((st = mn_gguf_hf_tensor(FN, src->g, src->arch, e->t, &e->hf, &known)) != MN_OK) return st;
    if (known)
      src->n++;
    else
      mn_io_name_list_add(&src->unknown, e->t->name);
  }
  qsort(src->entries, src->n, sizeof *src->entries, cmp_entry);
  return MN_OK;
}

/* Matches every parameter with its tensor (NULL when the file lacks it), checking type and
 * shape; parameters the file lacks go to `missing`. */
static mn_status match(source *src, const mn_io_param *params, size_t np, entry **of,
                       mn_io_name_list *missing, mn_io_name_list *missing_frozen) {
  for (size_t i = 0; i < np; i++) {
    const mn_io_param *p = &params[i];
    entry *e = of[i] = find_param(src, p->name);
    if (!e) {
      mn_io_name_list_add(missing, p->name);
      if (p->frozen) mn_io_name_list_add(missing_frozen, p->name);
      continue;
    }
    e->used = true;
    mn_status st = mn_gguf_check_convertible(src->g, e->t);
    if (st != MN_OK) return mn_io_rewrap(st, FN);
    if (!mn_io_same_shape(p->type, e->hf.rank, e->hf.shape)) {
      char have[96], want[96];
      return mn_fail(MN_ERR_SHAPE,
                     "%s: %s: tensor \"%s\" (\"%s\") is %s in transformers' layout, the "
                     "parameter is %s",
                     FN, src->path, e->t->name, p->name,
                     mn_io_shape_str(e->hf.rank, e->hf.shape, have, sizeof have),
                     mn_shape_str(p->type, want, sizeof want));
    }
  }
  return MN_OK;
}

static mn_status read_param(const source *src, const entry *e, const mn_io_param *p, float *stage) {
  mn_status st = mn_gguf_read_hf_f32(src->g, e->t, &e->hf, stage, p->numel);
  return st == MN_OK ? MN_OK : mn_io_rewrap(st, FN);
}

static mn_status check_finite(const source *src, const mn_io_param *params, size_t np,
                              entry *const *of, float *stage) {
  for (size_t i = 0; i < np; i++) {
    if (!of[i]) continue;
    mn_status st = read_param(src, of[i], &params[i], stage);
    if (st != MN_OK) return st;
    for (size_t k = 0; k < params[i].numel; k++)
      if (!isfinite(stage[k]))
        return mn_fail(MN_ERR_FORMAT,
                       "%s: %s: tensor \"%s\" holds a non-finite value (%g at element %zu); "
                       "nothing was loaded (MN_LOAD_ALLOW_NONFINITE loads it anyway)",
                       FN, src->path, of[i]->t->name, (double)stage[k], k);
  }
  return MN_OK;
}

/* The success message: what was skipped and what kept its value ("" when neither). */
static mn_status report(source *src, mn_io_name_list *missing) {
  mn_io_name_list skipped = src->unknown;
  for (size_t i = 0; i < src->n; i++)
    if (!src->entries[i].used) mn_io_name_list_add(&skipped, src->entries[i].t->name);
  return mn_io_load_report(FN, src->path, &skipped, missing);
}

mn_status mn_session_load_gguf(mn_session *s, const char *path, unsigned flags) {
  const unsigned known = MN_LOAD_STRICT | MN_LOAD_ALLOW_NONFINITE | MN_LOAD_STRICT_FROZEN;
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", FN);
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path is NULL", FN);
  if (flags & ~known)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", FN, flags & ~known);
  source src = {.path = path};
  mn_io_param *params = NULL;
  size_t np = 0;
  entry **of = NULL;
  float *stage = NULL;
  mn_io_name_list missing = {0}, missing_frozen = {0};
  mn_status st = open_source(&src);
  if (st == MN_OK) st = mn_io_params(FN, s, &params, &np);
  if (st == MN_OK && !(of = calloc(np ? np : 1, sizeof *of)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", FN);
  if (st == MN_OK) st = match(&src, params, np, of, &missing, &missing_frozen);
  if (st == MN_OK) st = mn_io_refuse_missing(FN, path, flags, &missing, &missing_frozen);
  if (st == MN_OK && !(stage = malloc(mn_io_params_max_numel(params, np) * sizeof *stage)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", FN, path);
  if (st == MN_OK && !(flags & MN_LOAD_ALLOW_NONFINITE))
    st = check_finite(&src, params, np, of, stage);
  for (size_t i = 0; st == MN_OK && i < np; i++)
    if (of[i] && (st = read_param(&src, of[i], &params[i], stage)) == MN_OK)
      st = mn_io_param_write(s, &params[i], stage);
  if (st == MN_OK) st = report(&src, &missing);
  free(stage);
  free(of);
  free(params);
  free(src.entries);
  mn_gguf_close(src.g);
  return st;
}
