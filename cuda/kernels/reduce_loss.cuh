// Cross-entropy losses and their gradients over rows of logits, with the row groups and
// row statistics of reduce.cuh (which sorts, and so is compiled, before this file). The
// losses write one double per row into scratch; mn_red_all_final (mn_loss_sparse_ce_mean for
// the sparse loss, whose mean is over the rows it counts) then takes the mean in a fixed order.
//
// Storage: logits, targets and the logits gradients may be bf16 / fp16 (mn_in / mn_out,
// common.cuh); the row statistics and sums stay float / double, each gradient is rounded once
// when stored, and the loss partials are double scratch.

// cross_entropy_loss rows: p[0] partials (double [ROWS]) = -sum_c t log_softmax(x),
// p[1] logits, p[2] target probabilities.
template <int BLOCK, int G, long long ROWS, long long N, class IO>
__device__ void mn_loss_ce_rows(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const auto x = mn_in<1>(io) + row * N;
  const auto t = mn_in<2>(io) + row * N;
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  float acc = 0.0f;
  mn_red_row_each<G, N, true>(x, t, lane, [&](long long, float4 a, float4 b, int w) {
    acc += mn_red_sum4(make_float4(b.x * ((a.x - m) - ls), b.y * ((a.y - m) - ls),
                                   b.z * ((a.z - m) - ls), b.w * ((a.w - m) - ls)),
                       w);
  });
  acc = mn_red_gsum<G>(acc, sh);
  if (lane == 0) mn_arg<double>(io, 0)[row] = -(double)acc;
}

// The rows a sparse cross-entropy counts, those whose label is not MN_DEV_IGNORE_LABEL, into
// p[0] (double [1], scratch), which the op's later kernels divide by: the mean is over the
// counted rows, and each gradient row is scaled by 1 / count. p[1] labels (u32 [ROWS]), p[2] the
// error record. One block, run first, since the one-pass loss gradient writes as it goes. When
// no row counts the mean is undefined: that is reported (LABELS, the labels node, as the
// value), the loss comes out NaN and the gradient zero. The count is an exact integer in
// double, whatever the order of the sum.
template <int BLOCK, long long ROWS, unsigned NODE, unsigned LABELS, class IO>
__device__ void mn_loss_label_count(const IO &io) {
  __shared__ double sh[32];
  const unsigned *labels = mn_arg<const unsigned>(io, 1);
  unsigned local = 0;
#pragma unroll 4
  for (long long r = threadIdx.x; r < ROWS; r += BLOCK)
    local += labels[r] != MN_DEV_IGNORE_LABEL ? 1u : 0u;
  const double count = mn_block_sum_d<BLOCK>((double)local, sh);
  if (threadIdx.x != 0) return;
  mn_arg<double>(io, 0)[0] = count;
  if (count == 0.0)
    mn_report(mn_arg<mn_dev_error>(io, 2), MN_DEV_ERR_ALL_IGNORED, NODE, LABELS, 0, ROWS);
}

// The sparse loss from its ROWS double row partials (p[1], zero on ignored rows), summed in a
// fixed order and divided by the count of mn_loss_label_count (p[2]), into p[0][0]. One block.
template <long long ROWS, int BLOCK, class IO>
__device__ void mn_loss_sparse_ce_mean(const IO &io) {
  __shared__ double sh[32];
  const double *part = mn_arg<const double>(io, 1);
  double acc = 0.0;
  for (long long i = threadIdx.x; i < ROWS; i += BLOCK)
    acc += part[i];
  acc = mn_block_sum_d<BLOCK>(acc, sh);
  if (threadIdx.x == 0) mn_out<0>(io)[0] = (float)(acc / mn_arg<const double>(io, 2)[0]);
}

// sparse_cross_entropy_loss rows: p[0] partials (double [ROWS]) = -log_softmax(x)[label],
// zero for a label of MN_DEV_IGNORE_LABEL, p[1] logits, rows XP values apart (a padded pitch,
// or N), p[2] labels (u32 [ROWS]), p[3] the error record. Any other label >= N is reported and
// its row's partial is NaN, so the loss is NaN; no logit outside the row is read.
template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, class IO>
__device__ void mn_loss_sparse_ce_rows(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const unsigned label = mn_arg<const unsigned>(io, 2)[row];
  double *part = mn_arg<double>(io, 0);
  if (label == MN_DEV_IGNORE_LABEL) {
    if (lane == 0) part[row] = 0.0;
    return;
  }
  if (label >= N) {
    if (lane == 0) {
      mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_LABEL, NODE, label, row, N);
      part[row] = (double)mn_nan();
    }
    return;
  }
  const auto x = mn_in<1>(io) + row * XP;
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  if (lane == 0) part[row] = -(double)((x[label] - m) - ls);
}

// cross_entropy_grad: dy[0]/ROWS * (softmax * sum_c t - t). p[0] out, p[1] logits,
// p[2] targets, p[3] dy [1]. The target sum is kept: targets need not sum to one.
template <int BLOCK, int G, long long ROWS, long long N, class IO>
__device__ void mn_loss_ce_grad(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const auto x = mn_in<1>(io) + row * N;
  const auto t = mn_in<2>(io) + row * N;
  const auto o = mn_out<0>(io) + row * N;
  const float k = (float)((double)mn_in<3>(io)[0] / (double)ROWS);
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  float ts = 0.0f;
  mn_red_row_each<G, N, false>(
      t, t, lane, [&](long long, float4 b, float4, int w) { ts += mn_red_sum4(b, w); });
  ts = mn_red_gsum<G>(ts, sh);
  mn_red_row_each<G, N, true>(x, t, lane, [&](long long i, float4 a, float4 b, int w) {
    mn_red_store(
        o + i,
        make_float4(k * (expf((a.x - m) - ls) * ts - b.x), k * (expf((a.y - m) - ls) * ts - b.y),
                    k * (expf((a.z - m) - ls) * ts - b.z), k * (expf((a.w - m) - ls) * ts - b.w)),
        w);
  });
}

// sparse_cross_entropy_grad: dy[0]/count * (softmax - onehot(label)), zero on a row whose
// label is MN_DEV_IGNORE_LABEL. p[0] out (rows OP values apart), p[1] logits (rows XP values
// apart), p[2] labels, p[3] dy [1], p[4] the error record, p[5] the count of counted rows
// (mn_loss_label_count). The labels are checked again (the kernel may run without its forward):
// a bad row is reported and set to NaN. With LOSS (sparse_cross_entropy_loss_grad) the same
// pass also writes the loss's row partial -log_softmax(x)[label] into p[6] (double [ROWS], zero
// for an ignored row, NaN for a bad one), which mn_loss_sparse_ce_mean averages next. An
// ignored row's logits are not read. Every lane reads the label's logit before the
// group's row statistics, whose reductions no lane leaves before all arrive, so a gradient
// written over the logits (host/memplan.c) never changes what the loss reads.
// 16-byte chunks of a padded 16-bit row of XP values that each of G lanes holds.
template <int G, long long XP> __device__ constexpr int mn_loss_row_chunks() {
  return (int)((XP + 8LL * G - 1) / (8LL * G));
}

// The gradient of one counted row of 16-bit logits, their gradient written in place or into
// rows of the same pitch: the row is read once, 8 values a load, into registers, which the
// statistics and then the gradient read (the generic path reads it from memory twice, and a
// GPT-2 row, 100 KB, is gone from L2 by the second pass). Values at N and past are the pad:
// left out of the statistics, written as zeros. x and o: the row's first element.
template <bool LOSS, int S, int G, long long N, long long XP, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_cached(const IO &io, const unsigned short *x,
                                                         unsigned short *o, int lane, float *sh,
                                                         long long row, unsigned label, float k) {
  constexpr int CH = mn_loss_row_chunks<G, XP>();
  const float ninf = -__int_as_float(0x7f800000);
  uint4 v[CH];
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    v[c] = i < XP ? *reinterpret_cast<const uint4 *>(x + i) : make_uint4(0u, 0u, 0u, 0u);
  }
  const float at_label = LOSS ? mn_lp_load<S>(x[label]) : 0.0f;
  float m = ninf, s = 0.0f;
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    const unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float4 q = make_float4(mn_lp_load<S>((unsigned short)(w[2 * h] & 0xffffu)),
                                   mn_lp_load<S>((unsigned short)(w[2 * h] >> 16)),
                                   mn_lp_load<S>((unsigned short)(w[2 * h + 1] & 0xffffu)),
                                   mn_lp_load<S>((unsigned short)(w[2 * h + 1] >> 16)));
      const long long at = i + 4 * h;
      if (at + 4 <= N) {
        mn_red_online(q, 4, m, s);
      } else {
        const float e[4] = {q.x, q.y, q.z, q.w};
        for (int j = 0; j < 4; j++)
          if (at + j < N) mn_red_online(make_float4(e[j], 0.0f, 0.0f, 0.0f), 1, m, s);
      }
    }
  }
  const float mx = mn_red_gmax<G>(m, sh);
  s = m == ninf ? 0.0f : s * expf(m - mx);
  const float ls = logf(mn_red_gsum<G>(s, sh));
  if constexpr (LOSS) {
    if (lane == 0) mn_arg<double>(io, 6)[row] = -(double)((at_label - mx) - ls);
    // The label's logit was read from memory, and a warp's shuffles order no memory: every
    // lane's read comes before any lane's store over it (wider groups met at a block barrier).
    __syncwarp(mn_red_group_mask<G>());
  }
  const long long l = label;
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    if (i >= XP) continue;
    const unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
    unsigned r[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const long long a = i + 2 * j;
      const float lo = mn_lp_load<S>((unsigned short)(w[j] & 0xffffu)),
                  hi = mn_lp_load<S>((unsigned short)(w[j] >> 16));
      const float glo = a < N ? k * (expf((lo - mx) - ls) - (a == l ? 1.0f : 0.0f)) : 0.0f;
      const float ghi = a + 1 < N ? k * (expf((hi - mx) - ls) - (a + 1 == l ? 1.0f : 0.0f)) : 0.0f;
      r[j] = mn_lp_round2<S>(glo, ghi);
    }
    *reinterpret_cast<uint4 *>(o + i) = make_uint4(r[0], r[1], r[2], r[3]);
  }
}

// One row of mn_loss_sparse_ce_grad_rows, by the G lanes of its group.
template <bool LOSS, int G, long long N, unsigned NODE, long long XP, long long OP, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_grad_row(const IO &io, long long row, int lane,
                                                           float *sh) {
  const unsigned label = mn_arg<const unsigned>(io, 2)[row];
  const auto o = mn_out<0>(io) + row * OP;
  // Padded rows: the pad is zero, which the product reading it along k sums.
  for (long long i = N + lane; i < OP; i += G)
    o[i] = 0.0f;
  if (label == MN_DEV_IGNORE_LABEL) {
    if constexpr (LOSS)
      if (lane == 0) mn_arg<double>(io, 6)[row] = 0.0;
    for (long long i = lane; i < N; i += G)
      o[i] = 0.0f;
    return;
  }
  if (label >= N) {
    if (lane == 0) {
      mn_report(mn_arg<mn_dev_error>(io, 4), MN_DEV_ERR_LABEL, NODE, label, row, N);
      if constexpr (LOSS) mn_arg<double>(io, 6)[row] = (double)mn_nan();
    }
    for (long long i = lane; i < N; i += G)
      o[i] = mn_nan();
    return;
  }
  const auto x = mn_in<1>(io) + row * XP;
  const float k = (float)((double)mn_in<3>(io)[0] / mn_arg<const double>(io, 5)[0]);
  constexpr int SX = mn_io_storage<IO, 1>::value, SO = mn_io_storage<IO, 0>::value;
  if constexpr (SX == SO && SX != MN_DEV_F32 && XP == OP && XP % 8 == 0 &&
                mn_loss_row_chunks<G, XP>() <= 8) {
    if ((reinterpret_cast<unsigned long long>(x.p) & 15ull) == 0 &&
        (reinterpret_cast<unsigned long long>(o.p) & 15ull) == 0) {
      mn_loss_sparse_ce_cached<LOSS, SX, G, N, XP>(io, x.p, o.p, lane, sh, row, label, k);
      return;
    }
  }
  const float at_label = LOSS ? (float)x[label] : 0.0f;
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  if constexpr (LOSS) {
    if (lane == 0) mn_arg<double>(io, 6)[row] = -(double)((at_label - m) - ls);
    // A warp's shuffles order no memory: every lane's read of the label's logit comes before
    // any lane's store over it (groups wider than a warp met at a block barrier already).
    __syncwarp(mn_red_group_mask<G>());
  }
  const long long l = label;
  mn_red_row_each<G, N, false>(x, x, lane, [&](long long i, float4 a, float4, int w) {
    mn_red_store(o + i,
                 make_float4(k * (expf((a.x - m) - ls) - (i == l ? 1.0f : 0.0f)),
                             k * (expf((a.y - m) - ls) - (i + 1 == l ? 1.0f : 0.0f)),
                             k * (expf((a.z - m) - ls) - (i + 2 == l ? 1.0f : 0.0f)),
                             k * (expf((a.w - m) - ls) - (i + 3 == l ? 1.0f : 0.0f))),
                 w);
  });
}

template <bool LOSS, int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP,
          long long OP, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_grad_rows(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  if (row < ROWS)
    mn_loss_sparse_ce_grad_row<LOSS, G, N, NODE, XP, OP>(io, row, threadIdx.x % G, sh);
}

template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, long long OP,
          class IO>
__device__ void mn_loss_sparse_ce_grad(const IO &io) {
  mn_loss_sparse_ce_grad_rows<false, BLOCK, G, ROWS, N, NODE, XP, OP>(io);
}
template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, long long OP,
          class IO>
__device__ void mn_loss_sparse_ce_loss_grad(const IO &io) {
  mn_loss_sparse_ce_grad_rows<true, BLOCK, G, ROWS, N, NODE, XP, OP>(io);
}

// sparse_cross_entropy_loss_grad of a small batch (at most BLOCK rows) in one block: the label
// count, every row's gradient and loss partial, and the mean, which otherwise take three
// kernels one after another, each a launch and a wait on the step's critical path (the MLP
// step's loss, 128 rows of 10, was 2.5 + 4.2 + 2.5 us under ncu). p[0] .. p[6] as for
// mn_loss_sparse_ce_loss_grad, p[7] the loss (float [1]). Groups of G <= 32 lanes, as few as
// a row needs, so that one pass of the block takes most batches; a row's statistics need no
// block barrier and groups may take different numbers of rows. The mean adds the partials in a
// fixed order, so the loss does not change from run to run.
template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, unsigned LABELS,
          long long XP, long long OP, class IO>
__device__ void mn_loss_sparse_ce_small(const IO &io) {
  static_assert(ROWS <= BLOCK && G <= 32, "one partial a thread in the mean; groups in a warp");
  __shared__ double shd[32];
  __shared__ float sh[32];
  const unsigned *labels = mn_arg<const unsigned>(io, 2);
  double *count = mn_arg<double>(io, 5), *part = mn_arg<double>(io, 6);
  const int t = threadIdx.x;
  const double counted =
      mn_block_sum_d<BLOCK>(t < ROWS && labels[t] != MN_DEV_IGNORE_LABEL ? 1.0 : 0.0, shd);
  if (t == 0) {
    *count = counted;
    if (counted == 0.0)
      mn_report(mn_arg<mn_dev_error>(io, 4), MN_DEV_ERR_ALL_IGNORED, NODE, LABELS, 0, ROWS);
  }
  __syncthreads();
  for (long long row = t / G; row < ROWS; row += BLOCK / G)
    mn_loss_sparse_ce_grad_row<true, G, N, NODE, XP, OP>(io, row, t % G, sh);
  __syncthreads();
  const double total = mn_block_sum_d<BLOCK>(t < ROWS ? part[t] : 0.0, shd);
  if (t == 0) mn_out<7>(io)[0] = (float)(total / counted);
}
