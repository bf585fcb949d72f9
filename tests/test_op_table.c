/* The op table is the single list of ops: every differentiable op has a VJP rule, no
 * other op has one, every pointwise op has its row of element math (host/pointwise.h), and
 * every op has a printable, unique name. */
#include "autodiff/autodiff.h"
#include "host/pointwise.h"
#include "host/reference/ref_kernels.h"
#include "tests/support/mn_test.h"

Test(op_table, every_differentiable_op_has_a_vjp_rule) {
  const mn_vjp_rule *rules = mn_vjp_rules;
  for (int op = 0; op < MN_OP_COUNT; op++) {
    bool diff = (mn_op_flags((mn_op)op) & MN_OPF_DIFF) != 0;
    cr_expect_eq(rules[op] != NULL, diff, "op %s: differentiable %d but rule %s",
                 mn_op_name((mn_op)op), diff, rules[op] ? "present" : "missing");
  }
}

Test(op_table, backward_ops_are_never_differentiated) {
  for (int op = 0; op < MN_OP_COUNT; op++)
    if (mn_op_flags((mn_op)op) & MN_OPF_BACKWARD)
      cr_expect_eq(mn_op_flags((mn_op)op) & MN_OPF_DIFF, 0u, "%s", mn_op_name((mn_op)op));
}

Test(op_table, names_are_unique_and_every_op_has_a_kernel) {
  for (int a = 0; a < MN_OP_COUNT; a++) {
    cr_assert_not_null(mn_ref_kernels[a], "op %d has no reference kernel", a);
    cr_assert(mn_op_name((mn_op)a)[0] != '?', "op %d has no name", a);
    for (int b = a + 1; b < MN_OP_COUNT; b++)
      cr_expect_str_neq(mn_op_name((mn_op)a), mn_op_name((mn_op)b));
  }
}

/* The compile-time assertions of host/pointwise.h say the same; this names the op that fails. */
Test(op_table, every_pointwise_op_has_a_row_reading_its_inputs) {
  for (int op = 0; op < MN_OP_COUNT; op++) {
    const mn_op_desc *d = &mn_op_table[op];
    int code = mn_pw_code_of_op((mn_op)op);
    if (!(d->flags & MN_OPF_POINTWISE) || d->arity == MN_ARITY_VARIADIC) continue;
    cr_assert_geq(code, 0, "pointwise op %s has no row", d->name);
    int scalar = (mn_pw_flags(code) & MN_PW_SCALAR) ? 1 : 0;
    cr_expect_eq(mn_pw_num_inputs(code) + scalar, d->arity, "op %s", d->name);
  }
}

Test(op_table, rows_compute_their_ops_math) {
  cr_expect_float_eq(mn_pw_eval(MN_PW_SILU, 1.5, 0, 0, 0, 0), 1.5 / (1 + exp(-1.5)), 1e-15);
  cr_expect_float_eq(mn_pw_eval(MN_PW_SCALE, 3, 0, 0, 0, -0.5), -1.5, 0);
  cr_expect_float_eq(
      mn_pw_eval(MN_PW_EXPAND_SCALAR, 0, 0, 0, mn_pw_factor(MN_PW_EXPAND_SCALAR, 2.0f, 4, 10), 4),
      8, 0);
  cr_expect_float_eq(mn_pw_factor(MN_PW_MSE_GRAD, 3.0f, 0, 4), 1.5, 0);
  /* 0 * dy keeps a NaN upstream gradient where the slope is 0, as the op graph would. */
  cr_expect(isnan(mn_pw_eval(MN_PW_RELU_GRAD, -1, NAN, 0, 0, 0)));
  cr_expect(isnan(mn_pw_eval(-1, 0, 0, 0, 0, 0)), "an unknown code gives NaN, not a number");
}
