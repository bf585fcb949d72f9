/* Reference kernels of this area are written by its owner; until then each reports
 * that it has none. */
#include "ref_kernels.h"

mn_status mn_ref_SWIGLU(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_RMS_NORM(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_LAYER_NORM(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ROPE(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ROPE_DYNAMIC(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_EMBEDDING(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_SCATTER_ADD(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
