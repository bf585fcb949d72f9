// Reductions: whole-tensor sums and mean losses (two passes through double partials, so
// results are deterministic), softmax and log_softmax over the last axis with their
// gradients (a group of G threads per row: one warp, or the whole block), and the
// column sums of sum_rows.
//
// Storage: every float argument is read through mn_in / written through mn_out (common.cuh),
// so inputs and outputs may be bf16 / fp16 (a loss or a scalar is fp32 by the storage table).
// Sums and row statistics are formed in float / double from the values as stored, and each
// output is rounded once when it is stored; no kernel reads back what it stored.

enum mn_red_code {
  MN_RED_SUM = 1,
  MN_RED_MEAN,
  MN_RED_MSE,
  MN_RED_L1,
  MN_RED_BCE,
};

__device__ __forceinline__ double mn_red_clamped_log(double v) {
  double l = log(v);
  return l < -100.0 ? -100.0 : l;
}

// One element's term of a whole-tensor reduction, in double like the reference.
template <int OP> __device__ __forceinline__ double mn_red_term(float a, float b) {
  if constexpr (OP == MN_RED_SUM || OP == MN_RED_MEAN)
    return (double)a;
  else if constexpr (OP == MN_RED_MSE) {
    double d = (double)a - (double)b;
    return d * d;
  } else if constexpr (OP == MN_RED_L1)
    return fabs((double)a - (double)b);
  else {
    double p = a, t = b;
    return t * mn_red_clamped_log(p) + (1.0 - t) * mn_red_clamped_log(1.0 - p);
  }
}

// The scalar result from the sum of the terms over N elements.
template <int OP, long long N> __device__ __forceinline__ float mn_red_finish(double acc) {
  if constexpr (OP == MN_RED_SUM)
    return (float)acc;
  else if constexpr (OP == MN_RED_BCE)
    return (float)(-acc / (double)N);
  else
    return (float)(acc / (double)N);
}

// Pass 1: each block sums a grid-strided share of the N terms (a in p[1], b in p[2]
// when the op has a second operand) and writes its double partial to p[0][blockIdx.x],
// or, when DIRECT (one block), the finished scalar to the float p[0][0].
template <int OP, long long N, int BLOCK, bool DIRECT, class IO>
__device__ void mn_red_all_partial(const IO &io) {
  __shared__ double sh[32];
  constexpr bool TWO = OP == MN_RED_MSE || OP == MN_RED_L1 || OP == MN_RED_BCE;
  const auto a = mn_in<1>(io);
  const auto b = mn_in<2>(io);
  double acc = 0.0;
  constexpr long long NQ = N / 4;
  MN_FOR_EACH(q, NQ) {
    float4 va = mn_ld4(a, q), vb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (TWO) vb = mn_ld4(b, q);
    acc += mn_red_term<OP>(va.x, vb.x) + mn_red_term<OP>(va.y, vb.y) + mn_red_term<OP>(va.z, vb.z) +
           mn_red_term<OP>(va.w, vb.w);
  }
  if constexpr (N % 4 != 0) {
    const long long i = NQ * 4 + (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < N) acc += mn_red_term<OP>(a[i], TWO ? b[i] : 0.0f);
  }
  acc = mn_block_sum_d<BLOCK>(acc, sh);
  if (threadIdx.x == 0) {
    if constexpr (DIRECT)
      mn_out<0>(io)[0] = mn_red_finish<OP, N>(acc);
    else
      mn_arg<double>(io, 0)[blockIdx.x] = acc;
  }
}

// Pass 2, one block: sums NPART double partials (p[1]) in a fixed order into the
// scalar p[0][0]; N is the element count the mean divides by.
template <int OP, long long N, long long NPART, int BLOCK, class IO>
__device__ void mn_red_all_final(const IO &io) {
  __shared__ double sh[32];
  const double *part = mn_arg<const double>(io, 1);
  double acc = 0.0;
  for (long long i = threadIdx.x; i < NPART; i += BLOCK)
    acc += part[i];
  acc = mn_block_sum_d<BLOCK>(acc, sh);
  if (threadIdx.x == 0) mn_out<0>(io)[0] = mn_red_finish<OP, N>(acc);
}

// Row groups: G threads per row (G < 32: aligned parts of a warp, several rows per warp;
// G == 32: a warp per row, BLOCK / 32 rows per block, no block barriers; G == BLOCK: a block
// per row). A group's threads all take the same branches, so a group may leave early without
// stranding a barrier or a shuffle: a group narrower than a warp shuffles among its own lanes.
template <int G> __device__ __forceinline__ unsigned mn_red_group_mask() {
  if constexpr (G >= 32)
    return 0xffffffffu;
  else
    return ((1u << G) - 1u) << ((threadIdx.x & 31u) & ~(unsigned)(G - 1));
}
template <int G> __device__ __forceinline__ float mn_red_gsum(float v, float *sh) {
  if constexpr (G < 32) {
    const unsigned m = mn_red_group_mask<G>();
    for (int o = G / 2; o > 0; o >>= 1)
      v += __shfl_xor_sync(m, v, o, G);
    return v;
  } else if constexpr (G == 32) {
    return mn_warp_sum(v);
  } else {
    return mn_block_sum<G>(v, sh);
  }
}
template <int G> __device__ __forceinline__ float mn_red_gmax(float v, float *sh) {
  if constexpr (G < 32) {
    const unsigned m = mn_red_group_mask<G>();
    for (int o = G / 2; o > 0; o >>= 1)
      v = fmaxf(v, __shfl_xor_sync(m, v, o, G));
    return v;
  } else if constexpr (G == 32) {
    return mn_warp_max(v);
  } else {
    return mn_block_max<G>(v, sh);
  }
}

// Visits the elements of one row of N that thread `lane` of a G-thread group owns,
// calling f(i, va, vb, 4) for the 16-byte aligned quad at element i and
// f(i, va, vb, 1) for a single element (in .x). A row whose length is
// not a multiple of 4 starts at any 4-byte boundary: a scalar head up to the first
// 16-byte boundary, float4s with four loads in flight per thread (a wide row is
// latency-bound otherwise), then a scalar tail. b (read when TWO) and any output row
// written by f must share a's alignment, as rows at one offset of 256-byte aligned
// buffers do. G >= 4, so the head and tail (at most 3 each) take one step.
//
// a, b and the output rows are fp32 pointers or low-precision views (common.cuh); a quad is
// 4 elements either way (16 bytes of fp32, 8 of bf16 / fp16), and rows at one element offset
// of 256-byte aligned buffers are misaligned by the same number of elements in any storage.
__device__ __forceinline__ long long mn_red_misalign(const float *p) {
  return (long long)((reinterpret_cast<unsigned long long>(p) >> 2) & 3);
}
template <int S, bool C> __device__ __forceinline__ long long mn_red_misalign(mn_lp_ptr<S, C> p) {
  return (long long)((reinterpret_cast<unsigned long long>(p.p) >> 1) & 3);
}

template <int G, long long N, bool TWO, class A, class B, typename F>
__device__ __forceinline__ void mn_red_row_each(A a, B b, int lane, F &&f) {
  const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const long long mis = mn_red_misalign(a);
  const long long head = ((4 - mis) & 3) < N ? ((4 - mis) & 3) : N;
  if (lane < head)
    f((long long)lane, make_float4(a[lane], 0.0f, 0.0f, 0.0f),
      make_float4(TWO ? b[lane] : 0.0f, 0.0f, 0.0f, 0.0f), 1);
  const long long nq = (N - head) >> 2;
  const auto a4 = a + head;
  const auto b4 = b + (TWO ? head : 0);
  long long q = lane;
  for (; q + 3 * G < nq; q += 4 * G) {
    float4 x0 = mn_ld4(a4, q), x1 = mn_ld4(a4, q + G), x2 = mn_ld4(a4, q + 2 * G),
           x3 = mn_ld4(a4, q + 3 * G);
    float4 y0 = z, y1 = z, y2 = z, y3 = z;
    if constexpr (TWO) {
      y0 = mn_ld4(b4, q);
      y1 = mn_ld4(b4, q + G);
      y2 = mn_ld4(b4, q + 2 * G);
      y3 = mn_ld4(b4, q + 3 * G);
    }
    f(head + 4 * q, x0, y0, 4);
    f(head + 4 * (q + G), x1, y1, 4);
    f(head + 4 * (q + 2 * G), x2, y2, 4);
    f(head + 4 * (q + 3 * G), x3, y3, 4);
  }
  for (; q < nq; q += G) {
    float4 y = z;
    if constexpr (TWO) y = mn_ld4(b4, q);
    f(head + 4 * q, mn_ld4(a4, q), y, 4);
  }
  const long long t = head + 4 * nq + lane;
  if (t < N)
    f(t, make_float4(a[t], 0.0f, 0.0f, 0.0f), make_float4(TWO ? b[t] : 0.0f, 0.0f, 0.0f, 0.0f), 1);
}

// Width w (4 or 1, a constant once the visitor is inlined) helpers: apply op to the
// first w lanes of v; store them at p (16-byte aligned when w is 4); add them up.
template <typename Op> __device__ __forceinline__ float4 mn_red_map4(float4 v, int w, Op op) {
  return w == 4 ? make_float4(op(v.x), op(v.y), op(v.z), op(v.w))
                : make_float4(op(v.x), 0.0f, 0.0f, 0.0f);
}
template <class P> __device__ __forceinline__ void mn_red_store(P p, float4 v, int w) {
  if (w == 4)
    mn_st4(p, 0, v);
  else
    p[0] = v.x;
}
__device__ __forceinline__ float mn_red_sum4(float4 v, int w) {
  return w == 4 ? (v.x + v.y) + (v.z + v.w) : v.x;
}

// Online max m and sum s of exp(x - m) over the first W values of v. While m is still
// -inf every value seen was -inf (each adds exp(-inf) = 0 against a finite stand-in); a
// NaN propagates into s.
__device__ __forceinline__ void mn_red_online(float4 v, int w, float &m, float &s) {
  const float ninf = -__int_as_float(0x7f800000);
  const float hi = w == 4 ? fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)) : v.x;
  if (hi > m) {
    s *= expf(m - hi);
    m = hi;
  }
  const float mm = m == ninf ? 0.0f : m;
  if (w == 4)
    s += (expf(v.x - mm) + expf(v.y - mm)) + (expf(v.z - mm) + expf(v.w - mm));
  else
    s += expf(v.x - mm);
}

// A row's max and log(sum(exp(x - max))) (the reference's row statistics), every
// thread of the group getting both.
template <int G, long long N, class P>
__device__ __forceinline__ void mn_red_row_stats(P x, int lane, float *sh, float &max,
                                                 float &log_sum) {
  const float ninf = -__int_as_float(0x7f800000);
  float m = ninf, s = 0.0f;
  mn_red_row_each<G, N, false>(
      x, x, lane, [&](long long, float4 v, float4, int w) { mn_red_online(v, w, m, s); });
  max = mn_red_gmax<G>(m, sh);
  s = m == ninf ? 0.0f : s * expf(m - max);
  log_sum = logf(mn_red_gsum<G>(s, sh));
}

// softmax (LOG false) or log_softmax (LOG true) of ROWS rows of N: p[0] out, p[1] x.
// Like the reference, the log-probability is (x - max) - log_sum.
template <bool LOG, int BLOCK, int G, long long ROWS, long long N, class IO>
__device__ void mn_red_softmax(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const auto x = mn_in<1>(io) + row * N;
  const auto o = mn_out<0>(io) + row * N;
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  mn_red_row_each<G, N, false>(x, x, lane, [&](long long i, float4 v, float4, int w) {
    mn_red_store(o + i,
                 mn_red_map4(v, w,
                             [&](float a) {
                               float l = (a - m) - ls;
                               return LOG ? l : expf(l);
                             }),
                 w);
  });
}

// softmax_grad: y (dy - sum(dy y)); log_softmax_grad: dy - exp(y) sum(dy).
// p[0] out, p[1] y (the forward output), p[2] dy.
template <bool LOG, int BLOCK, int G, long long ROWS, long long N, class IO>
__device__ void mn_red_softmax_grad(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const auto y = mn_in<1>(io) + row * N;
  const auto dy = mn_in<2>(io) + row * N;
  const auto o = mn_out<0>(io) + row * N;
  float s = 0.0f;
  mn_red_row_each<G, N, true>(y, dy, lane, [&](long long, float4 a, float4 d, int w) {
    s += LOG ? mn_red_sum4(d, w)
             : mn_red_sum4(make_float4(a.x * d.x, a.y * d.y, a.z * d.z, a.w * d.w), w);
  });
  s = mn_red_gsum<G>(s, sh);
  mn_red_row_each<G, N, true>(y, dy, lane, [&](long long i, float4 a, float4 d, int w) {
    float4 r;
    if constexpr (LOG)
      r = make_float4(d.x - expf(a.x) * s, d.y - expf(a.y) * s, d.z - expf(a.z) * s,
                      d.w - expf(a.w) * s);
    else
      r = make_float4(a.x * (d.x - s), a.y * (d.y - s), a.z * (d.z - s), a.w * (d.w - s));
    mn_red_store(o + i, r, w);
  });
}

// sum_rows: x [ROWS, NCOL] summed over rows into [NCOL]. Grid (column blocks, CH row
// chunks); thread j of a block owns one column, so loads are coalesced across the
// block, four rows in flight at a time. CH == 1 writes the float result to p[0];
// otherwise each chunk writes double partials p[0][chunk * NCOL + col] and
// mn_red_sum_rows_final adds them in a fixed order.
template <long long ROWS, long long NCOL, int CH, int BLOCK, class IO>
__device__ void mn_red_sum_rows(const IO &io) {
  const long long col = (long long)blockIdx.x * BLOCK + threadIdx.x;
  if (col >= NCOL) return;
  const auto x = mn_in<1>(io) + col;
  const long long r0 = ROWS * blockIdx.y / CH, r1 = ROWS * (blockIdx.y + 1) / CH;
  double acc = 0.0;
  long long r = r0;
  for (; r + 3 < r1; r += 4) {
    float a0 = x[r * NCOL], a1 = x[(r + 1) * NCOL], a2 = x[(r + 2) * NCOL], a3 = x[(r + 3) * NCOL];
    acc += (double)a0;
    acc += (double)a1;
    acc += (double)a2;
    acc += (double)a3;
  }
  for (; r < r1; r++)
    acc += (double)x[r * NCOL];
  if constexpr (CH == 1)
    mn_out<0>(io)[col] = (float)acc;
  else
    mn_arg<double>(io, 0)[(long long)blockIdx.y * NCOL + col] = acc;
}

// sum_rows of many rows of 8k columns: block (x, y) takes CT x 8 adjacent columns of the rows
// [ROWS y / CH, ROWS (y + 1) / CH), its LANES row lanes of CT threads each every LANES-th row of
// that chunk, 16 bytes of a row a load and 128 bytes in flight; a lane adds its U values of a
// column in float (bf16 or fp16 values: their float sum is exact but for the last bits) and that
// sum into a double. The lanes' sums of a column are added in lane order through shared memory
// into one double partial per chunk (CH > 1, for mn_red_sum_rows_final) or the sum itself
// (CH == 1). A thread a column moves 64 bytes of bf16 a warp a row: GPT-2's sums ran at
// 1.42 TB/s on an H200 that copies at 4.19. With 4 rows in flight, each value turned to double
// and added as one, they ran at about 1.6 (docs/performance.md).
template <long long ROWS, long long NCOL, int CH, int CT, int LANES, class IO>
__device__ void mn_red_sum_rows_vec(const IO &io) {
  static_assert(NCOL % 8 == 0, "8 columns a thread need rows of 8k");
  // 128 bytes in flight a thread either way: 8 rows of 8 16-bit values, 4 of 8 fp32 (two loads).
  constexpr int COLS = CT * 8, U = mn_io_storage<IO, 1>::value == MN_DEV_F32 ? 4 : 8;
  __shared__ double sh[LANES][COLS];
  const auto x = mn_in<1>(io);
  const int ct = threadIdx.x % CT, lane = threadIdx.x / CT;
  const long long col = ((long long)blockIdx.x * CT + ct) * 8;
  const long long r0 = ROWS * blockIdx.y / CH, r1 = ROWS * (blockIdx.y + 1) / CH;
  double acc[8] = {};
  if (col < NCOL) {
    long long r = r0 + lane;
    for (; r + (U - 1) * LANES < r1; r += U * LANES) {
      float v[U][8];
#pragma unroll
      for (int u = 0; u < U; u++)
        mn_pw_ld8(x, ((r + u * LANES) * NCOL + col) / 8, v[u]);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        float t = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++)
          t += v[u][j];
        acc[j] += (double)t;
      }
    }
    for (; r < r1; r += LANES) {
      float v[8];
      mn_pw_ld8(x, (r * NCOL + col) / 8, v);
#pragma unroll
      for (int j = 0; j < 8; j++)
        acc[j] += (double)v[j];
    }
  }
  // Column ct * 8 + j of the block at slot j * CT + ct: a warp's stores land side by side.
#pragma unroll
  for (int j = 0; j < 8; j++)
    sh[lane][j * CT + ct] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < COLS; c += CT * LANES) {
    const long long at = (long long)blockIdx.x * COLS + c;
    if (at >= NCOL) continue;
    const int slot = (c % 8) * CT + c / 8;
    double t = 0.0;
#pragma unroll
    for (int l = 0; l < LANES; l++)
      t += sh[l][slot];
    if constexpr (CH == 1)
      mn_out<0>(io)[at] = (float)t;
    else
      mn_arg<double>(io, 0)[(long long)blockIdx.y * NCOL + at] = t;
  }
}

// sum_rows of a few rows in one kernel: a block of CT columns by LANES row lanes, each lane
// adding every LANES-th row of its column in double, then the LANES sums of a column added in
// lane order, so that a column's sum is the same every run.
template <long long ROWS, long long NCOL, int CT, int LANES, class IO>
__device__ void mn_red_sum_rows_lanes(const IO &io) {
  __shared__ double sh[LANES][CT];
  const int ct = threadIdx.x % CT, lane = threadIdx.x / CT;
  const long long col = (long long)blockIdx.x * CT + ct;
  double acc = 0.0;
  if (col < NCOL) {
    const auto x = mn_in<1>(io) + col;
    for (long long r = lane; r < ROWS; r += LANES)
      acc += (double)x[r * NCOL];
  }
  sh[lane][ct] = acc;
  __syncthreads();
  if (lane == 0 && col < NCOL) {
    double t = 0.0;
    for (int l = 0; l < LANES; l++)
      t += sh[l][ct];
    mn_out<0>(io)[col] = (float)t;
  }
}

// The CH partials of each column: a block of 256 threads takes 32 columns, its 8 warps
// each sum every 8th chunk, and one warp adds the 8 sums in order.
template <long long NCOL, int CH, class IO> __device__ void mn_red_sum_rows_final(const IO &io) {
  __shared__ double sh[8][33];
  const int c = threadIdx.x & 31, part = threadIdx.x >> 5;
  const long long col = (long long)blockIdx.x * 32 + c;
  const double *p = mn_arg<const double>(io, 1);
  double acc = 0.0;
  if (col < NCOL)
    for (int k = part; k < CH; k += 8)
      acc += p[(long long)k * NCOL + col];
  sh[part][c] = acc;
  __syncthreads();
  if (part == 0 && col < NCOL) {
    double t = 0.0;
    for (int k = 0; k < 8; k++)
      t += sh[k][c];
    mn_out<0>(io)[col] = (float)t;
  }
}
