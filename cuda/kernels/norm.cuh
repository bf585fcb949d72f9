// Row norms over the last axis: rms_norm and layer_norm, their x gradients and their
// weight gradients. A group of BLOCK threads per row: one warp for short rows (RPB rows
// per block then, reduced with shuffles alone), else the whole block. A row of N floats is
// read as NV = N / VEC vectors (VEC 4 or 2 when N allows it: every node buffer starts
// 256-byte aligned, so every row then starts 16- or 8-byte aligned); thread t of the group
// owns vectors t, t + BLOCK, ..., ITEMS of them. When CACHE, a row is read from memory
// once and kept in registers between the passes; rows too wide for that are re-read
// (from L1/L2) in each pass.
//
// The reference works in double throughout. These kernels work on each element in float and
// carry every sum that crosses a vector of VEC values in double (mn_norm_stats): an element is
// off by a few float roundings (a few 1e-7 relative for rows whose mean is within a few
// standard deviations of zero), inside the 1e-5 the tests allow, and the mean is carried as
// its float and the rest (mn_norm_row_stats::x_hat), so that x - mean keeps its digits in rows far
// from zero; what a far row still loses is the float sum of each vector before the double one (VEC
// values, 2^-24 of their size each: 7e-6 of x_hat for rows of [1000, 1004)). The forward, the
// x gradient and the wide rows' weight gradient share one mn_norm_stats, so the gradients
// differentiate what the forward computed (rows of up to 1024 take mn_norm_grad_w_rows, which
// centres on a pivot of its own). eps arrives as the bits of the float attribute.
//
// The forward and the x gradient are written once, over a loader and a storer
// (mn_norm_fwd_with, mn_norm_grad_x_with), so that the code that cuda/lower_fused.c generates
// for a fused program can compute x and dy from its inputs as they are loaded (a prologue)
// and transform the result before it is stored (an epilogue) in the same kernel:
//   load(e, x, dy, write): the VEC floats of x (and for the gradient dy) at element e of the
//     tensor (e = row * N + j * VEC). write is true exactly once for each element, so a
//     prologue writes the values it must also store then; other calls only recompute.
//   store(e, o): the VEC results at element e.
// The plain kernels load x and dy from memory and store the results.
//
// Storage: every float argument is read through mn_in / written through mn_out (common.cuh),
// so x, dy, the weight, the bias and the outputs may be bf16 / fp16. The statistics and every
// sum are formed from the values as stored, and each output is rounded once when it is
// stored; nothing a kernel stores is read back.

// This thread's index within its row's group.
template <int BLOCK> __device__ __forceinline__ int mn_norm_t() {
  return BLOCK == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
}

// Sum over the row's group; every thread of it gets the result. A one-warp group needs
// no shared memory and no barrier, so warps of a block may leave independently.
template <int BLOCK> __device__ __forceinline__ double mn_norm_sum(double v, double *sh) {
  if constexpr (BLOCK == 32)
    return mn_warp_sum_d(v);
  else
    return mn_block_sum_d<BLOCK>(v, sh);
}

// Slot k of this thread's share of a row: from the register cache when CACHE, else from
// memory.
template <int VEC, bool CACHE, class P>
__device__ __forceinline__ void mn_norm_get(const float *cache, int k, P row, long long j,
                                            float *v) {
  if constexpr (CACHE) {
#pragma unroll
    for (int e = 0; e < VEC; e++)
      v[e] = cache[k * VEC + e];
  } else {
    mn_ld_vec<VEC>(row + j * VEC, v);
  }
}

// Loads this thread's share of a row into the cache (nothing when !CACHE).
template <int BLOCK, int VEC, long long N, int ITEMS, bool CACHE, class P>
__device__ __forceinline__ void mn_norm_fill(float *cache, P row) {
  if constexpr (CACHE) {
    constexpr long long NV = N / VEC;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
      const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
      if (j < NV) mn_ld_vec<VEC>(row + j * VEC, cache + k * VEC);
    }
  }
}

// Sums over the row's group of two values at once (one barrier pair for a block); sh holds 64.
template <int BLOCK>
__device__ __forceinline__ void mn_norm_sum2(double &a, double &b, double *sh) {
  a = mn_warp_sum_d(a);
  b = mn_warp_sum_d(b);
  if constexpr (BLOCK > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = a, sh[32 + warp] = b;
    __syncthreads();
    a = mn_warp_sum_d(lane < BLOCK / 32 ? sh[lane] : 0.0);
    b = mn_warp_sum_d(lane < BLOCK / 32 ? sh[32 + lane] : 0.0);
  }
}

// The type a row's elements are worked on in: float, but double for rows of one or two values,
// whose x gradient is nearly all cancellation (two centred values span their whole row, and
// what is left of g - mean(g) - x_hat mean(g x_hat) is of the order of eps / var), so that
// float roundings of its terms would be most of it.
template <long long N> struct mn_norm_real { using type = float; };
template <> struct mn_norm_real<1> { using type = double; };
template <> struct mn_norm_real<2> { using type = double; };

// A row's statistics: its mean (0 without CENTER) as mean, the mean rounded to R, and rest, the
// difference rounded to R, and inv = 1 / sqrt(mean((x - mean)^2) + eps).
template <class R> struct mn_norm_row_stats {
  R mean, rest, inv;
  // (x - mean) inv: x - mean is exact for x within a factor of two of it, so a row far from
  // zero keeps the digits of its spread.
  __device__ __forceinline__ R x_hat(float x) const { return (((R)x - mean) - rest) * inv; }
};

// The statistics of one row in mn_norm_real<N>; xat(k, j, a) gives the x floats of slot k
// (vector j). Every thread of the group gets them. A slot's VEC values are summed in
// R and that sum added into the thread's double, which crosses threads in double: with R
// float, one conversion a slot, where converting every value (and working on it in double)
// took most of the kernels' time, the double unit converting at an eighth of the float rate
// (docs/performance.md). The squares are of x - mean_r, and the variance is corrected by
// (mean - mean_r)^2: the two-pass form of the reference. A NaN or an infinity in the row makes
// inv NaN, as in the reference.
template <int BLOCK, int VEC, long long N, int ITEMS, bool CACHE, bool CENTER, class X>
__device__ __forceinline__ mn_norm_row_stats<typename mn_norm_real<N>::type>
mn_norm_stats(X &&xat, double eps, double *sh) {
  using R = typename mn_norm_real<N>::type;
  constexpr long long NV = N / VEC;
  constexpr double RN = 1.0 / (double)N;
  double m = 0.0;
  R mr = 0;
  if constexpr (CENTER) {
    double s = 0.0;
#pragma unroll(CACHE ? ITEMS : 1)
    for (int k = 0; k < ITEMS; k++) {
      const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
      if (j < NV) {
        float a[VEC];
        R t = 0;
        xat(k, j, a);
#pragma unroll
        for (int e = 0; e < VEC; e++)
          t += (R)a[e];
        s += (double)t;
      }
    }
    m = mn_norm_sum<BLOCK>(s, sh) * RN;
    mr = (R)m;
  }
  double ss = 0.0;
#pragma unroll(CACHE ? ITEMS : 1)
  for (int k = 0; k < ITEMS; k++) {
    const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
    if (j < NV) {
      float a[VEC];
      R t = 0;
      xat(k, j, a);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const R d = (R)a[e] - mr;
        t = fma(d, d, t);
      }
      ss += (double)t;
    }
  }
  const double shift = m - (double)mr;
  const double var = mn_norm_sum<BLOCK>(ss, sh) * RN - shift * shift;
  return {mr, (R)shift, (R)rsqrt((var < 0.0 ? 0.0 : var) + eps)};
}

template <int VEC> __device__ __forceinline__ void mn_norm_copy(const float *src, float *dst) {
#pragma unroll
  for (int e = 0; e < VEC; e++)
    dst[e] = src[e];
}

// The row of this thread's group, or -1 past the last of the ROWS rows (only whole
// warps of a block of one-warp groups get that).
template <int BLOCK, int RPB, long long ROWS> __device__ __forceinline__ long long mn_norm_row() {
  if constexpr (RPB == 1) return blockIdx.x;
  const long long row = (long long)blockIdx.x * RPB + (threadIdx.x >> 5);
  return row < ROWS ? row : -1;
}

// Forward over a loader and a storer (above): ROWS rows, RPB per block (RPB > 1 only with
// BLOCK 32); w the weight, b the bias (CENTER only; any pointer, or nullptr, otherwise).
//   rms_norm:   out = x * inv * w
//   layer_norm: out = (x - mean) * inv * w + b
template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool CACHE,
          bool CENTER, unsigned EPS_BITS, class W, class B, typename L, typename S>
__device__ __forceinline__ void mn_norm_fwd_with(W w, B b, L &&load, S &&store) {
  __shared__ double sh[32];
  constexpr long long NV = N / VEC;
  const long long row = mn_norm_row<BLOCK, RPB, ROWS>();
  if (row < 0) return;
  const long long r0 = row * N;
  float xc[CACHE ? ITEMS * VEC : 1], unused[VEC];
  if constexpr (CACHE) {
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
      const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
      if (j < NV) load(r0 + j * VEC, xc + k * VEC, unused, true);
    }
  }
  auto xat = [&](int k, long long j, float *a) {
    if constexpr (CACHE)
      mn_norm_copy<VEC>(xc + k * VEC, a);
    else
      load(r0 + j * VEC, a, unused, false);
  };
  using R = typename mn_norm_real<N>::type;
  const mn_norm_row_stats<R> st = mn_norm_stats<BLOCK, VEC, N, ITEMS, CACHE, CENTER>(
      xat, (double)__int_as_float((int)EPS_BITS), sh);
#pragma unroll(CACHE ? ITEMS : 1)
  for (int k = 0; k < ITEMS; k++) {
    const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
    if (j < NV) {
      float a[VEC], wv[VEC], o[VEC];
      if constexpr (CACHE)
        mn_norm_copy<VEC>(xc + k * VEC, a);
      else
        load(r0 + j * VEC, a, unused, true);
      mn_ld_vec<VEC>(w + j * VEC, wv);
      if constexpr (CENTER) {
        float bv[VEC];
        mn_ld_vec<VEC>(b + j * VEC, bv);
#pragma unroll
        for (int e = 0; e < VEC; e++)
          o[e] = (float)fma(st.x_hat(a[e]), (R)wv[e], (R)bv[e]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
          o[e] = (float)(st.x_hat(a[e]) * (R)wv[e]);
      }
      store(r0 + j * VEC, o);
    }
  }
}

// Forward. p[0] x, p[1] weight, p[2] bias (CENTER only), p[3] out.
template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool CACHE,
          bool CENTER, unsigned EPS_BITS, class IO>
__device__ void mn_norm_fwd(const IO &io) {
  auto x = mn_in<0>(io);
  auto out = mn_out<3>(io);
  mn_norm_fwd_with<BLOCK, RPB, ROWS, VEC, N, ITEMS, CACHE, CENTER, EPS_BITS>(
      mn_in<1>(io), mn_in<2>(io),
      [&](long long e, float *v, float *, bool) { mn_ld_vec<VEC>(x + e, v); },
      [&](long long e, const float *o) { mn_st_vec<VEC>(out + e, o); });
}

// x gradient over a loader and a storer (above), rows as for the forward; w the weight. With
// g = dy * w and x_hat = (x - mean) * inv: dx = inv * (g - mean(g) - x_hat * mean(g *
// x_hat)), without the mean(g) term for rms_norm (its x_hat is not centered).
template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool CACHE,
          bool CENTER, unsigned EPS_BITS, class W, typename L, typename S>
__device__ __forceinline__ void mn_norm_grad_x_with(W w, L &&load, S &&store) {
  __shared__ double sh[64];
  constexpr long long NV = N / VEC;
  const long long row = mn_norm_row<BLOCK, RPB, ROWS>();
  if (row < 0) return;
  const long long r0 = row * N;
  float xc[CACHE ? ITEMS * VEC : 1], dc[CACHE ? ITEMS * VEC : 1], unused[VEC];
  if constexpr (CACHE) {
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
      const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
      if (j < NV) load(r0 + j * VEC, xc + k * VEC, dc + k * VEC, true);
    }
  }
  auto xat = [&](int k, long long j, float *a) {
    if constexpr (CACHE)
      mn_norm_copy<VEC>(xc + k * VEC, a);
    else
      load(r0 + j * VEC, a, unused, false);
  };
  // Both operands of slot k; write as load's (ignored when CACHE: the fill wrote).
  auto both = [&](int k, long long j, float *a, float *d, bool write) {
    if constexpr (CACHE) {
      mn_norm_copy<VEC>(xc + k * VEC, a);
      mn_norm_copy<VEC>(dc + k * VEC, d);
    } else {
      load(r0 + j * VEC, a, d, write);
    }
  };
  using R = typename mn_norm_real<N>::type;
  const mn_norm_row_stats<R> st = mn_norm_stats<BLOCK, VEC, N, ITEMS, CACHE, CENTER>(
      xat, (double)__int_as_float((int)EPS_BITS), sh);
  double sg = 0.0, sgx = 0.0;
#pragma unroll(CACHE ? ITEMS : 1)
  for (int k = 0; k < ITEMS; k++) {
    const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
    if (j < NV) {
      float a[VEC], d[VEC], wv[VEC];
      R tg = 0, tgx = 0;
      both(k, j, a, d, false);
      mn_ld_vec<VEC>(w + j * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const R g = (R)d[e] * (R)wv[e];
        tg += g;
        tgx = fma(g, st.x_hat(a[e]), tgx);
      }
      sg += (double)tg;
      sgx += (double)tgx;
    }
  }
  mn_norm_sum2<BLOCK>(sg, sgx, sh);
  constexpr double RN = 1.0 / (double)N;
  const R mg = CENTER ? (R)(sg * RN) : (R)0, mgx = (R)(sgx * RN);
#pragma unroll(CACHE ? ITEMS : 1)
  for (int k = 0; k < ITEMS; k++) {
    const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
    if (j < NV) {
      float a[VEC], d[VEC], wv[VEC], o[VEC];
      both(k, j, a, d, true);
      mn_ld_vec<VEC>(w + j * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        o[e] = (float)(st.inv * fma(-st.x_hat(a[e]), mgx, (R)d[e] * (R)wv[e] - mg));
      }
      store(r0 + j * VEC, o);
    }
  }
}

// x gradient. p[0] x, p[1] weight, p[2] dy, p[3] dx.
template <int BLOCK, int RPB, long long ROWS, int VEC, long long N, int ITEMS, bool CACHE,
          bool CENTER, unsigned EPS_BITS, class IO>
__device__ void mn_norm_grad_x(const IO &io) {
  auto x = mn_in<0>(io);
  auto dy = mn_in<2>(io);
  auto dx = mn_out<3>(io);
  mn_norm_grad_x_with<BLOCK, RPB, ROWS, VEC, N, ITEMS, CACHE, CENTER, EPS_BITS>(
      mn_in<1>(io),
      [&](long long e, float *a, float *d, bool) {
        mn_ld_vec<VEC>(x + e, a);
        mn_ld_vec<VEC>(dy + e, d);
      },
      [&](long long e, const float *o) { mn_st_vec<VEC>(dx + e, o); });
}

// Weight gradient, pass 1 of 2, for rows wider than 1024 floats (narrower ones take a warp each:
// mn_norm_grad_w_rows, norm_grad_w.cuh): dw[i] = sum over rows of dy * x_hat. Block c takes rows
// [c * CHUNK, (c + 1) * CHUNK) of the ROWS and writes its column sums, in double, to
// p[2][c * N + i] (scratch). p[0] x, p[1] dy. A fixed split and a fixed order in pass 2
// make the result deterministic (no atomics).
template <int BLOCK, int VEC, long long N, int ITEMS, bool CACHE, bool CENTER, unsigned EPS_BITS,
          long long ROWS, long long CHUNK, class IO>
__device__ void mn_norm_grad_w_partial(const IO &io) {
  __shared__ double sh[32];
  constexpr long long NV = N / VEC;
  const auto x0 = mn_in<0>(io);
  const auto dy0 = mn_in<1>(io);
  double *part = mn_arg<double>(io, 2) + (long long)blockIdx.x * N;
  const double eps = (double)__int_as_float((int)EPS_BITS);
  // Column accumulators stay in registers for rows that fit the cache; wider rows spill
  // them to local memory, which is still correct.
  double acc[ITEMS * VEC];
#pragma unroll
  for (int k = 0; k < ITEMS * VEC; k++)
    acc[k] = 0.0;
  const long long r0 = (long long)blockIdx.x * CHUNK;
  const long long r1 = r0 + CHUNK < ROWS ? r0 + CHUNK : ROWS;
  for (long long r = r0; r < r1; r++) {
    const auto x = x0 + r * N;
    const auto dy = dy0 + r * N;
    float xc[CACHE ? ITEMS * VEC : 1];
    mn_norm_fill<BLOCK, VEC, N, ITEMS, CACHE>(xc, x);
    using R = typename mn_norm_real<N>::type;
    const mn_norm_row_stats<R> st = mn_norm_stats<BLOCK, VEC, N, ITEMS, CACHE, CENTER>(
        [&](int k, long long j, float *a) { mn_norm_get<VEC, CACHE>(xc, k, x, j, a); }, eps, sh);
#pragma unroll(CACHE ? ITEMS : 1)
    for (int k = 0; k < ITEMS; k++) {
      const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
      if (j < NV) {
        float a[VEC], d[VEC];
        mn_norm_get<VEC, CACHE>(xc, k, x, j, a);
        mn_ld_vec<VEC>(dy + j * VEC, d);
#pragma unroll
        for (int e = 0; e < VEC; e++)
          acc[k * VEC + e] += (double)((R)d[e] * st.x_hat(a[e]));
      }
    }
  }
#pragma unroll(CACHE ? ITEMS : 1)
  for (int k = 0; k < ITEMS; k++) {
    const long long j = mn_norm_t<BLOCK>() + (long long)k * BLOCK;
    if (j < NV) {
#pragma unroll
      for (int e = 0; e < VEC; e++)
        part[j * VEC + e] = acc[k * VEC + e];
    }
  }
}

// Weight gradient, pass 2 of 2: dw[i] = the sum of the CHUNKS partials of column i. A block of
// 8 warps takes 32 columns (a lane each, so every read of a chunk's row is one coalesced line);
// warp w adds chunks w, w + 8, ... in order, then warp 0 adds the 8 warp sums in order: a fixed
// order, the same bits every run. p[0] partials (scratch, double), p[1] dw. Grid ceil(N / 32)
// of 256 threads.
template <long long N, int CHUNKS, class IO> __device__ void mn_norm_grad_w_sum(const IO &io) {
  __shared__ double sh[8][32];
  const double *part = mn_arg<const double>(io, 0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long i = (long long)blockIdx.x * 32 + lane;
  double s = 0.0;
  if (i < N)
    for (int c = warp; c < CHUNKS; c += 8)
      s += part[(long long)c * N + i];
  sh[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && i < N) {
    double t = 0.0;
#pragma unroll
    for (int w = 0; w < 8; w++)
      t += sh[w][lane];
    mn_out<1>(io)[i] = (float)t;
  }
}
