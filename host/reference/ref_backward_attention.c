/* Reference kernels of this area are written by its owner; until then each reports
 * that it has none. */
#include "ref_kernels.h"

mn_status mn_ref_ATTENTION_GRAD_Q(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ATTENTION_GRAD_K(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ATTENTION_GRAD_V(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
