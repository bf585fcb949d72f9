/* meganeura train: AdamW on random windows of a token file, with a cosine schedule,
 * progress, metrics CSV, an SVG loss curve, checkpoints and resume. */
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const CMD = "meganeura train";
static const char USAGE[] =
    "usage: meganeura train --config CONFIG.json --data FILE --batch B --seq T --steps N --lr LR\n"
    "         [--tokenizer tokenizer.json | --data-format text|u16|u32]\n"
    "         [--init-from FILE.safetensors] [--warmup W] [--weight-decay WD] [--grad-clip C]\n"
    "         [--checkpoint-every K] [--out DIR] [--resume CKPT] [--seed S]\n"
    "         [--metrics FILE.csv] [--plot FILE.svg]\n"
    "Trains with AdamW on random windows of --data (text: each byte is a token, vocabulary\n"
    "256; with --tokenizer: its ids; u16/u32: little-endian token ids). The learning rate\n"
    "warms up linearly for W steps, then decays by a cosine to 10% of LR. Final weights go\n"
    "to OUT/model.safetensors (OUT defaults to meganeura-out); checkpoints to\n"
    "OUT/checkpoint-STEP.safetensors (with a .step file that --resume reads).\n";

enum {
  O_CONFIG,
  O_DATA,
  O_TOKENIZER,
  O_FORMAT,
  O_INIT,
  O_BATCH,
  O_SEQ,
  O_STEPS,
  O_LR,
  O_WARMUP,
  O_WD,
  O_CLIP,
  O_CKEVERY,
  O_OUT,
  O_RESUME,
  O_SEED,
  O_METRICS,
  O_PLOT,
  O_COUNT
};

typedef struct train_args {
  long batch, seq, steps, warmup, ck_every, seed;
  float lr, wd, clip;
} train_args;

static float lr_at(const train_args *a, long step) {
  if (step < a->warmup) return a->lr * (float)(step + 1) / (float)a->warmup;
  double p =
      (double)(step - a->warmup) / (double)(a->steps - a->warmup > 0 ? a->steps - a->warmup : 1);
  if (p > 1) p = 1;
  return a->lr * (float)(0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979323846 * p)));
}

static void fmt_eta(double s, char *buf, size_t n) {
  if (!(s >= 0) || s > 1e7) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else
    snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static long read_step_file(const char *ckpt) {
  char path[4200];
  snprintf(path, sizeof path, "%s.step", ckpt);
  FILE *f = fopen(path, "r");
  long step = -1;
  if (f) {
    if (fscanf(f, "%ld", &step) != 1) step = -1;
    fclose(f);
  }
  return step;
}

static int save_checkpoint(mn_session *s, const char *out, long step) {
  char path[4200];
  snprintf(path, sizeof path, "%s/checkpoint-%06ld.safetensors", out, step);
  if (mn_session_save_checkpoint(s, path) != MN_OK)
    return cli_lib_fail(CMD, "cannot save checkpoint");
  char sp[4300];
  snprintf(sp, sizeof sp, "%s.step", path);
  FILE *f = fopen(sp, "w");
  if (!f || fprintf(f, "%ld\n", step) < 0 || fclose(f) != 0) {
    fprintf(stderr, "%s: cannot write '%s': %s\n", CMD, sp, strerror(errno));
    return CLI_FAIL;
  }
  return CLI_OK;
}

static int check_args(cli_opt *o, train_args *a) {
  if (cli_pos_long(CMD, &o[O_BATCH], &a->batch) || cli_pos_long(CMD, &o[O_SEQ], &a->seq) ||
      cli_pos_long(CMD, &o[O_STEPS], &a->steps) || cli_pos_float(CMD, &o[O_LR], &a->lr) ||
      cli_nonneg_long(CMD, &o[O_WARMUP], &a->warmup) || cli_nonneg_float(CMD, &o[O_WD], &a->wd) ||
      cli_pos_float(CMD, &o[O_CLIP], &a->clip) || cli_pos_long(CMD, &o[O_CKEVERY], &a->ck_every) ||
      cli_nonneg_long(CMD, &o[O_SEED], &a->seed))
    return CLI_USAGE;
  const int req[] = {O_CONFIG, O_DATA, O_BATCH, O_SEQ, O_STEPS, O_LR};
  for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
    if (cli_require(CMD, &o[req[i]])) return CLI_USAGE;
  const char *fmt = o[O_FORMAT].value;
  if (fmt && strcmp(fmt, "text") && strcmp(fmt, "u16") && strcmp(fmt, "u32")) {
    fprintf(stderr, "%s: --data-format must be text, u16 or u32, got '%s'\n", CMD, fmt);
    return CLI_USAGE;
  }
  if (fmt && strcmp(fmt, "text") && o[O_TOKENIZER].seen) {
    fprintf(stderr, "%s: --tokenizer applies to text data only, not --data-format %s\n", CMD, fmt);
    return CLI_USAGE;
  }
  if (o[O_RESUME].seen && o[O_INIT].seen) {
    fprintf(stderr, "%s: --resume and --init-from cannot be used together\n", CMD);
    return CLI_USAGE;
  }
  return CLI_OK;
}

typedef struct run {
  mn_model_config cfg;
  mn_tokenizer *tok;
  uint32_t *data, *ids, *labels;
  size_t n_data;
  mn_graph *g;
  mn_session *s;
  long *steps_log;
  float *loss_log;
  FILE *csv;
} run;

static void run_free(run *r) {
  mn_tokenizer_free(r->tok);
  free(r->data);
  free(r->ids);
  free(r->labels);
  mn_session_free(r->s);
  mn_graph_free(r->g);
  free(r->steps_log);
  free(r->loss_log);
  if (r->csv) fclose(r->csv);
}

static int setup(cli_opt *o, const train_args *a, run *r, long *start) {
  if (cli_load_config(CMD, o[O_CONFIG].value, &r->cfg)) return CLI_FAIL;
  if (o[O_TOKENIZER].seen && mn_tokenizer_load(o[O_TOKENIZER].value, &r->tok) != MN_OK)
    return cli_lib_fail(CMD, "cannot load tokenizer");
  if (cli_load_tokens(CMD, o[O_DATA].value, o[O_FORMAT].value, r->tok, &r->data, &r->n_data))
    return CLI_FAIL;
  if (r->n_data < (size_t)a->seq + 1) {
    fprintf(stderr, "%s: '%s' holds %zu tokens, fewer than --seq + 1 = %ld\n", CMD, o[O_DATA].value,
            r->n_data, a->seq + 1);
    return CLI_FAIL;
  }
  for (size_t i = 0; i < r->n_data; i++)
    if ((int64_t)r->data[i] >= r->cfg.vocab_size) {
      fprintf(stderr, "%s: token %u at position %zu of '%s' is outside the vocabulary (%lld)\n",
              CMD, r->data[i], i, o[O_DATA].value, (long long)r->cfg.vocab_size);
      return CLI_FAIL;
    }
  const char *prefix = NULL;
  if (o[O_INIT].seen && mn_model_name_prefix(&r->cfg, o[O_INIT].value, &prefix) != MN_OK)
    return cli_lib_fail(CMD, "cannot read --init-from");
  if (mn_model_build(&r->cfg, a->batch, a->seq, prefix, &r->g) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the model");
  if (mn_build_session(r->g, NULL, &r->s) != MN_OK)
    return cli_lib_fail(CMD, "cannot build the session");
  if (mn_model_init_parameters(&r->cfg, r->g, r->s, (uint64_t)a->seed) != MN_OK)
    return cli_lib_fail(CMD, "cannot initialize the parameters");
  if (o[O_INIT].seen && mn_session_load_safetensors(r->s, o[O_INIT].value, true) != MN_OK)
    return cli_lib_fail(CMD, "cannot load --init-from");
  *start = 0;
  if (o[O_RESUME].seen) {
    if (mn_session_load_checkpoint(r->s, o[O_RESUME].value) != MN_OK)
      return cli_lib_fail(CMD, "cannot load --resume checkpoint");
    long st = read_step_file(o[O_RESUME].value);
    if (st < 0)
      fprintf(stderr, "%s: no step count beside '%s'; counting from 0\n", CMD, o[O_RESUME].value);
    *start = st < 0 ? 0 : st;
  }
  size_t bt = (size_t)(a->batch * a->seq), n = (size_t)a->steps + 1;
  r->ids = malloc(bt * sizeof *r->ids);
  r->labels = malloc(bt * sizeof *r->labels);
  r->steps_log = malloc(n * sizeof *r->steps_log);
  r->loss_log = malloc(n * sizeof *r->loss_log);
  if (!r->ids || !r->labels || !r->steps_log || !r->loss_log) {
    fprintf(stderr, "%s: out of memory\n", CMD);
    return CLI_FAIL;
  }
  if (o[O_METRICS].seen) {
    int append = *start > 0 && access(o[O_METRICS].value, F_OK) == 0;
    r->csv = fopen(o[O_METRICS].value, append ? "a" : "w");
    if (!r->csv) {
      fprintf(stderr, "%s: cannot write '%s': %s\n", CMD, o[O_METRICS].value, strerror(errno));
      return CLI_FAIL;
    }
    if (!append) fputs("step,loss,lr,tokens_per_s\n", r->csv);
  }
  return CLI_OK;
}

static int train_loop(cli_opt *o, const train_args *a, run *r, long start, const char *out) {
  uint64_t rng = (uint64_t)a->seed * 0x9E3779B97F4A7C15ull + (uint64_t)start + 1;
  size_t windows = r->n_data - (size_t)a->seq;
  size_t bt = (size_t)(a->batch * a->seq);
  int tty = isatty(STDERR_FILENO);
  mn_session_stats stats;
  const char *backend = mn_session_get_stats(r->s, &stats) == MN_OK ? stats.backend : "?";
  fprintf(stderr, "%s: %s backend, %zu tokens of data, steps %ld..%ld\n", CMD, backend, r->n_data,
          start + 1, a->steps);
  double t0 = cli_now();
  long done = 0;
  size_t nlog = 0;
  for (long step = start; step < a->steps; step++) {
    for (long b = 0; b < a->batch; b++) {
      size_t off = (size_t)(cli_rand(&rng) % windows);
      memcpy(r->ids + b * a->seq, r->data + off, (size_t)a->seq * sizeof *r->ids);
      memcpy(r->labels + b * a->seq, r->data + off + 1, (size_t)a->seq * sizeof *r->ids);
    }
    float lr = lr_at(a, step);
    if (mn_session_set_input_u32(r->s, "input_ids", r->ids, bt) != MN_OK ||
        mn_session_set_input_u32(r->s, "labels", r->labels, bt) != MN_OK ||
        mn_session_set_adamw(r->s, lr, 0.9f, 0.95f, 1e-8f, a->wd) != MN_OK ||
        (o[O_CLIP].seen && mn_session_set_grad_clip(r->s, a->clip) != MN_OK) ||
        mn_session_step(r->s) != MN_OK || mn_session_wait(r->s) != MN_OK)
      return cli_lib_fail(CMD, "training step failed");
    float loss = mn_session_read_loss(r->s);
    done++;
    double el = cli_now() - t0, tps = (double)bt * (double)done / (el > 0 ? el : 1e-9);
    r->steps_log[nlog] = step + 1;
    r->loss_log[nlog++] = loss;
    if (r->csv) fprintf(r->csv, "%ld,%.6f,%.6g,%.1f\n", step + 1, loss, lr, tps);
    char eta[32];
    fmt_eta(el / (double)done * (double)(a->steps - step - 1), eta, sizeof eta);
    long every = a->steps / 20 > 0 ? a->steps / 20 : 1;
    if (tty || (step + 1) % every == 0 || step + 1 == a->steps || step == start)
      fprintf(stderr, "%sstep %ld/%ld  loss %.4f  lr %.3g  %.0f tok/s  ETA %s%s", tty ? "\r" : "",
              step + 1, a->steps, loss, lr, tps, eta, tty ? "   " : "\n");
    if (!isfinite(loss)) {
      fprintf(stderr, "\n%s: the loss is not finite at step %ld; lower --lr\n", CMD, step + 1);
      return CLI_FAIL;
    }
    if (a->ck_every && (step + 1) % a->ck_every == 0 && save_checkpoint(r->s, out, step + 1))
      return CLI_FAIL;
  }
  if (tty) fputc('\n', stderr);
  if (nlog)
    fprintf(stderr, "%s: loss %.4f -> %.4f in %ld steps, %.1f s\n", CMD, r->loss_log[0],
            r->loss_log[nlog - 1], done, cli_now() - t0);
  if (o[O_PLOT].seen) {
    char title[256];
    snprintf(title, sizeof title, "training loss (batch %ld, seq %ld, lr %g)", a->batch, a->seq,
             (double)a->lr);
    if (cli_write_svg(o[O_PLOT].value, r->steps_log, r->loss_log, nlog, title)) {
      fprintf(stderr, "%s: cannot write '%s': %s\n", CMD, o[O_PLOT].value, strerror(errno));
      return CLI_FAIL;
    }
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  if (mn_session_save_safetensors(r->s, path) != MN_OK)
    return cli_lib_fail(CMD, "cannot save the final weights");
  fprintf(stderr, "%s: weights saved to %s\n", CMD, path);
  return CLI_OK;
}

int cli_train(int argc, char **argv) {
  cli_opt o[O_COUNT] = {
      [O_CONFIG] = {"--config", 1, NULL, 0},
      [O_DATA] = {"--data", 1, NULL, 0},
      [O_TOKENIZER] = {"--tokenizer", 1, NULL, 0},
      [O_FORMAT] = {"--data-format", 1, NULL, 0},
      [O_INIT] = {"--init-from", 1, NULL, 0},
      [O_BATCH] = {"--batch", 1, NULL, 0},
      [O_SEQ] = {"--seq", 1, NULL, 0},
      [O_STEPS] = {"--steps", 1, NULL, 0},
      [O_LR] = {"--lr", 1, NULL, 0},
      [O_WARMUP] = {"--warmup", 1, NULL, 0},
      [O_WD] = {"--weight-decay", 1, NULL, 0},
      [O_CLIP] = {"--grad-clip", 1, NULL, 0},
      [O_CKEVERY] = {"--checkpoint-every", 1, NULL, 0},
      [O_OUT] = {"--out", 1, NULL, 0},
      [O_RESUME] = {"--resume", 1, NULL, 0},
      [O_SEED] = {"--seed", 1, NULL, 0},
      [O_METRICS] = {"--metrics", 1, NULL, 0},
      [O_PLOT] = {"--plot", 1, NULL, 0},
  };
  int rc = cli_parse(CMD, argc, argv, o, O_COUNT, USAGE);
  if (rc) return rc == CLI_HELP ? CLI_OK : rc;
  train_args a = {.warmup = 0, .seed = 0, .wd = 0.01f};
  if (check_args(o, &a)) return CLI_USAGE;
  if (a.warmup >= a.steps) a.warmup = a.steps - 1;
  const char *out = o[O_OUT].seen ? o[O_OUT].value : "meganeura-out";
  if (cli_mkdir_p(out) != 0) {
    fprintf(stderr, "%s: cannot create --out directory '%s': %s\n", CMD, out, strerror(errno));
    return CLI_FAIL;
  }
  run r = {0};
  long start = 0;
  rc = setup(o, &a, &r, &start);
  if (!rc && start >= a.steps)
    fprintf(stderr, "%s: the checkpoint is at step %ld, nothing left of --steps %ld\n", CMD, start,
            a.steps);
  if (!rc) rc = train_loop(o, &a, &r, start, out);
  run_free(&r);
  return rc;
}
