// Decoding: one query row per sequence against its KV cache (cached_attention with q [B, H hd],
// and the attention of a Llama decode layer, decode_layer.cuh), the cache split along the
// sequence across blocks so that a long cache uses the whole GPU at batch 1, and the splits'
// merge (in the last split's block, or mn_attn_decode_combine). Lowered by
// cuda/lower_attention.c; the shared helpers (mn_attn_neg_inf) are attention.cuh's.

// VW consecutive elements of a row into floats: one 16-, 8-, 4- or 2-byte load of 16-bit
// values, or float4/float2 loads of fp32 (p aligned to VW elements).
template <int VW> __device__ __forceinline__ void mn_attn_ldv(const float *p, float *o) {
  if constexpr (VW >= 4) {
#pragma unroll
    for (int j = 0; j < VW; j += 4) {
      const float4 t = reinterpret_cast<const float4 *>(p)[j / 4];
      o[j] = t.x;
      o[j + 1] = t.y;
      o[j + 2] = t.z;
      o[j + 3] = t.w;
    }
  } else if constexpr (VW == 2) {
    const float2 t = *reinterpret_cast<const float2 *>(p);
    o[0] = t.x;
    o[1] = t.y;
  } else {
    o[0] = *p;
  }
}
template <int VW, int S, bool C>
__device__ __forceinline__ void mn_attn_ldv(mn_lp_ptr<S, C> p, float *o) {
  unsigned w[VW >= 2 ? VW / 2 : 1];
  if constexpr (VW == 8) {
    const uint4 t = *reinterpret_cast<const uint4 *>(p.p);
    w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
  } else if constexpr (VW == 4) {
    const uint2 t = *reinterpret_cast<const uint2 *>(p.p);
    w[0] = t.x, w[1] = t.y;
  } else if constexpr (VW == 2) {
    w[0] = *reinterpret_cast<const unsigned *>(p.p);
  } else {
    o[0] = mn_lp_load<S>(*p.p);
    return;
  }
#pragma unroll
  for (int j = 0; j < VW / 2; j++) {
    o[2 * j] = mn_lp_load<S>((unsigned short)(w[j] & 0xffffu));
    o[2 * j + 1] = mn_lp_load<S>((unsigned short)(w[j] >> 16));
  }
}

// The shape of mn_attn_decode_part's work: a cache row of HD elements is NVEC vectors of VW,
// read by a group of LPR lanes (NV vectors a lane), RPW rows a warp at a time, STEP rows a
// block at a time, NSTEP steps over the BLK rows of a split, U steps' loads in flight.
template <int HD, int BLK> struct mn_attn_decode_shape {
  static constexpr int THREADS = MN_ATTN_DECODE_THREADS, WARPS = THREADS / 32;
  static constexpr int VW = HD % 8 == 0 ? 8 : HD % 4 == 0 ? 4 : HD % 2 == 0 ? 2 : 1;
  static constexpr int NVEC = HD / VW;
  static constexpr int LPR = NVEC >= 32 ? 32 : NVEC > 8 ? 16 : NVEC > 4 ? 8 : NVEC > 2 ? 4 : NVEC;
  static constexpr int NV = (NVEC + LPR - 1) / LPR, E = NV * VW;
  static constexpr int RPW = 32 / LPR, STEP = WARPS * RPW;
  static constexpr int NSTEP = (BLK + STEP - 1) / STEP, U = NSTEP < 4 ? NSTEP : 4;
};

// Rows st0 * STEP + rb, (st0 + 1) * STEP + rb, .. (U steps) of a split's K or V (rows kvd
// elements apart), this lane's vectors of each, as floats; zeros past the split's nk keys or the
// row's end.
template <class SH, class P>
__device__ __forceinline__ void mn_attn_decode_rows(P base, long long kvd, int st0, int nk, int sub,
                                                    int rb, float (*dst)[SH::E]) {
  constexpr int VW = SH::VW, LPR = SH::LPR;
#pragma unroll
  for (int u = 0; u < SH::U; u++) {
    const int r = (st0 + u) * SH::STEP + rb;
#pragma unroll
    for (int j = 0; j < SH::NV; j++) {
      if (st0 + u < SH::NSTEP && r < nk && (SH::NVEC % LPR == 0 || sub + LPR * j < SH::NVEC)) {
        mn_attn_ldv<VW>(base + (long long)r * kvd + (sub + LPR * j) * VW, dst[u] + j * VW);
      } else {
#pragma unroll
        for (int e = 0; e < VW; e++)
          dst[u][j * VW + e] = 0.0f;
      }
    }
  }
}

// The end of a MERGE mn_attn_decode_part block: it counts itself done for its (sequence, group
// slice); the last of the slice's splits reads every split's partial results from L2 (written
// by other blocks, published by their fences before they counted) and writes the slice's rows
// of out, merging the splits in order, so the result does not depend on which block is last.
template <int HD, int H, long long NSPLIT, int THREADS, class IO>
__device__ __forceinline__ void mn_attn_decode_merge_last(const IO &io, int splits, int h0, int ng,
                                                          long long seq) {
  __threadfence();
  __syncthreads();
  int last = 0;
  if (threadIdx.x == 0)
    last = atomicAdd(mn_arg<unsigned int>(io, 8) + seq * gridDim.x + blockIdx.x, 1u) ==
           (unsigned int)(splits - 1);
  if (!__syncthreads_or(last)) return;
  __threadfence();
  const float *pm = mn_arg<const float>(io, 4) + seq * NSPLIT * H;
  const float *pl = mn_arg<const float>(io, 5) + seq * NSPLIT * H;
  const float *po = mn_arg<const float>(io, 6) + seq * NSPLIT * H * HD;
  float *out = mn_arg<float>(io, 7) + (seq * H + h0) * HD;
  for (int idx = threadIdx.x; idx < ng * HD; idx += THREADS) {
    const int h = h0 + idx / HD, d = idx % HD;
    float mx = mn_attn_neg_inf(), sum = 0.0f, acc = 0.0f;
    for (int sp = 0; sp < splits; sp++) {
      const float m = __ldcg(pm + (long long)sp * H + h), l = __ldcg(pl + (long long)sp * H + h);
      const float o = __ldcg(po + ((long long)sp * H + h) * HD + d);
      const float nm = fmaxf(mx, m), a = expf(mx - nm), e = expf(m - nm);
      sum = fmaf(sum, a, l * e);
      acc = fmaf(acc, a, o * e);
      mx = nm;
    }
    out[idx] = acc / sum;
  }
}

// Decoding one query row per sequence against its KV cache, split over the cache: block
// (group slice, split, sequence b) of MN_ATTN_DECODE_THREADS threads handles keys split * BLK ..
// + BLK - 1 for GB query heads of one kv head, grid (KVH * ceil(G / GB), ceil(MAXS / BLK), B);
// io = q, k_cache, v_cache, kv_len, pm, pl, po. A row's dot products are taken by a group of
// lanes, each with its slice of the GB queries in registers, so the loads of a row are one
// coalesced transaction and every warp has several rows' K and V loads in flight at once (the
// first steps' V rows are read before the scores are known). Partial results per (b, split,
// head) at (b * splits + split) * H + h: the max score pm, the sum of exp(score - pm) pl, and
// the unnormalized output po [HD]; the warps' sums meet in shared memory in a fixed order, so
// the result does not depend on timing. Splits at or past kv_len, and every split when kv_len is
// out of range, write nothing: mn_attn_decode_combine checks kv_len and reads only the splits
// it covers.
// MERGE (a decode layer, decode_layer.cuh): io also holds out [B, H * HD] (fp32), one counter
// per (sequence, group slice) that the kernel before this one zeroed, the error record and the
// node id (a value). The last split of a slice to finish merges the slice's partial results into
// out, so no other kernel has to; with one split the block normalizes its own sums and writes no
// partials. An out-of-range kv_len is reported once and out is NaN.
template <int HD, int H, int KVH, long long MAXS, int GB, int BLK, bool MERGE, class IO>
__device__ void mn_attn_decode_part(const IO &io) {
  mn_overlap_begin(); // a decode layer's next kernel loads its weights meanwhile
  using SH = mn_attn_decode_shape<HD, BLK>;
  constexpr int VW = SH::VW, NVEC = SH::NVEC, LPR = SH::LPR, NV = SH::NV, E = SH::E;
  constexpr int RPW = SH::RPW, STEP = SH::STEP, NSTEP = SH::NSTEP, U = SH::U;
  constexpr int WARPS = SH::WARPS, THREADS = SH::THREADS;
  static_assert(BLK % 32 == 0 && BLK <= THREADS, "a split's rows are one thread's each");
  constexpr int G = H / KVH, NGB = (G + GB - 1) / GB;
  constexpr long long KVD = (long long)KVH * HD;
  __shared__ float ps[GB * BLK];
  __shared__ float wred[2][BLK / 32][GB];
  __shared__ float vred[WARPS][GB * HD];
  const unsigned int kv_len = *mn_arg<const unsigned int>(io, 3);
  const long long c0 = (long long)blockIdx.y * BLK;
  constexpr long long NSPLIT = (MAXS + BLK - 1) / BLK;
  const int kvh = blockIdx.x / NGB, h0 = kvh * G + (blockIdx.x % NGB) * GB;
  const int ng = G - (h0 - kvh * G) < GB ? G - (h0 - kvh * G) : GB;
  const long long seq = blockIdx.z, slot = seq * NSPLIT + blockIdx.y;
  if (kv_len == 0u || kv_len > (unsigned long long)MAXS) {
    if constexpr (MERGE) {
      if (blockIdx.x == 0 && blockIdx.y == 0 && seq == 0 && threadIdx.x == 0)
        mn_report(mn_arg<mn_dev_error>(io, 9), MN_DEV_ERR_KV_LEN, mn_arg_value(io, 10), kv_len, 0,
                  MAXS);
      if (blockIdx.y == 0)
        for (int idx = threadIdx.x; idx < ng * HD; idx += THREADS)
          mn_arg<float>(io, 7)[(seq * H + h0) * HD + idx] = mn_nan();
    }
    return;
  }
  if (c0 >= kv_len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % LPR, grp = lane / LPR;
  const int nk = kv_len - c0 < BLK ? (int)(kv_len - c0) : BLK;
  const auto kb = mn_in<1>(io) + (seq * MAXS + c0) * KVD + kvh * HD;
  const auto vb = mn_in<2>(io) + (seq * MAXS + c0) * KVD + kvh * HD;
  const int rb = warp * RPW + grp; // the row of step st is st * STEP + rb
  float vf[U][E];
  mn_attn_decode_rows<SH>(vb, KVD, 0, nk, sub, rb, vf);

  float qf[GB][E];
  const auto q = mn_in<0>(io) + seq * H * HD;
#pragma unroll
  for (int i = 0; i < GB; i++)
#pragma unroll
    for (int j = 0; j < NV; j++) {
      if (i < ng && (NVEC % LPR == 0 || sub + LPR * j < NVEC))
        mn_attn_ldv<VW>(q + (long long)(h0 + i) * HD + (sub + LPR * j) * VW, qf[i] + j * VW);
      else
#pragma unroll
        for (int e = 0; e < VW; e++)
          qf[i][j * VW + e] = 0.0f;
    }

  const float scale = 1.0f / sqrtf((float)HD);
  for (int st0 = 0; st0 < NSTEP; st0 += U) {
    float kf[U][E];
    mn_attn_decode_rows<SH>(kb, KVD, st0, nk, sub, rb, kf);
#pragma unroll
    for (int u = 0; u < U; u++) {
      float s[GB];
#pragma unroll
      for (int i = 0; i < GB; i++) {
        float t = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++)
          t = fmaf(qf[i][e], kf[u][e], t);
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1)
          t += __shfl_xor_sync(0xffffffffu, t, o);
        s[i] = t;
      }
      const int r = (st0 + u) * STEP + rb;
      if (sub == 0 && st0 + u < NSTEP && r < BLK)
#pragma unroll
        for (int i = 0; i < GB; i++)
          ps[i * BLK + r] = r < nk ? s[i] * scale : mn_attn_neg_inf();
    }
  }
  __syncthreads();

  // Softmax over the split's rows, thread t taking row t: two block barriers for all heads.
  if (threadIdx.x < BLK) {
#pragma unroll
    for (int i = 0; i < GB; i++) {
      const float m = mn_warp_max(ps[i * BLK + threadIdx.x]);
      if (lane == 0) wred[0][warp][i] = m;
    }
  }
  __syncthreads();
  if (threadIdx.x < BLK) {
#pragma unroll
    for (int i = 0; i < GB; i++) {
      float mx = wred[0][0][i]; // finite: row 0 of a split that is not skipped is a key
#pragma unroll
      for (int w = 1; w < BLK / 32; w++)
        mx = fmaxf(mx, wred[0][w][i]);
      const int t = threadIdx.x;
      const float p = t < nk ? expf(ps[i * BLK + t] - mx) : 0.0f;
      ps[i * BLK + t] = p;
      const float sum = mn_warp_sum(p);
      if (lane == 0) wred[1][warp][i] = sum;
      if (t == 0 && i < ng) mn_out<4>(io)[slot * H + h0 + i] = mx;
    }
  }
  __syncthreads();
  if (threadIdx.x < ng) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < BLK / 32; w++)
      sum += wred[1][w][threadIdx.x];
    mn_out<5>(io)[slot * H + h0 + threadIdx.x] = sum;
  }

  float acc[GB][E];
  mn_attn_fill(acc, 0.0f);
  for (int st0 = 0; st0 < NSTEP; st0 += U) {
    if (st0 > 0) mn_attn_decode_rows<SH>(vb, KVD, st0, nk, sub, rb, vf);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int r = (st0 + u) * STEP + rb;
      if (st0 + u >= NSTEP || r >= nk) continue;
#pragma unroll
      for (int i = 0; i < GB; i++) {
        const float p = ps[i * BLK + r];
#pragma unroll
        for (int e = 0; e < E; e++)
          acc[i][e] = fmaf(p, vf[u][e], acc[i][e]);
      }
    }
  }
  // The RPW row groups of a warp, then the warps in order.
#pragma unroll
  for (int i = 0; i < GB; i++)
#pragma unroll
    for (int e = 0; e < E; e++) {
#pragma unroll
      for (int o = LPR; o < 32; o <<= 1)
        acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], o);
    }
  if (grp == 0)
#pragma unroll
    for (int i = 0; i < GB; i++)
#pragma unroll
      for (int j = 0; j < NV; j++)
        if (NVEC % LPR == 0 || sub + LPR * j < NVEC)
#pragma unroll
          for (int e = 0; e < VW; e++)
            vred[warp][i * HD + (sub + LPR * j) * VW + e] = acc[i][j * VW + e];
  __syncthreads();
  const int splits = (int)((kv_len + BLK - 1) / BLK);
  if constexpr (MERGE) {
    if (splits == 1) {
      float *out = mn_arg<float>(io, 7) + (seq * H + h0) * HD;
      for (int idx = threadIdx.x; idx < ng * HD; idx += THREADS) {
        float a = 0.0f, l = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
          a += vred[w][idx];
#pragma unroll
        for (int w = 0; w < BLK / 32; w++)
          l += wred[1][w][idx / HD];
        out[idx] = a / l;
      }
      return;
    }
  }
  const auto po = mn_out<6>(io);
  for (int idx = threadIdx.x; idx < ng * HD; idx += THREADS) {
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++)
      a += vred[w][idx];
    po[(slot * H + h0) * HD + idx] = a;
  }
  if constexpr (MERGE) mn_attn_decode_merge_last<HD, H, NSPLIT, THREADS>(io, splits, h0, ng, seq);
}

// Merges the splits of mn_attn_decode_part: one block per (query head, sequence), grid
// (H, B); io = kv_len,
// pm, pl, po, out, error. An out-of-range kv_len is reported once and every output is NaN.
template <int HD, int H, long long MAXS, unsigned int NODE, int BLOCK, class IO>
__device__ void mn_attn_decode_combine(const IO &io) {
  const unsigned int kv_len = *mn_arg<const unsigned int>(io, 0);
  constexpr long long NSPLIT = (MAXS + MN_ATTN_BLOCK - 1) / MN_ATTN_BLOCK;
  const int h = blockIdx.x;
  const long long seq = blockIdx.y;
  const auto out = mn_out<4>(io) + (seq * H + h) * HD;
  if (kv_len == 0u || kv_len > (unsigned long long)MAXS) {
    if (h == 0 && seq == 0 && threadIdx.x == 0)
      mn_report(mn_arg<mn_dev_error>(io, 5), MN_DEV_ERR_KV_LEN, NODE, kv_len, 0, MAXS);
    for (int d = threadIdx.x; d < HD; d += BLOCK)
      out[d] = mn_nan();
    return;
  }
  const auto pm = mn_in<1>(io) + seq * NSPLIT * H;
  const auto pl = mn_in<2>(io) + seq * NSPLIT * H;
  const auto po = mn_in<3>(io) + seq * NSPLIT * H * HD;
  const int splits = (int)((kv_len + MN_ATTN_BLOCK - 1) / MN_ATTN_BLOCK);
  float mx = mn_attn_neg_inf();
  for (int sp = 0; sp < splits; sp++)
    mx = fmaxf(mx, pm[(long long)sp * H + h]);
  float sum = 0.0f;
  for (int sp = 0; sp < splits; sp++)
    sum = fmaf(pl[(long long)sp * H + h], expf(pm[(long long)sp * H + h] - mx), sum);
  for (int d = threadIdx.x; d < HD; d += BLOCK) {
    float a = 0.0f;
    for (int sp = 0; sp < splits; sp++)
      a = fmaf(po[((long long)sp * H + h) * HD + d], expf(pm[(long long)sp * H + h] - mx), a);
    out[d] = a / sum;
  }
}
