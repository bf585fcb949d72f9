/* The meganeura half of scripts/quality_run.py: trains a model from given initial weights on
 * given batches with a given learning-rate schedule, so that another framework can train the
 * same model from the same start on the same data and the loss curves compare step by step.
 *
 * usage: bench_quality_driver --model DIR --batches FILE --lrs FILE --batch B --seq T
 *            --steps N --losses FILE [--precision f32|tf32|bf16|f16] [--beta1 X] [--beta2 X]
 *            [--eps X] [--weight-decay X] [--grad-clip C] [--save FILE.safetensors]
 *   DIR/config.json    a GPT-2 or Llama config (mn_model_config_load)
 *   DIR/init.safetensors   every parameter, loaded strictly (names as transformers saves them;
 *                      the name prefix is read from the file)
 *   --batches FILE     N * B windows of T + 1 little-endian uint32 token ids, step after
 *                      step: a window's first T tokens are the input ids, its last T the labels
 *   --lrs FILE         N little-endian float32 learning rates, one per step
 *   --precision        f32 (default: fp32, no TF32), tf32, or bf16 / f16 mixed precision
 *   AdamW: beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1 on every parameter, and global
 *   gradient-norm clipping at 1.0 (0 turns it off), unless given.
 * The backend follows MN_BACKEND (cpu, cuda). Writes --losses: one line "STEP LOSS" per step
 * (STEP from 1), after a first line "# backend B precision P". Exit status 0 on success,
 * 1 on a failure (the library's message on stderr), 2 on bad arguments. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchmarks/driver_util.h"
#include "meganeura.h"

#define PROG "quality_driver"

typedef struct driver_args {
  const char *model, *batches, *lrs, *losses, *save, *precision_name;
  long long batch, seq, steps;
  double beta1, beta2, eps, wd, clip;
  mn_precision precision;
  bool tf32;
} driver_args;

static void usage(void) {
  fprintf(stderr,
          "usage: bench_quality_driver --model DIR --batches FILE --lrs FILE --batch B --seq T "
          "--steps N --losses FILE [--precision f32|tf32|bf16|f16] [--beta1 X] [--beta2 X] "
          "[--eps X] [--weight-decay X] [--grad-clip C] [--save FILE.safetensors]\n");
  exit(2);
}

static driver_args parse_args(int argc, char **argv) {
  driver_args a = {.beta1 = 0.9,
                   .beta2 = 0.95,
                   .eps = 1e-8,
                   .wd = 0.1,
                   .clip = 1.0,
                   .precision_name = "f32",
                   .precision = MN_PRECISION_F32};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) usage();
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--model"))
      a.model = v;
    else if (!strcmp(k, "--batches"))
      a.batches = v;
    else if (!strcmp(k, "--lrs"))
      a.lrs = v;
    else if (!strcmp(k, "--losses"))
      a.losses = v;
    else if (!strcmp(k, "--save"))
      a.save = v;
    else if (!strcmp(k, "--batch"))
      a.batch = atoll(v);
    else if (!strcmp(k, "--seq"))
      a.seq = atoll(v);
    else if (!strcmp(k, "--steps"))
      a.steps = atoll(v);
    else if (!strcmp(k, "--beta1"))
      a.beta1 = atof(v);
    else if (!strcmp(k, "--beta2"))
      a.beta2 = atof(v);
    else if (!strcmp(k, "--eps"))
      a.eps = atof(v);
    else if (!strcmp(k, "--weight-decay"))
      a.wd = atof(v);
    else if (!strcmp(k, "--grad-clip"))
      a.clip = atof(v);
    else if (!strcmp(k, "--precision")) {
      a.precision_name = v;
      if (!drv_precision(v, &a.precision, &a.tf32)) usage();
    } else
      usage();
  }
  if (!a.model || !a.batches || !a.lrs || !a.losses || a.batch < 1 || a.seq < 1 || a.steps < 1 ||
      !(a.clip >= 0))
    usage();
  return a;
}

int main(int argc, char **argv) {
  driver_args a = parse_args(argc, argv);
  mn_session_options o = mn_session_options_default();
  o.allow_tf32 = a.tf32;
  o.precision = a.precision;
  drv_model m = drv_load_model(PROG, a.model, "init.safetensors", a.batch, a.seq, &o);
  mn_model_config c = m.config;
  mn_graph *g = m.graph;
  mn_session *s = m.session;
  drv_expect_ok(PROG, mn_model_prepare_session(g, s), "position ids");
  if (a.clip > 0) drv_expect_ok(PROG, mn_session_set_grad_clip(s, (float)a.clip), "grad clip");

  size_t bt = (size_t)(a.batch * a.seq), w = (size_t)a.seq + 1;
  size_t per_step = (size_t)a.batch * w;
  uint32_t *windows = drv_read_exact(PROG, a.batches, sizeof(uint32_t), per_step * (size_t)a.steps);
  float *lrs = drv_read_exact(PROG, a.lrs, sizeof(float), (size_t)a.steps);
  uint32_t *ids = malloc(bt * sizeof *ids), *labels = malloc(bt * sizeof *labels);
  if (!ids || !labels) drv_die(PROG, "out of memory");
  for (size_t i = 0; i < per_step * (size_t)a.steps; i++)
    if ((int64_t)windows[i] >= c.vocab_size) {
      fprintf(stderr, "quality_driver: token %u at %zu of %s is outside the vocabulary (%lld)\n",
              windows[i], i, a.batches, (long long)c.vocab_size);
      return 1;
    }

  FILE *out = fopen(a.losses, "w");
  if (!out) {
    fprintf(stderr, "quality_driver: cannot write %s: %s\n", a.losses, strerror(errno));
    return 1;
  }
  mn_session_stats stats;
  drv_expect_ok(PROG, mn_session_get_stats(s, &stats), "stats");
  fprintf(out, "# backend %s precision %s\n", stats.backend, a.precision_name);
  fprintf(stderr, "quality_driver: %s backend, %s, %lld steps of %lld x %lld tokens\n",
          stats.backend, a.precision_name, a.steps, a.batch, a.seq);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long long every = a.steps / 10 > 0 ? a.steps / 10 : 1;
  for (long long step = 0; step < a.steps; step++) {
    const uint32_t *win = windows + (size_t)step * per_step;
    for (long long b = 0; b < a.batch; b++) {
      memcpy(ids + b * a.seq, win + (size_t)b * w, (size_t)a.seq * sizeof *ids);
      memcpy(labels + b * a.seq, win + (size_t)b * w + 1, (size_t)a.seq * sizeof *ids);
    }
    drv_expect_ok(PROG, mn_session_set_input_u32(s, "input_ids", ids, bt), "input_ids");
    drv_expect_ok(PROG, mn_session_set_input_u32(s, "labels", labels, bt), "labels");
    drv_expect_ok(PROG,
                  mn_session_set_adamw(s, lrs[step], (float)a.beta1, (float)a.beta2, (float)a.eps,
                                       (float)a.wd),
                  "adamw");
    drv_expect_ok(PROG, mn_session_step(s), "step");
    drv_expect_ok(PROG, mn_session_wait(s), "wait");
    float loss = mn_session_read_loss(s);
    fprintf(out, "%lld %.9g\n", step + 1, (double)loss);
    if (!isfinite(loss)) {
      fprintf(stderr, "quality_driver: the loss is not finite at step %lld\n", step + 1);
      fclose(out);
      return 1;
    }
    if ((step + 1) % every == 0 || step == 0)
      fprintf(stderr, "quality_driver: %s step %lld/%lld loss %.4f\n", a.precision_name, step + 1,
              a.steps, (double)loss);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  fprintf(stderr, "quality_driver: %s %lld steps in %.1f s (%.1f ms per step)\n", a.precision_name,
          a.steps, secs, 1e3 * secs / (double)a.steps);
  if (fclose(out) != 0) {
    fprintf(stderr, "quality_driver: cannot write %s\n", a.losses);
    return 1;
  }
  if (a.save) drv_expect_ok(PROG, mn_session_save_safetensors(s, a.save), "save");
  free(windows);
  free(lrs);
  free(ids);
  free(labels);
  mn_session_free(s);
  mn_graph_free(g);
  return 0;
}
