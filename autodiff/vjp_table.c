/* The VJP rule of every op, generated from the op table. An op's flags are an expression,
 * so the preprocessor cannot pick the differentiable rows; the constant condition does,
 * and the compiler folds it away, leaving a reference to mn_vjp_<ENUM> only where the op
 * is MN_OPF_DIFF. A differentiable op without a rule therefore fails to link. */
#include <stddef.h>

#include "autodiff/autodiff.h"

const mn_vjp_rule mn_vjp_rules[MN_OP_COUNT] = {
#define MN_VJP_ENTRY(e, name, arity, flags) [MN_OP_##e] = ((flags)&MN_OPF_DIFF) ? mn_vjp_##e : NULL,
    MN_OP_LIST(MN_VJP_ENTRY)
#undef MN_VJP_ENTRY
};
