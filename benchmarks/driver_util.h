/* What the programs that scripts drive (hf_parity_driver, peft_parity_driver, quality_driver)
 * share (and the decode benchmarks' random weights): paths, exact binary files, folders, the
 * precision names, a language model's batch and the AdamW options. Static functions in a header
 * because CMake builds every .c file in benchmarks/ as its own program. Each exits with a message
 * naming `prog`. */
#ifndef MN_BENCH_DRIVER_UTIL_H
#define MN_BENCH_DRIVER_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "meganeura.h"

static inline const char *drv_join_path(const char *prog, char *buf, size_t size, const char *dir,
                                        const char *name) {
  if ((size_t)snprintf(buf, size, "%s/%s", dir, name) >= size) {
    fprintf(stderr, "%s: path too long: %s/%s\n", prog, dir, name);
    exit(1);
  }
  return buf;
}

/* Exactly n elements of `size` bytes from path (a file of any other length is refused). */
static inline void *drv_read_exact(const char *prog, const char *path, size_t size, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open %s: %s\n", prog, path, strerror(errno));
    exit(1);
  }
  void *x = malloc(n * size);
  char extra;
  if (!x || fread(x, size, n, f) != n || fread(&extra, 1, 1, f) != 0) {
    fprintf(stderr, "%s: %s does not hold exactly %zu values of %zu bytes\n", prog, path, n, size);
    exit(1);
  }
  fclose(f);
  return x;
}

/* f32, tf32 (f32 with TF32 products), bf16 or f16; false for any other name. */
static inline bool drv_precision(const char *name, mn_precision *p, bool *tf32) {
  *tf32 = false;
  if (!strcmp(name, "f32") || !strcmp(name, "tf32")) {
    *p = MN_PRECISION_F32;
    *tf32 = name[0] == 't';
  } else if (!strcmp(name, "bf16")) {
    *p = MN_PRECISION_BF16;
  } else if (!strcmp(name, "f16")) {
    *p = MN_PRECISION_F16;
  } else {
    return false;
  }
  return true;
}

/* Exits naming what failed and the library's last error. */
static inline void drv_die(const char *prog, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, mn_last_error());
  exit(1);
}

static inline void drv_expect_ok(const char *prog, mn_status st, const char *what) {
  if (st != MN_OK) drv_die(prog, what);
}

/* The model of DIR/config.json as a training session of batch x seq windows with options o,
 * its parameters loaded strictly from DIR/<weights> (names as transformers saves them; the
 * name prefix is read from the file). */
typedef struct drv_model {
  mn_model_config config;
  const char *prefix;
  mn_graph *graph;
  mn_session *session;
} drv_model;

static inline drv_model drv_load_model(const char *prog, const char *dir, const char *weights,
                                       int64_t batch, int64_t seq, const mn_session_options *o) {
  char path[4096], file[4096];
  drv_model m = {.prefix = NULL};
  drv_expect_ok(
      prog,
      mn_model_config_load(drv_join_path(prog, path, sizeof path, dir, "config.json"), &m.config),
      "config");
  drv_join_path(prog, file, sizeof file, dir, weights);
  drv_expect_ok(prog, mn_model_name_prefix(&m.config, file, &m.prefix), "name prefix");
  drv_expect_ok(prog, mn_model_build(&m.config, batch, seq, m.prefix, &m.graph), "build");
  drv_expect_ok(prog, mn_build_session(m.graph, o, &m.session), "session");
  drv_expect_ok(prog, mn_session_load_safetensors(m.session, file, true), "load weights");
  return m;
}

static inline void drv_make_dir(const char *prog, const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: mkdir %s: %s\n", prog, path, strerror(errno));
    exit(1);
  }
}

static inline void drv_write_f32(const char *prog, const char *path, const float *x, size_t n) {
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(x, sizeof *x, n, f) == n;
  if (f && fclose(f) != 0) ok = false;
  if (!ok) {
    fprintf(stderr, "%s: cannot write %s\n", prog, path);
    exit(1);
  }
}

/* The inputs of a graph of mn_model_build: positions (GPT-2), input_ids and labels. */
static inline void drv_set_lm_batch(const char *prog, mn_session *s, const mn_graph *g,
                                    const uint32_t *ids, const uint32_t *labels, size_t n) {
  drv_expect_ok(prog, mn_model_prepare_session(g, s), "position ids");
  drv_expect_ok(prog, mn_session_set_input_u32(s, "input_ids", ids, n), "input_ids");
  drv_expect_ok(prog, mn_session_set_input_u32(s, "labels", labels, n), "labels");
}

/* --lr, --beta1, --beta2, --eps, --weight-decay: whether option k was one of them (its value
 * v then stored). */
typedef struct drv_adamw {
  double lr, beta1, beta2, eps, wd;
} drv_adamw;
static inline bool drv_adamw_arg(const char *k, const char *v, drv_adamw *o) {
  double *at = !strcmp(k, "--lr")             ? &o->lr
               : !strcmp(k, "--beta1")        ? &o->beta1
               : !strcmp(k, "--beta2")        ? &o->beta2
               : !strcmp(k, "--eps")          ? &o->eps
               : !strcmp(k, "--weight-decay") ? &o->wd
                                              : NULL;
  if (at) *at = atof(v);
  return at != NULL;
}

/* Random weights of c (mn_model_init_parameters with seed) saved at path by a CPU session of
 * the training graph: a model file for the benchmarks that need no checkpoint. */
static inline mn_status drv_write_random_weights(const mn_model_config *c, const char *path,
                                                 uint64_t seed) {
  mn_graph *g = NULL;
  mn_session *s = NULL;
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  mn_status st = mn_model_build(c, 1, 1, NULL, &g);
  if (st == MN_OK) st = mn_build_inference_session(g, &so, &s);
  if (st == MN_OK) st = mn_model_init_parameters(c, g, s, seed);
  if (st == MN_OK) st = mn_session_save_safetensors(s, path);
  mn_session_free(s);
  mn_graph_free(g);
  return st;
}

#endif
