#include "tests/support/gradcheck.h"

#include <stdio.h>
#include <stdlib.h>

size_t mn_gc_leaf_numel(const mn_gc_leaf *l) {
  size_t n = 1;
  for (int i = 0; i < l->rank; i++)
    n *= (size_t)l->shape[i];
  return n;
}

float mn_gc_leaf_draw(mn_rng *r, const mn_gc_leaf *l) {
  for (;;) {
    float v = l->lo + (l->hi - l->lo) * (float)mn_rng_uniform(r);
    if (fabsf(v) >= l->min_abs) return v;
  }
}

mn_graph *mn_gc_graph(const char *what, const mn_gc_leaf *leaves, int num_leaves, mn_gc_build build,
                      void *user, mn_rng *rng, float r_lo, float r_hi, float **params, mn_node *y,
                      mn_node *loss) {
  mn_graph *g = mn_graph_new();
  mn_node nodes[16];
  cr_assert(num_leaves <= 16);
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    size_t n = mn_gc_leaf_numel(l);
    params[i] = NULL;
    if (l->u32) {
      nodes[i] = mn_input_u32(g, l->name, l->shape, l->rank);
      continue;
    }
    /* x = p * c with c in [0.5, 1.5]: the op sees a computed tensor. */
    float *c = malloc(n * sizeof *c), *p = malloc(n * sizeof *p);
    for (size_t k = 0; k < n; k++) {
      c[k] = 0.5f + (float)mn_rng_uniform(rng);
      p[k] = mn_gc_leaf_draw(rng, l) / c[k];
    }
    nodes[i] = mn_mul(g, mn_parameter(g, l->name, l->shape, l->rank),
                      mn_constant(g, c, l->shape, l->rank));
    params[i] = p;
    free(c);
  }
  *y = build(g, nodes, user);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s: building: %s", what, mn_graph_error(g));
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, *y, &info), MN_OK);
  size_t ny = (size_t)mn_tensor_type_numel(&info.type);
  float *r = malloc(ny * sizeof *r);
  mn_rng_fill(rng, r, ny, r_lo, r_hi);
  *loss = mn_sum_all(g, mn_mul(g, *y, mn_constant(g, r, info.type.shape, info.type.rank)));
  free(r);
  return g;
}

static float run_loss(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "step: %s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "wait: %s", mn_last_error());
  return mn_session_read_loss(s);
}

double mn_gradcheck(const char *what, const mn_gc_leaf *leaves, int num_leaves, mn_gc_build build,
                    void *user, const mn_gc_options *opts) {
  mn_gc_options o = {.h = 1e-3, .tol = 2e-3, .seed = 42, .max_probes = 64};
  if (opts) {
    if (opts->h > 0) o.h = opts->h;
    if (opts->tol > 0) o.tol = opts->tol;
    if (opts->seed) o.seed = opts->seed;
    if (opts->max_probes) o.max_probes = opts->max_probes;
  }
  mn_rng rng = mn_rng_new(o.seed);
  cr_assert(num_leaves <= 16);
  float *params[16] = {0};
  mn_node y, loss;
  mn_graph *g =
      mn_gc_graph(what, leaves, num_leaves, build, user, &rng, -1.0f, 1.0f, params, &y, &loss);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s: loss: %s", what, mn_graph_error(g));

  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &so, &s), MN_OK, "%s: build: %s", what, mn_last_error());
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    size_t n = mn_gc_leaf_numel(l);
    if (l->u32) {
      uint32_t *u = malloc(n * sizeof *u);
      for (size_t k = 0; k < n; k++)
        u[k] = l->fixed_u32 ? l->fixed_u32[k] : (uint32_t)(mn_rng_uniform(&rng) * l->below);
      cr_assert_eq(mn_session_set_input_u32(s, l->name, u, n), MN_OK, "%s", mn_last_error());
      free(u);
    } else {
      cr_assert_eq(mn_session_set_parameter(s, l->name, params[i], n), MN_OK, "%s",
                   mn_last_error());
    }
  }
  run_loss(s);
  /* Every analytic gradient is read now: the probes below run further steps, after
   * which read_grad would describe a perturbed point. */
  float *analytic[16] = {0};
  for (int i = 0; i < num_leaves; i++) {
    if (leaves[i].u32) continue;
    size_t n = mn_gc_leaf_numel(&leaves[i]);
    analytic[i] = malloc(n * sizeof *analytic[i]);
    cr_assert_eq(mn_session_read_grad(s, leaves[i].name, analytic[i], n), MN_OK, "%s",
                 mn_last_error());
  }

  double worst = 0;
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    if (l->u32) continue;
    size_t n = mn_gc_leaf_numel(l);
    float *ad = analytic[i], *p = params[i];
    size_t probes = n < o.max_probes ? n : o.max_probes, stride = n / probes;
    double num = 0, den = 0, worst_d = -1;
    size_t worst_k = 0;
    float worst_ad = 0, worst_fd = 0;
    for (size_t j = 0; j < probes; j++) {
      size_t k = j * stride;
      float saved = p[k];
      p[k] = (float)(saved + o.h);
      double hp = (double)p[k] - saved;
      mn_session_set_parameter(s, l->name, p, n);
      double lp = run_loss(s);
      p[k] = (float)(saved - o.h);
      double hm = saved - (double)p[k];
      mn_session_set_parameter(s, l->name, p, n);
      double lm = run_loss(s);
      p[k] = saved;
      mn_session_set_parameter(s, l->name, p, n);
      double fd = (lp - lm) / (hp + hm), d = (double)ad[k] - fd;
      num += d * d;
      den += fd * fd;
      if (fabs(d) > worst_d) {
        worst_d = fabs(d);
        worst_k = k;
        worst_ad = ad[k];
        worst_fd = (float)fd;
      }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (rel > worst) worst = rel;
    cr_assert(rel <= o.tol,
              "%s: gradient of \"%s\": relative error %.3g > %.3g; worst at [%zu]: analytic %.7g, "
              "finite difference %.7g",
              what, l->name, rel, o.tol, worst_k, (double)worst_ad, (double)worst_fd);
    free(ad);
    free(p);
  }
  mn_session_free(s);
  mn_graph_free(g);
  return worst;
}
