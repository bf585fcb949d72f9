// Cross-entropy losses and their gradients over rows of logits, with the row groups and
// row statistics of reduce.cuh (which sorts, and so is compiled, before this file). The
// losses write one double per row into scratch; mn_red_all_final then takes the mean in
// a fixed order.
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

// sparse_cross_entropy_loss rows: p[0] partials (double [ROWS]) = -log_softmax(x)[label],
// p[1] logits, rows XP values apart (a padded pitch, or N), p[2] labels (u32 [ROWS]), p[3]
// the error record. A label >= N is reported and its row's partial is NaN, so the loss is
// NaN; no logit outside the row is read.
template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, class IO>
__device__ void mn_loss_sparse_ce_rows(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const unsigned label = mn_arg<const unsigned>(io, 2)[row];
  double *part = mn_arg<double>(io, 0);
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

// sparse_cross_entropy_grad: dy[0]/ROWS * (softmax - onehot(label)). p[0] out (rows OP
// values apart), p[1] logits (rows XP values apart), p[2] labels, p[3] dy [1], p[4] the error
// record. The labels are checked again (the kernel may run without its forward): a bad row
// is reported and set to NaN. With LOSS (sparse_cross_entropy_loss_grad) the same pass also
// writes the loss's row partial -log_softmax(x)[label] into p[5] (double [ROWS], NaN for a bad
// row), which mn_red_all_final averages next. Every lane reads the label's logit before the
// group's row statistics, whose reductions no lane leaves before all arrive, so a gradient
// written over the logits (host/memplan.c) never changes what the loss reads.
template <bool LOSS, int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP,
          long long OP, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_grad_rows(const IO &io) {
  __shared__ float sh[32];
  const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (row >= ROWS) return;
  const unsigned label = mn_arg<const unsigned>(io, 2)[row];
  const auto o = mn_out<0>(io) + row * OP;
  // Padded rows: the pad is zero, which the product reading it along k sums.
  for (long long i = N + lane; i < OP; i += G)
    o[i] = 0.0f;
  if (label >= N) {
    if (lane == 0) {
      mn_report(mn_arg<mn_dev_error>(io, 4), MN_DEV_ERR_LABEL, NODE, label, row, N);
      if constexpr (LOSS) mn_arg<double>(io, 5)[row] = (double)mn_nan();
    }
    for (long long i = lane; i < N; i += G)
      o[i] = mn_nan();
    return;
  }
  const auto x = mn_in<1>(io) + row * XP;
  const float k = (float)((double)mn_in<3>(io)[0] / (double)ROWS);
  const float at_label = LOSS ? (float)x[label] : 0.0f;
  float m, ls;
  mn_red_row_stats<G, N>(x, lane, sh, m, ls);
  if constexpr (LOSS) {
    if (lane == 0) mn_arg<double>(io, 5)[row] = -(double)((at_label - m) - ls);
    // A warp's shuffles order no memory: every lane's read of the label's logit comes before
    // any lane's store over it (groups wider than a warp met at a block barrier already).
    __syncwarp();
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
