/* The CUDA runtime pieces that need no device: kernel compilation, the cubin cache and
 * compile errors; and, on a GPU, the one-launch-per-step contract. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/cuda_check.h"
#include "support/mn_test.h"
#ifdef MN_WITH_CUDA
#include "jit.h"
#endif

Test(cuda_runtime, an_mlp_graph_compiles_for_sm90) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(4, 8));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(8, 3));
  mn_node y = mn_matmul(g, x, w);
  mn_node t = mn_input(g, "t", MN_SHAPE(4, 3));
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t)}, 1);
  mn_test_assert_compiles(g, true);
  mn_graph_free(g);
}
