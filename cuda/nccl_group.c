/* The NCCL group of one CUDA rank: its communicator lives on the rank's device, and a device
 * float serves the barrier. */
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"
#include "host/error.h"
#include "host/nccl.h"

mn_status mn_cuda_nccl_group_new(const mn_group_id *id, int world_size, int rank, int device,
                                 double timeout_s, mn_group **out) {
  const char *fn = "mn_group_new_nccl";
  int devices = mn_cuda_usable_devices();
  if (device < 0 || device >= devices)
    return mn_fail(MN_ERR_DEVICE, "%s: device %d is not usable (%d CUDA device%s)", fn, device,
                   devices, devices == 1 ? "" : "s");
  if (cudaSetDevice(device) != cudaSuccess)
    return mn_fail(MN_ERR_DEVICE, "%s: cannot use device %d", fn, device);
  float *scratch = NULL;
  if (cudaMalloc((void **)&scratch, sizeof *scratch) != cudaSuccess)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: cannot allocate on device %d", fn, device);
  mn_status st = mn_nccl_group_new(id, world_size, rank, NULL, scratch, out);
  if (st != MN_OK) {
    cudaFree(scratch);
    return mn_fail(st, "%s: %s", fn, mn_last_error());
  }
  if (timeout_s > 0) (*out)->timeout_s = timeout_s;
  return MN_OK;
}
