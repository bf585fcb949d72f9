/* The MLP training step of issue 4: 784-512-512-10, batch 128, ReLU, softmax
 * cross-entropy, SGD. Prints one BENCH line (milliseconds per step, build times) for
 * scripts/gpu-test.sh; benchmarks/torch_steps.py times the same step in PyTorch. */
#include "benchmarks/common/step_bench.h"

enum { B = 128, IN = 784, H = 512, OUT = 10 };

static mn_graph *mlp_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node h = mn_input(g, "x", MN_SHAPE(B, IN));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(B));
  const int64_t dims[] = {IN, H, H, OUT};
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

int main(int argc, char **argv) {
  bench_step b = bench_step_begin(argc, argv, mlp_graph);
  mn_session *s = b.s;
  float *x = malloc(sizeof(float) * B * IN);
  uint32_t labels[B];
  srand(1);
  for (int i = 0; i < B * IN; i++)
    x[i] = (float)rand() / (float)RAND_MAX;
  for (int i = 0; i < B; i++)
    labels[i] = (uint32_t)(rand() % OUT);
  bench_check(mn_session_set_input(s, "x", x, B * IN), "x");
  bench_check(mn_session_set_input_u32(s, "labels", labels, B), "labels");
  const int64_t dims[] = {IN, H, H, OUT};
  for (int l = 0; l < 3; l++) {
    size_t n = (size_t)(dims[l] * dims[l + 1]);
    float *w = malloc(n * sizeof *w);
    for (size_t k = 0; k < n; k++)
      w[k] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.1f;
    char wn[32];
    snprintf(wn, sizeof wn, "%d.weight", 2 * l);
    bench_check(mn_session_set_parameter(s, wn, w, n), "weights");
    free(w);
  }
  bench_check(mn_session_set_learning_rate(s, 0.01f), "lr");
  bench_step_end(&b, "mlp_step", bench_steps_ms(s, 50, 21, 100));
  free(x);
  return 0;
}
