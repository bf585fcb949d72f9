/* The graph builder core: leaves, outputs, inspection, sticky errors, toposort. */
#include <stdlib.h>

#include "support/mn_test.h"

Test(graph, mlp_forward_runs_on_cpu) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(2, 3));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(3, 2));
  mn_node y = mn_matmul(g, x, w);
  mn_set_outputs(g, &y, 1);
  float xd[] = {1, 2, 3, 4, 5, 6}, wd[] = {1, 0, 0, 1, 1, 1};
  mn_test_feed feeds[] = {{"x", xd, NULL, 6, false}, {"w", wd, NULL, 6, true}};
  mn_session *s = mn_test_run(g, feeds, 2);
  float *out = mn_test_read_output(s, 0, 4);
  float want[] = {4, 5, 10, 11};
  mn_assert_close(out, want, 4, 0);
  free(out);
  mn_session_free(s);
  mn_graph_free(g);
}
