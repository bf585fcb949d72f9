/* Reference kernels of this area are written by its owner; until then each reports
 * that it has none. */
#include "ref_kernels.h"

mn_status mn_ref_SWIGLU_GRAD_GATE(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_RMS_NORM_GRAD_X(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_RMS_NORM_GRAD_W(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_LAYER_NORM_GRAD_X(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_LAYER_NORM_GRAD_W(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ROPE_GRAD(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ROPE_DYNAMIC_GRAD(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
