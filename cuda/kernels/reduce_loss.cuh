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

// The larger of two 16-bit values in each half of a word; a NaN loses to a number (as fmaxf).
template <int S> __device__ __forceinline__ unsigned mn_lp_max2(unsigned a, unsigned b) {
#if __CUDA_ARCH__ >= 800
  unsigned r;
  MN_LP_ASM(S, "max.", "x2 %0, %1, %2;", : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const float lo = fmaxf(mn_lp_load<S>((unsigned short)(a & 0xffffu)),
                         mn_lp_load<S>((unsigned short)(b & 0xffffu)));
  const float hi =
      fmaxf(mn_lp_load<S>((unsigned short)(a >> 16)), mn_lp_load<S>((unsigned short)(b >> 16)));
  return mn_lp_round2<S>(lo, hi);
#endif
}

// The gradient of one counted row of 16-bit logits held in registers, 8 values a chunk: v,
// as loaded by mn_loss_row_load or from the stage of mn_loss_sparse_ce_pipe. Their gradient is
// written in place or into rows of the same pitch (the generic path reads the row from memory
// twice, and a GPT-2 row, 100 KB, is gone from L2 by the second pass). Values at N and past are
// the pad: set to -inf here, so that the max and the sum leave them out and the gradient writes
// them as zeros with no test a value. The work a value is what bounded GPT-2's loss (824M logits
// a step): here a max of two values an instruction, then the sum and the gradient each one
// exponential in base 2 of x log2(e) - bias, one fused multiply-add before it; the label's -1
// is stored after the row by the lane that holds it. Written with expf, an online max and a
// test of the label a value, the kernel took 1.46 ms of the H200's GPT-2 step (2.3 TB/s,
// docs/performance.md). x and o: the row's first element; after_max() is called once every
// lane of the group has its values out of v's source (the block barrier of the max).
template <bool LOSS, int S, int G, long long N, long long XP, int CH, class IO, class F>
__device__ __forceinline__ void
mn_loss_sparse_ce_held(const IO &io, uint4 (&v)[CH], const unsigned short *x, unsigned short *o,
                       int lane, float *sh, long long row, unsigned label, float k, F after_max) {
  constexpr float LOG2E = 1.4426950408889634f;
  constexpr unsigned NEG = S == MN_DEV_BF16 ? 0xff80u : 0xfc00u; // -inf
  const float ninf = -__int_as_float(0x7f800000);
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    if ((long long)(c + 1) * G * 8 > N) {
      unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
      for (int j = 0; j < 8; j++)
        if (i + j >= N)
          w[j / 2] = j % 2 ? (w[j / 2] & 0xffffu) | (NEG << 16) : (w[j / 2] & 0xffff0000u) | NEG;
      v[c] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  const float at_label = mn_lp_load<S>(x[label]);
  unsigned mw = NEG | (NEG << 16);
#pragma unroll
  for (int c = 0; c < CH; c++)
    mw = mn_lp_max2<S>(mw,
                       mn_lp_max2<S>(mn_lp_max2<S>(v[c].x, v[c].y), mn_lp_max2<S>(v[c].z, v[c].w)));
  const float mx = mn_red_gmax<G>(fmaxf(mn_lp_load<S>((unsigned short)(mw & 0xffffu)),
                                        mn_lp_load<S>((unsigned short)(mw >> 16))),
                                  sh);
  after_max();
  // A row of -inf only: its sum is zero, its log -inf, and the loss and gradient NaN.
  const float bias = (mx == ninf ? 0.0f : mx) * LOG2E;
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
    for (int j = 0; j < 4; j++)
      s += mn_ex2(fmaf(mn_lp_load<S>((unsigned short)(w[j] & 0xffffu)), LOG2E, -bias)) +
           mn_ex2(fmaf(mn_lp_load<S>((unsigned short)(w[j] >> 16)), LOG2E, -bias));
  }
  s = mn_red_gsum<G>(s, sh);
  const float gbias = bias + log2f(s);
  if constexpr (LOSS)
    if (lane == 0) mn_arg<double>(io, 6)[row] = -(double)((at_label - mx) - logf(s));
  // The label's logit was read from memory, and a warp's shuffles order no memory: every
  // lane's read comes before any lane's store over it (wider groups met at a block barrier).
  __syncwarp(mn_red_group_mask<G>());
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    if (i >= XP) continue;
    const unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
    unsigned r[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
      r[j] = mn_lp_round2<S>(
          k * mn_ex2(fmaf(mn_lp_load<S>((unsigned short)(w[j] & 0xffffu)), LOG2E, -gbias)),
          k * mn_ex2(fmaf(mn_lp_load<S>((unsigned short)(w[j] >> 16)), LOG2E, -gbias)));
    *reinterpret_cast<uint4 *>(o + i) = make_uint4(r[0], r[1], r[2], r[3]);
  }
  // The same thread stored the label's chunk above, so this store lands after it.
  if ((long long)(label / 8) % G == lane)
    o[label] = mn_lp_round<S>(k * (mn_ex2(fmaf(at_label, LOG2E, -gbias)) - 1.0f));
}

// The chunks of a padded 16-bit row that lane `lane` of G holds (zeros past XP).
template <int G, long long XP, int CH>
__device__ __forceinline__ void mn_loss_row_load(const unsigned short *x, int lane,
                                                 uint4 (&v)[CH]) {
#pragma unroll
  for (int c = 0; c < CH; c++) {
    const long long i = ((long long)c * G + lane) * 8;
    v[c] = i < XP ? *reinterpret_cast<const uint4 *>(x + i) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// A row whose label counts none of its logits: ignored (gradient and loss partial zero, the
// logits not read) or out of range (reported, NaN); true when the row is done. First the pad
// of a padded row is zeroed: the product reading the gradient along k sums it.
template <bool LOSS, int G, long long N, unsigned NODE, long long OP, class IO, class O>
__device__ __forceinline__ bool mn_loss_sparse_ce_uncounted(const IO &io, O o, long long row,
                                                            int lane, unsigned label) {
  for (long long i = N + lane; i < OP; i += G)
    o[i] = 0.0f;
  if (label == MN_DEV_IGNORE_LABEL) {
    if constexpr (LOSS)
      if (lane == 0) mn_arg<double>(io, 6)[row] = 0.0;
    for (long long i = lane; i < N; i += G)
      o[i] = 0.0f;
    return true;
  }
  if (label >= N) {
    if (lane == 0) {
      mn_report(mn_arg<mn_dev_error>(io, 4), MN_DEV_ERR_LABEL, NODE, label, row, N);
      if constexpr (LOSS) mn_arg<double>(io, 6)[row] = (double)mn_nan();
    }
    for (long long i = lane; i < N; i += G)
      o[i] = mn_nan();
    return true;
  }
  return false;
}

// Whether rows of XP 16-bit values (the same pitch in and out) fit mn_loss_sparse_ce_held.
template <int SX, int SO, int G, long long XP, long long OP>
__device__ constexpr bool mn_loss_held() {
  return SX == SO && SX != MN_DEV_F32 && XP == OP && XP % 8 == 0 &&
         mn_loss_row_chunks<G, XP>() <= 8;
}

// The scale of every gradient: dy over the counted rows.
template <class IO> __device__ __forceinline__ float mn_loss_sparse_ce_scale(const IO &io) {
  return (float)((double)mn_in<3>(io)[0] / mn_arg<const double>(io, 5)[0]);
}

// One row of mn_loss_sparse_ce_grad_rows, by the G lanes of its group.
template <bool LOSS, int G, long long N, unsigned NODE, long long XP, long long OP, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_grad_row(const IO &io, long long row, int lane,
                                                           float *sh) {
  const unsigned label = mn_arg<const unsigned>(io, 2)[row];
  const auto o = mn_out<0>(io) + row * OP;
  if (mn_loss_sparse_ce_uncounted<LOSS, G, N, NODE, OP>(io, o, row, lane, label)) return;
  const auto x = mn_in<1>(io) + row * XP;
  const float k = mn_loss_sparse_ce_scale(io);
  constexpr int SX = mn_io_storage<IO, 1>::value, SO = mn_io_storage<IO, 0>::value;
  if constexpr (mn_loss_held<SX, SO, G, XP, OP>()) {
    if ((reinterpret_cast<unsigned long long>(x.p) & 15ull) == 0 &&
        (reinterpret_cast<unsigned long long>(o.p) & 15ull) == 0) {
      uint4 v[mn_loss_row_chunks<G, XP>()];
      mn_loss_row_load<G, XP>(x.p, lane, v);
      mn_loss_sparse_ce_held<LOSS, SX, G, N, XP>(io, v, x.p, o.p, lane, sh, row, label, k, [] {});
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

// R rows a block of one group (G == BLOCK), each row held in registers: the next row's loads
// of its first SC chunks a lane are issued (cp.async, each thread its own chunks, into the
// dynamic shared memory the launch gives: SC x G x 16 bytes) while this row is worked on, since
// a block of 1024 threads holding a 100 KB row is alone on its SM and its loads would otherwise
// wait for its stores and exponentials; chunks past SC (the stage is kept within what every
// card from sm_80 on gives a block) are loaded when the row starts, which cost GPT-2's step 0.1 ms
// against a stage of the whole row (docs/performance.md). The stage's chunks are read into
// registers before the max's block barrier and refilled after it. Rows are R apart in the
// grid; x0 and o0 are the first row's elements.
template <bool LOSS, int S, int G, long long ROWS, long long N, unsigned NODE, long long XP, int R,
          int SC, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_pipe(const IO &io, const unsigned short *x0,
                                                       unsigned short *o0, float *sh) {
  constexpr int CH = mn_loss_row_chunks<G, XP>();
  static_assert(SC > 0 && SC <= CH, "a stage of some of the row's chunks");
  extern __shared__ __align__(16) uint4 mn_loss_stage[];
  const int lane = threadIdx.x;
  const long long first = (long long)blockIdx.x * R;
  const auto fetch = [&](long long row) {
#pragma unroll
    for (int c = 0; c < SC; c++) {
      const long long i = ((long long)c * G + lane) * 8;
      if (i < XP) mn_cp_async16(&mn_loss_stage[c * G + lane], x0 + row * XP + i, true);
    }
    mn_cp_commit();
  };
  const float k = mn_loss_sparse_ce_scale(io);
  fetch(first);
  for (int t = 0; t < R; t++) {
    const long long row = first + t;
    if (row >= ROWS) break;
    const bool more = t + 1 < R && row + 1 < ROWS;
    mn_cp_wait<0>();
    const unsigned label = mn_arg<const unsigned>(io, 2)[row];
    if (mn_loss_sparse_ce_uncounted<LOSS, G, N, NODE, XP>(io, mn_out<0>(io) + row * XP, row, lane,
                                                          label)) {
      if (more) fetch(row + 1);
      continue;
    }
    uint4 v[CH];
#pragma unroll
    for (int c = 0; c < CH; c++) {
      const long long i = ((long long)c * G + lane) * 8;
      v[c] = i >= XP  ? make_uint4(0u, 0u, 0u, 0u)
             : c < SC ? mn_loss_stage[c * G + lane]
                      : *reinterpret_cast<const uint4 *>(x0 + row * XP + i);
    }
    mn_loss_sparse_ce_held<LOSS, S, G, N, XP>(io, v, x0 + row * XP, o0 + row * XP, lane, sh, row,
                                              label, k, [&] {
                                                if (more) fetch(row + 1);
                                              });
  }
}

// Rows of groups of G lanes: BLOCK / G rows a block, or (G == BLOCK) R rows a block one after
// another, pipelined when SC > 0 (the launch gives a stage of SC chunks a lane), the rows are
// held in registers and the card has cp.async.
template <bool LOSS, int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP,
          long long OP, int R, int SC, class IO>
__device__ __forceinline__ void mn_loss_sparse_ce_grad_rows(const IO &io) {
  __shared__ float sh[32];
  if constexpr (G < BLOCK) {
    static_assert(R == 1 && SC == 0, "several rows a block: one row a group");
    const long long row = (long long)blockIdx.x * (BLOCK / G) + threadIdx.x / G;
    if (row < ROWS)
      mn_loss_sparse_ce_grad_row<LOSS, G, N, NODE, XP, OP>(io, row, threadIdx.x % G, sh);
  } else {
#if __CUDA_ARCH__ >= 800
    constexpr int SX = mn_io_storage<IO, 1>::value, SO = mn_io_storage<IO, 0>::value;
    if constexpr (SC > 0 && mn_loss_held<SX, SO, G, XP, OP>()) {
      const unsigned short *x0 = mn_in<1>(io).p;
      unsigned short *o0 = mn_out<0>(io).p;
      if (((reinterpret_cast<unsigned long long>(x0) | reinterpret_cast<unsigned long long>(o0)) &
           15ull) == 0) {
        mn_loss_sparse_ce_pipe<LOSS, SX, G, ROWS, N, NODE, XP, R, SC>(io, x0, o0, sh);
        return;
      }
    }
#endif
    for (int t = 0; t < R; t++) {
      const long long row = (long long)blockIdx.x * R + t;
      if (row >= ROWS) break;
      mn_loss_sparse_ce_grad_row<LOSS, G, N, NODE, XP, OP>(io, row, threadIdx.x, sh);
    }
  }
}

template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, long long OP,
          int R, int SC, class IO>
__device__ void mn_loss_sparse_ce_grad(const IO &io) {
  mn_loss_sparse_ce_grad_rows<false, BLOCK, G, ROWS, N, NODE, XP, OP, R, SC>(io);
}
template <int BLOCK, int G, long long ROWS, long long N, unsigned NODE, long long XP, long long OP,
          int R, int SC, class IO>
__device__ void mn_loss_sparse_ce_loss_grad(const IO &io) {
  mn_loss_sparse_ce_grad_rows<true, BLOCK, G, ROWS, N, NODE, XP, OP, R, SC>(io);
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
