#include <stdarg.h>

#include "host/reference/ref_kernels.h"

const mn_ref_kernel mn_ref_kernels[MN_OP_COUNT] = {
#define MN_REF_ENTRY(e, name, arity, flags) [MN_OP_##e] = mn_ref_##e,
    MN_OP_LIST(MN_REF_ENTRY)
#undef MN_REF_ENTRY
};

mn_status mn_ref_fail(const mn_ref_ctx *c, mn_status s, const char *fmt, ...) {
  int w = snprintf(c->error, c->error_size, "node %u (%s): ", c->id, mn_op_name(c->node->op));
  if (w < 0 || (size_t)w >= c->error_size) return s;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error + w, c->error_size - (size_t)w, fmt, ap);
  va_end(ap);
  return s;
}

/* Leaves hold data put there by the session; running them does nothing. */
mn_status mn_ref_INPUT(const mn_ref_ctx *c) { return (void)c, MN_OK; }
mn_status mn_ref_PARAMETER(const mn_ref_ctx *c) { return (void)c, MN_OK; }
mn_status mn_ref_CONSTANT(const mn_ref_ctx *c) { return (void)c, MN_OK; }
