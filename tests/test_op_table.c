/* The op table is the single list of ops: every differentiable op has a VJP rule, no
 * other op has one, and every op has a printable, unique name. */
#include "autodiff/autodiff.h"
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
