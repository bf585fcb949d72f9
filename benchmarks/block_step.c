/* A Llama-style transformer block training step (SmolLM2-135M layer shape: D 576, 9
 * query heads over 3 kv heads of 64, SwiGLU 1536, RoPE, causal), batch 8, sequence 512,
 * AdamW, MSE against a target. The block is tests/support/models.c, the one the
 * gradient checks verify. benchmarks/torch_steps.py times the same step in PyTorch. */
#include "benchmarks/common/step_bench.h"
#include "tests/support/models.h"

enum { B = 8, T = 512 };
static const mn_test_block_config cfg = MN_TEST_BLOCK_CONFIG(576, 9, 3, 64, 1536);

static mn_graph *block_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(B, T, cfg.d_model));
  mn_node target = mn_input(g, "target", MN_SHAPE(B, T, cfg.d_model));
  mn_test_block_weights w = mn_test_block_params(g, &cfg, 0);
  mn_node y = mn_test_block(g, &cfg, &w, x);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, target)}, 1);
  return g;
}

static void fill_random(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 2.0f * scale;
}

int main(int argc, char **argv) {
  bench_step b = bench_step_begin(argc, argv, block_graph);
  mn_graph *g = b.g;
  mn_session *s = b.s;
  srand(2);
  size_t act = (size_t)B * T * (size_t)cfg.d_model;
  float *x = malloc(act * sizeof *x);
  fill_random(x, act, 1.0f);
  bench_check(mn_session_set_input(s, "x", x, act), "x");
  fill_random(x, act, 1.0f);
  bench_check(mn_session_set_input(s, "target", x, act), "target");
  free(x);
  for (size_t i = 0; i < mn_graph_num_nodes(g); i++) {
    mn_node_info info;
    mn_graph_node(g, (mn_node)i, &info);
    if (strcmp(info.op, "parameter") != 0) continue;
    size_t n = (size_t)mn_tensor_type_numel(&info.type);
    float *w = malloc(n * sizeof *w);
    if (info.type.rank == 1)
      for (size_t k = 0; k < n; k++)
        w[k] = 1.0f;
    else
      fill_random(w, n, 0.04f);
    bench_check(mn_session_set_parameter(s, info.name, w, n), info.name);
    free(w);
  }
  bench_check(mn_session_set_adamw(s, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f), "adamw");
  bench_step_end(&b, "block_step", bench_steps_ms(s, 10, 11, 10));
  return 0;
}
