/* The MLP training step of issue 4: 784-512-512-10, batch 128, ReLU, softmax
 * cross-entropy, SGD. Prints one BENCH line (milliseconds per step, build times) for
 * scripts/gpu-test.sh; benchmarks/torch_steps.py times the same step in PyTorch. */
#include "benchmarks/common/step_bench.h"
#include "benchmarks/mlp_graph.h"

enum { B = MLP_BATCH, IN = MLP_IN, H = MLP_HIDDEN, OUT = MLP_OUT };

int main(int argc, char **argv) {
  bench_step b = bench_step_begin(argc, argv, bench_mlp_graph);
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
