// Weight gradient of rms_norm and layer_norm, pass 1 of 2, for rows of at most 1024 floats:
// dw[i] = sum over rows of dy * x_hat (layer_norm's bias gradient is a plain column sum, done
// elsewhere). Pass 2 is mn_norm_grad_w_sum (norm.cuh); wider rows take mn_norm_grad_w_partial.
//
// A warp per row: the block's WARPS warps take the rows of its chunk [c * CHUNK, (c + 1) *
// CHUNK) strided (warp w: rows w, w + WARPS, ... of the chunk), so a row's statistics need
// shuffles alone, never a block barrier. Lane l owns the vectors j = l + 32 k of every row (a
// fixed set of columns) and keeps one double sum per column it owns in registers across its
// rows; at the end the warps add their sums in warp order through shared memory and write the
// block's partial row p[2][c * N + i]. The rows a warp takes and every order of summation
// depend on the shape alone, so each run gives the same bits (no atomics).
//
// Precision: within one row a lane works in fp32 on its at most 32 elements, and everything
// that crosses lanes or rows is double: the lane's partial sums of the statistics are reduced
// across the warp in double, mean and 1 / sqrt(var + eps) are formed in double, and each
// product dy * (x - mean) is scaled by the double rstd into the double column sums. A row is
// centred on its first element before the fp32 work (the shifted-data variance), so a mean far
// from zero costs no precision; a product is then off by a few fp32 roundings, well under the
// 1e-5 the tests allow against the double reference. Every element costs one float-to-double
// conversion (the all-double form took four, and H100 converts to and from double at an
// eighth of its fp32 rate, as fast as the memory delivers bf16 rows). The fp32 squares limit
// deviations from the mean to below 1e19, far beyond any activation.
//
// Vectors: 8 low-precision elements (one 16-byte access) when both x and dy are bf16 / fp16
// and N allows, else 4, 2 or 1 floats, as N allows (node buffers start 256-byte aligned).
// p[0] x, p[1] dy, p[2] partials (scratch, double). A block of 32 * WARPS threads.
// The lane's vectors j = lane + 32 k of one row (row: its first element) into v.
template <int VEC, int ITEMS, int NV, class P>
__device__ __forceinline__ void mn_ngw_load_row(P row, int lane, float *v) {
#pragma unroll
  for (int k = 0; k < ITEMS; k++) {
    const int j = lane + 32 * k;
    if (j < NV) mn_ld_vec<VEC>(row + j * VEC, v + k * VEC);
  }
}

// The lane's sum over its elements of the row, part = f(part, v) on one fp32 chain per vector
// element (short chains), the chains added last in element order.
template <int VEC, int ITEMS, int NV, class F>
__device__ __forceinline__ float mn_ngw_lane_sum(const float *a, int lane, F f) {
  float part[VEC];
#pragma unroll
  for (int e = 0; e < VEC; e++)
    part[e] = 0.0f;
#pragma unroll
  for (int k = 0; k < ITEMS; k++)
    if (lane + 32 * k < NV)
#pragma unroll
      for (int e = 0; e < VEC; e++)
        part[e] = f(part[e], a[k * VEC + e]);
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < VEC; e++)
    s += part[e];
  return s;
}

template <int WARPS, long long N, bool CENTER, unsigned EPS_BITS, long long ROWS, long long CHUNK,
          class IO>
__device__ void mn_norm_grad_w_rows(const IO &io) {
  static_assert(N >= 1 && N <= 1024, "rows of at most 1024 floats");
  constexpr bool LP =
      mn_io_storage<IO, 0>::value != MN_DEV_F32 && mn_io_storage<IO, 1>::value != MN_DEV_F32;
  constexpr int VEC = LP && N % 8 == 0 ? 8 : N % 4 == 0 ? 4 : N % 2 == 0 ? 2 : 1;
  constexpr int NV = (int)(N / VEC);
  constexpr int ITEMS = (NV + 31) / 32, E = ITEMS * VEC;
  // A product and rsqrt rather than a division and sqrt: each is a long sequence in double,
  // whose latency every row would wait for.
  constexpr double RN = 1.0 / (double)N;
  __shared__ double sh[WARPS][32 * VEC];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const auto x0 = mn_in<0>(io);
  const auto dy0 = mn_in<1>(io);
  const double eps = (double)__int_as_float((int)EPS_BITS);
  double acc[E];
#pragma unroll
  for (int i = 0; i < E; i++)
    acc[i] = 0.0;
  const long long c0 = (long long)blockIdx.x * CHUNK;
  const long long c1 = c0 + CHUNK < ROWS ? c0 + CHUNK : ROWS;
  for (long long r = c0 + warp; r < c1; r += WARPS) {
    // Every load of the row is issued before any is used; x first, as the statistics need it
    // alone.
    float a[E], d[E];
    mn_ngw_load_row<VEC, ITEMS, NV>(x0 + r * N, lane, a);
    mn_ngw_load_row<VEC, ITEMS, NV>(dy0 + r * N, lane, d);
    if constexpr (CENTER) {
      const float pivot = __shfl_sync(0xffffffffu, a[0], 0);
      const float s = mn_ngw_lane_sum<VEC, ITEMS, NV>(
          a, lane, [&](float part, float v) { return part + (v - pivot); });
      // mean - pivot, rounded once to float: x - mean is (x - pivot) - shift, two fp32
      // roundings of values the size of the row's spread.
      const float shift = (float)(mn_warp_sum_d((double)s) * RN);
#pragma unroll
      for (int k = 0; k < ITEMS; k++)
        if (lane + 32 * k < NV)
#pragma unroll
          for (int e = 0; e < VEC; e++)
            a[k * VEC + e] = (a[k * VEC + e] - pivot) - shift;
    }
    const float q = mn_ngw_lane_sum<VEC, ITEMS, NV>(
        a, lane, [](float part, float v) { return fmaf(v, v, part); });
    const double inv = rsqrt(mn_warp_sum_d((double)q) * RN + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; k++)
      if (lane + 32 * k < NV)
#pragma unroll
        for (int e = 0; e < VEC; e++)
          acc[k * VEC + e] = fma((double)(a[k * VEC + e] * d[k * VEC + e]), inv, acc[k * VEC + e]);
  }
  // Vector slot k of every lane covers columns [32 k VEC, 32 (k + 1) VEC): the warps' sums of
  // one slot meet in shared memory and are added in warp order.
  double *out = mn_arg<double>(io, 2) + (long long)blockIdx.x * N;
#pragma unroll
  for (int k = 0; k < ITEMS; k++) {
#pragma unroll
    for (int e = 0; e < VEC; e++)
      sh[warp][lane * VEC + e] = acc[k * VEC + e];
    __syncthreads();
    for (int c = (int)threadIdx.x; c < 32 * VEC; c += 32 * WARPS) {
      const long long col = 32LL * VEC * k + c;
      if (col < N) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
          t += sh[w][c];
        out[col] = t;
      }
    }
    __syncthreads();
  }
}
