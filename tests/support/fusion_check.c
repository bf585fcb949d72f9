#include "tests/support/fusion_check.h"

#include <stdlib.h>

#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

mn_session_options mn_fz_cpu(bool optimize) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = optimize;
  return o;
}

mn_session *mn_fz_build(const mn_graph *g, mn_fz_mode m, bool training) {
  mn_session_options o = mn_fz_cpu(m != MN_FZ_UNOPTIMIZED);
  o.fusion = m == MN_FZ_FUSED ? MN_FUSION_AUTO : MN_FUSION_OFF;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

mn_plan *mn_fz_lower(const mn_graph *g, bool training) {
  mn_session_options o = mn_fz_cpu(true);
  mn_plan *p = NULL;
  mn_status st =
      training ? mn_lower_training("test", g, &o, &p) : mn_lower_inference("test", g, &o, &p);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return p;
}

size_t mn_fz_count_op(const mn_graph *g, mn_op op) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += g->nodes[i].op == op;
  return n;
}

static void feed(const mn_graph *g, mn_session *s, uint64_t seed, float lo, float hi) {
  mn_rng r = mn_rng_new(seed);
  mn_test_init_uniform(g, s, &r, lo, hi, true);
}

static float *read_outputs(const mn_graph *g, mn_session *s, size_t *total) {
  size_t n = 0;
  for (size_t k = 0; k < g->num_outputs; k++)
    n += (size_t)mn_tensor_type_numel(&g->nodes[g->outputs[k]].type);
  float *all = malloc((n ? n : 1) * sizeof *all), *at = all;
  for (size_t k = 0; k < g->num_outputs; k++) {
    size_t m = (size_t)mn_tensor_type_numel(&g->nodes[g->outputs[k]].type);
    cr_assert_eq(mn_session_read_output_by_index(s, k, at, m), MN_OK, "%s", mn_last_error());
    at += m;
  }
  *total = n;
  return all;
}

static float *read_grads(const mn_graph *g, mn_session *s, size_t *total) {
  size_t n = mn_test_param_count(g);
  float *all = malloc((n ? n : 1) * sizeof *all), *at = all;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *p = &g->nodes[i];
    if (p->op != MN_OP_PARAMETER) continue;
    size_t m = (size_t)mn_tensor_type_numel(&p->type);
    cr_assert_eq(mn_session_read_grad(s, p->name, at, m), MN_OK, "%s", mn_last_error());
    at += m;
  }
  *total = n;
  return all;
}

static const char *const mode_name[MN_FZ_NUM_MODES] = {"unoptimized", "optimized unfused", "fused"};

static void assert_bitwise(const float *fused, const float *other, size_t n, const char *what,
                           mn_fz_mode m, int step) {
  for (size_t i = 0; i < n; i++)
    cr_assert(memcmp(&fused[i], &other[i], sizeof *fused) == 0 ||
                  (isnan(fused[i]) && isnan(other[i])),
              "step %d, %s [%zu of %zu]: fused %.9g, %s %.9g", step, what, i, n, (double)fused[i],
              mode_name[m], (double)other[i]);
}

void mn_fz_agree_inference(const mn_graph *g, mn_fz_mode from, uint64_t seed, float lo, float hi) {
  size_t n[MN_FZ_NUM_MODES] = {0};
  float *out[MN_FZ_NUM_MODES] = {NULL};
  for (int m = from; m < MN_FZ_NUM_MODES; m++) {
    mn_session *s = mn_fz_build(g, (mn_fz_mode)m, false);
    feed(g, s, seed, lo, hi);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    out[m] = read_outputs(g, s, &n[m]);
    mn_session_free(s);
  }
  for (int m = from; m < MN_FZ_FUSED; m++) {
    cr_assert_eq(n[m], n[MN_FZ_FUSED]);
    assert_bitwise(out[MN_FZ_FUSED], out[m], n[m], "output", (mn_fz_mode)m, 0);
    free(out[m]);
  }
  free(out[MN_FZ_FUSED]);
}

enum { OUTPUTS, GRADS, PARAMS, KINDS };

void mn_fz_agree_training(const mn_graph *g, mn_fz_mode from, int steps, uint64_t seed, float lo,
                          float hi) {
  mn_session *s[MN_FZ_NUM_MODES] = {NULL};
  for (int m = from; m < MN_FZ_NUM_MODES; m++) {
    s[m] = mn_fz_build(g, (mn_fz_mode)m, true);
    feed(g, s[m], seed, lo, hi);
    cr_assert_eq(mn_session_set_adamw(s[m], 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
    cr_assert_eq(mn_session_set_grad_clip(s[m], 1.0f), MN_OK);
  }
  static const char *const what[KINDS] = {"output", "gradient", "parameter"};
  for (int t = 1; t <= steps; t++) {
    float loss[MN_FZ_NUM_MODES] = {0};
    size_t n[MN_FZ_NUM_MODES][KINDS] = {{0}};
    float *v[MN_FZ_NUM_MODES][KINDS] = {{NULL}};
    for (int m = from; m < MN_FZ_NUM_MODES; m++) {
      cr_assert_eq(mn_session_step(s[m]), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_wait(s[m]), MN_OK, "%s", mn_last_error());
      loss[m] = mn_session_read_loss(s[m]);
      v[m][OUTPUTS] = read_outputs(g, s[m], &n[m][OUTPUTS]);
      v[m][GRADS] = read_grads(g, s[m], &n[m][GRADS]);
      v[m][PARAMS] = mn_test_read_params(g, s[m]);
      n[m][PARAMS] = mn_test_param_count(g);
    }
    for (int m = from; m < MN_FZ_FUSED; m++) {
      assert_bitwise(&loss[MN_FZ_FUSED], &loss[m], 1, "loss", (mn_fz_mode)m, t);
      for (int k = 0; k < KINDS; k++) {
        cr_assert_eq(n[m][k], n[MN_FZ_FUSED][k]);
        assert_bitwise(v[MN_FZ_FUSED][k], v[m][k], n[m][k], what[k], (mn_fz_mode)m, t);
      }
    }
    for (int m = from; m < MN_FZ_NUM_MODES; m++)
      for (int k = 0; k < KINDS; k++)
        free(v[m][k]);
  }
  for (int m = from; m < MN_FZ_NUM_MODES; m++)
    mn_session_free(s[m]);
}
