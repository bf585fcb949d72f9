/* Reference kernels of this area are written by its owner; until then each reports
 * that it has none. */
#include "ref_kernels.h"

mn_status mn_ref_CONV2D(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_GROUP_NORM(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_CONCAT(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_SPLIT_A(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_SPLIT_B(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_UPSAMPLE_2X(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_ADD_PER_CHANNEL(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
