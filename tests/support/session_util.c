#include "tests/support/session_util.h"

#include <math.h>
#include <stdlib.h>

mn_session *mn_test_session(const mn_graph *g, mn_backend backend, bool training) {
  return mn_test_session_precision(g, backend, MN_PRECISION_F32, training);
}

mn_session *mn_test_session_precision(const mn_graph *g, mn_backend backend, mn_precision prec,
                                      bool training) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.precision = prec;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

/* Node i's description, and whether it is a leaf of the kind asked for: a parameter, or an
 * input when `inputs`. */
static bool leaf_at(const mn_graph *g, size_t i, mn_node_info *info, bool inputs) {
  cr_assert_eq(mn_graph_node(g, (mn_node)i, info), MN_OK);
  return strcmp(info->op, "parameter") == 0 || (inputs && strcmp(info->op, "input") == 0);
}

static size_t numel(const mn_node_info *info) { return (size_t)mn_tensor_type_numel(&info->type); }

void mn_test_init_normal(const mn_graph *g, mn_session *const *sessions, size_t n, mn_rng *r,
                         float std, bool norms_at_one) {
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (!leaf_at(g, i, &info, false)) continue;
    size_t count = numel(&info);
    float *w = malloc(count * sizeof *w);
    bool ones = norms_at_one && strstr(info.name, "norm") != NULL;
    for (size_t k = 0; k < count; k++)
      w[k] = ones ? 1.0f : std * (float)mn_rng_normal(r);
    for (size_t j = 0; j < n; j++)
      cr_assert_eq(mn_session_set_parameter(sessions[j], info.name, w, count), MN_OK, "%s: %s",
                   info.name, mn_last_error());
    free(w);
  }
}

void mn_test_init_uniform(const mn_graph *g, mn_session *s, mn_rng *r, float lo, float hi,
                          bool with_inputs) {
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (!leaf_at(g, i, &info, with_inputs)) continue;
    size_t count = numel(&info);
    float *v = malloc(count * sizeof *v);
    mn_rng_fill(r, v, count, lo, hi);
    mn_status st = strcmp(info.op, "parameter") == 0
                       ? mn_session_set_parameter(s, info.name, v, count)
                       : mn_session_set_input(s, info.name, v, count);
    cr_assert_eq(st, MN_OK, "%s: %s", info.name, mn_last_error());
    free(v);
  }
}

size_t mn_test_param_count(const mn_graph *g) {
  mn_node_info info;
  size_t total = 0;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++)
    if (leaf_at(g, i, &info, false)) total += numel(&info);
  return total;
}

float *mn_test_read_params(const mn_graph *g, mn_session *s) {
  float *all = malloc(mn_test_param_count(g) * sizeof *all), *dst = all;
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (!leaf_at(g, i, &info, false)) continue;
    size_t count = numel(&info);
    cr_assert_eq(mn_session_read_param(s, info.name, dst, count), MN_OK, "%s", mn_last_error());
    dst += count;
  }
  return all;
}

void mn_test_assert_same_params(const mn_graph *g, mn_session *a, mn_session *b, double tol,
                                const char *when) {
  mn_node_info info;
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    if (!leaf_at(g, i, &info, false)) continue;
    size_t count = numel(&info);
    float *va = malloc(count * sizeof *va), *vb = malloc(count * sizeof *vb);
    cr_assert_eq(mn_session_read_param(a, info.name, va, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_param(b, info.name, vb, count), MN_OK, "%s", mn_last_error());
    if (tol == 0) {
      cr_assert(memcmp(va, vb, count * sizeof *va) == 0, "parameter %s differs %s", info.name,
                when);
    } else {
      double err = mn_test_rel_err(va, vb, count);
      cr_assert(err <= tol, "parameter %s %s: relative error %.3g above %.3g", info.name, when, err,
                tol);
    }
    free(va);
    free(vb);
  }
}

float mn_test_step_loss(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

double mn_test_fd_gradient_error(mn_session *s, const char *name, size_t n, const size_t *at,
                                 size_t count, double h) {
  float *p = malloc(n * sizeof *p), *ad = malloc(n * sizeof *ad);
  cr_assert(p && ad);
  cr_assert_eq(mn_session_read_param(s, name, p, n), MN_OK, "%s", mn_last_error());
  /* At the unperturbed point: earlier probes ran steps at other points. */
  mn_test_step_loss(s);
  cr_assert_eq(mn_session_read_grad(s, name, ad, n), MN_OK, "%s", mn_last_error());
  double num_sq = 0, den_sq = 0;
  for (size_t j = 0; j < count; j++) {
    size_t k = at[j] < n ? at[j] : n - 1;
    float saved = p[k];
    p[k] = (float)(saved + h);
    cr_assert_eq(mn_session_set_parameter(s, name, p, n), MN_OK);
    double lp = mn_test_step_loss(s), hp = (double)p[k] - saved;
    p[k] = (float)(saved - h);
    cr_assert_eq(mn_session_set_parameter(s, name, p, n), MN_OK);
    double lm = mn_test_step_loss(s), hm = saved - (double)p[k];
    p[k] = saved;
    cr_assert_eq(mn_session_set_parameter(s, name, p, n), MN_OK);
    double fd = (lp - lm) / (hp + hm), d = ad[k] - fd;
    num_sq += d * d;
    den_sq += fd * fd;
  }
  free(p);
  free(ad);
  return sqrt(num_sq / den_sq);
}
