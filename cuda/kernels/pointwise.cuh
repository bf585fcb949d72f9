// Element-wise ops: one grid-stride template over the element functions of host/pointwise.h
// (embedded ahead of this file), instantiated per row code and size. Arguments: p[0] the
// output, p[1..NIN] the element-wise inputs, and for MN_PW_SCALAR rows (loss gradients,
// expand_scalar) p[1 + NIN] the buffer of the scalar the row's factor reads.
// Every node buffer starts 256-byte aligned, so whole buffers are read as float4 (fp32) or,
// when an argument is stored in 2 bytes, in groups of 8 elements (16 bytes).

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

// Whether any of arguments 0 .. LAST of a launch stores 2-byte values: then the element-wise
// kernels below move 8 elements per access.
template <class IO, int LAST>
constexpr bool mn_pw_any_low = (LAST >= 0 && mn_io_storage<IO, 0>::value != MN_DEV_F32) ||
                               (LAST >= 1 && mn_io_storage<IO, 1>::value != MN_DEV_F32) ||
                               (LAST >= 2 && mn_io_storage<IO, 2>::value != MN_DEV_F32) ||
                               (LAST >= 3 && mn_io_storage<IO, 3>::value != MN_DEV_F32);

// Elements 8g .. 8g+7: one 16-byte access for 2-byte storage (16-byte aligned), two float4
// for fp32 (so mixed instances move 8 elements of every argument per step too).
template <int S, bool C>
__device__ __forceinline__ void mn_pw_ld8(mn_lp_ptr<S, C> p, long long g, float (&v)[8]) {
  const uint4 w = reinterpret_cast<const uint4 *>(p.p)[g];
  const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    v[2 * k] = mn_lp_load<S>((unsigned short)(u[k] & 0xffffu));
    v[2 * k + 1] = mn_lp_load<S>((unsigned short)(u[k] >> 16));
  }
}
__device__ __forceinline__ void mn_pw_ld8(const float *p, long long g, float (&v)[8]) {
  const float4 lo = mn_ld4(p, 2 * g), hi = mn_ld4(p, 2 * g + 1);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
  v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}
template <int S>
__device__ __forceinline__ void mn_pw_st8(mn_lp_ptr<S, false> p, long long g, const float (&v)[8]) {
  reinterpret_cast<uint4 *>(p.p)[g] =
      make_uint4(mn_lp_round2<S>(v[0], v[1]), mn_lp_round2<S>(v[2], v[3]),
                 mn_lp_round2<S>(v[4], v[5]), mn_lp_round2<S>(v[6], v[7]));
}
__device__ __forceinline__ void mn_pw_st8(float *p, long long g, const float (&v)[8]) {
  mn_st4(p, 2 * g, make_float4(v[0], v[1], v[2], v[3]));
  mn_st4(p, 2 * g + 1, make_float4(v[4], v[5], v[6], v[7]));
}

// out[i] = f(a[i], b[i], c[i]) for one element (the tail of mn_pw_map).
template <int OP, int NIN, class O, class A, class B, class C>
__device__ __forceinline__ void mn_pw_one(O out, A a, B b, C c, long long i, double k, float s) {
  float va = 0.0f, vb = 0.0f, vc = 0.0f;
  if constexpr (NIN > 0) va = a[i];
  if constexpr (NIN > 1) vb = b[i];
  if constexpr (NIN > 2) vc = c[i];
  out[i] = mn_pw_apply<OP>(va, vb, vc, k, s);
}

// out[i] = f(in0[i], in1[i], in2[i]) for i < N; SBITS is the float attribute (scale)
// as its bit pattern, since C++17 has no float template parameters.
template <int OP, long long N, unsigned SBITS, class IO> __device__ void mn_pw_map(const IO &io) {
  constexpr int NIN = mn_pw_num_inputs(OP);
  const float s = __uint_as_float(SBITS);
  auto out = mn_out<0>(io);
  auto a = mn_in<1>(io);
  auto b = mn_in<2>(io);
  auto c = mn_in<3>(io);
  double k = 0.0;
  if constexpr ((mn_pw_flags(OP) & MN_PW_SCALAR) != 0)
    k = mn_pw_factor(OP, mn_in<1 + NIN>(io)[0], s, N);
  if constexpr (mn_pw_any_low<IO, NIN>) {
    constexpr long long NG = N / 8;
    MN_FOR_EACH(g, NG) {
      float va[8] = {}, vb[8] = {}, vc[8] = {}, r[8];
      if constexpr (NIN > 0) mn_pw_ld8(a, g, va);
      if constexpr (NIN > 1) mn_pw_ld8(b, g, vb);
      if constexpr (NIN > 2) mn_pw_ld8(c, g, vc);
#pragma unroll
      for (int j = 0; j < 8; j++)
        r[j] = mn_pw_apply<OP>(va[j], vb[j], vc[j], k, s);
      mn_pw_st8(out, g, r);
    }
    if constexpr (N % 8 != 0)
      if (const long long i = NG * 8 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N)
        mn_pw_one<OP, NIN>(out, a, b, c, i, k, s);
  } else {
    constexpr long long NQ = N / 4;
    const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    MN_FOR_EACH(q, NQ) {
      float4 va = zero4, vb = zero4, vc = zero4;
      if constexpr (NIN > 0) va = mn_ld4(a, q);
      if constexpr (NIN > 1) vb = mn_ld4(b, q);
      if constexpr (NIN > 2) vc = mn_ld4(c, q);
      mn_st4(out, q, mn_pw_apply4<OP>(va, vb, vc, k, s));
    }
    if constexpr (N % 4 != 0)
      if (const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N)
        mn_pw_one<OP, NIN>(out, a, b, c, i, k, s);
  }
}

// Dropout and its gradient (mn_pw_dropout of host/pointwise.h): io = out, x, the per-step
// scalars, whose micro_step the step graph copies in before each launch. SEED and PBITS (p's
// bit pattern) are the node's attributes.
template <long long N, unsigned long long SEED, unsigned PBITS, class IO>
__device__ void mn_dropout(const IO &io) {
  const float p = __uint_as_float(PBITS);
  const unsigned threshold = mn_pw_dropout_threshold(p);
  const unsigned long long key =
      mn_pw_dropout_key(SEED, mn_arg<const mn_dev_scalars>(io, 2)->micro_step);
  auto out = mn_out<0>(io);
  auto x = mn_in<1>(io);
  constexpr long long NQ = N / 4;
  MN_FOR_EACH(q, NQ) {
    const float4 v = mn_ld4(x, q);
    const unsigned long long i = 4ull * (unsigned long long)q;
    mn_st4(out, q,
           make_float4(mn_pw_dropout(v.x, key, i, threshold, p),
                       mn_pw_dropout(v.y, key, i + 1, threshold, p),
                       mn_pw_dropout(v.z, key, i + 2, threshold, p),
                       mn_pw_dropout(v.w, key, i + 3, threshold, p)));
  }
  if constexpr (N % 4 != 0)
    if (const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < N)
      out[i] = mn_pw_dropout(x[i], key, (unsigned long long)i, threshold, p);
}

// out[i] = x[i] + row[i % NCOL] (bias_add, broadcast_add).
template <long long N, long long NCOL, class IO> __device__ void mn_pw_add_row(const IO &io) {
  auto out = mn_out<0>(io);
  auto x = mn_in<1>(io);
  auto row = mn_in<2>(io);
  if constexpr (mn_pw_any_low<IO, 2> && NCOL % 8 == 0) {
    constexpr long long NG = N / 8, GCOL = NCOL / 8;
    MN_FOR_EACH(g, NG) {
      float v[8], r[8];
      mn_pw_ld8(x, g, v);
      mn_pw_ld8(row, g % GCOL, r);
#pragma unroll
      for (int j = 0; j < 8; j++)
        v[j] += r[j];
      mn_pw_st8(out, g, v);
    }
  } else if constexpr (NCOL % 4 == 0) {
    constexpr long long NQ = N / 4, QCOL = NCOL / 4;
    MN_FOR_EACH(q, NQ) {
      float4 v = mn_ld4(x, q), r = mn_ld4(row, q % QCOL);
      mn_st4(out, q, make_float4(v.x + r.x, v.y + r.y, v.z + r.z, v.w + r.w));
    }
  } else {
    MN_FOR_EACH(i, N) { out[i] = x[i] + row[i % NCOL]; }
  }
}

// out[i] = in[i] between storage types (fp32 to bf16 / fp16 rounds to nearest even).
template <long long N, class IO> __device__ void mn_convert(const IO &io) {
  auto out = mn_out<0>(io);
  auto in = mn_in<1>(io);
  if constexpr (mn_pw_any_low<IO, 1>) {
    constexpr long long NG = N / 8;
    MN_FOR_EACH(g, NG) {
      float v[8];
      mn_pw_ld8(in, g, v);
      mn_pw_st8(out, g, v);
    }
    MN_FOR_EACH(i, N - NG * 8) { out[NG * 8 + i] = in[NG * 8 + i]; }
  } else {
    constexpr long long NQ = N / 4;
    MN_FOR_EACH(q, NQ) { mn_st4(out, q, mn_ld4(in, q)); }
    MN_FOR_EACH(i, N - NQ * 4) { out[NQ * 4 + i] = in[NQ * 4 + i]; }
  }
}

// v as storage S keeps it: rounded to 2 bytes and back, or for fp32 v itself, through an empty
// asm so that the compiler cannot fuse v's last product into the sum that adds it (sums of the
// same stored values are then the same bits in every kernel that makes them).
template <int S> __device__ __forceinline__ float mn_as_stored(float v) {
  if constexpr (S == MN_DEV_F32) {
    asm("" : "+f"(v));
    return v;
  } else {
    return mn_lp_load<S>(mn_lp_round<S>(v));
  }
}

// One row's VEC elements of a and b at element i (8 a 16-byte access, or 1).
template <int VEC, class A, class B>
__device__ __forceinline__ void mn_colsum_load(A a, B b, long long i, float (&va)[VEC],
                                               float (&vb)[VEC]) {
  if constexpr (VEC == 8) {
    mn_pw_ld8(a, i / 8, va);
    mn_pw_ld8(b, i / 8, vb);
  } else {
    va[0] = a[i];
    vb[0] = b[i];
  }
}

// f(a, b) of row OP stored at p[0][i..], added as stored into acc; with AOP >= 0 row AOP of a
// alone stored at p[4][i..].
template <int OP, int AOP, int VEC, class IO>
__device__ __forceinline__ void mn_colsum_emit(const IO &io, long long i, const float (&va)[VEC],
                                               const float (&vb)[VEC], float (&acc)[VEC]) {
  float v[VEC];
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    v[j] = mn_pw_apply<OP>(va[j], vb[j], 0.0f, 0.0, 0.0f);
    acc[j] += mn_as_stored<mn_io_storage<IO, 0>::value>(v[j]);
  }
  if constexpr (VEC == 8)
    mn_pw_st8(mn_out<0>(io), i / 8, v);
  else
    mn_out<0>(io)[i] = v[0];
  if constexpr (AOP >= 0) {
#pragma unroll
    for (int j = 0; j < VEC; j++)
      v[j] = mn_pw_apply<AOP>(va[j], 0.0f, 0.0f, 0.0, 0.0f);
    if constexpr (VEC == 8)
      mn_pw_st8(mn_out<4>(io), i / 8, v);
    else
      mn_out<4>(io)[i] = v[0];
  }
}

// out = f(a, b) of row OP over ROWS x NCOL, and the column sums of the values as out stores
// them (what sum_rows reading out would add). Block (x, y) takes CT x VEC adjacent columns of the
// rows [ROWS y / CH, ROWS (y + 1) / CH); its LANES row lanes of CT threads each take every LANES-th
// row of that chunk, two rows loaded before either is stored, and add their sums in a fixed
// order through shared memory. With CH > 1, p[3] receives one double partial per chunk and
// column, in the layout mn_red_sum_rows_final adds in a fixed order; with CH == 1 p[3] is the
// sums themselves. With AOP >= 0, p[4] receives row AOP of a alone (gelu_grad's forward GELU,
// recomputed for the backward where its gradient reads the same input).
template <int OP, long long ROWS, long long NCOL, int CH, int VEC, int CT, int LANES, int AOP,
          class IO>
__device__ void mn_pw_map_colsum(const IO &io) {
  static_assert(mn_pw_num_inputs(OP) == 2 && (mn_pw_flags(OP) & MN_PW_SCALAR) == 0,
                "a row of two element-wise inputs");
  static_assert(VEC == 1 || (VEC == 8 && NCOL % 8 == 0), "8 columns a thread need rows of 8k");
  constexpr int U = 2, COLS = CT * VEC;
  __shared__ float sums[LANES][COLS];
  auto a = mn_in<1>(io);
  auto b = mn_in<2>(io);
  const int ct = threadIdx.x % CT, lane = threadIdx.x / CT;
  const long long col = ((long long)blockIdx.x * CT + ct) * VEC;
  const long long r0 = ROWS * blockIdx.y / CH, r1 = ROWS * (blockIdx.y + 1) / CH;
  float acc[VEC] = {};
  if (col < NCOL) {
    long long r = r0 + lane;
    for (; r + (U - 1) * LANES < r1; r += U * LANES) {
      float va[U][VEC], vb[U][VEC];
#pragma unroll
      for (int u = 0; u < U; u++)
        mn_colsum_load<VEC>(a, b, (r + u * LANES) * NCOL + col, va[u], vb[u]);
#pragma unroll
      for (int u = 0; u < U; u++)
        mn_colsum_emit<OP, AOP, VEC>(io, (r + u * LANES) * NCOL + col, va[u], vb[u], acc);
    }
    for (; r < r1; r += LANES) {
      float va[VEC], vb[VEC];
      mn_colsum_load<VEC>(a, b, r * NCOL + col, va, vb);
      mn_colsum_emit<OP, AOP, VEC>(io, r * NCOL + col, va, vb, acc);
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; j++)
    sums[lane][ct * VEC + j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < COLS; c += CT * LANES) {
    const long long at = (long long)blockIdx.x * COLS + c;
    if (at >= NCOL) continue;
    float t = 0.0f;
#pragma unroll
    for (int l = 0; l < LANES; l++)
      t += sums[l][c];
    if constexpr (CH == 1)
      mn_out<3>(io)[at] = t;
    else
      mn_arg<double>(io, 3)[(long long)blockIdx.y * NCOL + at] = (double)t;
  }
}
