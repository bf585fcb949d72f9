/* Training checkpoints as safetensors: every parameter under its own name (F32), the Adam
 * moments of every parameter that has a gradient ("optimizer.exp_avg.<name>",
 * "optimizer.exp_avg_sq.<name>"), and in __metadata__ the format, the optimizer settings and
 * the step counter, floats printed with %.9g so that they read back to the same bits.
 *
 * Loading checks the whole file against the session (metadata, every name, dtype and shape,
 * no tensor left over) before it writes anything, so a file that does not fit changes nothing.
 * mn_session_save_checkpoint_with adds the caller's own entries to __metadata__ (a training
 * program's sampler state, config and hyper-parameters); loading ignores keys it does not know,
 * so such files load like any other, and the caller reads its entries back with
 * mn_safetensors_metadata.
 * Statuses: MN_ERR_IO (cannot open), MN_ERR_FORMAT (not safetensors, not a checkpoint, bad
 * metadata, a dtype other than F32), MN_ERR_SHAPE (a tensor of another shape),
 * MN_ERR_NOT_FOUND (a parameter or moment missing from the file, or a tensor of the file that
 * the session has no place for). Loading restores the optimizer settings and the step counter
 * of training sessions; inference sessions take the parameters and ignore the optimizer part.
 * Moments are saved for Adam and AdamW only; loading an SGD checkpoint leaves the session's
 * moments (unused by SGD) as they were.
 *
 * Parameters are named as users named them: the sources of a parameter that the optimizer
 * concatenated (optimizer/siblings.h) are saved and loaded one by one, moments included, as
 * ranges of the derived tensors, so that optimized and unoptimized sessions of one graph read
 * each other's checkpoints.
 *
 * Reads go through the backend's read_buffer and read_optim_state, which wait for a step in
 * flight, as mn_session_read_param does. Saving goes through mn_safetensors_write, which
 * replaces the file atomically: after a crash the path holds the old checkpoint or the new
 * one, and a temp file of the interrupted save may be left beside it (nothing reads it). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/data_parallel.h"
#include "host/error.h"
#include "io/safetensors.h"
#include "session/session_params.h"

#define CK_FORMAT   "meganeura"
#define CK_VERSION  "1"
#define EXP_AVG     "optimizer.exp_avg."
#define EXP_AVG_SQ  "optimizer.exp_avg_sq."
#define FLOAT_CHARS 32

static const char *const kind_names[] = {[MN_OPTIM_NONE] = "none",
                                         [MN_OPTIM_SGD] = "sgd",
                                         [MN_OPTIM_ADAM] = "adam",
                                         [MN_OPTIM_ADAMW] = "adamw"};

static bool adam_family(mn_optimizer_kind k) { return k == MN_OPTIM_ADAM || k == MN_OPTIM_ADAMW; }

/* The optimizer fields in metadata order; the config is written and read through these. */
typedef struct float_field {
  const char *key;
  size_t offset;
  bool below1; /* betas: [0, 1); the others are >= 0 */
} float_field;

static const float_field float_fields[] = {
    {"lr", offsetof(mn_optimizer_config, lr), false},
    {"beta1", offsetof(mn_optimizer_config, beta1), true},
    {"beta2", offsetof(mn_optimizer_config, beta2), true},
    {"eps", offsetof(mn_optimizer_config, eps), false},
    {"weight_decay", offsetof(mn_optimizer_config, weight_decay), false},
    {"max_grad_norm", offsetof(mn_optimizer_config, max_grad_norm), false},
};
#define NUM_FLOAT_FIELDS (sizeof float_fields / sizeof float_fields[0])

static float *field_of(mn_optimizer_config *c, const float_field *f) {
  return (float *)((char *)c + f->offset);
}

/* ---------------------------------------------------------------- save */

typedef struct save_buffers {
  mn_st_tensor *tensors;
  float *data;
  char **names; /* the moment names we built */
  size_t num_names;
} save_buffers;

static void save_buffers_free(save_buffers *b) {
  for (size_t i = 0; i < b->num_names; i++)
    free(b->names[i]);
  free(b->names);
  free(b->tensors);
  free(b->data);
}

static char *join(const char *prefix, const char *name) {
  size_t n = strlen(prefix) + strlen(name) + 1;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s%s", prefix, name);
  return s;
}

static mn_st_tensor tensor_of(const char *name, const mn_io_param *p, const float *data) {
  mn_st_tensor t = {.name = name, .dtype = "F32", .rank = p->type->rank, .data = data};
  memcpy(t.shape, p->type->shape, sizeof t.shape);
  t.bytes = p->numel * sizeof(float);
  return t;
}

/* Reads every parameter (and moment) into one host block and describes them as tensors. */
static mn_status gather(const char *fn, mn_session *s, const mn_io_param *params, size_t np,
                        bool moments, save_buffers *b, size_t *num_tensors) {
  size_t floats = 0, count = np;
  for (size_t i = 0; i < np; i++) {
    floats += params[i].numel;
    if (moments && params[i].slot >= 0) {
      floats += 2 * params[i].numel;
      count += 2;
    }
  }
  b->tensors = calloc(count ? count : 1, sizeof *b->tensors);
  b->data = malloc((floats ? floats : 1) * sizeof(float));
  b->names = calloc(count ? count : 1, sizeof *b->names);
  if (!b->tensors || !b->data || !b->names)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory staging %zu floats", fn, floats);
  float *dst = b->data;
  size_t k = 0;
  for (size_t i = 0; i < np; i++) {
    const mn_io_param *p = &params[i];
    mn_status st = mn_io_param_read(s, p, dst);
    if (st != MN_OK) return st;
    b->tensors[k++] = tensor_of(p->name, p, dst);
    dst += p->numel;
    if (!moments || p->slot < 0) continue;
    for (int which = 0; which < 2; which++) {
      char *name = join(which ? EXP_AVG_SQ : EXP_AVG, p->name);
      if (!name) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
      b->names[b->num_names++] = name;
      st = mn_io_moment_read(s, p, which, dst);
      if (st != MN_OK) return st;
      b->tensors[k++] = tensor_of(name, p, dst);
      dst += p->numel;
    }
  }
  *num_tensors = k;
  return MN_OK;
}

/* The keys the library writes; callers' entries may not reuse them. */
static bool library_key(const char *key) {
  static const char *const own[] = {
      "checkpoint_format", "checkpoint_version", "library_version", "optimizer", "step",
      "micro_step",        "loss_scaler"};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (strcmp(key, own[i]) == 0) return true;
  for (size_t i = 0; i < NUM_FLOAT_FIELDS; i++)
    if (strcmp(key, float_fields[i].key) == 0) return true;
  return false;
}

static mn_status check_entries(const char *fn, const mn_checkpoint_entry *extra, size_t n) {
  if (n && !extra)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: extra is NULL with %zu entries", fn, n);
  for (size_t i = 0; i < n; i++) {
    const char *key = extra[i].key;
    if (!key || !*key) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: entry %zu has no key", fn, i);
    if (!extra[i].value)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: entry \"%.64s\" has a NULL value", fn, key);
    if (library_key(key))
      return mn_fail(MN_ERR_INVALID_ARGUMENT,
                     "%s: entry \"%.64s\" is a key the library writes itself", fn, key);
    for (size_t j = 0; j < i; j++)
      if (strcmp(extra[j].key, key) == 0)
        return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: entry \"%.64s\" is given twice", fn, key);
  }
  return MN_OK;
}

/* Every rank of a group returns once rank 0 has written the file, with rank 0's outcome (a
 * rank's own failure first). */
static mn_status group_outcome(const char *fn, mn_session *s, mn_status mine) {
  struct {
    int status;
    char error[500];
  } root = {.status = (int)mine};
  if (mine != MN_OK) snprintf(root.error, sizeof root.error, "%s", mn_last_error());
  mn_status st = mn_broadcast_host(s->dp->group, s->dp->rank, &root, sizeof root, 0);
  if (st != MN_OK || mine != MN_OK) return st != MN_OK ? st : mine;
  if (root.status == MN_OK) return MN_OK;
  return mn_fail((mn_status)root.status, "%s: rank 0 could not write the checkpoint: %s", fn,
                 root.error);
}

static mn_status save(const char *fn, mn_session *s, const char *path,
                      const mn_checkpoint_entry *extra, size_t n_extra) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
  mn_status st = check_entries(fn, extra, n_extra);
  if (st != MN_OK) return st;
  mn_optimizer_config c = s->optim;
  if ((unsigned)c.kind > MN_OPTIM_ADAMW) c.kind = MN_OPTIM_NONE;
  /* Inference sessions have no optimizer state worth restoring. */
  if (!s->training) c = (mn_optimizer_config){.kind = MN_OPTIM_NONE};
  bool moments = s->training && adam_family(c.kind);

  enum { OWN = 5 + NUM_FLOAT_FIELDS };
  /* F16 training: the loss scaler, so that a resumed run skips the steps the first one would. */
  bool scaler = s->training && s->plan->loss_scale != MN_NO_NODE;
  /* Training: the micro-step counter, so that a resumed run draws the dropout masks the
   * uninterrupted one would. */
  size_t own = OWN + (s->training ? 1 : 0) + (scaler ? 1 : 0);
  mn_st_meta *meta = malloc((own + n_extra) * sizeof *meta);
  if (!meta) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  mn_io_param *params = NULL;
  size_t np = 0, nt = 0;
  save_buffers b = {0};
  st = mn_io_params(fn, s, &params, &np);
  /* A group's checkpoint is rank 0's: the others only take part in gathering ZeRO-1 shards. */
  bool writes = !s->dp || s->dp->rank == 0;
  if (st == MN_OK && (writes || s->dp->zero1)) st = gather(fn, s, params, np, moments, &b, &nt);

  char values[NUM_FLOAT_FIELDS][FLOAT_CHARS], step[32];
  meta[0] = (mn_st_meta){"checkpoint_format", CK_FORMAT};
  meta[1] = (mn_st_meta){"checkpoint_version", CK_VERSION};
  meta[2] = (mn_st_meta){"library_version", mn_version()};
  meta[3] = (mn_st_meta){"optimizer", kind_names[c.kind]};
  meta[4] = (mn_st_meta){"step", step};
  snprintf(step, sizeof step, "%llu", (unsigned long long)(s->training ? s->step_count : 0));
  for (size_t i = 0; i < NUM_FLOAT_FIELDS; i++) {
    snprintf(values[i], sizeof values[i], "%.9g", (double)*field_of(&c, &float_fields[i]));
    meta[5 + i] = (mn_st_meta){float_fields[i].key, values[i]};
  }
  char scaler_value[64], micro_step[32];
  size_t m = OWN;
  if (s->training) {
    snprintf(micro_step, sizeof micro_step, "%llu", (unsigned long long)s->micro_steps);
    meta[m++] = (mn_st_meta){"micro_step", micro_step};
  }
  if (scaler) {
    snprintf(scaler_value, sizeof scaler_value, "%.9g %u %llu", (double)s->scaler.scale,
             s->scaler.good_steps, (unsigned long long)s->scaler.skipped);
    meta[m++] = (mn_st_meta){"loss_scaler", scaler_value};
  }
  for (size_t i = 0; i < n_extra; i++)
    meta[own + i] = (mn_st_meta){extra[i].key, extra[i].value};
  if (st == MN_OK && writes) {
    st = mn_safetensors_write(path, b.tensors, nt, meta, own + n_extra);
    if (st != MN_OK) st = mn_io_rewrap(st, fn);
  }
  save_buffers_free(&b);
  free(params);
  free(meta);
  return s->dp ? group_outcome(fn, s, st) : st;
}

mn_status mn_session_save_checkpoint(mn_session *s, const char *path) {
  return save("mn_session_save_checkpoint", s, path, NULL, 0);
}

mn_status mn_session_save_checkpoint_with(mn_session *s, const char *path,
                                          const mn_checkpoint_entry *extra, size_t n_extra) {
  return save("mn_session_save_checkpoint_with", s, path, extra, n_extra);
}

/* ---------------------------------------------------------------- load */

typedef struct ck_file {
  const char *fn, *path;
  mn_safetensors *st;
  mn_optimizer_config optim;
  unsigned long long step;
  bool has_micro_step; /* "micro_step": the session's micro-step counter (training) */
  unsigned long long micro_step;
  bool has_scaler; /* "loss_scaler": scale, good steps, skipped steps (F16 training) */
  mn_loss_scaler scaler;
} ck_file;

static mn_status bad_meta(const ck_file *f, const char *key, const char *value, const char *want) {
  if (!value)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: metadata \"%s\" is missing", f->fn, f->path, key);
  return mn_fail(MN_ERR_FORMAT, "%s: %s: metadata \"%s\" is \"%.64s\", expected %s", f->fn, f->path,
                 key, value, want);
}

static mn_status read_metadata(ck_file *f) {
  const char *format = mn_safetensors_metadata(f->st, "checkpoint_format");
  if (!format || strcmp(format, CK_FORMAT) != 0)
    return mn_fail(MN_ERR_FORMAT,
                   "%s: %s: not a meganeura checkpoint (no \"checkpoint_format\": \"" CK_FORMAT
                   "\" in its metadata)",
                   f->fn, f->path);
  const char *version = mn_safetensors_metadata(f->st, "checkpoint_version");
  if (!version || strcmp(version, CK_VERSION) != 0)
    return bad_meta(f, "checkpoint_version", version, "\"" CK_VERSION "\"");
  const char *kind = mn_safetensors_metadata(f->st, "optimizer");
  bool known = false;
  for (size_t k = 0; kind && k < sizeof kind_names / sizeof kind_names[0]; k++)
    if (strcmp(kind, kind_names[k]) == 0) {
      f->optim.kind = (mn_optimizer_kind)k;
      known = true;
    }
  if (!known) return bad_meta(f, "optimizer", kind, "none, sgd, adam or adamw");
  for (size_t i = 0; i < NUM_FLOAT_FIELDS; i++) {
    const float_field *fl = &float_fields[i];
    const char *v = mn_safetensors_metadata(f->st, fl->key);
    char *end = NULL;
    errno = 0;
    float x = v ? strtof(v, &end) : NAN;
    if (!v || end == v || *end || !isfinite(x) || x < 0 || (fl->below1 && x >= 1.0f))
      return bad_meta(f, fl->key, v, fl->below1 ? "a number in [0, 1)" : "a number >= 0");
    *field_of(&f->optim, fl) = x;
  }
  const char *step = mn_safetensors_metadata(f->st, "step");
  char *end = NULL;
  errno = 0;
  if (step && step[0] >= '0' && step[0] <= '9') f->step = strtoull(step, &end, 10);
  if (!step || !end || *end || errno == ERANGE)
    return bad_meta(f, "step", step, "a non-negative integer");
  const char *micro = mn_safetensors_metadata(f->st, "micro_step");
  if (micro) {
    end = NULL;
    errno = 0;
    if (micro[0] >= '0' && micro[0] <= '9') f->micro_step = strtoull(micro, &end, 10);
    if (!end || *end || errno == ERANGE)
      return bad_meta(f, "micro_step", micro, "a non-negative integer");
    f->has_micro_step = true;
  }
  const char *scaler = mn_safetensors_metadata(f->st, "loss_scaler");
  if (scaler) {
    float scale;
    unsigned good;
    unsigned long long skipped;
    int used = 0;
    if (sscanf(scaler, "%f %u %llu%n", &scale, &good, &skipped, &used) != 3 ||
        scaler[used] != '\0' || !isfinite(scale) || !(scale > 0) || good >= MN_LOSS_SCALE_INTERVAL)
      return bad_meta(f, "loss_scaler", scaler, "\"SCALE GOOD_STEPS SKIPPED\"");
    f->has_scaler = true;
    f->scaler = (mn_loss_scaler){.scale = scale, .good_steps = good, .skipped = skipped};
  }
  return MN_OK;
}

/* One tensor of the file that must hold param's values: present, F32, the parameter's shape. */
static mn_status check_tensor(const ck_file *f, const char *name, const mn_io_param *p) {
  mn_safetensors_info info;
  if (mn_safetensors_raw(f->st, name, NULL, NULL, NULL) != MN_OK)
    return mn_fail(MN_ERR_NOT_FOUND, "%s: %s: no tensor \"%s\" for parameter \"%s\"", f->fn,
                   f->path, name, p->name);
  /* Only a rank above MN_MAX_RANK fails here, which no parameter has. */
  if (mn_safetensors_info_of(f->st, name, &info) != MN_OK) return mn_io_rewrap(MN_ERR_SHAPE, f->fn);
  if (strcmp(info.dtype, "F32") != 0)
    return mn_fail(MN_ERR_FORMAT, "%s: %s: tensor \"%s\" is %s, checkpoints hold F32", f->fn,
                   f->path, name, info.dtype);
  if (!mn_io_same_shape(p->type, info.rank, info.shape)) {
    char have[96], want[96];
    return mn_fail(MN_ERR_SHAPE, "%s: %s: tensor \"%s\" is %s in the file, the parameter is %s",
                   f->fn, f->path, name, mn_io_shape_str(info.rank, info.shape, have, sizeof have),
                   mn_shape_str(p->type, want, sizeof want));
  }
  return MN_OK;
}

/* A moment tensor name ("optimizer.exp_avg.<param>") and the parameter it belongs to. */
static const char *moment_param(const char *name) {
  if (strncmp(name, EXP_AVG_SQ, strlen(EXP_AVG_SQ)) == 0) return name + strlen(EXP_AVG_SQ);
  if (strncmp(name, EXP_AVG, strlen(EXP_AVG)) == 0) return name + strlen(EXP_AVG);
  return NULL;
}

/* Every tensor of the file must be restored by this session: a leftover means the checkpoint
 * belongs to another model (or another optimizer). */
static mn_status check_no_extra(const ck_file *f, const mn_io_param *params, size_t np,
                                bool moments, bool training) {
  for (size_t i = 0, n = mn_safetensors_count(f->st); i < n; i++) {
    const char *name = mn_safetensors_name(f->st, i);
    if (mn_io_param_index(params, np, name) >= 0) continue;
    const char *owner = moment_param(name);
    long k = owner ? mn_io_param_index(params, np, owner) : -1;
    /* Inference sessions take the parameters of a training checkpoint and ignore the rest. */
    if (owner && !training) continue;
    if (k >= 0 && moments && params[k].slot >= 0) continue;
    return mn_fail(MN_ERR_NOT_FOUND, "%s: %s: tensor \"%s\" is not %s of this session", f->fn,
                   f->path, name, owner ? "the optimizer state of a parameter" : "a parameter");
  }
  return MN_OK;
}

static mn_status validate(ck_file *f, const mn_io_param *params, size_t np, bool training) {
  mn_status st = read_metadata(f);
  bool moments = training && adam_family(f->optim.kind);
  char name[1024];
  for (size_t i = 0; st == MN_OK && i < np; i++) {
    st = check_tensor(f, params[i].name, &params[i]);
    if (st != MN_OK || !moments || params[i].slot < 0) continue;
    for (int which = 0; st == MN_OK && which < 2; which++) {
      int w = snprintf(name, sizeof name, "%s%s", which ? EXP_AVG_SQ : EXP_AVG, params[i].name);
      if (w < 0 || (size_t)w >= sizeof name)
        st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: parameter name \"%.64s...\" is too long", f->fn,
                     params[i].name);
      else
        st = check_tensor(f, name, &params[i]);
    }
  }
  if (st == MN_OK) st = check_no_extra(f, params, np, moments, training);
  return st;
}

/* After validation nothing here can fail on the file's account, only on the backend's. */
static mn_status apply(ck_file *f, mn_session *s, const mn_io_param *params, size_t np,
                       float *stage) {
  bool moments = s->training && adam_family(f->optim.kind);
  char name[1024];
  for (size_t i = 0; i < np; i++) {
    const mn_io_param *p = &params[i];
    const void *data = NULL;
    mn_status st = mn_safetensors_raw(f->st, p->name, &data, NULL, NULL);
    if (st != MN_OK) return st;
    /* Tensor data need not be aligned in the file; stage it so it is a float array. */
    memcpy(stage, data, p->numel * sizeof(float));
    if ((st = mn_io_param_write(s, p, stage)) != MN_OK) return st;
    for (int which = 0; moments && p->slot >= 0 && which < 2; which++) {
      snprintf(name, sizeof name, "%s%s", which ? EXP_AVG_SQ : EXP_AVG, p->name);
      if ((st = mn_safetensors_raw(f->st, name, &data, NULL, NULL)) != MN_OK) return st;
      memcpy(stage, data, p->numel * sizeof(float));
      st = mn_io_moment_write(s, p, which, stage);
      if (st != MN_OK) return st;
    }
  }
  if (s->training) {
    s->optim = f->optim;
    s->step_count = f->step;
    /* A checkpoint without the counter (written before it was kept) continues from the steps
     * that its optimizer steps took under this session's accumulation. */
    s->micro_steps = f->has_micro_step
                         ? f->micro_step
                         : f->step * (unsigned long long)(s->grad_accum > 1 ? s->grad_accum : 1);
    /* A partial gradient sum of this session's past is not the checkpoint's: start a round. */
    s->accum_index = 0;
    if (f->has_scaler && s->plan->loss_scale != MN_NO_NODE) s->scaler = f->scaler;
  }
  return MN_OK;
}

mn_status mn_session_load_checkpoint(mn_session *s, const char *path) {
  const char *fn = "mn_session_load_checkpoint";
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!path) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
  ck_file f = {.fn = fn, .path = path};
  mn_status st = mn_safetensors_open(path, &f.st);
  if (st != MN_OK) return mn_io_rewrap(st, fn);
  mn_io_param *params = NULL;
  size_t np = 0;
  float *stage = NULL;
  st = mn_io_params(fn, s, &params, &np);
  if (st == MN_OK) st = validate(&f, params, np, s->training);
  if (st == MN_OK && !(stage = malloc(mn_io_params_max_numel(params, np) * sizeof *stage)))
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", fn, path);
  if (st == MN_OK) st = apply(&f, s, params, np, stage);
  free(stage);
  free(params);
  mn_safetensors_close(f.st);
  return st;
}
