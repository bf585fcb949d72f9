// ---- Products with one side of at most 16 (cuda/lower_skinny.c)
//
// cuBLASLt tiles its products for width: an MLP's classifier [128, 512] x [512, 10] ran on 4
// blocks for 9 us on an H200 and its input gradient [128, 10] x [10, 512] on 16 blocks for
// 5 us, where the arithmetic is a few microseconds of one SM's loads. These two kernels spread
// such a product over the card in fp32 on CUDA cores (exact products, never TF32):
//  - mn_mm_narrow: C [M, N] with N <= 16 and A not transposed. A warp per row of C: each lane
//    takes every 32nd k with N running sums, then a butterfly sum gives every lane the same
//    totals (a + b == b + a in floats, so the order is fixed: the same bits on every run).
//  - mn_mm_short_k: K <= 16. A thread per element of C, k in order.
// Both finish as cuBLASLt's epilogues do: alpha times the sum, plus the bias row, then the
// activation (a pointwise row of host/pointwise.h; ACT < 0: none), or a gradient's gate
// GATE(g, value) with g the element of G at the same place (matmul_drelu: relu_grad; GATE < 0:
// none), stored once.
//
// io: C, A, B, the bias row (NULL when BIAS is false), G (NULL when GATE < 0). A is [M, K] at
// row pitch LDA, or [K, M] when TA; B is [K, N] at row pitch LDB, or [N, K] when TB; C and G are
// [M, N] at row pitch LDC.

template <int ACT, int GATE, bool BIAS, unsigned ALPHA, class Bias, class Gate>
__device__ __forceinline__ float mn_mm_finish(float sum, Bias bias, Gate gate, long long at,
                                              long long j) {
  float v = sum * __uint_as_float(ALPHA);
  if constexpr (BIAS) v += bias[j];
  if constexpr (ACT >= 0) v = mn_pw_apply<ACT>(v, 0.0f, 0.0f, 0.0, 0.0f);
  if constexpr (GATE >= 0) v = mn_pw_apply<GATE>((float)gate[at], v, 0.0f, 0.0, 0.0f);
  return v;
}

template <int WARPS, long long M, int N, long long K, long long LDA, long long LDB, long long LDC,
          bool TB, int ACT, int GATE, bool BIAS, unsigned ALPHA, class IO>
__device__ void mn_mm_narrow(const IO &io) {
  static_assert(N >= 1 && N <= 16, "mn_mm_narrow: N of 1 to 16");
  auto c = mn_out<0>(io);
  auto a = mn_in<1>(io);
  auto b = mn_in<2>(io);
  auto bias = mn_in<3>(io);
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (row >= M) return;
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; j++)
    acc[j] = 0.0f;
  for (long long k = lane; k < K; k += 32) {
    const float x = a[row * LDA + k];
#pragma unroll
    for (int j = 0; j < N; j++)
      acc[j] += x * b[TB ? j * LDB + k : k * LDB + j];
  }
  float mine = 0.0f;
#pragma unroll
  for (int j = 0; j < N; j++) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    if (lane == j) mine = acc[j];
  }
  if (lane < N)
    c[row * LDC + lane] =
        mn_mm_finish<ACT, GATE, BIAS, ALPHA>(mine, bias, mn_in<4>(io), row * LDC + lane, lane);
}

template <long long M, long long N, int K, long long LDA, long long LDB, long long LDC, bool TA,
          bool TB, int ACT, int GATE, bool BIAS, unsigned ALPHA, class IO>
__device__ void mn_mm_short_k(const IO &io) {
  static_assert(K >= 1 && K <= 16, "mn_mm_short_k: K of 1 to 16");
  auto c = mn_out<0>(io);
  auto a = mn_in<1>(io);
  auto b = mn_in<2>(io);
  auto bias = mn_in<3>(io);
  MN_FOR_EACH(e, M * N) {
    const long long i = e / N, j = e % N;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
      sum += a[TA ? k * LDA + i : i * LDA + k] * b[TB ? j * LDB + k : k * LDB + j];
    c[i * LDC + j] = mn_mm_finish<ACT, GATE, BIAS, ALPHA>(sum, bias, mn_in<4>(io), i * LDC + j, j);
  }
}
