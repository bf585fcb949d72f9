// The quantized weight formats of host/quant.h read on the device: f16 scales, and one
// 32-weight slice of a packed row (a GGML block, or part of an affine group) dequantized into
// registers. The slices are mn_quant_matmul's (quant_matmul.cuh), the f16 scales also the decode
// layer's (decode_layer.cuh mn_dl_qrow); named to come before both in the translation unit.

// The f16 whose bits are the low half of h.
__device__ __forceinline__ float mn_qmm_half(unsigned h) {
  h &= 0xffffu;
  const unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f; // 2^-24: subnormal halves are exact
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ float mn_qmm_f16(const unsigned char *p) {
  return mn_qmm_half((unsigned)p[0] | ((unsigned)p[1] << 8));
}

// The 32 weights of slice s of a row, into registers: the scale (and bias) read once.
template <int FMT, int GROUP>
__device__ __forceinline__ void mn_qmm_slice(const unsigned char *row, long long s, float *w) {
  if constexpr (FMT == 1) { // Q8_0
    const unsigned char *b = row + s * 34;
    const float d = mn_qmm_f16(b);
#pragma unroll
    for (int j = 0; j < 32; j++)
      w[j] = __fmul_rn((float)(signed char)b[2 + j], d);
  } else if constexpr (FMT == 2 || FMT == 5) { // Q4_0, Q4_1
    const unsigned char *b = row + s * (FMT == 2 ? 18 : 20);
    const unsigned char *qs = b + (FMT == 2 ? 2 : 4);
    const float d = mn_qmm_f16(b), m = FMT == 5 ? mn_qmm_f16(b + 2) : 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const int lo = qs[j] & 15, hi = qs[j] >> 4;
      if constexpr (FMT == 2) {
        w[j] = __fmul_rn(d, (float)(lo - 8));
        w[j + 16] = __fmul_rn(d, (float)(hi - 8));
      } else {
        w[j] = __fadd_rn(__fmul_rn(d, (float)lo), m);
        w[j + 16] = __fadd_rn(__fmul_rn(d, (float)hi), m);
      }
    }
  } else { // affine int8 (3) or int4 (4): slice s is part (s * 32) % GROUP of its group
    constexpr int QB = FMT == 3 ? GROUP : GROUP / 2;
    const long long e0 = s * 32;
    const unsigned char *b = row + (e0 / GROUP) * (4 + QB);
    const int off = (int)(e0 % GROUP);
    const float sc = mn_qmm_f16(b), bias = mn_qmm_f16(b + 2);
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const int e = off + j;
      int code;
      if constexpr (FMT == 3)
        code = b[4 + e];
      else
        code = e < GROUP / 2 ? (b[4 + e] & 15) : (b[4 + e - GROUP / 2] >> 4);
      w[j] = __fadd_rn(__fmul_rn(sc, (float)code), bias);
    }
  }
}
