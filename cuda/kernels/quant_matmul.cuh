// mn_matmul_quant: y [ROWS, OUT] = x [ROWS, IN] W^T with W [OUT, IN] in a quantized format
// (host/quant.h; FMT is its mn_quant value, GROUP the affine group). One warp per output
// feature: its lanes walk the row's 32-weight slices (a GGML block, or a quarter/half/whole
// affine group), dequantize each slice's weights in registers and multiply them with up to
// MN_QMM_CHUNK rows of x at once, so that batch-1-8 decoding reads every weight once. Longer
// inputs (prefill) repeat the walk per chunk of rows; the weight re-reads hit L2.
// Dequantization rounds the product before the sum (__fmul_rn, __fadd_rn) as the CPU reference
// does (the slices: block_formats.cuh). io = x, wq U32 [OUT, RW], y.

#define MN_QMM_CHUNK 8

template <int FMT, int GROUP, long long ROWS, long long IN, long long OUT, long long RW, int WARPS,
          class IO>
__device__ void mn_quant_matmul(const IO &io) {
  const auto x = mn_in<0>(io);
  const unsigned *wq = mn_arg<const unsigned>(io, 1);
  auto y = mn_out<2>(io);
  const int lane = threadIdx.x & 31;
  const long long o = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (o >= OUT) return;
  const unsigned char *row = reinterpret_cast<const unsigned char *>(wq + o * RW);
  constexpr long long SLICES = IN / 32;
  for (long long r0 = 0; r0 < ROWS; r0 += MN_QMM_CHUNK) {
    const int nr = ROWS - r0 < MN_QMM_CHUNK ? (int)(ROWS - r0) : MN_QMM_CHUNK;
    float acc[MN_QMM_CHUNK];
#pragma unroll
    for (int r = 0; r < MN_QMM_CHUNK; r++)
      acc[r] = 0.0f;
    for (long long s = lane; s < SLICES; s += 32) {
      float w[32];
      mn_qmm_slice<FMT, GROUP>(row, s, w);
#pragma unroll
      for (int r = 0; r < MN_QMM_CHUNK; r++)
        if (r < nr) {
          const auto xr = x + (r0 + r) * IN + s * 32;
#pragma unroll
          for (int j = 0; j < 32; j++)
            acc[r] += w[j] * (float)xr[j];
        }
    }
#pragma unroll
    for (int r = 0; r < MN_QMM_CHUNK; r++) {
      float v = acc[r];
      for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && r < nr) y[(r0 + r) * OUT + o] = v;
    }
  }
}

// A quantized weight W [OUT, IN] dequantized into dst [OUT, IN] (stored as argument 1 stores
// its values), for a prefill's product to run as a GEMM (cuda/lower_quant.c): thread i of the
// grid takes slice i (32 weights) of the rows in turn, rounded as mn_quant_matmul rounds them,
// and stores it in 16-byte pieces. io = wq U32 [OUT, RW], dst.
template <int FMT, int GROUP, long long IN, long long OUT, long long RW, class IO>
__device__ void mn_quant_dequant(const IO &io) {
  const unsigned *wq = mn_arg<const unsigned>(io, 0);
  constexpr int S = mn_io_storage<IO, 1>::value;
  constexpr long long SLICES = IN / 32;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < OUT * SLICES;
       i += (long long)gridDim.x * blockDim.x) {
    const long long o = i / SLICES, s = i % SLICES;
    float w[32];
    mn_qmm_slice<FMT, GROUP>(reinterpret_cast<const unsigned char *>(wq + o * RW), s, w);
    if constexpr (S == MN_DEV_F32) {
      float4 *d = reinterpret_cast<float4 *>(mn_arg<float>(io, 1) + o * IN + s * 32);
#pragma unroll
      for (int j = 0; j < 8; j++)
        d[j] = make_float4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
    } else {
      uint4 *d = reinterpret_cast<uint4 *>(mn_arg<unsigned short>(io, 1) + o * IN + s * 32);
#pragma unroll
      for (int j = 0; j < 4; j++)
        d[j] = make_uint4(mn_lp_round2<S>(w[8 * j], w[8 * j + 1]),
                          mn_lp_round2<S>(w[8 * j + 2], w[8 * j + 3]),
                          mn_lp_round2<S>(w[8 * j + 4], w[8 * j + 5]),
                          mn_lp_round2<S>(w[8 * j + 6], w[8 * j + 7]));
    }
  }
}
