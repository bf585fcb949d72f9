/* meganeura train's side of checkpoints: the train.* metadata that makes --resume
 * self-contained and faithful (the step, the sampler state, the model config, the identity of
 * the data and the tokenizer, the options that shape the trajectory), reading it back, and
 * cutting the metrics CSV back to the resume step. */
#include "tools/cli_train.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* How --resume treats a recorded option: a default for an option not given, or a value the
 * given option must equal because it shapes the trajectory (the batches drawn, the updates). */
typedef enum rule { DEFAULT_ONLY, SAME_NUMBER, SAME_TEXT } rule;
typedef enum field_type { PATH, LONG, FLOAT } field_type;

typedef struct recorded_option {
  const char *option, *key;
  rule rule;
  field_type type;
  size_t offset;      /* in train_args */
  bool zero_is_unset; /* 0 means the option was not given (and is not recorded) */
} recorded_option;

#define ARG(f) offsetof(train_args, f)
static const recorded_option recorded[] = {
    {"--data", "train.data", DEFAULT_ONLY, PATH, ARG(data), false},
    {"--data-format", "train.data_format", SAME_TEXT, PATH, ARG(format), false},
    {"--tokenizer", "train.tokenizer", DEFAULT_ONLY, PATH, ARG(tokenizer), false},
    {"--val-data", "train.val_data", DEFAULT_ONLY, PATH, ARG(val_data), false},
    {"--val-fraction", "train.val_fraction", SAME_NUMBER, FLOAT, ARG(val_fraction), true},
    {"--eval-every", "train.eval_every", DEFAULT_ONLY, LONG, ARG(eval_every), true},
    {"--eval-batches", "train.eval_batches", DEFAULT_ONLY, LONG, ARG(eval_batches), true},
    {"--batch", "train.batch", SAME_NUMBER, LONG, ARG(batch), false},
    {"--seq", "train.seq", SAME_NUMBER, LONG, ARG(seq), false},
    {"--steps", "train.steps", DEFAULT_ONLY, LONG, ARG(steps), false},
    {"--lr", "train.lr", SAME_NUMBER, FLOAT, ARG(lr), false},
    {"--warmup", "train.warmup", SAME_NUMBER, LONG, ARG(warmup), false},
    {"--weight-decay", "train.weight_decay", SAME_NUMBER, FLOAT, ARG(wd), false},
    {"--grad-clip", "train.grad_clip", SAME_NUMBER, FLOAT, ARG(clip), true},
    {"--seed", "train.seed", SAME_NUMBER, LONG, ARG(seed), false},
    {"--checkpoint-every", "train.checkpoint_every", DEFAULT_ONLY, LONG, ARG(ck_every), true},
    {"--keep-last", "train.keep_last", DEFAULT_ONLY, LONG, ARG(keep_last), true},
    {"--out", "train.out", DEFAULT_ONLY, PATH, ARG(out), false},
    {"--metrics", "train.metrics", DEFAULT_ONLY, PATH, ARG(metrics), false},
    {"--plot", "train.plot", DEFAULT_ONLY, PATH, ARG(plot), false},
    {"--precision", "train.precision", SAME_TEXT, PATH, ARG(precision), false},
    {"--grad-accum", "train.grad_accum", SAME_NUMBER, LONG, ARG(grad_accum), false},
    {"--freeze", "train.freeze", SAME_TEXT, PATH, ARG(freeze), false},
    {"--lora-rank", "train.lora_rank", SAME_NUMBER, LONG, ARG(lora_rank), true},
    {"--lora-alpha", "train.lora_alpha", SAME_NUMBER, FLOAT, ARG(lora_alpha), true},
    {"--lora-dropout", "train.lora_dropout", SAME_NUMBER, FLOAT, ARG(lora_dropout), true},
    {"--lora-targets", "train.lora_targets", SAME_TEXT, PATH, ARG(lora_targets), false},
    {"--chat-template", "train.chat_template", SAME_TEXT, PATH, ARG(chat_template), false},
    {"--pack", "train.pack", SAME_NUMBER, LONG, ARG(pack), true},
};
#define NUM_RECORDED (sizeof recorded / sizeof recorded[0])

/* The model config field by field, under the names of mn_model_config. */
typedef enum cfg_type { CFG_FAMILY, CFG_INT, CFG_FLOAT, CFG_BOOL } cfg_type;
typedef struct cfg_field {
  const char *name;
  cfg_type type;
  size_t offset;
} cfg_field;
#define CFG(f) offsetof(mn_model_config, f)
static const cfg_field cfg_fields[] = {
    {"family", CFG_FAMILY, CFG(family)},
    {"vocab_size", CFG_INT, CFG(vocab_size)},
    {"hidden_size", CFG_INT, CFG(hidden_size)},
    {"num_layers", CFG_INT, CFG(num_layers)},
    {"num_heads", CFG_INT, CFG(num_heads)},
    {"num_kv_heads", CFG_INT, CFG(num_kv_heads)},
    {"head_dim", CFG_INT, CFG(head_dim)},
    {"intermediate_size", CFG_INT, CFG(intermediate_size)},
    {"max_positions", CFG_INT, CFG(max_positions)},
    {"norm_eps", CFG_FLOAT, CFG(norm_eps)},
    {"rope_theta", CFG_FLOAT, CFG(rope_theta)},
    {"initializer_range", CFG_FLOAT, CFG(initializer_range)},
    {"tie_word_embeddings", CFG_BOOL, CFG(tie_word_embeddings)},
};
#define NUM_CFG    (sizeof cfg_fields / sizeof cfg_fields[0])
#define CFG_PREFIX "train.config."

enum { VALUE_CHARS = 48 };

uint64_t cli_fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

const char *cli_resume_key(const char *option) {
  for (size_t i = 0; i < NUM_RECORDED; i++)
    if (strcmp(recorded[i].option, option) == 0) return recorded[i].key;
  return NULL;
}

static void format_cfg(const mn_model_config *c, const cfg_field *f, char *buf) {
  const char *p = (const char *)c + f->offset;
  switch (f->type) {
  case CFG_FAMILY: snprintf(buf, VALUE_CHARS, "%d", (int)*(const mn_model_family *)p); break;
  case CFG_INT: snprintf(buf, VALUE_CHARS, "%" PRId64, *(const int64_t *)p); break;
  case CFG_FLOAT: snprintf(buf, VALUE_CHARS, "%.9g", (double)*(const float *)p); break;
  case CFG_BOOL: snprintf(buf, VALUE_CHARS, "%d", *(const bool *)p ? 1 : 0); break;
  }
}

/* The option's value in a, or NULL when it is unset. */
static const char *format_option(const train_args *a, const recorded_option *r, char *buf) {
  const char *p = (const char *)a + r->offset;
  switch (r->type) {
  case PATH: return *(const char *const *)p;
  case LONG: {
    long v = *(const long *)p;
    if (r->zero_is_unset && v == 0) return NULL;
    snprintf(buf, VALUE_CHARS, "%ld", v);
    return buf;
  }
  case FLOAT: {
    float v = *(const float *)p;
    if (r->zero_is_unset && v == 0) return NULL;
    snprintf(buf, VALUE_CHARS, "%.9g", (double)v);
    return buf;
  }
  }
  return NULL;
}

int cli_save_checkpoint(const char *cmd, mn_session *s, const char *path, const ckpt_record *rec,
                        long step, uint64_t sampler_rng) {
  enum { FIXED = 5, MAX = FIXED + NUM_CFG + NUM_RECORDED };
  char values[MAX][VALUE_CHARS];
  char cfg_keys[NUM_CFG][64];
  mn_checkpoint_entry e[MAX];
  size_t n = 0;
  snprintf(values[n], VALUE_CHARS, "%ld", step);
  e[n] = (mn_checkpoint_entry){"train.step", values[n]}, n++;
  snprintf(values[n], VALUE_CHARS, "%016" PRIx64, sampler_rng);
  e[n] = (mn_checkpoint_entry){"train.sampler_rng", values[n]}, n++;
  snprintf(values[n], VALUE_CHARS, "%016" PRIx64, rec->data_hash);
  e[n] = (mn_checkpoint_entry){"train.data_fnv1a64", values[n]}, n++;
  snprintf(values[n], VALUE_CHARS, "%016" PRIx64, rec->tokenizer_hash);
  e[n] = (mn_checkpoint_entry){"train.tokenizer_fnv1a64", values[n]}, n++;
  e[n++] = (mn_checkpoint_entry){"train.name_prefix", rec->name_prefix};
  for (size_t i = 0; i < NUM_CFG; i++) {
    snprintf(cfg_keys[i], sizeof cfg_keys[i], CFG_PREFIX "%s", cfg_fields[i].name);
    format_cfg(rec->cfg, &cfg_fields[i], values[n]);
    e[n] = (mn_checkpoint_entry){cfg_keys[i], values[n]}, n++;
  }
  for (size_t i = 0; i < NUM_RECORDED; i++) {
    const char *v = format_option(rec->a, &recorded[i], values[n]);
    if (v) e[n] = (mn_checkpoint_entry){recorded[i].key, v}, n++;
  }
  if (mn_session_save_checkpoint_with(s, path, e, n) != MN_OK)
    return cli_lib_fail(cmd, "cannot save checkpoint");
  return CLI_OK;
}

/* ---------------------------------------------------------------- reading */

static bool parse_u64(const char *s, int base, uint64_t *out) {
  if (!s || !*s) return false;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, base);
  if (errno || *end) return false;
  *out = v;
  return true;
}

static int bad_entry(const char *cmd, const char *path, const char *key, const char *v) {
  fprintf(stderr, "%s: '%s': checkpoint metadata \"%s\" is %s%.64s%s\n", cmd, path, key,
          v ? "\"" : "", v ? v : "missing", v ? "\"" : "");
  return CLI_FAIL;
}

static int read_config(const char *cmd, const char *path, const mn_safetensors *st,
                       mn_model_config *c) {
  char key[64];
  for (size_t i = 0; i < NUM_CFG; i++) {
    const cfg_field *f = &cfg_fields[i];
    snprintf(key, sizeof key, CFG_PREFIX "%s", f->name);
    const char *v = mn_safetensors_metadata(st, key);
    char *end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || errno) return bad_entry(cmd, path, key, v);
    char *p = (char *)c + f->offset;
    switch (f->type) {
    case CFG_FAMILY: *(mn_model_family *)p = (mn_model_family)(int)x; break;
    case CFG_INT: *(int64_t *)p = (int64_t)x; break;
    case CFG_FLOAT: *(float *)p = (float)x; break;
    case CFG_BOOL: *(bool *)p = x != 0; break;
    }
  }
  return CLI_OK;
}

/* Old checkpoints kept the step in a side file; still read, with a deprecation notice. */
static long read_step_file(const char *cmd, const char *ckpt) {
  char path[4200];
  snprintf(path, sizeof path, "%s.step", ckpt);
  FILE *f = fopen(path, "r");
  long step = -1;
  if (!f) return -1;
  if (fscanf(f, "%ld", &step) != 1) step = -1;
  fclose(f);
  if (step >= 0)
    fprintf(stderr,
            "%s: warning: reading the step from '%s', which is deprecated: checkpoints now "
            "record it themselves\n",
            cmd, path);
  return step;
}

static bool same_number(const recorded_option *r, const char *a, const char *b) {
  double x = strtod(a, NULL), y = strtod(b, NULL);
  return r->type == FLOAT ? (float)x == (float)y : x == y;
}

/* A checkpoint without train.precision (one written before --precision existed, or one without
 * any train.* metadata) comes from a run at the old default, f32: its resume stays on f32
 * rather than taking today's default for the device it resumes on. */
#define UNRECORDED_PRECISION "f32"

static cli_opt *find_opt(cli_opt *opts, size_t n, const char *name) {
  for (size_t j = 0; j < n; j++)
    if (strcmp(opts[j].name, name) == 0) return &opts[j];
  return NULL;
}

/* Fills in recorded options not given and refuses given ones that differ. */
static int apply_recorded(const char *cmd, const mn_safetensors *st, cli_opt *opts, size_t n) {
  for (size_t i = 0; i < NUM_RECORDED; i++) {
    const recorded_option *r = &recorded[i];
    cli_opt *o = find_opt(opts, n, r->option);
    if (!o) continue;
    const char *v = mn_safetensors_metadata(st, r->key);
    if (!v && strcmp(r->option, "--precision") == 0) v = UNRECORDED_PRECISION;
    if (!o->seen) {
      if (v) o->value = o->takes_value ? v : NULL, o->seen = 1;
      continue;
    }
    if (r->rule == DEFAULT_ONLY) continue;
    /* A flag given reads as the 1 it is recorded as. */
    const char *given = o->takes_value ? o->value : "1";
    bool same = v && (r->rule == SAME_TEXT ? strcmp(v, given) == 0 : same_number(r, v, given));
    if (same) continue;
    fprintf(stderr,
            "%s: %s %s differs from the checkpoint's %s%s: a resumed run keeps what shapes its "
            "trajectory (start a new run with --init-from CHECKPOINT to change it)\n",
            cmd, r->option, given, v ? "" : "(not given)", v ? v : "");
    return CLI_USAGE;
  }
  return CLI_OK;
}

int cli_resume_read(const char *cmd, const char *path, cli_opt *opts, size_t n, resume_point *rp,
                    mn_safetensors **st_out) {
  *rp = (resume_point){.step = -1};
  mn_safetensors *st = NULL;
  if (mn_safetensors_open(path, &st) != MN_OK)
    return cli_lib_fail(cmd, "cannot load --resume checkpoint");
  *st_out = st;
  const char *step = mn_safetensors_metadata(st, "train.step");
  uint64_t u = 0;
  if (!step) {
    rp->step = read_step_file(cmd, path);
    if (rp->step < 0 && parse_u64(mn_safetensors_metadata(st, "step"), 10, &u)) rp->step = (long)u;
    if (rp->step < 0) rp->step = 0;
    cli_opt *precision = find_opt(opts, n, "--precision");
    if (precision && !precision->seen) precision->value = UNRECORDED_PRECISION, precision->seen = 1;
    return CLI_OK;
  }
  rp->self_contained = true;
  if (!parse_u64(step, 10, &u) || u > 1000000000u) return bad_entry(cmd, path, "train.step", step);
  rp->step = (long)u;
  const char *keys[] = {"train.sampler_rng", "train.data_fnv1a64", "train.tokenizer_fnv1a64"};
  uint64_t *dst[] = {&rp->sampler_rng, &rp->data_hash, &rp->tokenizer_hash};
  for (size_t i = 0; i < 3; i++)
    if (!parse_u64(mn_safetensors_metadata(st, keys[i]), 16, dst[i]))
      return bad_entry(cmd, path, keys[i], mn_safetensors_metadata(st, keys[i]));
  const char *prefix = mn_safetensors_metadata(st, "train.name_prefix");
  if (!prefix || strlen(prefix) >= sizeof rp->name_prefix)
    return bad_entry(cmd, path, "train.name_prefix", prefix);
  strcpy(rp->name_prefix, prefix);
  if (read_config(cmd, path, st, &rp->cfg)) return CLI_FAIL;
  rp->has_config = true;
  return apply_recorded(cmd, st, opts, n);
}

int cli_resume_check_config(const char *cmd, const resume_point *rp, const mn_model_config *cfg) {
  if (!rp->has_config) return CLI_OK;
  char have[VALUE_CHARS], want[VALUE_CHARS];
  for (size_t i = 0; i < NUM_CFG; i++) {
    format_cfg(&rp->cfg, &cfg_fields[i], have);
    format_cfg(cfg, &cfg_fields[i], want);
    if (strcmp(have, want) == 0) continue;
    fprintf(stderr,
            "%s: --config differs from the checkpoint's model at \"%s\": %s in --config, %s in "
            "the checkpoint\n",
            cmd, cfg_fields[i].name, want, have);
    return CLI_FAIL;
  }
  return CLI_OK;
}

/* ---------------------------------------------------------------- metrics */

int cli_metrics_cut(const char *cmd, const char *path, long step, const char *header) {
  FILE *in = fopen(path, "r");
  if (!in) return CLI_OK; /* nothing to cut */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.cut", path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    fprintf(stderr, "%s: cannot write '%s': %s\n", cmd, tmp, strerror(errno));
    return CLI_FAIL;
  }
  fputs(header, out);
  char line[1024];
  bool first = true;
  while (fgets(line, sizeof line, in)) {
    bool was_first = first;
    first = false;
    char *end = NULL;
    long row = strtol(line, &end, 10);
    /* The header (first line) is replaced; rows past the resume step are what the resumed
     * run writes again. */
    if (was_first || end == line || *end != ',' || row > step) continue;
    fputs(line, out);
  }
  bool bad = ferror(in) || ferror(out);
  fclose(in);
  if (fclose(out) != 0 || bad || rename(tmp, path) != 0) {
    fprintf(stderr, "%s: cannot rewrite '%s': %s\n", cmd, path, strerror(errno));
    remove(tmp);
    return CLI_FAIL;
  }
  return CLI_OK;
}
