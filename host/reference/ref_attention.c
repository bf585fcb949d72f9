/* Reference kernels of this area are written by its owner; until then each reports
 * that it has none. */
#include "ref_kernels.h"

mn_status mn_ref_CAUSAL_ATTENTION(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_FULL_ATTENTION(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_CROSS_ATTENTION(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_CACHE_WRITE(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
mn_status mn_ref_CACHED_ATTENTION(const mn_ref_ctx *c) {
  return mn_ref_fail(c, MN_ERR_UNSUPPORTED, "no reference kernel yet");
}
