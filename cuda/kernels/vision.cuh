// Vision kernels (NCHW, float values in any storage): im2col / col2im around cuBLASLt matmuls for
// conv2d and its gradients, group norm and its gradients, per-channel sums, channel copies for
// concat and split, nearest 2x upsampling and its gradient, per-channel bias add.
// Shapes are template constants; every flat index is 64-bit, per-dimension values fit
// in int (the host checks).

// ---- conv2d

// The three kernels below run on a 2-D grid: blockIdx.x picks a row (an image's kernel
// tap, input plane or channel), blockIdx.y and the threads stride along the row, so the
// per-element index math is 32-bit and the row's decomposition happens once.

// col[b * SB + kd * SK + p] = x[b, ci, oy * S - PAD + ky, ox * S - PAD + kx] (0 in the
// padding) for row blockIdx.x = b * KD + kd, kd = (ci * KH + ky) * KW + kx and
// p = oy * WO + ox. SB = KD * P, SK = P gives one [KD, P] matrix per image (forward,
// batched matmul); SB = P, SK = B * P gives one [KD, B * P] matrix for B images
// (kernel gradient, one long matmul). io: x (first image of the chunk), col.
#define MN_VIS_IM2COL_UNROLL 4
template <int BLOCK, int CI, int H, int W, int KH, int KW, int S, int PAD, int HO, int WO,
          long long SB, long long SK, class IO>
__device__ void mn_vis_im2col(const IO &io) {
  constexpr int KD = CI * KH * KW, P = HO * WO;
  const int kd = (int)(blockIdx.x % KD), b = (int)(blockIdx.x / KD);
  const int kx = kd % KW, ky = (kd / KW) % KH, ci = kd / (KW * KH);
  const auto x = mn_in<0>(io) + ((long long)b * CI + ci) * H * W;
  const auto col = mn_out<1>(io) + (long long)b * SB + (long long)kd * SK;
  // MN_VIS_IM2COL_UNROLL loads in flight per thread before their stores: with one, the
  // kernel waited on load latency and wrote at half the memory bandwidth.
  for (int p0 = blockIdx.y * BLOCK * MN_VIS_IM2COL_UNROLL + threadIdx.x; p0 < P;
       p0 += gridDim.y * BLOCK * MN_VIS_IM2COL_UNROLL) {
    float v[MN_VIS_IM2COL_UNROLL];
#pragma unroll
    for (int j = 0; j < MN_VIS_IM2COL_UNROLL; j++) {
      const int p = p0 + j * BLOCK, oy = p / WO, ox = p - oy * WO;
      const int iy = oy * S - PAD + ky, ix = ox * S - PAD + kx;
      v[j] = p < P && iy >= 0 && iy < H && ix >= 0 && ix < W ? x[iy * W + ix] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < MN_VIS_IM2COL_UNROLL; j++)
      if (p0 + j * BLOCK < P) col[p0 + j * BLOCK] = v[j];
  }
}

// dx[b, ci, iy, ix] = sum over the taps (ky, kx) whose output position (oy, ox) reads
// it of dcol[b * SB + ((ci * KH + ky) * KW + kx) * P + oy * WO + ox]: a gather, so each
// input pixel is written once (0 where no window covers it) in a fixed order. Row
// blockIdx.x = b * CI + ci. io: dcol (per image [KD, P] at stride SB), dx (first image
// of the chunk).
template <int BLOCK, int CI, int H, int W, int KH, int KW, int S, int PAD, int HO, int WO,
          long long SB, class IO>
__device__ void mn_vis_col2im(const IO &io) {
  constexpr int P = HO * WO;
  const int ci = (int)(blockIdx.x % CI), b = (int)(blockIdx.x / CI);
  const auto dcol = mn_in<0>(io) + (long long)b * SB + (long long)ci * KH * KW * P;
  const auto dx = mn_out<1>(io) + (long long)blockIdx.x * H * W;
  for (int q = blockIdx.y * BLOCK + threadIdx.x; q < H * W; q += gridDim.y * BLOCK) {
    const int iy = q / W, ix = q - iy * W;
    float acc = 0.0f;
#pragma unroll
    for (int ky = 0; ky < KH; ky++) {
      const int ty = iy + PAD - ky;
      if (ty < 0 || ty % S != 0 || ty / S >= HO) continue;
      const int oy = ty / S;
#pragma unroll
      for (int kx = 0; kx < KW; kx++) {
        const int tx = ix + PAD - kx;
        if (tx < 0 || tx % S != 0 || tx / S >= WO) continue;
        acc += dcol[(long long)(ky * KW + kx) * P + oy * WO + tx / S];
      }
    }
    dx[q] = acc;
  }
}

// dst[co, b, p] = src[b, co, p]: dy of B images as one [CO, B * P] matrix. Row
// blockIdx.x = co * B + b. io: src (first image of the chunk), dst.
template <int BLOCK, int B, int CO, int P, class IO>
__device__ void mn_vis_batch_to_rows(const IO &io) {
  const long long co = blockIdx.x / B, b = blockIdx.x % B;
  const auto src = mn_in<0>(io) + (b * CO + co) * P;
  const auto dst = mn_out<1>(io) + (long long)blockIdx.x * P;
  for (int p = blockIdx.y * BLOCK + threadIdx.x; p < P; p += gridDim.y * BLOCK)
    dst[p] = src[p];
}

// ---- group norm

// Mean and 1 / sqrt(biased variance + eps) of the COUNT contiguous values at x, in two
// passes (the variance around the mean, as the reference does), accumulated in double:
// the gradient below subtracts nearly equal terms when a group is small, and float
// statistics would leave visible error there. Every thread of the block must call it;
// every thread gets both values. X: a pointer to the values (float or a storage view).
template <int BLOCK, int VEC, long long COUNT, class X>
__device__ __forceinline__ void mn_vis_block_stats(X x, float eps, double *shared, double &mean,
                                                   double &inv) {
  double s = 0.0;
  for (long long i = (long long)threadIdx.x * VEC; i < COUNT; i += (long long)BLOCK * VEC) {
    float v[VEC];
    mn_ld_vec<VEC>(x + i, v);
#pragma unroll
    for (int j = 0; j < VEC; j++)
      s += v[j];
  }
  mean = mn_block_sum_d<BLOCK>(s, shared) / (double)COUNT;
  double q = 0.0;
  for (long long i = (long long)threadIdx.x * VEC; i < COUNT; i += (long long)BLOCK * VEC) {
    float v[VEC];
    mn_ld_vec<VEC>(x + i, v);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const double d = v[j] - mean;
      q += d * d;
    }
  }
  const double var = mn_block_sum_d<BLOCK>(q, shared) / (double)COUNT;
  inv = 1.0 / sqrt(var + (double)eps);
}

// One block per (sample, group): the group's CPG channels x HW values are contiguous.
// VEC divides HW, so the VEC values of one load share a channel. SILU applies silu to the
// stored result with the silu op's own element function (pointwise.cuh, which precedes
// this file in the translation unit), so the fused op matches group_norm then silu.
// io: x, w, b, y.
template <int BLOCK, int VEC, int C, long long HW, int G, unsigned EPS_BITS, bool SILU, class IO>
__device__ void mn_vis_group_norm_fwd(const IO &io) {
  constexpr int CPG = C / G;
  constexpr long long COUNT = CPG * HW;
  __shared__ double shared[32];
  const long long base = (long long)blockIdx.x * COUNT;
  const auto x = mn_in<0>(io) + base;
  const auto w = mn_in<1>(io) + (blockIdx.x % G) * CPG;
  const auto b = mn_in<2>(io) + (blockIdx.x % G) * CPG;
  const auto y = mn_out<3>(io) + base;
  double mean_d, inv_d;
  mn_vis_block_stats<BLOCK, VEC, COUNT>(x, __int_as_float((int)EPS_BITS), shared, mean_d, inv_d);
  const float mean = (float)mean_d, inv = (float)inv_d;
  for (long long i = (long long)threadIdx.x * VEC; i < COUNT; i += (long long)BLOCK * VEC) {
    const int ch = (int)(i / HW);
    const float scale = inv * w[ch], shift = b[ch];
    float v[VEC];
    mn_ld_vec<VEC>(x + i, v);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      v[j] = (v[j] - mean) * scale + shift;
      if constexpr (SILU) v[j] = mn_pw_apply<MN_PW_SILU>(v[j], 0.0f, 0.0f, 0.0, 0.0f);
    }
    mn_st_vec<VEC>(y + i, v);
  }
}

// dx = inv * (g - mean(g) - xh * mean(g * xh)) with g = dy * w and xh the normalized x,
// one block per (sample, group) as the forward. In double throughout: the three terms
// nearly cancel when dy is close to the span of 1 and xh (always, for groups of two).
// io: x, w, dy, dx.
template <int BLOCK, int VEC, int C, long long HW, int G, unsigned EPS_BITS, class IO>
__device__ void mn_vis_group_norm_grad_x(const IO &io) {
  constexpr int CPG = C / G;
  constexpr long long COUNT = CPG * HW;
  __shared__ double shared[32];
  const long long base = (long long)blockIdx.x * COUNT;
  const auto x = mn_in<0>(io) + base;
  const auto w = mn_in<1>(io) + (blockIdx.x % G) * CPG;
  const auto dy = mn_in<2>(io) + base;
  const auto dx = mn_out<3>(io) + base;
  double mean, inv;
  mn_vis_block_stats<BLOCK, VEC, COUNT>(x, __int_as_float((int)EPS_BITS), shared, mean, inv);
  // Sums of g and g * (x - mean); inv is factored out of the second.
  double sg = 0.0, sgx = 0.0;
  for (long long i = (long long)threadIdx.x * VEC; i < COUNT; i += (long long)BLOCK * VEC) {
    const double wc = w[i / HW];
    float xv[VEC], dv[VEC];
    mn_ld_vec<VEC>(x + i, xv);
    mn_ld_vec<VEC>(dy + i, dv);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const double g = dv[j] * wc;
      sg += g;
      sgx += g * (xv[j] - mean);
    }
  }
  const double mean_g = mn_block_sum_d<BLOCK>(sg, shared) / (double)COUNT;
  const double mean_gx = mn_block_sum_d<BLOCK>(sgx, shared) * inv / (double)COUNT;
  for (long long i = (long long)threadIdx.x * VEC; i < COUNT; i += (long long)BLOCK * VEC) {
    const double wc = w[i / HW];
    float xv[VEC], dv[VEC];
    mn_ld_vec<VEC>(x + i, xv);
    mn_ld_vec<VEC>(dy + i, dv);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const double xh = (xv[j] - mean) * inv;
      xv[j] = (float)(inv * (dv[j] * wc - mean_g - xh * mean_gx));
    }
    mn_st_vec<VEC>(dx + i, xv);
  }
}

// stats[2 * blk] = mean, stats[2 * blk + 1] = inv of each (sample, group) block, one
// block each. io: x, stats.
template <int BLOCK, int VEC, long long COUNT, unsigned EPS_BITS, class IO>
__device__ void mn_vis_group_stats(const IO &io) {
  __shared__ double shared[32];
  const auto x = mn_in<0>(io) + (long long)blockIdx.x * COUNT;
  const auto stats = mn_out<1>(io);
  double mean, inv;
  mn_vis_block_stats<BLOCK, VEC, COUNT>(x, __int_as_float((int)EPS_BITS), shared, mean, inv);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = (float)mean;
    stats[2 * blockIdx.x + 1] = (float)inv;
  }
}

// ---- per-channel sums (first pass: one value per (sample, channel) row)

// partial[row] = sum over the row's HW values of dy (NORMED false) or of
// dy * (x - mean) * inv with the statistics of the row's (sample, group) (NORMED true).
// TPR threads per row: 32 (a warp per row, BLOCK / 32 rows per block) or BLOCK (one
// row per block). io: dy, x, stats, partial (x and stats unused unless NORMED).
template <int BLOCK, int TPR, int VEC, int C, long long HW, int G, long long ROWS, bool NORMED,
          class IO>
__device__ void mn_vis_channel_rows(const IO &io) {
  const long long row = (long long)blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  // A whole warp (TPR 32) or the whole block (grid == ROWS) shares the row, so no thread
  // that leaves here has partners still shuffling or waiting at a barrier.
  if (row >= ROWS) return;
  const auto dy = mn_in<0>(io) + row * HW;
  const auto x = mn_in<1>(io) + row * HW;
  const auto stats = mn_in<2>(io);
  const auto partial = mn_out<3>(io);
  float mean = 0.0f, inv = 0.0f;
  if constexpr (NORMED) {
    const long long blk = (row / C) * G + (row % C) / (C / G);
    mean = stats[2 * blk];
    inv = stats[2 * blk + 1];
  }
  float s = 0.0f;
  for (long long i = (long long)lane * VEC; i < HW; i += (long long)TPR * VEC) {
    float dv[VEC];
    mn_ld_vec<VEC>(dy + i, dv);
    if constexpr (NORMED) {
      float xv[VEC];
      mn_ld_vec<VEC>(x + i, xv);
#pragma unroll
      for (int j = 0; j < VEC; j++)
        s += dv[j] * ((xv[j] - mean) * inv);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; j++)
        s += dv[j];
    }
  }
  if constexpr (TPR == 32) {
    s = mn_warp_sum(s);
  } else {
    __shared__ float shared[32];
    s = mn_block_sum<BLOCK>(s, shared);
  }
  if (lane == 0) partial[row] = s;
}

// out[c] = sum over n of partial[n * C + c], in order of n. io: partial, out.
template <int C, int N, class IO> __device__ void mn_vis_sum_over_batch(const IO &io) {
  const auto partial = mn_in<0>(io);
  const auto out = mn_out<1>(io);
  MN_FOR_EACH(c, C) {
    float s = 0.0f;
    for (int n = 0; n < N; n++)
      s += partial[(long long)n * C + c];
    out[c] = s;
  }
}

// ---- layout and pointwise ops (VEC-wide units; the host picks VEC dividing every size
// and offset, so vector accesses stay aligned)

// dst[n * DS + DO + r] = src[n * SS + SO + r] for n < NR, r < L (all in VEC units):
// concat writes each input into its channel range, split reads one out. io: src, dst.
template <int VEC, long long NR, long long L, long long SS, long long SO, long long DS,
          long long DO, class IO>
__device__ void mn_vis_copy_rows(const IO &io) {
  const auto src = mn_in<0>(io);
  const auto dst = mn_out<1>(io);
  MN_FOR_EACH(i, NR * L) {
    const long long n = i / L, r = i % L;
    float v[VEC];
    mn_ld_vec<VEC>(src + (n * SS + SO + r) * VEC, v);
    mn_st_vec<VEC>(dst + (n * DS + DO + r) * VEC, v);
  }
}

// y[p, 2i + a, 2j + b] = x[p, i, j] for a, b in {0, 1}: one thread per input value
// writes its 2x2 block as two float2 (even offsets, so 8-byte aligned). io: x, y.
template <long long PLANES, int H, int W, class IO>
__device__ void mn_vis_upsample_2x(const IO &io) {
  const auto x = mn_in<0>(io);
  const auto y = mn_out<1>(io);
  MN_FOR_EACH(i, PLANES * H * W) {
    const int j = (int)(i % W);
    const long long r = i / W;
    const long long o = (r * 2) * (2 * W) + 2 * j; // r = p * H + row, output row 2 * r
    const float v[2] = {x[i], x[i]};
    mn_st_vec<2>(y + o, v);
    mn_st_vec<2>(y + o + 2 * W, v);
  }
}

// dx[p, i, j] = sum of dy over the 2x2 block that upsample_2x copied x[p, i, j] to.
// io: dy [PLANES, 2H, 2W], dx [PLANES, H, W].
template <long long PLANES, int H, int W, class IO>
__device__ void mn_vis_downsample_sum_2x(const IO &io) {
  const auto dy = mn_in<0>(io);
  const auto dx = mn_out<1>(io);
  MN_FOR_EACH(i, PLANES * H * W) {
    const int j = (int)(i % W);
    const long long r = i / W;
    const long long o = (r * 2) * (2 * W) + 2 * j;
    float a[2], b[2];
    mn_ld_vec<2>(dy + o, a);
    mn_ld_vec<2>(dy + o + 2 * W, b);
    dx[i] = (a[0] + a[1]) + (b[0] + b[1]);
  }
}

// y = x + bias[channel]; VEC divides HW, so one load lies in one channel.
// io: x, bias, y.
template <int VEC, int C, long long HW, long long TOTAL, class IO>
__device__ void mn_vis_add_per_channel(const IO &io) {
  const auto x = mn_in<0>(io);
  const auto bias = mn_in<1>(io);
  const auto y = mn_out<2>(io);
  MN_FOR_EACH(i, TOTAL / VEC) {
    const float bc = bias[(i * VEC / HW) % C];
    float v[VEC];
    mn_ld_vec<VEC>(x + i * VEC, v);
#pragma unroll
    for (int j = 0; j < VEC; j++)
      v[j] += bc;
    mn_st_vec<VEC>(y + i * VEC, v);
  }
}
