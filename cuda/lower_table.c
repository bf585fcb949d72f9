/* The lowering function of every op, generated from the op table so that an op without
 * one fails to link. */
#include "cuda/emit.h"

const mn_cu_lower_fn mn_cu_lowerers[MN_OP_COUNT] = {
#define MN_CU_ENTRY(e, name, arity, flags) [MN_OP_##e] = mn_cu_lower_##e,
    MN_OP_LIST(MN_CU_ENTRY)
#undef MN_CU_ENTRY
};

/* Leaves live in pinned buffers that the session fills; they run nothing. */
mn_status mn_cu_lower_INPUT(const mn_cu_op_ctx *c) { return (void)c, MN_OK; }
mn_status mn_cu_lower_PARAMETER(const mn_cu_op_ctx *c) { return (void)c, MN_OK; }
mn_status mn_cu_lower_CONSTANT(const mn_cu_op_ctx *c) { return (void)c, MN_OK; }
