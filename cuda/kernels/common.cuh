// Shared by every kernel template: argument access, runtime error reporting and block-wide
// reductions. Compiled by NVRTC with no CUDA headers, so only builtins are used. The
// structs and numbers shared with the host code (mn_ptrs, mn_dev_scalars, mn_dev_error)
// are defined once in cuda/device_abi.h, which precedes this file in the translation unit.

template <typename T> __device__ __forceinline__ T *mn_arg(const mn_ptrs &io, int i) {
  return static_cast<T *>(io.p[i]);
}

// Records a failure unless one is recorded already: the first one is reported.
__device__ __forceinline__ void mn_report(mn_dev_error *e, unsigned int what, unsigned int node,
                                          long long value, long long position, long long limit) {
  if (atomicCAS(&e->what, 0u, what) == 0u) {
    e->node = node;
    e->value = value;
    e->position = position;
    e->limit = limit;
  }
}

__device__ __forceinline__ float mn_nan() { return __int_as_float(0x7fffffff); }

__device__ __forceinline__ float mn_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float mn_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double mn_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum / max for a block of BLOCK threads (a multiple of 32, at most 1024);
// every thread gets the result. `shared` holds at least 32 values; the function
// synchronizes before reusing it, so back-to-back calls with one buffer are safe.
template <int BLOCK> __device__ __forceinline__ float mn_block_sum(float v, float *shared) {
  v = mn_warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < BLOCK / 32 ? shared[lane] : 0.0f;
  return mn_warp_sum(v);
}
template <int BLOCK> __device__ __forceinline__ float mn_block_max(float v, float *shared) {
  v = mn_warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < BLOCK / 32 ? shared[lane] : -__int_as_float(0x7f800000);
  return mn_warp_max(v);
}
template <int BLOCK> __device__ __forceinline__ double mn_block_sum_d(double v, double *shared) {
  v = mn_warp_sum_d(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < BLOCK / 32 ? shared[lane] : 0.0;
  return mn_warp_sum_d(v);
}

// VEC floats (1, 2 or 4) at an address aligned to VEC floats.
template <int VEC> __device__ __forceinline__ void mn_ld_vec(const float *p, float *v) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4 *>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else if constexpr (VEC == 2) {
    const float2 t = *reinterpret_cast<const float2 *>(p);
    v[0] = t.x;
    v[1] = t.y;
  } else {
    v[0] = *p;
  }
}

template <int VEC> __device__ __forceinline__ void mn_st_vec(float *p, const float *v) {
  if constexpr (VEC == 4)
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else if constexpr (VEC == 2)
    *reinterpret_cast<float2 *>(p) = make_float2(v[0], v[1]);
  else
    *p = v[0];
}

// Grid-stride loop over [0, n) for 1-D launches.
#define MN_FOR_EACH(i, n)                                                                          \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n);         \
       i += (long long)gridDim.x * blockDim.x)
