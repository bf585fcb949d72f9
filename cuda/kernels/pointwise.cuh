// Element-wise ops: one grid-stride template over the element functions of host/pointwise.h
// (embedded ahead of this file), instantiated per row code and size. Arguments: p[0] the
// output, p[1..NIN] the element-wise inputs, and for MN_PW_SCALAR rows (loss gradients,
// expand_scalar) p[1 + NIN] the buffer of the scalar the row's factor reads.
// Every node buffer starts 256-byte aligned, so whole buffers are read as float4.

// A row's value; k is the scalar factor, s the float attribute.
template <int OP>
__device__ __forceinline__ float mn_pw_apply(float a, float b, float c, double k, float s) {
  return mn_pw_eval(OP, a, b, c, k, s);
}

template <int OP>
__device__ __forceinline__ float4 mn_pw_apply4(float4 a, float4 b, float4 c, double k, float s) {
  return make_float4(mn_pw_apply<OP>(a.x, b.x, c.x, k, s), mn_pw_apply<OP>(a.y, b.y, c.y, k, s),
                     mn_pw_apply<OP>(a.z, b.z, c.z, k, s), mn_pw_apply<OP>(a.w, b.w, c.w, k, s));
}

// out[i] = f(in0[i], in1[i], in2[i]) for i < N; SBITS is the float attribute (scale)
// as its bit pattern, since C++17 has no float template parameters.
template <int OP, long long N, unsigned SBITS> __device__ void mn_pw_map(const mn_ptrs &io) {
  constexpr int NIN = mn_pw_num_inputs(OP);
  const float s = __uint_as_float(SBITS);
  float *out = mn_arg<float>(io, 0);
  const float *a = mn_arg<const float>(io, 1), *b = mn_arg<const float>(io, 2),
              *c = mn_arg<const float>(io, 3);
  double k = 0.0;
  if constexpr ((mn_pw_flags(OP) & MN_PW_SCALAR) != 0)
    k = mn_pw_factor(OP, mn_arg<const float>(io, 1 + NIN)[0], s, N);
  constexpr long long NQ = N / 4;
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  MN_FOR_EACH(q, NQ) {
    float4 va = zero4, vb = zero4, vc = zero4;
    if constexpr (NIN > 0) va = reinterpret_cast<const float4 *>(a)[q];
    if constexpr (NIN > 1) vb = reinterpret_cast<const float4 *>(b)[q];
    if constexpr (NIN > 2) vc = reinterpret_cast<const float4 *>(c)[q];
    reinterpret_cast<float4 *>(out)[q] = mn_pw_apply4<OP>(va, vb, vc, k, s);
  }
  if constexpr (N % 4 != 0) {
    const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
      float va = 0.0f, vb = 0.0f, vc = 0.0f;
      if constexpr (NIN > 0) va = a[i];
      if constexpr (NIN > 1) vb = b[i];
      if constexpr (NIN > 2) vc = c[i];
      out[i] = mn_pw_apply<OP>(va, vb, vc, k, s);
    }
  }
}

// out[i] = x[i] + row[i % NCOL] (bias_add, broadcast_add).
template <long long N, long long NCOL> __device__ void mn_pw_add_row(const mn_ptrs &io) {
  float *out = mn_arg<float>(io, 0);
  const float *x = mn_arg<const float>(io, 1), *row = mn_arg<const float>(io, 2);
  if constexpr (NCOL % 4 == 0) {
    constexpr long long NQ = N / 4, QCOL = NCOL / 4;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    const float4 *r4 = reinterpret_cast<const float4 *>(row);
    MN_FOR_EACH(q, NQ) {
      float4 v = x4[q], r = r4[q % QCOL];
      reinterpret_cast<float4 *>(out)[q] = make_float4(v.x + r.x, v.y + r.y, v.z + r.z, v.w + r.w);
    }
  } else {
    MN_FOR_EACH(i, N) { out[i] = x[i] + row[i % NCOL]; }
  }
}

// out[i] = in[i] between storage types (fp32 to bf16 / fp16 rounds to nearest even).
template <long long N, class IO> __device__ void mn_convert(const IO &io) {
  auto out = mn_out<0>(io);
  auto in = mn_in<1>(io);
  constexpr long long NQ = N / 4;
  MN_FOR_EACH(q, NQ) { mn_st4(out, q, mn_ld4(in, q)); }
  MN_FOR_EACH(i, N - NQ * 4) { out[NQ * 4 + i] = in[NQ * 4 + i]; }
}
