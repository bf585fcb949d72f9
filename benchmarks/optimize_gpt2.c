/* Reports what the graph optimizer costs and what it saves: the optimize time for a
 * GPT-2 small training graph (12 layers, 768 wide, 12 heads, vocab 50257; target <= 200
 * ms for both stages), and plan dispatches with the optimizer off, on without pointwise
 * fusion and on, for an MLP and for the transformer block of tests/support/models.c, with
 * what fusion made (fused nodes, those holding a norm, extra values written).
 * Lowers plans only; nothing is allocated on a device. Usage: optimize_gpt2 [batch] [seq] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "benchmarks/gpt_graph.h"
#include "optimizer/report.h"
#include "session/session.h"

/* The block's builder is compiled in here: the benchmark build compiles each file of
 * benchmarks/ on its own. */
#include "tests/support/models.c"

enum { REPS = 7 };

static mn_graph *mlp_graph(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(256, 784));
  mn_node t = mn_input(g, "targets", MN_SHAPE(256, 10));
  mn_node h = mn_bias_add(g, mn_matmul_bt(g, x, mn_parameter(g, "fc1.weight", MN_SHAPE(512, 784))),
                          mn_parameter(g, "fc1.bias", MN_SHAPE(512)));
  h = mn_relu(g, h);
  mn_node logits =
      mn_bias_add(g, mn_matmul_bt(g, h, mn_parameter(g, "fc2.weight", MN_SHAPE(10, 512))),
                  mn_parameter(g, "fc2.bias", MN_SHAPE(10)));
  mn_set_outputs(g, (mn_node[]){mn_cross_entropy_loss(g, logits, t)}, 1);
  return g;
}

static mn_graph *block_graph(void) {
  static const mn_test_block_config cfg = {.d_model = 576,
                                           .num_heads = 9,
                                           .num_kv_heads = 3,
                                           .head_dim = 64,
                                           .d_ff = 1536,
                                           .rope_theta = 10000.0f,
                                           .eps = 1e-5f};
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 512, cfg.d_model));
  mn_node target = mn_input(g, "target", MN_SHAPE(8, 512, cfg.d_model));
  mn_test_block_weights w = mn_test_block_params(g, &cfg, 0);
  mn_node y = mn_test_block(g, &cfg, &w, x);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, target)}, 1);
  return g;
}

static void expect_ok(mn_status st, const char *what) {
  if (st == MN_OK) return;
  fprintf(stderr, "%s: %s\n", what, mn_last_error());
  exit(1);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* What fusion made in a plan: fused nodes, those holding a row op (a norm with its prologue
 * and epilogue), and the extra values they write. */
typedef struct fused_counts {
  size_t fused, rows, extras;
} fused_counts;

static fused_counts count_fused(const mn_plan *p) {
  fused_counts c = {0};
  const mn_graph *g = p->graph;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_FUSED) continue;
    c.fused++;
    c.rows += mn_fused_prog_row(n->fused) >= 0;
    c.extras += (size_t)mn_node_num_extra_outputs(n);
  }
  return c;
}

static void print_fused(const fused_counts *c) {
  printf("fused nodes: %zu (%zu with a row op), writing %zu extra values\n", c->fused, c->rows,
         c->extras);
}

/* Dispatches with the optimizer off, on without pointwise fusion, and on (the default). */
static void print_dispatches(const char *name, mn_graph *g) {
  size_t n[3];
  fused_counts fc = {0};
  mn_optimize_report *r = mn_optimize_report_new();
  if (!r) exit(1);
  for (int mode = 0; mode < 3; mode++) {
    mn_session_options o = mn_session_options_default();
    o.optimize = mode > 0;
    o.fusion = mode == 2 ? MN_FUSION_AUTO : MN_FUSION_OFF;
    mn_plan *plan = NULL;
    expect_ok(mn_lower_training_report("optimize_gpt2", g, &o, &plan, mode == 2 ? r : NULL), name);
    n[mode] = plan->num_dispatches;
    if (mode == 2) fc = count_fused(plan);
    mn_plan_free(plan);
  }
  char text[4096];
  mn_optimize_report_format(r, text, sizeof text);
  printf("%s training step: %zu dispatches unoptimized, %zu optimized without fusion, %zu with "
         "fusion\n%s",
         name, n[0], n[1], n[2], text);
  print_fused(&fc);
  mn_optimize_report_free(r);
  mn_graph_free(g);
}

int main(int argc, char **argv) {
  gpt_config c = {.layers = 12,
                  .heads = 12,
                  .d_model = 768,
                  .d_ff = 3072,
                  .vocab = 50257,
                  .batch = argc > 1 ? atoll(argv[1]) : 16,
                  .seq = argc > 2 ? atoll(argv[2]) : 1024};
  mn_graph *g = gpt_graph(&c);
  mn_session_options o = mn_session_options_default();
  mn_session_options unfused_o = o;
  unfused_o.fusion = MN_FUSION_OFF;
  mn_plan *unfused = NULL;
  expect_ok(mn_lower_training("optimize_gpt2", g, &unfused_o, &unfused), "gpt2 without fusion");
  size_t unfused_dispatches = unfused->num_dispatches;
  mn_plan_free(unfused);
  double ms[REPS], lower[REPS];
  fused_counts fc = {0};
  mn_optimize_report *r = mn_optimize_report_new();
  if (!r) return 1;
  for (int i = 0; i < REPS; i++) {
    mn_plan *plan = NULL;
    expect_ok(mn_lower_training_report("optimize_gpt2", g, &o, &plan, r), "gpt2");
    ms[i] = r->stage[MN_OPTIMIZE_FORWARD].total_ms + r->stage[MN_OPTIMIZE_FULL].total_ms;
    lower[i] = r->lower_ms;
    fc = count_fused(plan);
    mn_plan_free(plan);
  }
  qsort(ms, REPS, sizeof *ms, by_value);
  qsort(lower, REPS, sizeof *lower, by_value);
  char text[4096];
  mn_optimize_report_format(r, text, sizeof text);
  printf("gpt2-small training graph (%d layers, batch %lld, seq %lld): optimize %.2f ms "
         "(both stages, median of %d; target <= 200 ms), whole lowering %.2f ms; "
         "%zu dispatches without fusion\n%s",
         c.layers, (long long)c.batch, (long long)c.seq, ms[REPS / 2], REPS, lower[REPS / 2],
         unfused_dispatches, text);
  print_fused(&fc);
  mn_optimize_report_free(r);
  mn_graph_free(g);
  print_dispatches("mlp 784-512-10", mlp_graph());
  print_dispatches("transformer block (SmolLM2-135M layer)", block_graph());
  return 0;
}
