// Shared by every kernel template: argument access, runtime error reporting and block-wide
// reductions. Compiled by NVRTC with no CUDA headers, so only builtins are used. The
// structs and numbers shared with the host code (mn_ptrs, mn_dev_scalars, mn_dev_error)
// are defined once in cuda/device_abi.h, which precedes this file in the translation unit.

template <typename T> __device__ __forceinline__ T *mn_arg(const mn_ptrs &io, int i) {
  return static_cast<T *>(io.p[i]);
}
// A number passed in place of a pointer (emit.h MN_CU_ARG_VALUE).
__device__ __forceinline__ unsigned int mn_arg_value(const mn_ptrs &io, int i) {
  return (unsigned int)reinterpret_cast<unsigned long long>(io.p[i]);
}

// ---- Storage: a float argument may hold bf16 or fp16 values (host/storage.h).
//
// The emitter wraps a launch's pointers in mn_io<SM>, where SM holds MN_DEV_STORAGE_BITS per
// argument (an mn_dev_storage). A kernel template takes `const IO &io` and gets its float
// arguments with mn_out<I>(io) / mn_in<I>(io): a plain float pointer for fp32 storage, so an
// fp32 kernel is the same code it always was, or a pointer-like view that converts each
// element as it is read (exactly) and written (rounded to nearest even). Arithmetic stays
// float: only loads and stores change.
template <unsigned SM> struct mn_io : mn_ptrs { static constexpr unsigned storage_mask = SM; };
template <class IO, int I> struct mn_io_storage {
  static constexpr int value =
      (int)((IO::storage_mask >> (MN_DEV_STORAGE_BITS * I)) & ((1u << MN_DEV_STORAGE_BITS) - 1u));
};
template <int I> struct mn_io_storage<mn_ptrs, I> { static constexpr int value = MN_DEV_F32; };

template <int S> __device__ __forceinline__ float mn_lp_load(unsigned short h) {
  if constexpr (S == MN_DEV_BF16) {
    return __uint_as_float((unsigned)h << 16);
  } else {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
}
// The bf16 or the fp16 form of one instruction by storage S: PRE "bf16" POST or PRE "f16" POST,
// with the asm operands after it (starting with their ':').
#define MN_LP_ASM(S, PRE, POST, ...)                                                               \
  do {                                                                                             \
    if constexpr ((S) == MN_DEV_BF16)                                                              \
      asm(PRE "bf16" POST __VA_ARGS__);                                                            \
    else                                                                                           \
      asm(PRE "f16" POST __VA_ARGS__);                                                             \
  } while (0)
template <int S> __device__ __forceinline__ unsigned short mn_lp_round(float v) {
  unsigned short h;
  MN_LP_ASM(S, "cvt.rn.", ".f32 %0, %1;", : "=h"(h) : "f"(v));
  return h;
}
// Two values rounded into one 32-bit word, lo in the low half (one instruction for bf16).
template <int S> __device__ __forceinline__ unsigned mn_lp_round2(float lo, float hi) {
  unsigned r;
  MN_LP_ASM(S, "cvt.rn.", "x2.f32 %0, %1, %2;", : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One stored low-precision element, read and assigned as a float.
template <int S> struct mn_lp_ref {
  unsigned short *p;
  __device__ __forceinline__ operator float() const { return mn_lp_load<S>(*p); }
  __device__ __forceinline__ mn_lp_ref &operator=(float v) {
    *p = mn_lp_round<S>(v);
    return *this;
  }
  __device__ __forceinline__ mn_lp_ref &operator=(const mn_lp_ref &o) { return *this = (float)o; }
  __device__ __forceinline__ mn_lp_ref &operator+=(float v) { return *this = (float)*this + v; }
  __device__ __forceinline__ mn_lp_ref &operator-=(float v) { return *this = (float)*this - v; }
  __device__ __forceinline__ mn_lp_ref &operator*=(float v) { return *this = (float)*this * v; }
};

template <bool B> struct mn_enable_if {};
template <> struct mn_enable_if<true> { using type = int; };

// A pointer to low-precision elements; C: read-only.
template <int S, bool C> struct mn_lp_ptr {
  unsigned short *p;
  __device__ __forceinline__ auto operator[](long long i) const {
    if constexpr (C)
      return mn_lp_load<S>(p[i]);
    else
      return mn_lp_ref<S>{p + i};
  }
  __device__ __forceinline__ auto operator*() const { return (*this)[0]; }
  __device__ __forceinline__ mn_lp_ptr operator+(long long i) const { return {p + i}; }
  __device__ __forceinline__ mn_lp_ptr operator-(long long i) const { return {p - i}; }
  __device__ __forceinline__ mn_lp_ptr &operator+=(long long i) {
    p += i;
    return *this;
  }
  __device__ __forceinline__ mn_lp_ptr &operator-=(long long i) {
    p -= i;
    return *this;
  }
  // A writable view converts to a read-only one (a template so that the read-only view has
  // no conversion to itself).
  template <bool D = C, class = typename mn_enable_if<!D>::type>
  __device__ __forceinline__ operator mn_lp_ptr<S, true>() const {
    return {p};
  }
  __device__ __forceinline__ explicit operator bool() const { return p != nullptr; }
};

template <int S, bool C> struct mn_fptr_sel { using type = mn_lp_ptr<S, C>; };
template <> struct mn_fptr_sel<MN_DEV_F32, false> { using type = float *; };
template <> struct mn_fptr_sel<MN_DEV_F32, true> { using type = const float *; };
// The pointer type of float values stored as S: float * for fp32.
template <int S> using mn_fptr = typename mn_fptr_sel<S, false>::type;
template <int S> using mn_cfptr = typename mn_fptr_sel<S, true>::type;

// A typed view of a raw pointer to values stored as S.
template <int S, bool C> __device__ __forceinline__ auto mn_fptr_of(void *p) {
  if constexpr (S != MN_DEV_F32)
    return mn_lp_ptr<S, C>{static_cast<unsigned short *>(p)};
  else if constexpr (C)
    return static_cast<const float *>(p);
  else
    return static_cast<float *>(p);
}

// Float argument I of a launch, writable (mn_out) or read-only (mn_in).
template <int I, class IO> __device__ __forceinline__ auto mn_out(const IO &io) {
  return mn_fptr_of<mn_io_storage<IO, I>::value, false>(io.p[I]);
}
template <int I, class IO> __device__ __forceinline__ auto mn_in(const IO &io) {
  return mn_fptr_of<mn_io_storage<IO, I>::value, true>(io.p[I]);
}

// Four consecutive elements 4q .. 4q+3 (16-byte aligned for fp32, 8-byte for low precision).
__device__ __forceinline__ float4 mn_ld4(const float *p, long long q) {
  return reinterpret_cast<const float4 *>(p)[q];
}
template <int S, bool C> __device__ __forceinline__ float4 mn_ld4(mn_lp_ptr<S, C> p, long long q) {
  const uint2 w = reinterpret_cast<const uint2 *>(p.p)[q];
  return make_float4(
      mn_lp_load<S>((unsigned short)(w.x & 0xffffu)), mn_lp_load<S>((unsigned short)(w.x >> 16)),
      mn_lp_load<S>((unsigned short)(w.y & 0xffffu)), mn_lp_load<S>((unsigned short)(w.y >> 16)));
}
__device__ __forceinline__ void mn_st4(float *p, long long q, float4 v) {
  reinterpret_cast<float4 *>(p)[q] = v;
}
template <int S>
__device__ __forceinline__ void mn_st4(mn_lp_ptr<S, false> p, long long q, float4 v) {
  reinterpret_cast<uint2 *>(p.p)[q] =
      make_uint2(mn_lp_round2<S>(v.x, v.y), mn_lp_round2<S>(v.z, v.w));
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

// Asynchronous copies from global into shared memory (sm_80 and later): a thread's copies
// are committed as a group and waited for by that thread.
__device__ __forceinline__ void mn_cp_async16(void *dst, const void *src, bool valid) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  // A source size of 0 fills the 16 bytes with zeros: rows past the end of a head.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void mn_cp_async4(void *dst, const void *src, bool valid) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
// 16 bytes of which the first `bytes` (0 .. 16) come from src and the rest are zeros.
__device__ __forceinline__ void mn_cp_async16_part(void *dst, const void *src, int bytes) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mn_cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void mn_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 2^x on the special-function unit alone (relative error about 2^-22). exp2f wraps the same
// instruction in a rescaling that keeps results below 2^-126 as subnormals (3 more instructions
// an element); this flushes them to zero instead, which no probability rounded to 16 bits can
// tell apart. The attention kernels all use it, so the backward recomputes the forward's P bit
// for bit.
__device__ __forceinline__ float mn_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (emit.h mn_cu_kernel_overlaps). mn_overlap_begin lets the next
// kernel, when it is launched as a programmatic dependent, start its blocks now; that kernel
// calls mn_overlap_wait before it touches anything an earlier kernel writes or reads, which
// returns once the kernels before it have finished and their writes are visible. Both do
// nothing in a plain launch, and below sm_90.
__device__ __forceinline__ void mn_overlap_begin() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void mn_overlap_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

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

// VEC floats (1, 2, 4 or 8) at an address aligned to VEC floats (8: to 4 floats).
template <int VEC> __device__ __forceinline__ void mn_ld_vec(const float *p, float *v) {
  if constexpr (VEC == 8) {
    mn_ld_vec<4>(p, v);
    mn_ld_vec<4>(p + 4, v + 4);
  } else if constexpr (VEC == 4) {
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

// The same for low-precision storage: VEC elements of 2 bytes (an aligned 2-, 4-, 8- or 16-byte
// access).
template <int VEC, int S, bool C>
__device__ __forceinline__ void mn_ld_vec(mn_lp_ptr<S, C> p, float *v) {
  if constexpr (VEC == 8) {
    const uint4 w = *reinterpret_cast<const uint4 *>(p.p);
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[2 * i] = mn_lp_load<S>((unsigned short)(u[i] & 0xffffu));
      v[2 * i + 1] = mn_lp_load<S>((unsigned short)(u[i] >> 16));
    }
  } else if constexpr (VEC == 4) {
    const float4 t = mn_ld4(p, 0);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else if constexpr (VEC == 2) {
    const unsigned w = *reinterpret_cast<const unsigned *>(p.p);
    v[0] = mn_lp_load<S>((unsigned short)(w & 0xffffu));
    v[1] = mn_lp_load<S>((unsigned short)(w >> 16));
  } else {
    v[0] = p[0];
  }
}

template <int VEC, int S>
__device__ __forceinline__ void mn_st_vec(mn_lp_ptr<S, false> p, const float *v) {
  if constexpr (VEC == 4)
    mn_st4(p, 0, make_float4(v[0], v[1], v[2], v[3]));
  else if constexpr (VEC == 2)
    *reinterpret_cast<unsigned *>(p.p) = mn_lp_round2<S>(v[0], v[1]);
  else
    p[0] = v[0];
}

// Grid-stride loop over [0, n) for 1-D launches.
#define MN_FOR_EACH(i, n)                                                                          \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n);         \
       i += (long long)gridDim.x * blockDim.x)
