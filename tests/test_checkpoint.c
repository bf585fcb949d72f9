/* Checkpoints: resuming from one continues training bit for bit (AdamW, with and without
 * clipping); a file that does not fit the session (missing, foreign, truncated, another shape,
 * a missing or extra tensor, bad metadata) is refused with its own status and message and
 * changes nothing; and a save killed at any moment leaves at the path either nothing (before
 * the first save finished) or one complete checkpoint, never a partial one. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/logging.h>

#include "io/safetensors.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- the model */

enum { M = 16, K = 8, H = 32, N = 4 };

/* A two-layer MLP and a parameter the loss ignores (no gradient, so no Adam moments). */
static mn_graph *mlp(int64_t hidden) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(M, K));
  mn_node y = mn_input(g, "y", MN_SHAPE(M, N));
  mn_node w1 = mn_parameter(g, "fc1.weight", MN_SHAPE(K, hidden));
  mn_node b1 = mn_parameter(g, "fc1.bias", MN_SHAPE(hidden));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(hidden, N));
  mn_node b2 = mn_parameter(g, "fc2.bias", MN_SHAPE(N));
  mn_parameter(g, "unused", MN_SHAPE(3));
  mn_node h = mn_gelu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node loss = mn_mse_loss(g, mn_bias_add(g, mn_matmul(g, h, w2), b2), y);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* The parameters of mlp(), "unused" included. */
enum { NUM_PARAMS = 5 };

/* Every parameter uniform in [-0.5, 0.5), drawn in node order from `seed`. */
static void init_params(const mn_graph *g, mn_session *s, uint64_t seed) {
  mn_rng rng = mn_rng_new(seed);
  mn_test_init_uniform(g, s, &rng, -0.5f, 0.5f, false);
}

/* Inputs differ from step to step but depend only on the step number. */
static void feed_step(mn_session *s, int step) {
  float x[M * K], y[M * N];
  mn_rng rng = mn_rng_new(1000 + (uint64_t)step);
  mn_rng_fill(&rng, x, M * K, -1, 1);
  mn_rng_fill(&rng, y, M * N, -1, 1);
  cr_assert_eq(mn_session_set_input(s, "x", x, M * K), MN_OK);
  cr_assert_eq(mn_session_set_input(s, "y", y, M * N), MN_OK);
}

static float step(mn_session *s, int t) {
  feed_step(s, t);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

typedef enum variant { ADAMW, ADAMW_CLIP, ADAM, SGD } variant;

static void configure(mn_session *s, variant v) {
  if (v == SGD) {
    cr_assert_eq(mn_session_set_learning_rate(s, 0.05f), MN_OK);
    return;
  }
  if (v == ADAM)
    cr_assert_eq(mn_session_set_adam(s, 0.01f, 0.8f, 0.99f, 1e-7f), MN_OK);
  else
    cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.05f), MN_OK);
  if (v == ADAMW_CLIP) cr_assert_eq(mn_session_set_grad_clip(s, 0.1f), MN_OK);
}

/* A session trained `steps` steps from a fixed start. */
static mn_session *trained(const mn_graph *g, variant v, int steps) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  init_params(g, s, 5);
  configure(s, v);
  for (int t = 0; t < steps; t++)
    step(s, t);
  return s;
}

/* ---------------------------------------------------------------- resuming */

static void check_resume(variant v) {
  enum { BEFORE = 10, AFTER = 10 };
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *a = trained(g, v, BEFORE);
  cr_assert_eq(mn_session_save_checkpoint(a, path), MN_OK, "%s", mn_last_error());
  float want[AFTER], got[AFTER];
  for (int i = 0; i < AFTER; i++)
    want[i] = step(a, BEFORE + i);

  /* A fresh session: other initial values, no optimizer configured; the file restores all. */
  mn_session *b = mn_test_session(g, MN_BACKEND_CPU, true);
  init_params(g, b, 99);
  cr_assert_eq(mn_session_load_checkpoint(b, path), MN_OK, "%s", mn_last_error());
  cr_assert_eq(b->step_count, (uint64_t)BEFORE);
  for (int i = 0; i < AFTER; i++)
    got[i] = step(b, BEFORE + i);
  cr_assert(memcmp(want, got, sizeof want) == 0, "losses differ after resuming: %.9g vs %.9g",
            want[AFTER - 1], got[AFTER - 1]);
  mn_test_assert_same_params(g, a, b, 0, "after resuming");
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, resume_adamw_is_exact) { check_resume(ADAMW); }
Test(checkpoint, resume_adamw_with_clipping_is_exact) { check_resume(ADAMW_CLIP); }
Test(checkpoint, resume_adam_is_exact) { check_resume(ADAM); }
Test(checkpoint, resume_sgd_is_exact) { check_resume(SGD); }

Test(checkpoint, file_layout_and_metadata) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW_CLIP, 3);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  const struct {
    const char *key, *value;
  } meta[] = {{"checkpoint_format", "meganeura"},
              {"checkpoint_version", "1"},
              {"optimizer", "adamw"},
              {"lr", "0.00999999978"},
              {"beta1", "0.899999976"},
              {"beta2", "0.999000013"},
              {"eps", "9.99999994e-09"},
              {"weight_decay", "0.0500000007"},
              {"max_grad_norm", "0.100000001"},
              {"step", "3"},
              {"library_version", MN_VERSION_STRING}};
  for (size_t i = 0; i < LEN(meta); i++) {
    const char *v = mn_safetensors_metadata(st, meta[i].key);
    cr_assert_not_null(v, "no metadata %s", meta[i].key);
    cr_assert_str_eq(v, meta[i].value, "metadata %s", meta[i].key);
  }
  /* Four trained parameters with two moments each, plus "unused" without moments. */
  cr_assert_eq(mn_safetensors_count(st), NUM_PARAMS + 4 * 2);
  mn_safetensors_info info;
  cr_assert_eq(mn_safetensors_info_of(st, "optimizer.exp_avg_sq.fc1.weight", &info), MN_OK);
  cr_assert_str_eq(info.dtype, "F32");
  cr_assert(info.rank == 2 && info.shape[0] == K && info.shape[1] == H);
  cr_assert_neq(mn_safetensors_info_of(st, "optimizer.exp_avg.unused", &info), MN_OK);
  /* The moments are the backend's, bit for bit. */
  float m[K * H], v[K * H], file_v[K * H];
  cr_assert_eq(s->backend->read_optim_state(s, 0, 0, m, K * H), MN_OK);
  cr_assert_eq(s->backend->read_optim_state(s, 0, 1, v, K * H), MN_OK);
  cr_assert_eq(mn_safetensors_read_f32(st, "optimizer.exp_avg_sq.fc1.weight", file_v, K * H),
               MN_OK);
  cr_assert(memcmp(v, file_v, sizeof v) == 0);
  cr_assert_eq(mn_safetensors_read_f32(st, "optimizer.exp_avg.fc1.weight", file_v, K * H), MN_OK);
  cr_assert(memcmp(m, file_v, sizeof m) == 0);
  mn_safetensors_close(st);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, inference_session_takes_the_parameters) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW, 2);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  mn_session *inf = mn_test_session(g, MN_BACKEND_CPU, false);
  cr_assert_eq(mn_session_load_checkpoint(inf, path), MN_OK, "%s", mn_last_error());
  mn_test_assert_same_params(g, s, inf, 0, "in the inference session");
  /* And an inference session's own checkpoint has no optimizer state. */
  cr_assert_eq(mn_session_save_checkpoint(inf, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK);
  cr_assert_eq(mn_safetensors_count(st), NUM_PARAMS);
  cr_assert_str_eq(mn_safetensors_metadata(st, "optimizer"), "none");
  mn_safetensors_close(st);
  mn_session_free(s);
  mn_session_free(inf);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* ---------------------------------------------------------------- refused files */

/* Writes a checkpoint of `s` whose tensors and metadata can be edited: `drop` is left out,
 * `extra` added, `f16` stored as F16, and metadata key `meta_key` set to `meta_value` (NULL:
 * removed). */
typedef struct edit {
  const char *drop, *extra, *f16, *meta_key, *meta_value;
} edit;

static void write_edited(mn_session *s, const char *path, edit e) {
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK);
  size_t n = mn_safetensors_count(st);
  mn_st_tensor *ts = calloc(n + 1, sizeof *ts);
  void **bufs = calloc(n + 1, sizeof *bufs);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = mn_safetensors_name(st, i);
    if (e.drop && strcmp(name, e.drop) == 0) continue;
    mn_safetensors_info info;
    cr_assert_eq(mn_safetensors_info_of(st, name, &info), MN_OK);
    size_t numel = info.bytes / 4;
    float *f = malloc(numel * sizeof *f);
    cr_assert_eq(mn_safetensors_read_f32(st, name, f, numel), MN_OK);
    ts[k] = (mn_st_tensor){
        .name = name, .dtype = "F32", .rank = info.rank, .data = f, .bytes = info.bytes};
    memcpy(ts[k].shape, info.shape, sizeof ts[k].shape);
    bufs[k] = f;
    if (e.f16 && strcmp(name, e.f16) == 0) {
      uint16_t *h = malloc(numel * sizeof *h);
      for (size_t j = 0; j < numel; j++)
        h[j] = mn_f32_to_f16(f[j]);
      free(f);
      bufs[k] = h;
      ts[k].data = h;
      ts[k].dtype = "F16";
      ts[k].bytes = numel * 2;
    }
    k++;
  }
  static const float extra_data[2] = {1, 2};
  if (e.extra)
    ts[k++] = (mn_st_tensor){.name = e.extra,
                             .dtype = "F32",
                             .rank = 1,
                             .shape = {2},
                             .data = extra_data,
                             .bytes = sizeof extra_data};
  static const char *const keys[] = {"checkpoint_format",
                                     "checkpoint_version",
                                     "library_version",
                                     "optimizer",
                                     "step",
                                     "lr",
                                     "beta1",
                                     "beta2",
                                     "eps",
                                     "weight_decay",
                                     "max_grad_norm"};
  mn_st_meta meta[LEN(keys)];
  size_t nm = 0;
  for (size_t i = 0; i < LEN(keys); i++) {
    const char *v = mn_safetensors_metadata(st, keys[i]);
    if (e.meta_key && strcmp(keys[i], e.meta_key) == 0) v = e.meta_value;
    if (v) meta[nm++] = (mn_st_meta){keys[i], v};
  }
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s.edited", path);
  cr_assert_eq(mn_safetensors_write(tmp, ts, k, meta, nm), MN_OK, "%s", mn_last_error());
  mn_safetensors_close(st);
  cr_assert_eq(rename(tmp, path), 0);
  for (size_t i = 0; i < k; i++)
    if (bufs[i]) free(bufs[i]);
  free(bufs);
  free(ts);
}

/* Two sessions in the same state; a refused load into one must leave it equal to the other:
 * same parameters, optimizer settings and step, and the next step gives the same loss. */
static void check_refused(const char *path, mn_status want, const char *fragment) {
  mn_graph *g = mlp(H);
  mn_session *a = trained(g, ADAMW_CLIP, 3), *b = trained(g, ADAMW_CLIP, 3);
  mn_assert_error(mn_session_load_checkpoint(a, path), want, fragment);
  cr_assert(strstr(mn_last_error(), "mn_session_load_checkpoint: ") == mn_last_error(), "%s",
            mn_last_error());
  mn_test_assert_same_params(g, a, b, 0, "after a refused load");
  cr_assert(memcmp(&a->optim, &b->optim, sizeof a->optim) == 0, "optimizer settings changed");
  cr_assert_eq(a->step_count, b->step_count);
  float la = step(a, 3), lb = step(b, 3);
  cr_assert(memcmp(&la, &lb, sizeof la) == 0, "loss after a refused load: %.9g vs %.9g", la, lb);
  mn_session_free(a);
  mn_session_free(b);
  mn_graph_free(g);
}

/* Saves a checkpoint of the standard model (edited by e) and checks that it is refused. */
static void check_refused_edit(edit e, mn_status want, const char *fragment) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW_CLIP, 1);
  init_params(g, s, 77); /* values the refused load must not bring in */
  write_edited(s, path, e);
  mn_session_free(s);
  mn_graph_free(g);
  check_refused(path, want, fragment);
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, missing_file) {
  check_refused("/tmp/mn_no_such_checkpoint.safetensors", MN_ERR_IO,
                "mn_safetensors_open: /tmp/mn_no_such_checkpoint.safetensors: cannot open");
}

Test(checkpoint, not_a_checkpoint) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "weights.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW, 1);
  /* Weights alone, as for transformers: no checkpoint metadata. */
  cr_assert_eq(mn_session_save_safetensors(s, path), MN_OK, "%s", mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
  check_refused(path, MN_ERR_FORMAT, "not a meganeura checkpoint");
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, truncated_file) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW, 1);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK);
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_assert_eq(truncate(path, sb.st_size - 100), 0);
  mn_session_free(s);
  mn_graph_free(g);
  check_refused(path, MN_ERR_FORMAT, "mn_session_load_checkpoint: mn_safetensors_open: ");
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, shape_mismatch) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H / 2);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK);
  mn_session_free(s);
  mn_graph_free(g);
  check_refused(path, MN_ERR_SHAPE,
                "tensor \"fc1.weight\" is [8,16] in the file, the parameter is [8,32]");
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, missing_parameter) {
  check_refused_edit((edit){.drop = "fc2.bias"}, MN_ERR_NOT_FOUND,
                     "no tensor \"fc2.bias\" for parameter \"fc2.bias\"");
}

Test(checkpoint, missing_moment) {
  check_refused_edit((edit){.drop = "optimizer.exp_avg_sq.fc1.bias"}, MN_ERR_NOT_FOUND,
                     "no tensor \"optimizer.exp_avg_sq.fc1.bias\" for parameter \"fc1.bias\"");
}

Test(checkpoint, unknown_parameter) {
  check_refused_edit((edit){.extra = "fc3.weight"}, MN_ERR_NOT_FOUND,
                     "tensor \"fc3.weight\" is not a parameter of this session");
  check_refused_edit((edit){.extra = "optimizer.exp_avg.unused"}, MN_ERR_NOT_FOUND,
                     "tensor \"optimizer.exp_avg.unused\" is not the optimizer state of a "
                     "parameter of this session");
}

Test(checkpoint, wrong_dtype) {
  check_refused_edit((edit){.f16 = "fc1.bias"}, MN_ERR_FORMAT,
                     "tensor \"fc1.bias\" is F16, checkpoints hold F32");
}

Test(checkpoint, bad_metadata) {
  check_refused_edit((edit){.meta_key = "checkpoint_format", .meta_value = NULL}, MN_ERR_FORMAT,
                     "not a meganeura checkpoint");
  check_refused_edit((edit){.meta_key = "checkpoint_version", .meta_value = "2"}, MN_ERR_FORMAT,
                     "metadata \"checkpoint_version\" is \"2\", expected \"1\"");
  check_refused_edit((edit){.meta_key = "optimizer", .meta_value = "lion"}, MN_ERR_FORMAT,
                     "metadata \"optimizer\" is \"lion\", expected none, sgd, adam or adamw");
  check_refused_edit((edit){.meta_key = "lr", .meta_value = "fast"}, MN_ERR_FORMAT,
                     "metadata \"lr\" is \"fast\", expected a number >= 0");
  check_refused_edit((edit){.meta_key = "beta2", .meta_value = "1"}, MN_ERR_FORMAT,
                     "metadata \"beta2\" is \"1\", expected a number in [0, 1)");
  check_refused_edit((edit){.meta_key = "eps", .meta_value = "nan"}, MN_ERR_FORMAT,
                     "metadata \"eps\" is \"nan\"");
  check_refused_edit((edit){.meta_key = "step", .meta_value = "-1"}, MN_ERR_FORMAT,
                     "metadata \"step\" is \"-1\", expected a non-negative integer");
  check_refused_edit((edit){.meta_key = "max_grad_norm", .meta_value = NULL}, MN_ERR_FORMAT,
                     "metadata \"max_grad_norm\" is missing");
}

Test(checkpoint, argument_errors) {
  mn_graph *g = mlp(H);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_assert_error(mn_session_save_checkpoint(NULL, "/tmp/x"), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_checkpoint: session is NULL");
  mn_assert_error(mn_session_save_checkpoint(s, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_checkpoint: path is NULL");
  mn_assert_error(mn_session_load_checkpoint(NULL, "/tmp/x"), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_checkpoint: session is NULL");
  mn_assert_error(mn_session_load_checkpoint(s, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_load_checkpoint: path is NULL");
  mn_assert_error(mn_session_save_checkpoint(s, "/nonexistent_mn_dir/ck.safetensors"), MN_ERR_IO,
                  "mn_session_save_checkpoint: mn_safetensors_write: "
                  "/nonexistent_mn_dir/ck.safetensors");
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- caller's metadata */

Test(checkpoint, caller_entries_round_trip_and_load) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = trained(g, ADAMW, 2);
  const mn_checkpoint_entry extra[] = {{"train.sampler_rng", "0123456789abcdef"},
                                       {"train.note", "quote \" and \\ and\nnewline"}};
  cr_assert_eq(mn_session_save_checkpoint_with(s, path, extra, LEN(extra)), MN_OK, "%s",
               mn_last_error());
  mn_safetensors *st = NULL;
  cr_assert_eq(mn_safetensors_open(path, &st), MN_OK, "%s", mn_last_error());
  for (size_t i = 0; i < LEN(extra); i++)
    cr_assert_str_eq(mn_safetensors_metadata(st, extra[i].key), extra[i].value);
  cr_assert_str_eq(mn_safetensors_metadata(st, "step"), "2");
  mn_safetensors_close(st);
  /* The library's loader ignores the entries it does not know. */
  mn_session *b = mn_test_session(g, MN_BACKEND_CPU, true);
  cr_assert_eq(mn_session_load_checkpoint(b, path), MN_OK, "%s", mn_last_error());
  mn_test_assert_same_params(g, s, b, 0, "after loading a checkpoint with entries");
  mn_session_free(b);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

Test(checkpoint, caller_entry_errors_write_nothing) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = mlp(H);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_assert_error(mn_session_save_checkpoint_with(s, path, NULL, 1), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_checkpoint_with: extra is NULL with 1 entries");
  mn_assert_error(mn_session_save_checkpoint_with(s, path, &(mn_checkpoint_entry){"", "v"}, 1),
                  MN_ERR_INVALID_ARGUMENT, "mn_session_save_checkpoint_with: entry 0 has no key");
  mn_assert_error(mn_session_save_checkpoint_with(s, path, &(mn_checkpoint_entry){"k", NULL}, 1),
                  MN_ERR_INVALID_ARGUMENT, "entry \"k\" has a NULL value");
  mn_assert_error(mn_session_save_checkpoint_with(s, path, &(mn_checkpoint_entry){"step", "9"}, 1),
                  MN_ERR_INVALID_ARGUMENT, "entry \"step\" is a key the library writes itself");
  mn_assert_error(
      mn_session_save_checkpoint_with(s, path, &(mn_checkpoint_entry){"max_grad_norm", "1"}, 1),
      MN_ERR_INVALID_ARGUMENT, "entry \"max_grad_norm\" is a key the library writes itself");
  const mn_checkpoint_entry twice[] = {{"a", "1"}, {"b", "2"}, {"a", "3"}};
  mn_assert_error(mn_session_save_checkpoint_with(s, path, twice, LEN(twice)),
                  MN_ERR_INVALID_ARGUMENT, "entry \"a\" is given twice");
  mn_assert_error(mn_session_save_checkpoint_with(NULL, path, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_checkpoint_with: session is NULL");
  mn_assert_error(mn_session_save_checkpoint_with(s, NULL, NULL, 0), MN_ERR_INVALID_ARGUMENT,
                  "mn_session_save_checkpoint_with: path is NULL");
  struct stat sb;
  cr_assert_neq(stat(path, &sb), 0, "a refused save wrote %s", path);
  mn_session_free(s);
  mn_graph_free(g);
  mn_tmp_dir_remove(&t);
}

/* ---------------------------------------------------------------- killed while saving */

enum { BIG_ROWS = 1024, BIG_COLS = 2048, NUM_BIG = 3, KILLS = 30 };
#define BIG_NUMEL ((size_t)BIG_ROWS * BIG_COLS)

/* A tiny trained model beside three 8 MB parameters the loss does not read. */
static mn_graph *big_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 2));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(2, 2));
  mn_node loss = mn_mean_all(g, mn_matmul(g, x, w));
  for (int i = 0; i < NUM_BIG; i++) {
    char name[32];
    snprintf(name, sizeof name, "big.%d", i);
    mn_parameter(g, name, MN_SHAPE(BIG_ROWS, BIG_COLS));
  }
  mn_set_outputs(g, &loss, 1);
  return g;
}

static float version_value(uint64_t version, size_t i) {
  return (float)version + 0.25f * (float)(i % 4);
}

/* Version v: every big parameter holds version_value(v, i) and the step counter is v. */
static void set_version(mn_session *s, float *buf, uint64_t v) {
  for (size_t i = 0; i < BIG_NUMEL; i++)
    buf[i] = version_value(v, i);
  for (int k = 0; k < NUM_BIG; k++) {
    char name[32];
    snprintf(name, sizeof name, "big.%d", k);
    if (mn_session_set_parameter(s, name, buf, BIG_NUMEL) != MN_OK) _exit(3);
  }
  s->step_count = v;
}

/* Loads the file into `check` and returns its version, failing unless it is complete. */
static uint64_t loaded_version(mn_session *check, const char *path, float *buf) {
  mn_status st = mn_session_load_checkpoint(check, path);
  cr_assert_eq(st, MN_OK, "the file at the path does not load: %s", mn_last_error());
  uint64_t v = check->step_count;
  for (int k = 0; k < NUM_BIG; k++) {
    char name[32];
    snprintf(name, sizeof name, "big.%d", k);
    cr_assert_eq(mn_session_read_param(check, name, buf, BIG_NUMEL), MN_OK);
    for (size_t i = 0; i < BIG_NUMEL; i++)
      if (buf[i] != version_value(v, i))
        cr_assert_fail("%s[%zu] = %g in a file of version %llu: a mix of versions", name, i,
                       (double)buf[i], (unsigned long long)v);
  }
  return v;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Children save versions in a loop and report each finished save through a pipe; the parent
 * kills them at random moments. After each kill the path holds the last reported version or
 * the one whose save was under way (its rename can land just before the kill), or nothing if
 * no save ever finished. Temp files of killed saves may remain in the folder (nothing reads
 * them); the test counts them and removes them. */
Test(checkpoint, killed_saves_leave_a_complete_file, .timeout = 240) {
  mn_tmp_dir t = mn_tmp_dir_make("mn_checkpoint");
  const char *path = mn_tmp_path(&t, "ck.safetensors");
  mn_graph *g = big_graph();
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true),
             *check = mn_test_session(g, MN_BACKEND_CPU, true);
  float *buf = malloc(BIG_NUMEL * sizeof *buf);

  /* One save's duration sets the range of kill delays. */
  set_version(s, buf, 1);
  double t0 = now_ms();
  cr_assert_eq(mn_session_save_checkpoint(s, path), MN_OK, "%s", mn_last_error());
  double save_ms = now_ms() - t0;
  unlink(path);

  srand(12345);
  uint64_t last_done = 0; /* the newest version any child reported as saved */
  int absent = 0;
  for (int kill_no = 0; kill_no < KILLS; kill_no++) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    uint64_t first = (uint64_t)(kill_no + 1) * 1000; /* distinct versions per child */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      for (uint64_t v = first; v < first + 1000; v++) {
        set_version(s, buf, v);
        if (mn_session_save_checkpoint(s, path) != MN_OK) _exit(2);
        if (write(fds[1], &v, sizeof v) != (ssize_t)sizeof v) _exit(4);
      }
      _exit(0);
    }
    close(fds[1]);
    /* Between 0 and 2.5 saves: kills land before, inside and between saves. */
    double delay_ms = (double)rand() / RAND_MAX * 2.5 * save_ms;
    struct timespec delay = {.tv_sec = (time_t)(delay_ms / 1000),
                             .tv_nsec = (long)(fmod(delay_ms, 1000.0) * 1e6)};
    nanosleep(&delay, NULL);
    kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status), "child exited by itself (status %d)", status);
    uint64_t v, reported = 0;
    while (read(fds[0], &v, sizeof v) == (ssize_t)sizeof v)
      reported = v;
    close(fds[0]);
    if (reported) last_done = reported;
    uint64_t in_flight = reported ? reported + 1 : first;

    if (access(path, F_OK) != 0) {
      cr_assert_eq(errno, ENOENT);
      cr_assert_eq(last_done, 0, "the checkpoint vanished after version %llu was saved",
                   (unsigned long long)last_done);
      absent++;
      continue;
    }
    uint64_t got = loaded_version(check, path, buf);
    cr_assert(got == in_flight || (got == last_done && last_done != 0),
              "file holds version %llu; saved %llu, in flight %llu", (unsigned long long)got,
              (unsigned long long)last_done, (unsigned long long)in_flight);
    if (got == in_flight) last_done = got;
  }
  size_t present = access(path, F_OK) == 0 ? 1 : 0;
  size_t leftovers = mn_tmp_dir_remove(&t) - present;
  cr_log_info("%d kills, save of %.0f ms: %d before any save finished, %zu leftover temp files",
              KILLS, save_ms, absent, leftovers);
  free(buf);
  mn_session_free(s);
  mn_session_free(check);
  mn_graph_free(g);
}
