// mn_matmul_quant: y [ROWS, OUT] = x [ROWS, IN] W^T with W [OUT, IN] in a quantized format
// (host/quant.h; FMT is its mn_quant value, GROUP the affine group). One warp per output
// feature: its lanes walk the row's 32-weight slices (a GGML block, or a quarter/half/whole
// affine group), dequantize each slice's weights in registers and multiply them with up to
// MN_QMM_CHUNK rows of x at once, so that batch-1-8 decoding reads every weight once. Longer
// inputs (prefill) repeat the walk per chunk of rows; the weight re-reads hit L2.
// Dequantization rounds the product before the sum (__fmul_rn, __fadd_rn) as the CPU reference
// does. io = x, wq U32 [OUT, RW], y.

#define MN_QMM_CHUNK 8

__device__ __forceinline__ float mn_qmm_f16(const unsigned char *p) {
  const unsigned h = (unsigned)p[0] | ((unsigned)p[1] << 8);
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f; // 2^-24: subnormal halves are exact
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// Weight j (0..31) of slice s of a row.
template <int FMT, int GROUP>
__device__ __forceinline__ float mn_qmm_weight(const unsigned char *row, long long s, int j) {
  if constexpr (FMT == 1) { // Q8_0
    const unsigned char *b = row + s * 34;
    return __fmul_rn((float)(signed char)b[2 + j], mn_qmm_f16(b));
  } else if constexpr (FMT == 2 || FMT == 5) { // Q4_0, Q4_1
    const unsigned char *b = row + s * (FMT == 2 ? 18 : 20);
    const unsigned char q = b[(FMT == 2 ? 2 : 4) + (j & 15)];
    const int nib = j < 16 ? (q & 15) : (q >> 4);
    if constexpr (FMT == 2) return __fmul_rn(mn_qmm_f16(b), (float)(nib - 8));
    return __fadd_rn(__fmul_rn(mn_qmm_f16(b), (float)nib), mn_qmm_f16(b + 2));
  } else { // affine int8 (3) or int4 (4)
    constexpr int QB = FMT == 3 ? GROUP : GROUP / 2;
    const long long e0 = s * 32;
    const unsigned char *b = row + (e0 / GROUP) * (4 + QB);
    const int e = (int)(e0 % GROUP) + j;
    int code;
    if constexpr (FMT == 3)
      code = b[4 + e];
    else
      code = e < GROUP / 2 ? (b[4 + e] & 15) : (b[4 + e - GROUP / 2] >> 4);
    return __fadd_rn(__fmul_rn(mn_qmm_f16(b), (float)code), mn_qmm_f16(b + 2));
  }
}

template <int FMT, int GROUP, long long ROWS, long long IN, long long OUT, long long RW,
          int WARPS, class IO>
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
      for (int j = 0; j < 32; j++) {
        const float w = mn_qmm_weight<FMT, GROUP>(row, s, j);
#pragma unroll
        for (int r = 0; r < MN_QMM_CHUNK; r++)
          if (r < nr) acc[r] += w * (float)x[(r0 + r) * IN + s * 32 + j];
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
