/* mn_build_session_cached: a warm build (plan read from the cache) trains bit for bit like
 * mn_build_session; a changed graph, other options or another library version make the cache
 * stale; a damaged file is corrupt; either costs exactly one warning line and a rebuild that
 * rewrites the file. Also the reader's validation, called directly on edited cache text. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/plan_cache.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

#define STEPS 3

/* ---------------------------------------------------------------- files and stderr */

/* A fresh folder and the cache file's path in it (not created). */
typedef struct cache_dir {
  mn_tmp_dir t;
  char cache[128];
} cache_dir;

static cache_dir make_dir(void) {
  cache_dir c = {.t = mn_tmp_dir_make("mn_plan_cache")};
  snprintf(c.cache, sizeof c.cache, "%s", mn_tmp_path(&c.t, "plan.json"));
  return c;
}

static void remove_dir(const cache_dir *c) { mn_tmp_dir_remove(&c->t); }

/* text with its first `from` replaced by `to`, malloc'd; text must contain `from` (`where`
 * names the text in the failure). */
static char *replace_first(const char *text, const char *from, const char *to, const char *where) {
  const char *at = strstr(text, from);
  cr_assert_not_null(at, "\"%s\" not in the %s", from, where);
  size_t head = (size_t)(at - text);
  char *out = malloc(strlen(text) - strlen(from) + strlen(to) + 1);
  memcpy(out, text, head);
  strcpy(out + head, to);
  strcat(out, at + strlen(from));
  return out;
}

/* Replaces the first `from` in the file with `to`; the file must contain it. */
static void edit_file(const char *path, const char *from, const char *to) {
  char *text = mn_test_read_file(path, NULL);
  char *out = replace_first(text, from, to, "cache file");
  mn_test_write_file(path, out, strlen(out));
  free(out);
  free(text);
}

/* Sets the file's mtime to a fixed past time; a later rewrite changes it. */
static void age_file(const char *path) {
  struct timespec t[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  cr_assert_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

static bool file_was_rewritten(const char *path) {
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0, "%s missing", path);
  return sb.st_mtim.tv_sec != 1000000000;
}

/* Everything written to fd 2 between begin and end. */
typedef struct capture {
  int saved, fd;
  char text[4096];
} capture;

static void capture_begin(capture *c) {
  char name[] = "/tmp/mn_plan_cache_err_XXXXXX";
  fflush(stderr);
  c->fd = mkstemp(name);
  cr_assert_geq(c->fd, 0);
  unlink(name);
  c->saved = dup(2);
  dup2(c->fd, 2);
}

static const char *capture_end(capture *c) {
  fflush(stderr);
  dup2(c->saved, 2);
  close(c->saved);
  lseek(c->fd, 0, SEEK_SET);
  ssize_t n = read(c->fd, c->text, sizeof c->text - 1);
  c->text[n > 0 ? n : 0] = '\0';
  close(c->fd);
  return c->text;
}

/* ---------------------------------------------------------------- models and training */

typedef struct mlp_config {
  int64_t hidden;
  float scale;
} mlp_config;

/* A constant the user made (referenced by index in the cache) and an unused parameter (no
 * gradient slot) next to an ordinary MLP. */
static mn_graph *mlp_graph(mlp_config c) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 6));
  mn_node y = mn_input(g, "y", MN_SHAPE(8, 3));
  mn_node w1 = mn_parameter(g, "fc1.weight", MN_SHAPE(6, c.hidden));
  mn_node b1 = mn_parameter(g, "fc1.bias", MN_SHAPE(c.hidden));
  mn_node w2 = mn_parameter(g, "fc2.weight", MN_SHAPE(c.hidden, 3));
  mn_node b2 = mn_parameter(g, "fc2.bias", MN_SHAPE(3));
  mn_parameter(g, "unused", MN_SHAPE(2));
  float shift[3] = {0.25f, -0.5f, 1.0f};
  mn_node k = mn_constant(g, shift, MN_SHAPE(3));
  mn_node h = mn_scale(g, mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1)), c.scale);
  mn_node pred = mn_bias_add(g, mn_bias_add(g, mn_matmul(g, h, w2), b2), k);
  mn_node loss = mn_mse_loss(g, pred, y);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_graph *default_mlp(void) { return mlp_graph((mlp_config){.hidden = 16, .scale = 0.5f}); }

static mn_graph *block_graph(void) {
  const mn_test_block_config *c = &mn_test_tiny_block;
  mn_graph *g = mn_graph_new();
  mn_node h = mn_input(g, "h", MN_SHAPE(6, c->d_model));
  mn_node target = mn_input(g, "target", MN_SHAPE(6, c->d_model));
  mn_test_block_weights w = mn_test_block_params(g, c, 0);
  mn_node out = mn_test_block(g, c, &w, h);
  mn_node loss = mn_mse_loss(g, out, target);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_session_options cpu(void) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  return o;
}

typedef struct run {
  float losses[STEPS];
  float *params;
  size_t num_params;
} run;

/* Feeds every input and parameter from one seeded stream in node order, so sessions of the
 * same graph start equal; then AdamW with clipping. */
static run train(mn_session *s, const mn_graph *g) {
  mn_rng rng = mn_rng_new(42);
  run r = {.params = NULL};
  mn_test_init_uniform(g, s, &rng, -0.5f, 0.5f, true);
  cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
  cr_assert_eq(mn_session_set_grad_clip(s, 0.5f), MN_OK);
  for (int t = 0; t < STEPS; t++) {
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    r.losses[t] = mn_session_read_loss(s);
  }
  r.params = mn_test_read_params(g, s);
  r.num_params = mn_test_param_count(g);
  return r;
}

static void assert_same_run(const run *a, const run *b) {
  cr_assert(memcmp(a->losses, b->losses, sizeof a->losses) == 0,
            "losses differ: %.9g %.9g %.9g vs %.9g %.9g %.9g", a->losses[0], a->losses[1],
            a->losses[2], b->losses[0], b->losses[1], b->losses[2]);
  cr_assert_eq(a->num_params, b->num_params);
  cr_assert(memcmp(a->params, b->params, a->num_params * sizeof(float)) == 0, "params differ");
}

static run train_uncached(const mn_graph *g) {
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  run r = train(s, g);
  mn_session_free(s);
  return r;
}

/* A cached build that must print `want_stderr` exactly, then a training run. */
static run train_cached(const mn_graph *g, const char *cache, const mn_session_options *o,
                        const char *want_stderr) {
  mn_session *s = NULL;
  capture c;
  capture_begin(&c);
  mn_status st = mn_build_session_cached(g, cache, o, &s);
  const char *err = capture_end(&c);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  cr_assert_str_eq(err, want_stderr);
  run r = train(s, g);
  mn_session_free(s);
  return r;
}

static void run_free(run *r) { free(r->params); }

static char *warning(const char *path, const char *state, const char *why) {
  static char buf[512];
  snprintf(buf, sizeof buf, "meganeura: plan cache %s is %s (%s); rebuilding\n", path, state, why);
  return buf;
}

/* Cold (no file: silent, writes it), warm (silent, reads it, leaves it alone), both equal to
 * the uncached build bit for bit. */
static void check_cold_and_warm(mn_graph *g) {
  cache_dir t = make_dir();
  mn_session_options o = cpu();
  run ref = train_uncached(g);
  run cold = train_cached(g, t.cache, &o, "");
  assert_same_run(&ref, &cold);
  age_file(t.cache);
  run warm = train_cached(g, t.cache, &o, "");
  cr_assert(!file_was_rewritten(t.cache), "a warm build rewrote the cache");
  assert_same_run(&ref, &warm);
  run_free(&ref);
  run_free(&cold);
  run_free(&warm);
  remove_dir(&t);
  mn_graph_free(g);
}

Test(plan_cache, mlp_cached_trains_like_uncached) { check_cold_and_warm(default_mlp()); }

Test(plan_cache, transformer_block_cached_trains_like_uncached) {
  check_cold_and_warm(block_graph());
}

/* The cache is written for graph a; building b must say stale, rebuild, and rewrite it. */
static void check_stale(mn_graph *a, mn_graph *b, const mn_session_options *oa,
                        const mn_session_options *ob, const char *why) {
  cache_dir t = make_dir();
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session_cached(a, t.cache, oa, &s), MN_OK, "%s", mn_last_error());
  mn_session_free(s);
  age_file(t.cache);
  run ref = train_uncached(b);
  run got = train_cached(b, t.cache, ob, warning(t.cache, "stale", why));
  assert_same_run(&ref, &got);
  cr_assert(file_was_rewritten(t.cache));
  run again = train_cached(b, t.cache, ob, "");
  assert_same_run(&ref, &again);
  run_free(&ref);
  run_free(&got);
  run_free(&again);
  remove_dir(&t);
  mn_graph_free(a);
  mn_graph_free(b);
}

Test(plan_cache, changed_attribute_is_stale) {
  mn_session_options o = cpu();
  check_stale(default_mlp(), mlp_graph((mlp_config){.hidden = 16, .scale = 0.25f}), &o, &o,
              "key mismatch");
}

Test(plan_cache, changed_shape_is_stale) {
  mn_session_options o = cpu();
  check_stale(default_mlp(), mlp_graph((mlp_config){.hidden = 12, .scale = 0.5f}), &o, &o,
              "key mismatch");
}

Test(plan_cache, changed_options_are_stale) {
  mn_session_options a = cpu(), b = cpu();
  b.allow_tf32 = true;
  check_stale(default_mlp(), default_mlp(), &a, &b, "key mismatch");
  mn_session_options c = cpu();
  c.optimize = false;
  check_stale(default_mlp(), default_mlp(), &a, &c, "key mismatch");
}

Test(plan_cache, device_ordinal_is_not_part_of_the_key) {
  cache_dir t = make_dir();
  mn_graph *g = default_mlp();
  mn_session_options a = cpu(), b = cpu();
  b.device = 3;
  run first = train_cached(g, t.cache, &a, "");
  run second = train_cached(g, t.cache, &b, "");
  assert_same_run(&first, &second);
  run_free(&first);
  run_free(&second);
  mn_graph_free(g);
  remove_dir(&t);
}

/* Fusion and sibling modes change what lowering makes: a cache written with the default modes
 * is stale for another mode (then rewritten for it), and a cache written with a mode is read
 * back by a build with the same mode. */
Test(plan_cache, fusion_and_siblings_modes_are_part_of_the_key) {
  mn_session_options modes[3] = {cpu(), cpu(), cpu()}, base = cpu();
  modes[0].fusion = MN_FUSION_OFF;
  modes[1].siblings = MN_SIBLINGS_ALWAYS;
  modes[2].siblings = MN_SIBLINGS_NEVER;
  mn_graph *g = block_graph();
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    cache_dir t = make_dir();
    mn_session *s = NULL;
    cr_assert_eq(mn_build_session_cached(g, t.cache, &base, &s), MN_OK, "%s", mn_last_error());
    mn_session_free(s);
    for (int pass = 0; pass < 2; pass++) {
      age_file(t.cache);
      capture c;
      capture_begin(&c);
      mn_status st = mn_build_session_cached(g, t.cache, &modes[i], &s);
      const char *err = capture_end(&c);
      cr_assert_eq(st, MN_OK, "%s", mn_last_error());
      mn_session_free(s);
      cr_assert_str_eq(err, pass ? "" : warning(t.cache, "stale", "key mismatch"), "mode %zu", i);
      cr_assert_eq(file_was_rewritten(t.cache), pass == 0, "mode %zu, build %d", i, pass);
    }
    /* The reader itself: the other mode's options miss as stale, the same mode's hit. */
    char *text = mn_test_read_file(t.cache, NULL), why[256];
    mn_plan *plan = NULL;
    mn_status st = mn_plan_cache_parse(text, strlen(text), g, &base, MN_PLAN_CACHE_VERIFY_CHECKSUM,
                                       &plan, why, sizeof why);
    cr_assert_eq(st, MN_ERR_STATE, "mode %zu: %s", i, why);
    cr_assert_str_eq(why, "key mismatch");
    cr_assert_null(plan);
    st = mn_plan_cache_parse(text, strlen(text), g, &modes[i], MN_PLAN_CACHE_VERIFY_CHECKSUM, &plan,
                             why, sizeof why);
    cr_assert_eq(st, MN_OK, "mode %zu: %s", i, why);
    mn_plan_free(plan);
    free(text);
    remove_dir(&t);
  }
  mn_graph_free(g);
}

Test(plan_cache, other_library_version_is_stale) {
  cache_dir t = make_dir();
  mn_graph *g = default_mlp();
  mn_session_options o = cpu();
  run ref = train_cached(g, t.cache, &o, "");
  edit_file(t.cache, "\"library_version\":\"" MN_VERSION_STRING "\"",
            "\"library_version\":\"0.0.1\"");
  char why[128];
  snprintf(why, sizeof why, "written by meganeura 0.0.1, this is %s", MN_VERSION_STRING);
  run got = train_cached(g, t.cache, &o, warning(t.cache, "stale", why));
  assert_same_run(&ref, &got);
  run again = train_cached(g, t.cache, &o, "");
  run_free(&ref);
  run_free(&got);
  run_free(&again);
  mn_graph_free(g);
  remove_dir(&t);
}

/* The file is damaged by `damage`; the build must say corrupt (why), rebuild and rewrite it. */
static void check_corrupt(void (*damage)(const char *path), const char *why) {
  cache_dir t = make_dir();
  mn_graph *g = default_mlp();
  mn_session_options o = cpu();
  run ref = train_uncached(g);
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session_cached(g, t.cache, &o, &s), MN_OK, "%s", mn_last_error());
  mn_session_free(s);
  damage(t.cache);
  age_file(t.cache);
  run got = train_cached(g, t.cache, &o, warning(t.cache, "corrupt", why));
  assert_same_run(&ref, &got);
  cr_assert(file_was_rewritten(t.cache));
  run again = train_cached(g, t.cache, &o, "");
  assert_same_run(&ref, &again);
  run_free(&ref);
  run_free(&got);
  run_free(&again);
  mn_graph_free(g);
  remove_dir(&t);
}

static void truncate_half(const char *path) {
  size_t n;
  char *text = mn_test_read_file(path, &n);
  mn_test_write_file(path, text, n / 2);
  free(text);
}

static void garbage(const char *path) {
  unsigned char junk[700];
  mn_rng rng = mn_rng_new(7);
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (unsigned char)(mn_rng_uniform(&rng) * 256);
  junk[0] = 0x89; /* not '{' whatever the generator says */
  mn_test_write_file(path, junk, sizeof junk);
}

static void empty(const char *path) { mn_test_write_file(path, "", 0); }
static void unknown_op(const char *path) {
  edit_file(path, "\"op\":\"bias_add\"", "\"op\":\"frobnicate\"");
}
/* Still valid JSON with a plausible value, and the key still matches: the checksum catches it. */
static void changed_attribute(const char *path) {
  edit_file(path, "\"scale\":0.5", "\"scale\":0.25");
}
static void not_a_cache(const char *path) { mn_test_write_file(path, "{\"hello\":1}", 11); }
static void wrong_arity(const char *path) {
  edit_file(path, "\"op\":\"bias_add\",\"in\":[", "\"op\":\"bias_add\",\"in\":[0,");
}

Test(plan_cache, truncated_file_is_corrupt) { check_corrupt(truncate_half, "not valid JSON"); }
Test(plan_cache, garbage_file_is_corrupt) { check_corrupt(garbage, "not valid JSON"); }
Test(plan_cache, empty_file_is_corrupt) { check_corrupt(empty, "not valid JSON"); }
Test(plan_cache, other_json_is_corrupt) {
  check_corrupt(not_a_cache, "no \"format\": \"meganeura-plan-cache\"");
}
/* The first bias_add's node number in the cached plan of default_mlp() (the relu is inside a
 * fused node there). Node numbers are those of the lowered graph, where inputs and parameters
 * come first. */
static size_t cached_bias_add_node(void) {
  cache_dir t = make_dir();
  mn_graph *g = default_mlp();
  mn_session_options o = cpu();
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session_cached(g, t.cache, &o, &s), MN_OK);
  const mn_graph *lowered = mn_session_plan(s)->graph;
  size_t node = 0;
  while (lowered->nodes[node].op != MN_OP_BIAS_ADD)
    node++;
  mn_session_free(s);
  mn_graph_free(g);
  remove_dir(&t);
  return node;
}
Test(plan_cache, unknown_op_is_rejected) {
  char why[64];
  snprintf(why, sizeof why, "node %zu: unknown op \"frobnicate\"", cached_bias_add_node());
  check_corrupt(unknown_op, why);
}
Test(plan_cache, wrong_arity_is_rejected) {
  char why[64];
  snprintf(why, sizeof why, "node %zu: bias_add takes 2 inputs, not 3", cached_bias_add_node());
  check_corrupt(wrong_arity, why);
}
Test(plan_cache, changed_value_fails_the_checksum) {
  check_corrupt(changed_attribute, "checksum mismatch");
}

Test(plan_cache, unreadable_cache_path_is_corrupt_and_unwritable_is_reported) {
  cache_dir t = make_dir();
  mn_graph *g = default_mlp();
  mn_session_options o = cpu();
  /* A folder where the file should be: cannot be read as a cache nor replaced by one. */
  cr_assert_eq(mkdir(t.cache, 0700), 0);
  mn_session *s = NULL;
  capture c;
  capture_begin(&c);
  mn_status st = mn_build_session_cached(g, t.cache, &o, &s);
  const char *err = capture_end(&c);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  cr_assert(strstr(err, "is corrupt (not a regular file") != NULL, "stderr: %s", err);
  cr_assert(strstr(err, "not written: cannot write") != NULL, "stderr: %s", err);
  mn_session_free(s);
  rmdir(t.cache);
  mn_graph_free(g);
  remove_dir(&t);
}

Test(plan_cache, missing_folder_still_builds) {
  mn_graph *g = default_mlp();
  mn_session_options o = cpu();
  mn_session *s = NULL;
  capture c;
  capture_begin(&c);
  mn_status st = mn_build_session_cached(g, "/nonexistent_mn_dir/plan.json", &o, &s);
  const char *err = capture_end(&c);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  cr_assert(strstr(err, "meganeura: plan cache /nonexistent_mn_dir/plan.json not written: "
                        "cannot create") != NULL,
            "stderr: %s", err);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(plan_cache, argument_errors) {
  mn_graph *g = default_mlp();
  mn_session *s = NULL;
  mn_assert_error(mn_build_session_cached(NULL, "/tmp/x.json", NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session_cached: graph is NULL");
  mn_assert_error(mn_build_session_cached(g, NULL, NULL, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session_cached: cache_path is NULL");
  mn_assert_error(mn_build_session_cached(g, "/tmp/x.json", NULL, NULL), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session_cached: out is NULL");
  mn_graph *empty_graph = mn_graph_new();
  mn_assert_error(mn_build_session_cached(empty_graph, "/tmp/x.json", NULL, &s),
                  MN_ERR_INVALID_ARGUMENT, "mn_build_session_cached: graph has no outputs");
  mn_graph_free(empty_graph);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- the reader, directly */

typedef struct cached_text {
  mn_graph *g;
  char *json;
} cached_text;

static cached_text serialized_mlp(void) {
  cached_text c = {.g = default_mlp()};
  mn_session_options o = cpu();
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", c.g, &o, &plan), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_plan_cache_serialize(plan, c.g, &o, &c.json), MN_OK);
  mn_plan_free(plan);
  return c;
}

/* Parses json with `from` replaced by `to` (checksum not verified, as the fuzzer does, so that
 * the structural checks themselves are what rejects it). */
static mn_status parse_edited(const cached_text *c, const char *from, const char *to, char *why,
                              size_t why_size) {
  char *text = replace_first(c->json, from, to, "cache text");
  mn_session_options o = cpu();
  mn_plan *plan = NULL;
  mn_status st = mn_plan_cache_parse(text, strlen(text), c->g, &o, 0, &plan, why, why_size);
  if (st == MN_OK) mn_plan_free(plan);
  free(text);
  return st;
}

static void expect_rejected(const char *from, const char *to, mn_status want, const char *part) {
  cached_text c = serialized_mlp();
  char why[256];
  mn_status st = parse_edited(&c, from, to, why, sizeof why);
  cr_assert_eq(st, want, "status %d, why: %s", (int)st, why);
  cr_assert(strstr(why, part) != NULL, "why \"%s\" lacks \"%s\"", why, part);
  free(c.json);
  mn_graph_free(c.g);
}

Test(plan_cache_reader, accepts_what_it_wrote) {
  cached_text c = serialized_mlp();
  char why[256] = "";
  mn_session_options o = cpu();
  mn_plan *plan = NULL;
  cr_assert_eq(mn_plan_cache_parse(c.json, strlen(c.json), c.g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM,
                                   &plan, why, sizeof why),
               MN_OK, "%s", why);
  cr_assert_gt(plan->num_params, 0);
  mn_plan_free(plan);
  /* The user's constant is referenced, the seed of autodiff (made by lowering) is inline. */
  cr_assert_not_null(strstr(c.json, "\"user_constant\":"));
  cr_assert_not_null(strstr(c.json, "\"data\":[1]"));
  free(c.json);
  mn_graph_free(c.g);
}

Test(plan_cache_reader, rejects_structural_damage) {
  expect_rejected("\"in\":[", "\"in\":[99999,", MN_ERR_FORMAT, "takes");
  expect_rejected("\"name\":\"fc1.weight\"", "\"name\":\"fc9.weight\"", MN_ERR_FORMAT,
                  "no parameter named \"fc9.weight\"");
  expect_rejected("\"dtype\":\"f32\"", "\"dtype\":\"f64\"", MN_ERR_FORMAT, "unknown dtype");
  expect_rejected("\"dtype\":\"f32\"", "\"dtype\":\"f32\",\"bogus\":1", MN_ERR_FORMAT,
                  "unknown field \"bogus\"");
  expect_rejected("\"dtype\":\"f32\"", "\"dtype\":\"f32\",\"dtype\":\"f32\"", MN_ERR_FORMAT,
                  "field dtype twice");
  expect_rejected("\"shape\":[8,6]", "\"shape\":[8,0]", MN_ERR_FORMAT, "bad dimension");
  expect_rejected("\"shape\":[8,6]", "\"shape\":[8,6,1,1,1,1,1]", MN_ERR_FORMAT, "rank above");
  expect_rejected("\"shape\":[8,6]", "\"shape\":[8,7]", MN_ERR_FORMAT, "another type");
  expect_rejected("\"param_grads\":[[", "\"param_grads\":[[0,1],[", MN_ERR_FORMAT,
                  "not a gradient slot");
  expect_rejected("\"num_user_outputs\":1", "\"num_user_outputs\":2", MN_ERR_FORMAT,
                  "num_user_outputs");
  expect_rejected("\"outputs\":[", "\"outputs\":[0,", MN_ERR_FORMAT, "");
  expect_rejected("\"data\":[1]", "\"data\":[1,2]", MN_ERR_FORMAT, "does not hold 1 numbers");
  expect_rejected("\"data\":[1]", "\"data\":[\"0x3f800000\"]", MN_ERR_FORMAT, "bad data value");
  expect_rejected("\"scale\":0.5", "\"scale\":0.5,\"bogus\":1", MN_ERR_FORMAT,
                  "unknown attribute \"bogus\"");
  expect_rejected("\"format_version\":2", "\"format_version\":3", MN_ERR_STATE, "format version 3");
  expect_rejected("\"key\":\"", "\"key\":\"0", MN_ERR_STATE, "key mismatch");
}

Test(plan_cache_reader, inputs_must_come_earlier) {
  cached_text c = serialized_mlp();
  /* "nodes" is the last field; point the first input of its first computed node at itself. */
  const char *nodes = strstr(c.json, "\"nodes\":[");
  const char *first = strstr(nodes, "\"in\":[");
  cr_assert_not_null(first);
  size_t self = 0;
  for (const char *p = strstr(nodes, "{\"op\""); p && p < first; p = strstr(p + 1, "{\"op\""))
    self++;
  self--; /* the node that holds `first` was counted too */
  char from[64], to[64], why[256];
  snprintf(from, sizeof from, "\"in\":[%ld,", strtol(first + 6, NULL, 10));
  snprintf(to, sizeof to, "\"in\":[%zu,", self);
  cr_assert_eq(parse_edited(&c, from, to, why, sizeof why), MN_ERR_FORMAT);
  cr_assert(strstr(why, "input is not an earlier node") != NULL, "%s", why);
  free(c.json);
  mn_graph_free(c.g);
}
