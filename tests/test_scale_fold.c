/* Scales folded into their product's alpha (optimizer/scale_fold.h): the adapter shape of LoRA,
 * y = ((x A^T) s) B^T, trains with no scale op left in the plan and the same losses and
 * gradients as the unfolded graph: bitwise in fp32 on the CPU (the reference multiplies the
 * rounded product, as the scale op did), and in a bf16 plan within bf16 rounding (the folded
 * product is rounded to bf16 once, after the scale, instead of before and after it); a product
 * read twice keeps its scale. */
#include <math.h>
#include <string.h>

#include "host/backend.h"
#include "host/plan.h"
#include "optimizer/report.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

enum { ROWS = 12, IN = 10, R = 3, OUT = 7 };

/* With `shared`, the product x A^T is also an output, so its scale cannot be folded. */
static mn_graph *adapter(bool shared) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(ROWS, IN)), t = mn_input(g, "t", MN_SHAPE(ROWS, OUT));
  mn_node a = mn_parameter(g, "a", MN_SHAPE(R, IN)), b = mn_parameter(g, "b", MN_SHAPE(OUT, R));
  mn_node down = mn_matmul_bt(g, x, a);
  mn_node y = mn_matmul_bt(g, mn_scale(g, down, 2.5f), b);
  mn_node loss = mn_mse_loss(g, y, t);
  if (shared) return MN_TEST_OUTPUTS(g, loss, down);
  return MN_TEST_OUTPUTS(g, loss);
}

static mn_session *build(const mn_graph *g, bool optimize, mn_precision p, size_t *folded) {
  mn_session_options o = mn_test_cpu_options(optimize);
  o.precision = p;
  mn_session *s = NULL;
  mn_optimize_report *r = NULL;
  cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
  *folded = r->stage[MN_OPTIMIZE_FULL].scales_folded;
  mn_optimize_report_free(r);
  return s;
}

static void same_training(mn_precision p, double tol) {
  mn_graph *g = adapter(false);
  size_t folded = 0, none = 0;
  mn_session *s[2] = {build(g, true, p, &folded), build(g, false, p, &none)};
  cr_assert_eq(folded, 2, "the forward scale and its gradient's: %zu", folded);
  cr_assert_eq(none, 0);
  cr_assert_eq(mn_test_count_op(s[0]->plan->graph, MN_OP_SCALE), 0);
  cr_assert_gt(mn_test_count_op(s[1]->plan->graph, MN_OP_SCALE), 0);
  mn_rng r = mn_rng_new(5);
  mn_test_init_normal(g, s, 2, &r, 0.5f, false);
  float x[ROWS * IN], t[ROWS * OUT];
  mn_rng_fill(&r, x, ROWS * IN, -1, 1);
  mn_rng_fill(&r, t, ROWS * OUT, -1, 1);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, ROWS * IN), MN_OK);
    cr_assert_eq(mn_session_set_input(s[i], "t", t, ROWS * OUT), MN_OK);
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f), MN_OK);
  }
  for (int step = 0; step < 5; step++) {
    float l0 = mn_test_step_loss(s[0]), l1 = mn_test_step_loss(s[1]);
    cr_assert_leq(fabs((double)l0 - l1), tol * fabs((double)l1),
                  "step %d: loss %.9g folded, %.9g not", step, l0, l1);
  }
  mn_test_assert_same_params(g, s[0], s[1], tol, "after 5 AdamW steps");
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

Test(scale_fold, adapter_trains_bitwise_as_unfolded_fp32) { same_training(MN_PRECISION_F32, 0); }

Test(scale_fold, adapter_trains_bitwise_as_unfolded_bf16) { same_training(MN_PRECISION_BF16, 0x1p-7); }

Test(scale_fold, a_product_read_twice_keeps_its_scale) {
  mn_graph *g = adapter(true);
  size_t folded = 0;
  mn_session *s = build(g, true, MN_PRECISION_F32, &folded);
  /* the gradient's scale still folds; the forward one does not */
  cr_assert_eq(folded, 1, "%zu", folded);
  cr_assert_eq(mn_test_count_op(s->plan->graph, MN_OP_SCALE), 1);
  mn_session_free(s);
  mn_graph_free(g);
}
