/* The MLP of issue 4, 784-512-512-10, batch 128, ReLU, softmax cross-entropy: the graph of
 * bench_mlp_step, and of bench_plan_kernels mlp (its kernels compiled where no GPU is). */
#ifndef MN_BENCH_MLP_GRAPH_H
#define MN_BENCH_MLP_GRAPH_H

#include <stdio.h>

#include "meganeura.h"

enum { MLP_BATCH = 128, MLP_IN = 784, MLP_HIDDEN = 512, MLP_OUT = 10 };

/* in-hidden-hidden-out with biases and ReLU: input "x" [batch, in], u32 "labels" [batch],
 * parameters "<2l>.weight" [fan_in, fan_out] and "<2l>.bias" (torch.nn.Sequential's names),
 * softmax cross-entropy. Also the tests' MLP (tests/support/models.h). */
static inline mn_graph *bench_relu_mlp(int64_t batch, int64_t in, int64_t hidden, int64_t out) {
  mn_graph *g = mn_graph_new();
  mn_node h = mn_input(g, "x", MN_SHAPE(batch, in));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(batch));
  const int64_t dims[] = {in, hidden, hidden, out};
  for (int l = 0; l < 3; l++) {
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%d.weight", 2 * l);
    snprintf(bn, sizeof bn, "%d.bias", 2 * l);
    mn_node w = mn_parameter(g, wn, MN_SHAPE(dims[l], dims[l + 1]));
    mn_node b = mn_parameter(g, bn, MN_SHAPE(dims[l + 1]));
    h = mn_bias_add(g, mn_matmul(g, h, w), b);
    if (l < 2) h = mn_relu(g, h);
  }
  mn_set_outputs(g, (mn_node[]){mn_sparse_cross_entropy_loss(g, h, labels)}, 1);
  return g;
}

static inline mn_graph *bench_mlp_graph(void) {
  return bench_relu_mlp(MLP_BATCH, MLP_IN, MLP_HIDDEN, MLP_OUT);
}

#endif
