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

int mn_cuda_compute_capability(int device) {
  if (device < 0 || device >= mn_cuda_usable_devices()) return 0;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}
