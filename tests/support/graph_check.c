#include "tests/support/graph_check.h"

#include "tests/support/mn_test.h"

mn_session_options mn_test_cpu_options(bool optimize) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.optimize = optimize;
  return o;
}

mn_graph *mn_test_with_outputs(mn_graph *g, const mn_node *outs, size_t n) {
  mn_set_outputs(g, outs, n);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

size_t mn_test_count_op(const mn_graph *g, mn_op op) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += g->nodes[i].op == op;
  return n;
}
