/* The user graph and session options of the plan-cache fuzz target (fuzz/fuzz_plan_cache.c),
 * shared with tests/test_fuzz_seeds.c, which checks that its seeds are caches of this graph. */
#ifndef MN_FUZZ_PLAN_CACHE_GRAPH_H
#define MN_FUZZ_PLAN_CACHE_GRAPH_H

#include "session/session.h"

/* Leaves of every kind, a user constant, an unused parameter, enough ops (matmul, norm,
 * activations, a dropout with its seed, a loss) for the lowered graph to hold several backward
 * ops, and two sibling products of x, which the options below concatenate into a derived
 * parameter (so that the seeds hold a table of sources). */
static inline mn_graph *mn_fuzz_plan_cache_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 3));
  mn_node y = mn_input(g, "y", MN_SHAPE(4, 2));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 2));
  mn_node b = mn_parameter(g, "b", MN_SHAPE(2));
  mn_node nw = mn_parameter(g, "norm.weight", MN_SHAPE(2));
  mn_parameter(g, "unused", MN_SHAPE(5));
  float shift[2] = {0.5f, -1.0f};
  mn_node c = mn_constant(g, shift, MN_SHAPE(2));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w), b));
  mn_node q = mn_matmul_bt(g, x, mn_parameter(g, "q.weight", MN_SHAPE(2, 3)));
  mn_node k = mn_matmul_bt(g, x, mn_parameter(g, "k.weight", MN_SHAPE(2, 3)));
  h = mn_add(g, h, mn_mul(g, q, k));
  h = mn_rms_norm(g, mn_scale(g, mn_bias_add(g, h, c), 0.5f), nw, 1e-5f);
  mn_node loss = mn_mse_loss(g, mn_tanh(g, mn_dropout(g, h, 0.25f)), y);
  mn_set_outputs(g, &loss, 1);
  return g;
}

static inline mn_session_options mn_fuzz_plan_cache_options(void) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.siblings = MN_SIBLINGS_ALWAYS;
  return o;
}

#endif
