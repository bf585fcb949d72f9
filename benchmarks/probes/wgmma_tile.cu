// Hopper's warpgroup products (wgmma) for the attention kernels, in isolation: which shared-memory
// descriptors give the right product, and how fast a warpgroup multiplies when its B operand is
// read from shared memory by the tensor cores instead of by each warp with ldmatrix.
//
// 1. Layouts. C[64 x 64] = A[64 x 64] B with A in registers (the m16n8k16 A fragments of each
//    warp's 16 rows, as the pipelined attention kernels hold Q or P) and B in shared memory as
//    8 x 8 core matrices of 16 bytes a row, one 128-byte block each, either K-major (B stored as
//    [n][k], the K tile of S = Q K^T) or MN-major with the transpose bit (B stored as [k][n], the
//    V tile of O = P V). Every assignment of the two core-matrix strides to the descriptor's
//    leading and stride byte offsets is tried and checked against the CPU.
//    A from shared memory as well (K-major) is checked with the B layouts that work, and so is
//    the 128-byte swizzle (rows of 128 bytes, chunk c of row r at c ^ (r % 8)) that the
//    attention kernels use, K-major and MN-major.
// 2. Rates. Products with both operands through descriptors and products with B MN-major, each
//    group of 4 waited for, unswizzled against swizzled (the same rate, about 950 TFLOP/s: the
//    swizzle pays in the copies into shared memory, not in the products). One warpgroup a block,
//    2 blocks an SM, each multiplying a 64 x 64 register tile by a
//    64 x 64 shared tile 4096 times: wgmma (m64n64k16, B read by the tensor cores) against
//    mma.sync m16n8k16 with each warp reading B with ldmatrix (attention_pipe.cuh's way).
// Not part of the CMake build (wgmma needs sm_90a):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/wgmma_tile \
//     benchmarks/probes/wgmma_tile.cu && /tmp/wgmma_tile
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

// swz: the 128-byte swizzle (layout type 1 in bits 62-63), else none.
__device__ __forceinline__ uint64_t desc_of(const void *smem, unsigned lbo, unsigned sbo,
                                            bool swz = false) {
  const uint64_t a = (unsigned)__cvta_generic_to_shared(smem);
  return ((a & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
         ((uint64_t)(swz ? 1 : 0) << 62);
}

// Element (outer o, inner i) of a 64 x 64 tile in the 128-byte swizzle: rows of 128 bytes (the 64
// inner values), the 16-byte chunk c of row o at chunk c ^ (o % 8); the tile 1024-byte aligned.
__device__ __forceinline__ int swz_offset(int o, int i) {
  return o * 128 + (((i / 8) ^ (o % 8)) * 16) + (i % 8) * 2;
}

// The 32 accumulator operands of an m64n64 f32 product: the operand list and its constraints.
#define WG_D32                                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OUT(d)                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (32 floats a thread: the m64n64 accumulator) += a (registers) * B (descriptor).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const unsigned (&a)[4], uint64_t desc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32
               ", {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
               : WG_D32_OUT(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TRANS_B), "r"(1));
}
// The same with A in shared memory too (K-major, a_desc).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %35, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32
               ", %32, %33, p, 1, 1, 0, %34;\n}\n"
               : WG_D32_OUT(d)
               : "l"(a_desc), "l"(b_desc), "n"(TRANS_B), "r"(1));
}
__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

__device__ __forceinline__ unsigned pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}

// The A fragments of warp w's rows 16w .. 16w + 15 for k-step kk (m16n8k16 layout).
__device__ __forceinline__ void a_frag(unsigned (&a)[4], const __nv_bfloat16 *A, int kk) {
  const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const __nv_bfloat16 *r0 = A + (16 * w + g) * 64 + 16 * kk + 2 * t, *r1 = r0 + 8 * 64;
  a[0] = pack(r0[0], r0[1]);
  a[1] = pack(r1[0], r1[1]);
  a[2] = pack(r0[8], r0[9]);
  a[3] = pack(r1[8], r1[9]);
}

// Element (outer o, inner i) of a 64 x 64 tile stored as core matrices: 8 outer x 8 inner values
// (16 bytes a row) in 128 contiguous bytes, core (o / 8, i / 8) at byte ((o / 8) * OUTER_STEP +
// (i / 8) * INNER_STEP) with the steps in bytes.
__device__ __forceinline__ int core_offset(int o, int i, int outer_step, int inner_step) {
  return (o / 8) * outer_step + (i / 8) * inner_step + (o % 8) * 16 + (i % 8) * 2;
}

// C = A B. TRANS_B 0: B given as Bt[n][k] and stored K-major (outer n, inner k); 1: B given as
// B[k][n] and stored MN-major (outer k, inner n). The cores advance by `along` bytes in the
// inner dimension and `across` in the outer one; the descriptor gets lbo and sbo.
// SWZ: A and B in the 128-byte swizzle instead (swz_offset; along and across unused), A's k-step
// 32 bytes into its rows.
template <int TRANS_B, bool A_SMEM, bool SWZ = false>
__global__ void product(const __nv_bfloat16 *A, const __nv_bfloat16 *Bg, float *C, int along,
                        int across, unsigned lbo, unsigned sbo, int kstep_bytes) {
  // A_SMEM: A in the K-major core layout too (cores 128 bytes apart along k, 1024 along m).
  __shared__ __align__(1024) unsigned char sa[64 * 64 * 2];
  if (A_SMEM)
    for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x)
      *reinterpret_cast<__nv_bfloat16 *>(
          sa + (SWZ ? swz_offset(e / 64, e % 64) : core_offset(e / 64, e % 64, 1024, 128))) = A[e];
  // Room past the tile, so that a wrong descriptor reads zeros instead of faulting.
  __shared__ __align__(1024) unsigned char sb[3 * 64 * 64 * 2];
  for (int e = threadIdx.x; e < 3 * 64 * 64 * 2 / 4; e += blockDim.x)
    reinterpret_cast<unsigned *>(sb)[e] = 0u;
  __syncthreads();
  for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) {
    const int o = e / 64, i = e % 64;
    *reinterpret_cast<__nv_bfloat16 *>(
        sb + (SWZ ? swz_offset(o, i) : core_offset(o, i, across, along))) = Bg[e];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[32];
  for (int i = 0; i < 32; i++)
    d[i] = 0.0f;
  wg_fence();
  for (int kk = 0; kk < 4; kk++) {
    if (A_SMEM) {
      wgmma_ss<TRANS_B>(
          d, SWZ ? desc_of(sa + kk * 32, 16, 1024, true) : desc_of(sa + kk * 256, 128, 1024),
          desc_of(sb + kk * kstep_bytes, lbo, sbo, SWZ));
    } else {
      unsigned a[4];
      a_frag(a, A, kk);
      wgmma_rs<TRANS_B>(d, a, desc_of(sb + kk * kstep_bytes, lbo, sbo, SWZ));
    }
  }
  wg_commit();
  wg_wait0();
  const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  for (int i = 0; i < 32; i++) {
    const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = (i >> 2) * 8 + 2 * t + (i & 1);
    C[row * 64 + col] = d[i];
  }
}

static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

// Runs one layout candidate; returns the largest error against the CPU.
template <int TRANS_B, bool A_SMEM = false, bool SWZ = false>
static double try_layout(const std::vector<float> &a, const std::vector<float> &b, int along,
                         int across, unsigned lbo, unsigned sbo, int kstep) {
  std::vector<__nv_bfloat16> ha(4096), hb(4096);
  for (int i = 0; i < 4096; i++) {
    ha[i] = __float2bfloat16(a[i]);
    // TRANS_B 0 stores Bt[n][k]; 1 stores B[k][n].
    const int r = i / 64, c = i % 64;
    hb[i] = __float2bfloat16(TRANS_B ? b[r * 64 + c] : b[c * 64 + r]);
  }
  __nv_bfloat16 *da, *db;
  float *dc;
  CK(cudaMalloc(&da, 8192));
  CK(cudaMalloc(&db, 8192));
  CK(cudaMalloc(&dc, 16384));
  CK(cudaMemcpy(da, ha.data(), 8192, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), 8192, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0, 16384));
  product<TRANS_B, A_SMEM, SWZ><<<1, 128>>>(da, db, dc, along, across, lbo, sbo, kstep);
  CK(cudaDeviceSynchronize());
  std::vector<float> c(4096);
  CK(cudaMemcpy(c.data(), dc, 16384, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int m = 0; m < 64; m++)
    for (int n = 0; n < 64; n++) {
      double ref = 0;
      for (int k = 0; k < 64; k++)
        ref += (double)bf(a[m * 64 + k]) * (double)bf(b[k * 64 + n]);
      worst = fmax(worst, fabs(ref - c[m * 64 + n]));
    }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return worst;
}

// ---- rates

template <bool WGMMA> __global__ void __launch_bounds__(128) rate(float *out, int iters) {
  __shared__ __align__(128) unsigned char sb[64 * 72 * 2];
  for (int e = threadIdx.x; e < 64 * 72; e += blockDim.x)
    reinterpret_cast<__nv_bfloat16 *>(sb)[e] = __float2bfloat16((e % 7) * 0.01f);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  unsigned a[4][4];
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 4; j++)
      a[k][j] = 0x3c003c00u + threadIdx.x + j;
  float d[32];
  for (int i = 0; i < 32; i++)
    d[i] = 0.0f;
  const int lane = threadIdx.x & 31;
  for (int it = 0; it < iters; it++) {
    if constexpr (WGMMA) {
      wg_fence();
      for (int kk = 0; kk < 4; kk++)
        wgmma_rs<0>(d, a[kk], desc_of(sb + kk * 256, 128, 1024));
      wg_commit();
      wg_wait0();
    } else {
      // Each warp: its 16 rows times the 64 x 64 tile, B fragments by ldmatrix (row pitch 72).
      const unsigned short *base = reinterpret_cast<const unsigned short *>(sb);
      const unsigned short *p = base + ((lane & 7) + 8 * (lane >> 4)) * 72 + 8 * ((lane >> 3) & 1);
      for (int kk = 0; kk < 4; kk++)
        for (int n = 0; n < 8; n += 2) {
          unsigned fb[4];
          const unsigned addr = (unsigned)__cvta_generic_to_shared(p + n * 8 * 72 + 16 * kk);
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(fb[0]), "=r"(fb[1]), "=r"(fb[2]), "=r"(fb[3])
                       : "r"(addr));
          for (int h = 0; h < 2; h++) {
            float *c = d + 4 * (n + h);
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3]),
                           "r"(fb[2 * h]), "r"(fb[2 * h + 1]));
          }
        }
    }
  }
  float s = 0;
  for (int i = 0; i < 32; i++)
    s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// A warpgroup's S = Q K^T, both operands through descriptors (the attention kernels' way), 4
// products (one k-step each) a group, each group waited for: no swizzle (the core layout) or the
// 128-byte swizzle. TRANS: B MN-major (O = P V's V), A then in registers.
template <bool SWZ, bool TRANS>
__global__ void __launch_bounds__(128) rate_ss(float *out, int iters) {
  __shared__ __align__(1024) unsigned char sa[64 * 64 * 2], sb[64 * 64 * 2];
  for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) {
    reinterpret_cast<__nv_bfloat16 *>(sa)[e] = __float2bfloat16((e % 5) * 0.01f);
    reinterpret_cast<__nv_bfloat16 *>(sb)[e] = __float2bfloat16((e % 7) * 0.01f);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  unsigned a[4][4];
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 4; j++)
      a[k][j] = 0x3c003c00u + threadIdx.x + j;
  float d[32];
  for (int i = 0; i < 32; i++)
    d[i] = 0.0f;
  for (int it = 0; it < iters; it++) {
    wg_fence();
    for (int kk = 0; kk < 4; kk++) {
      if constexpr (TRANS)
        wgmma_rs<1>(d, a[kk],
                    SWZ ? desc_of(sb + kk * 2048, 16, 1024, true)
                        : desc_of(sb + kk * 2048, 1024, 128));
      else
        wgmma_ss<0>(
            d, SWZ ? desc_of(sa + kk * 32, 16, 1024, true) : desc_of(sa + kk * 256, 128, 1024),
            SWZ ? desc_of(sb + kk * 32, 16, 1024, true) : desc_of(sb + kk * 256, 128, 1024));
    }
    wg_commit();
    wg_wait0();
  }
  float s = 0;
  for (int i = 0; i < 32; i++)
    s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <class K> static double time_rate(K kernel, int blocks, int iters) {
  float *out;
  CK(cudaMalloc(&out, (size_t)blocks * 128 * 4));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  kernel<<<blocks, 128>>>(out, 16);
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(5);
  for (auto &m : ms) {
    CK(cudaEventRecord(e0));
    kernel<<<blocks, 128>>>(out, iters);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&m, e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(out);
  return 2.0 * 64 * 64 * 64 * (double)iters * blocks / (ms[2] * 1e9);
}

template <bool WGMMA> static double tflops(int sms) {
  return time_rate(rate<WGMMA>, 2 * sms, 4096);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<float> a(4096), b(4096);
  srand(1);
  for (int i = 0; i < 4096; i++) {
    a[i] = (float)(rand() % 17 - 8) / 8.0f;
    b[i] = (float)(rand() % 13 - 6) / 4.0f;
  }
  // K-major: outer n, inner k; a k-step of 16 is two cores along k.
  // Cores along the inner dimension 128 bytes apart, rows of cores 1024 apart, or the reverse.
  struct cand {
    int along, across;
  } cands[2] = {{128, 1024}, {1024, 128}};
  for (int trans = 0; trans < 2; trans++)
    for (auto cd : cands)
      for (int swap = 0; swap < 2; swap++) {
        // The k-step: K-major advances two inner cores, MN-major two outer cores (16 k rows).
        const int kstep = trans ? 2 * cd.across : 2 * cd.along;
        const unsigned k_stride = trans ? cd.across : cd.along,
                       mn_stride = trans ? cd.along : cd.across;
        const unsigned lbo = swap ? mn_stride : k_stride, sbo = swap ? k_stride : mn_stride;
        const double err = trans ? try_layout<1>(a, b, cd.along, cd.across, lbo, sbo, kstep)
                                 : try_layout<0>(a, b, cd.along, cd.across, lbo, sbo, kstep);
        printf("WGMMA-LAYOUT %s cores inner %4d outer %4d: lbo %4u (%s) sbo %4u: max error %g %s\n",
               trans ? "MN-major (trans b)" : "K-major           ", cd.along, cd.across, lbo,
               swap ? "mn stride" : "k stride ", sbo, err, err < 1e-3 ? "OK" : "wrong");
      }
  // A from shared memory as well (the forward's S = Q K^T with Q through a descriptor), with the
  // B layouts found above.
  const double ss_k = try_layout<0, true>(a, b, 128, 1024, 128, 1024, 256),
               ss_mn = try_layout<1, true>(a, b, 128, 1024, 1024, 128, 2048);
  printf(
      "WGMMA-LAYOUT A in shared memory (K-major, lbo 128 sbo 1024), B K-major: max error %g %s\n",
      ss_k, ss_k < 1e-3 ? "OK" : "wrong");
  printf("WGMMA-LAYOUT A in shared memory, B MN-major (trans b): max error %g %s\n", ss_mn,
         ss_mn < 1e-3 ? "OK" : "wrong");
  // The 128-byte swizzle: K-major operands step 32 bytes into the rows a k-step (the leading
  // offset unused, the stride 1024 between groups of 8 rows); MN-major B steps 16 rows (2048
  // bytes) a k-step, its offsets tried.
  const double sw_k = try_layout<0, false, true>(a, b, 0, 0, 16, 1024, 32),
               sw_ss = try_layout<0, true, true>(a, b, 0, 0, 16, 1024, 32);
  printf("WGMMA-LAYOUT swizzle-128 B K-major (A registers): max error %g %s\n", sw_k,
         sw_k < 1e-3 ? "OK" : "wrong");
  printf("WGMMA-LAYOUT swizzle-128 A and B K-major: max error %g %s\n", sw_ss,
         sw_ss < 1e-3 ? "OK" : "wrong");
  const unsigned offs[] = {16, 128, 1024, 2048, 8192};
  for (unsigned lbo : offs)
    for (unsigned sbo : offs) {
      const double e = try_layout<1, false, true>(a, b, 0, 0, lbo, sbo, 2048),
                   e2 = try_layout<1, true, true>(a, b, 0, 0, lbo, sbo, 2048);
      printf("WGMMA-LAYOUT swizzle-128 B MN-major (trans b): lbo %4u sbo %4u: max error %g %s, "
             "with A in shared memory %g %s\n",
             lbo, sbo, e, e < 1e-3 ? "OK" : "wrong", e2, e2 < 1e-3 ? "OK" : "wrong");
    }
  for (int bps = 2; bps <= 3; bps++) {
    printf("WGMMA-RATE %d blocks an SM, groups of 4 waited: SS no swizzle %.1f, SS swizzle-128 "
           "%.1f, RS MN-major B no swizzle %.1f, swizzle-128 %.1f TFLOP/s\n",
           bps, time_rate(rate_ss<false, false>, bps * sms, 4096),
           time_rate(rate_ss<true, false>, bps * sms, 4096),
           time_rate(rate_ss<false, true>, bps * sms, 4096),
           time_rate(rate_ss<true, true>, bps * sms, 4096));
  }
  const double w = tflops<true>(sms), m = tflops<false>(sms);
  printf("WGMMA-RATE wgmma m64n64k16 (B by descriptor): %.1f TFLOP/s\n", w);
  printf("WGMMA-RATE mma.sync m16n8k16 (B by ldmatrix, each warp): %.1f TFLOP/s\n", m);
  return 0;
}
