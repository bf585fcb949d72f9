/* Device discovery through the runtime API, which loads the driver itself: on a machine
 * without one, every call fails cleanly and the library falls back to the CPU. */
#include <cuda_runtime_api.h>

#include "cuda/cuda_backend.h"

int mn_cuda_usable_devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no driver" error */
    return 0;
  }
  return n;
}
