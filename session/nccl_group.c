/* mn_group_new_nccl: the public entry, which checks its arguments on every build and needs
 * the CUDA backend for the rest. */
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "host/error.h"
#include "host/nccl.h"

mn_status mn_group_new_nccl(const mn_group_id *id, int world_size, int rank, int device,
                            double timeout_s, mn_group **out) {
  const char *fn = "mn_group_new_nccl";
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (!id) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: id is NULL", fn);
  if (world_size < 1)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: world_size = %d, must be at least 1", fn,
                   world_size);
  if (rank < 0 || rank >= world_size)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rank = %d outside [0, %d)", fn, rank, world_size);
  const mn_nccl *api = NULL;
  mn_status st = mn_nccl_get(&api);
  if (st != MN_OK) return mn_fail(st, "%s: %s", fn, mn_nccl_error());
#ifdef MN_WITH_CUDA
  return mn_cuda_nccl_group_new(id, world_size, rank, device, timeout_s, out);
#else
  (void)device;
  (void)timeout_s;
  return mn_fail(MN_ERR_UNSUPPORTED, "%s: this build of meganeura has no CUDA backend", fn);
#endif
}
