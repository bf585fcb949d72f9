// Attention: flash-style forward (online softmax, no [T, S] matrix in memory), its
// statistics pre-pass for the backward ops, and dQ and dK / dV kernels that recompute the
// probabilities (split-KV decoding over a KV cache: attention_decode.cuh).
//
// Every tiled kernel runs MN_ATTN_BLOCK = 128 threads (4 warps) and owns a tile of BR = 16 * RM
// "rows" (queries, or keys for dK / dV); it streams tiles of BC "columns" through shared memory. In
// a warp, lane = rg * 8 + cg: the lane holds rows rg * RM .. rg * RM + RM - 1 of its warp's 4 * RM
// rows, score columns cg, cg + 8, ... (so a row's statistics reduce over the 8 lanes of one rg with
// xor-shuffles 1, 2, 4, and the float4 reads of a column tile hit 8 distinct bank groups), and
// accumulator head dims cg * 4 + 32 * u + e. Head dims are padded with zeros to HDP, a multiple
// of 32. Tiles are stored row-major with a stride of HDP + 4 (or BC + 4) floats so that those
// float4 reads do not conflict.
//
// Scores are scale * q.k with the dot product always summed in the same order (mn_attn_dot),
// so the backward kernels recompute bit-identical scores and probabilities no larger than 1.
//
// MASK (an mn_attn_mask of cuda/device_abi.h) says which keys a query sees. With
// MN_ATTN_MASK_SEGMENTS (packed sequences) query r of batch b sees keys lo(r) .. r, lo(r) = r -
// positions[b * T + r] (0 when the position exceeds r). A block of query rows starts at the key
// tile holding the smallest lo of its rows and a block of keys skips every query tile none of
// whose rows reaches back to its keys, so the work is that of the keys the segments see, not of
// the causal triangle; the element mask does the rest.

__device__ __forceinline__ float mn_attn_f4(const float4 &v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// Max and sum over the 8 lanes that share a row (same rg).
__device__ __forceinline__ float mn_attn_row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}
__device__ __forceinline__ float mn_attn_row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

__device__ __forceinline__ float mn_attn_neg_inf() { return -__int_as_float(0x7f800000); }

// Copies rows first .. first + ROWS - 1 of one head (src: row 0 at the head's first column,
// rows `stride` elements apart; a float pointer or a low-precision view) into dst[r * LD + d] as
// floats; rows at or past `count` and dims at or past HD become zeros.
template <int HD, int HDP, int ROWS, int LD, class P>
__device__ __forceinline__ void mn_attn_load(float *dst, P src, long long stride, long long first,
                                             long long count) {
  if constexpr (HD % 4 == 0) {
    constexpr int C4 = HDP / 4;
    for (int i = threadIdx.x; i < ROWS * C4; i += MN_ATTN_BLOCK) {
      const int r = i / C4, c = (i - r * C4) * 4;
      const long long row = first + r;
      float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
      if (row < count && c < HD) v = mn_ld4(src + row * stride + c, 0);
      *reinterpret_cast<float4 *>(dst + r * LD + c) = v;
    }
  } else {
    for (int i = threadIdx.x; i < ROWS * HDP; i += MN_ATTN_BLOCK) {
      const int r = i / HDP, c = i - r * HDP;
      const long long row = first + r;
      dst[r * LD + c] = row < count && c < HD ? src[row * stride + c] : 0.0f;
    }
  }
}

// s[i][j] = a[i * LDA + :] . b[j * 8 * LDB + :] over the first HDQ dims (a: the lane's first
// row; b: its first column), summed in increasing d.
template <int RM, int CN, int HDQ, int LDA, int LDB>
__device__ __forceinline__ void mn_attn_dot(float (&s)[RM][CN], const float *a, const float *b) {
#pragma unroll
  for (int i = 0; i < RM; i++)
#pragma unroll
    for (int j = 0; j < CN; j++)
      s[i][j] = 0.0f;
#pragma unroll 2
  for (int d = 0; d < HDQ; d += 4) {
    float4 av[RM], bv[CN];
#pragma unroll
    for (int i = 0; i < RM; i++)
      av[i] = *reinterpret_cast<const float4 *>(a + i * LDA + d);
#pragma unroll
    for (int j = 0; j < CN; j++)
      bv[j] = *reinterpret_cast<const float4 *>(b + j * 8 * LDB + d);
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
      for (int j = 0; j < CN; j++) {
        float t = fmaf(av[i].x, bv[j].x, s[i][j]);
        t = fmaf(av[i].y, bv[j].y, t);
        t = fmaf(av[i].z, bv[j].z, t);
        s[i][j] = fmaf(av[i].w, bv[j].w, t);
      }
  }
}

// acc[i][u][e] += sum_k p[i * LDP + k] * c[k * LDC + 32 * u + e] over the BC columns of a
// tile (p: the lane's first row of the probability tile; c: the value tile at dim cg * 4).
template <int RM, int DN4, int BC, int LDP, int LDC>
__device__ __forceinline__ void mn_attn_acc(float (&acc)[RM][DN4][4], const float *p,
                                            const float *c) {
#pragma unroll 2
  for (int k = 0; k < BC; k += 4) {
    float4 pv[RM];
#pragma unroll
    for (int i = 0; i < RM; i++)
      pv[i] = *reinterpret_cast<const float4 *>(p + i * LDP + k);
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
      for (int u = 0; u < DN4; u++) {
        const float4 cv = *reinterpret_cast<const float4 *>(c + (k + kk) * LDC + 32 * u);
#pragma unroll
        for (int i = 0; i < RM; i++) {
          const float pk = mn_attn_f4(pv[i], kk);
          acc[i][u][0] = fmaf(pk, cv.x, acc[i][u][0]);
          acc[i][u][1] = fmaf(pk, cv.y, acc[i][u][1]);
          acc[i][u][2] = fmaf(pk, cv.z, acc[i][u][2]);
          acc[i][u][3] = fmaf(pk, cv.w, acc[i][u][3]);
        }
      }
  }
}

// Writes row `row` of a head's output (dst: row 0 at the head's first column; a float pointer or
// a low-precision view, each value rounded once) from the lane's accumulator dims, times `mul`.
template <int HD, int DN4, class P>
__device__ __forceinline__ void mn_attn_store_row(P dst, const float (&acc)[DN4][4], float mul,
                                                  int cg) {
#pragma unroll
  for (int u = 0; u < DN4; u++) {
    const int d = cg * 4 + 32 * u;
    if constexpr (HD % 4 == 0) {
      if (d < HD) {
        float4 o = {acc[u][0] * mul, acc[u][1] * mul, acc[u][2] * mul, acc[u][3] * mul};
        mn_st4(dst + d, 0, o);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (d + e < HD) dst[d + e] = acc[u][e] * mul;
    }
  }
}

// Sets every element of a register array (of any rank) to v.
__device__ __forceinline__ void mn_attn_fill(float &a, float v) { a = v; }
template <typename A, int N> __device__ __forceinline__ void mn_attn_fill(A (&a)[N], float v) {
#pragma unroll
  for (int i = 0; i < N; i++)
    mn_attn_fill(a[i], v);
}

// Where query head h of batch b starts: qoff in q, dy and the output, sb in the statistics.
struct mn_attn_head {
  long long qoff, sb;
};
template <int HD, long long T, int H>
__device__ __forceinline__ mn_attn_head mn_attn_head_of(long long b, int h) {
  return {b * T * H * HD + h * HD, ((long long)b * H + h) * T};
}
// The sb of mn_attn_head alone.
template <long long T, int H> __device__ __forceinline__ long long mn_attn_sb(long long b, int h) {
  return ((long long)b * H + h) * T;
}

// A block over the query tile q0 .. q0 + BR - 1 of head h of batch b (grid (ceil(T / BR), H, B)):
// qoff, where the head's rows start in q (rows QS apart), yoff in dy and the output (rows H * HD
// apart), and its kv head's K and V (row 0 of each, rows KS apart; PK, PV: the pointer types of
// arguments 1 and 2, mn_in). QS and KS are wider than a head row set when q, k and v are column
// blocks of one tensor (attention_pipe.cuh, QKV).
template <class PK, class PV> struct mn_attn_qtile {
  long long q0, b;
  int h;
  long long qoff, yoff;
  PK kb;
  PV vb;
};
template <int BR, int HD, long long T, long long S, int H, int KVH, int MASK,
          long long QS = (long long)H *HD, long long KS = (long long)KVH *HD, class IO>
__device__ __forceinline__ auto mn_attn_qtile_of(const IO &io) {
  mn_attn_qtile<decltype(mn_in<1>(io)), decltype(mn_in<2>(io))> q;
  const long long num_tiles = (T + BR - 1) / BR;
  // Causal tiles late in the sequence do the most work: start them first.
  const long long tile = MASK != MN_ATTN_MASK_NONE ? num_tiles - 1 - blockIdx.x : blockIdx.x;
  q.q0 = tile * BR;
  q.b = blockIdx.z;
  q.h = blockIdx.y;
  const int kvh = q.h / (H / KVH);
  q.qoff = q.b * T * QS + q.h * HD;
  q.yoff = q.b * T * H * HD + q.h * HD;
  q.kb = mn_in<1>(io) + q.b * S * KS + kvh * HD;
  q.vb = mn_in<2>(io) + q.b * S * KS + kvh * HD;
  return q;
}

// The end of the keys that the query tile from q0 sees.
template <int BR, long long S, int MASK>
__device__ __forceinline__ long long mn_attn_kend(long long q0) {
  return MASK != MN_ATTN_MASK_NONE ? (q0 + BR < S ? q0 + BR : S) : S;
}

// The first key query r of batch b sees: lo(r) when packed (0 past T), else 0.
template <long long T, int MASK, class IO>
__device__ __forceinline__ long long mn_attn_seg_lo(const IO &io, long long b, long long r) {
  if constexpr (MASK == MN_ATTN_MASK_SEGMENTS) {
    if (r >= T) return 0;
    const long long pos = mn_arg<const unsigned int>(io, MN_ATTN_POSITIONS_ARG)[b * T + r];
    return pos < r ? r - pos : 0;
  } else {
    return 0;
  }
}

// Where the key tiles (of BC) of the query tile q0 .. q0 + BR - 1 of batch b start: at the tile
// holding the smallest lo of its rows when packed, else 0. Every thread of the block calls it
// (it synchronizes) and gets the same value.
template <int BR, int BC, long long T, int MASK, class IO>
__device__ __forceinline__ long long mn_attn_kstart(const IO &io, long long b, long long q0) {
  if constexpr (MASK == MN_ATTN_MASK_SEGMENTS) {
    __shared__ unsigned long long lo;
    if (threadIdx.x == 0) lo = (unsigned long long)q0; // lo(q0) <= q0
    __syncthreads();
    for (int i = threadIdx.x; i < BR && q0 + i < T; i += MN_ATTN_BLOCK)
      atomicMin(&lo, (unsigned long long)mn_attn_seg_lo<T, MASK>(io, b, q0 + i));
    __syncthreads();
    return (long long)lo / BC * BC;
  } else {
    return 0;
  }
}

// Whether a query of the tile r0 .. r0 + BC - 1 of batch b sees a key at or before c_last: when
// packed, a vote of the block (every thread calls it and gets the same answer), else true.
template <int BC, long long T, int MASK, class IO>
__device__ __forceinline__ bool mn_attn_q_tile_live(const IO &io, long long b, long long r0,
                                                    long long c_last) {
  if constexpr (MASK == MN_ATTN_MASK_SEGMENTS) {
    static_assert(BC <= MN_ATTN_BLOCK, "one thread per query row of the tile");
    const long long r = r0 + threadIdx.x;
    const bool sees = threadIdx.x < BC && r < T && mn_attn_seg_lo<T, MASK>(io, b, r) <= c_last;
    return __syncthreads_or(sees) != 0;
  } else {
    return true;
  }
}

// Query rows first .. first + ROWS - 1 of one head (qoff: mn_attn_head) into qs and, when DY, their
// output gradients into dys.
template <int HD, int HDP, int ROWS, int LD, long long T, int H, bool DY, class IO>
__device__ __forceinline__ void mn_attn_load_q(float *qs, float *dys, const IO &io, long long qoff,
                                               long long first) {
  mn_attn_load<HD, HDP, ROWS, LD>(qs, mn_in<0>(io) + qoff, (long long)H * HD, first, T);
  if constexpr (DY)
    mn_attn_load<HD, HDP, ROWS, LD>(dys, mn_in<3>(io) + qoff, (long long)H * HD, first, T);
}

// Key rows first .. first + ROWS - 1 of one kv head (kb, vb: its row 0) into ks and, when V, their
// values into vs.
template <int HD, int HDP, int ROWS, int LD, long long S, int KVH, bool V, class PK, class PV>
__device__ __forceinline__ void mn_attn_load_kv(float *ks, float *vs, PK kb, PV vb,
                                                long long first) {
  mn_attn_load<HD, HDP, ROWS, LD>(ks, kb, (long long)KVH * HD, first, S);
  if constexpr (V) mn_attn_load<HD, HDP, ROWS, LD>(vs, vb, (long long)KVH * HD, first, S);
}

// The pre-pass statistics of query row r (sb: mn_attn_head), zeros past T: row max m, inv_l and,
// when DELTA, delta.
template <long long T, bool DELTA, class IO>
__device__ __forceinline__ void mn_attn_load_stats(const IO &io, long long sb, long long r,
                                                   float &m, float &inv_l, float &delta) {
  m = r < T ? mn_in<4>(io)[sb + r] : 0.0f;
  inv_l = r < T ? mn_in<5>(io)[sb + r] : 0.0f;
  if constexpr (DELTA) delta = r < T ? mn_in<6>(io)[sb + r] : 0.0f;
}

// A block over the key tile c0 .. c0 + BR - 1 of kv head kvh of batch b (grid (ceil(S / BR), KVH,
// B)), and kvoff, where the kv head's rows start in K and V.
struct mn_attn_kvtile {
  long long c0, b;
  int kvh;
  long long kvoff;
};
template <int BR, int HD, long long S, int KVH>
__device__ __forceinline__ mn_attn_kvtile mn_attn_kvtile_of() {
  mn_attn_kvtile k;
  k.c0 = (long long)blockIdx.x * BR;
  k.b = blockIdx.z;
  k.kvh = blockIdx.y;
  k.kvoff = k.b * S * KVH * HD + k.kvh * HD;
  return k;
}

// Moves a key-tile block to the query tile r0 .. r0 + BC - 1 of head qh of batch b: once every
// thread is done with the previous tile, loads q, dy, the statistics (st: [3][BC]) and, when
// packed, each row's first key (lo: [BC]), then waits until all of them are in.
template <int HD, int HDP, int BC, int LD, long long T, int H, int MASK, bool DELTA, class IO>
__device__ __forceinline__ void mn_attn_next_q_tile(float *qs, float *dys, float *st, int *lo,
                                                    const IO &io, const mn_attn_head &qh,
                                                    long long b, long long r0) {
  __syncthreads();
  mn_attn_load_q<HD, HDP, BC, LD, T, H, true>(qs, dys, io, qh.qoff, r0);
  for (int j = threadIdx.x; j < BC; j += MN_ATTN_BLOCK) {
    mn_attn_load_stats<T, DELTA>(io, qh.sb, r0 + j, st[j], st[BC + j], st[2 * BC + j]);
    if constexpr (MASK == MN_ATTN_MASK_SEGMENTS)
      lo[j] = (int)mn_attn_seg_lo<T, MASK>(io, b, r0 + j);
  }
  __syncthreads();
}

// Runs body(r0) for every query tile r0 .. r0 + BC - 1 that the key-tile block kt (of BR keys)
// sees, for each of the G query heads that share its kv head, after loading the tile into qs,
// dys, st and lo (mn_attn_next_q_tile). Causal: queries before the key tile never see it, so it
// starts at the tile holding query c0; packed: tiles whose rows all start past the block's last
// key are skipped.
template <int HD, int HDP, int BR, int BC, int LD, long long T, long long S, int H, int G, int MASK,
          bool DELTA, class IO, typename F>
__device__ __forceinline__ void mn_attn_for_q_tiles(const mn_attn_kvtile &kt, float *qs, float *dys,
                                                    float *st, int *lo, const IO &io, F &&body) {
  const long long r_start = MASK != MN_ATTN_MASK_NONE ? kt.c0 / BC * BC : 0;
  const long long c_last = (kt.c0 + BR < S ? kt.c0 + BR : S) - 1;
  for (int g = 0; g < G; g++) {
    const mn_attn_head qh = mn_attn_head_of<HD, T, H>(kt.b, kt.kvh * G + g);
    for (long long r0 = r_start; r0 < T; r0 += BC) {
      if (!mn_attn_q_tile_live<BC, T, MASK>(io, kt.b, r0, c_last)) continue;
      mn_attn_next_q_tile<HD, HDP, BC, LD, T, H, MASK, DELTA>(qs, dys, st, lo, io, qh, kt.b, r0);
      body(r0);
    }
  }
}

// Whether query r, whose first visible key is lo (mn_attn_seg_lo), sees key c: both exist and,
// when causal or packed, lo <= c <= r.
template <long long T, long long S, int MASK>
__device__ __forceinline__ bool mn_attn_visible(long long r, long long c, long long lo) {
  return r < T && c < S && (MASK == MN_ATTN_MASK_NONE || (c <= r && c >= lo));
}

// Writes the pre-pass statistics of one query row at index i (sb + row): m, 1 / l and, when DELTA,
// dsum / l.
template <bool DELTA, class IO>
__device__ __forceinline__ void mn_attn_store_stats(const IO &io, long long i, float m, float l,
                                                    float dsum) {
  const float inv_l = 1.0f / l;
  mn_out<4>(io)[i] = m;
  mn_out<5>(io)[i] = inv_l;
  if constexpr (DELTA) mn_out<6>(io)[i] = dsum * inv_l;
}

// delta = dy . y for every (batch, query, head) row of T * H per batch, stored at (b * H + h) *
// T + t as the pre-pass stores its delta: the _saved gradients' shift of the softmax gradient
// (sum_s P_s dP_s = dy . sum_s P_s v_s), read from the forward's stored output instead of a
// second pass over the scores. RPW rows a warp: with RPW > 1 (HD a multiple of 8, 32 / RPW = HD
// / 8 lanes a row) each lane reads 8 consecutive values of y and of dy at once; with RPW 1 the
// warp's lanes step over the head dim. Grid ceil(ROWS / (4 RPW)). io = y, dy, delta.
template <int HD, long long T, int H, long long ROWS, int RPW, class IO>
__device__ void mn_attn_delta(const IO &io) {
  constexpr int LPR = 32 / RPW; // lanes a row
  static_assert(RPW == 1 || LPR * 8 == HD, "8 values a lane");
  const int lane = threadIdx.x & 31, sub = lane % LPR;
  const long long row =
      ((long long)blockIdx.x * (MN_ATTN_BLOCK / 32) + (threadIdx.x >> 5)) * RPW + lane / LPR;
  float s = 0.0f;
  if (row < ROWS) {
    const auto y = mn_in<0>(io) + row * HD;
    const auto dy = mn_in<1>(io) + row * HD;
    if constexpr (RPW > 1) {
      const float4 y0 = mn_ld4(y, 2 * sub), y1 = mn_ld4(y, 2 * sub + 1);
      const float4 d0 = mn_ld4(dy, 2 * sub), d1 = mn_ld4(dy, 2 * sub + 1);
      s = y0.x * d0.x + y0.y * d0.y + y0.z * d0.z + y0.w * d0.w + y1.x * d1.x + y1.y * d1.y +
          y1.z * d1.z + y1.w * d1.w;
    } else {
      for (int d = lane; d < HD; d += 32)
        s = fmaf((float)dy[d], (float)y[d], s);
    }
  }
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if (sub == 0 && row < ROWS) {
    const long long b = row / (T * H), t = row / H % T, h = row % H;
    mn_out<2>(io)[(b * H + h) * T + t] = s;
  }
}

// Forward over one (query tile, head, batch) block: grid (ceil(T / BR), H, B).
// MODE (an mn_attn_mode of cuda/device_abi.h) MN_ATTN_OUTPUT writes the output: io = q, k,
// v, out; MN_ATTN_OUTPUT_STATS also the row statistics: io = q, k, v, out, m, inv_l.
// MN_ATTN_STATS_DELTA and MN_ATTN_STATS are the backward pre-pass: io = q, k, v, dy, m, inv_l,
// delta; they write per (b, h, t) at (b * H + h) * T + t the row max m and 1 / sum of exp(score -
// m), so that P = exp(score - m) * inv_l, and MN_ATTN_STATS_DELTA also delta = sum_s P_s dP_s with
// dP_s = dy . v_s (like the reference, not dy . out: dP comes from the same mn_attn_dot as in the
// gradient kernels, so a row that sees one key gets dS = P (dP - delta) = 0 exactly).
// MN_ATTN_MASK_CACHE (a prefill over KV caches of S rows, MODE MN_ATTN_OUTPUT) reports a bad
// kv_len as the node whose id is argument MN_ATTN_POSITIONS_ARG + 1 (a value).
template <int HD, int HDP, int RM, int BC, long long T, long long S, int H, int KVH, int MASK,
          int MODE, class IO>
__device__ void mn_attn_fwd(const IO &io) {
  constexpr int BR = 16 * RM, LDA = HDP + 4, LDP = BC + 4, CN = BC / 8, DN4 = HDP / 32;
  constexpr int HDQ = (HD + 3) / 4 * 4;
  constexpr bool OUT = MODE == MN_ATTN_OUTPUT || MODE == MN_ATTN_OUTPUT_STATS;
  extern __shared__ __align__(16) float mn_attn_smem[];
  float *qs = mn_attn_smem;  // [BR][LDA]
  float *ks = qs + BR * LDA; // [BC][LDA]
  float *vs = ks + BC * LDA; // [BC][LDA], modes 0 and 1
  float *ps = vs + BC * LDA; // output: probabilities [BR][LDP]; delta: dy rows [BR][LDA]

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK>(io);
  const long long q0 = qt.q0;
  const int lane = threadIdx.x & 31, cg = lane & 7;
  const int rbase = (threadIdx.x >> 5) * 4 * RM + (lane >> 3) * RM;
  const float scale = 1.0f / sqrtf((float)HD);

  mn_attn_load_q<HD, HDP, BR, LDA, T, H, MODE == MN_ATTN_STATS_DELTA>(qs, ps, io, qt.qoff, q0);
  // acc: the unnormalized output (MN_ATTN_OUTPUT); dsum: sum_s exp(score_s - m) dP_s
  // (MN_ATTN_STATS_DELTA).
  float acc[OUT ? RM : 1][DN4][4], m[RM], l[RM], dsum[RM];
  mn_attn_fill(m, mn_attn_neg_inf());
  mn_attn_fill(l, 0.0f);
  mn_attn_fill(dsum, 0.0f);
  mn_attn_fill(acc, 0.0f);
  long long lo[RM];
#pragma unroll
  for (int i = 0; i < RM; i++)
    lo[i] = mn_attn_seg_lo<T, MASK>(io, qt.b, q0 + rbase + i);
  // A prefill's query r is the cache's row r + off. kv_len is the same for every block, so a
  // bad one returns from all of them before any barrier.
  long long off = 0;
  if constexpr (MASK == MN_ATTN_MASK_CACHE) {
    const unsigned int kv_len = *mn_arg<const unsigned int>(io, MN_ATTN_POSITIONS_ARG);
    if ((long long)kv_len < T || (long long)kv_len > S) {
      if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0)
        mn_report(mn_arg<mn_dev_error>(io, 4), MN_DEV_ERR_KV_LEN,
                  mn_arg_value(io, MN_ATTN_POSITIONS_ARG + 1), kv_len, 0, S);
      return;
    }
    off = (long long)kv_len - T;
  }

  // Cache rows from kv_len on are never read (they may hold anything, NaN included: a zero
  // probability times NaN would still be NaN), so they load as zeros.
  const long long kv_end = off + T;
  const long long kend = MASK == MN_ATTN_MASK_CACHE
                             ? (q0 + BR + off < kv_end ? q0 + BR + off : kv_end)
                             : mn_attn_kend<BR, S, MASK>(q0);
  for (long long c0 = mn_attn_kstart<BR, BC, T, MASK>(io, qt.b, q0); c0 < kend; c0 += BC) {
    __syncthreads(); // the previous tile's readers are done with ks, vs
    if constexpr (MASK == MN_ATTN_MASK_CACHE) {
      mn_attn_load<HD, HDP, BC, LDA>(ks, qt.kb, (long long)KVH * HD, c0, kv_end);
      mn_attn_load<HD, HDP, BC, LDA>(vs, qt.vb, (long long)KVH * HD, c0, kv_end);
    } else {
      mn_attn_load_kv<HD, HDP, BC, LDA, S, KVH, MODE != MN_ATTN_STATS>(ks, vs, qt.kb, qt.vb, c0);
    }
    __syncthreads();
    float s[RM][CN], dp[MODE == MN_ATTN_STATS_DELTA ? RM : 1][CN];
    mn_attn_dot<RM, CN, HDQ, LDA, LDA>(s, qs + rbase * LDA, ks + cg * LDA);
    if constexpr (MODE == MN_ATTN_STATS_DELTA)
      mn_attn_dot<RM, CN, HDQ, LDA, LDA>(dp, ps + rbase * LDA, vs + cg * LDA);
#pragma unroll
    for (int i = 0; i < RM; i++) {
      const long long r = q0 + rbase + i;
      float mx = mn_attn_neg_inf();
#pragma unroll
      for (int j = 0; j < CN; j++) {
        const long long c = c0 + cg + 8 * j;
        const bool ok = c < S && (MASK == MN_ATTN_MASK_NONE || (c <= r + off && c >= lo[i]));
        s[i][j] = ok ? s[i][j] * scale : mn_attn_neg_inf();
        mx = fmaxf(mx, s[i][j]);
      }
      // Key 0 is in the first tile and visible to every row, so m_new is finite, except for a
      // packed row whose segment starts in a later tile: it subtracts 0 until then (its l and
      // acc stay 0), so that -inf - -inf makes no NaN.
      const float m_new = fmaxf(m[i], mn_attn_row_max(mx));
      const float m_sub =
          MASK == MN_ATTN_MASK_SEGMENTS && m_new == mn_attn_neg_inf() ? 0.0f : m_new;
      const float alpha = expf(m[i] - m_sub);
      float sum = 0.0f, dpart = 0.0f;
#pragma unroll
      for (int j = 0; j < CN; j++) {
        s[i][j] = expf(s[i][j] - m_sub);
        sum += s[i][j];
        if constexpr (OUT) ps[(rbase + i) * LDP + cg + 8 * j] = s[i][j];
        if constexpr (MODE == MN_ATTN_STATS_DELTA) dpart = fmaf(s[i][j], dp[i][j], dpart);
      }
      l[i] = l[i] * alpha + mn_attn_row_sum(sum);
      m[i] = m_new;
      if constexpr (MODE == MN_ATTN_STATS_DELTA) dsum[i] = dsum[i] * alpha + mn_attn_row_sum(dpart);
      if constexpr (OUT) {
#pragma unroll
        for (int u = 0; u < DN4; u++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            acc[i][u][e] *= alpha;
      }
    }
    if constexpr (OUT) {
      __syncwarp(); // a warp reads back only the probability rows it wrote
      mn_attn_acc<RM, DN4, BC, LDP, LDA>(acc, ps + rbase * LDP, vs + cg * 4);
    }
  }

  if constexpr (OUT) {
    const auto ob = mn_out<3>(io) + qt.qoff;
#pragma unroll
    for (int i = 0; i < RM; i++) {
      const long long r = q0 + rbase + i;
      if (r < T) mn_attn_store_row<HD, DN4>(ob + r * H * HD, acc[i], 1.0f / l[i], cg);
    }
  }
  if constexpr (MODE != MN_ATTN_OUTPUT) {
    const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
#pragma unroll
    for (int i = 0; i < RM; i++) {
      const long long r = q0 + rbase + i;
      if (cg == 0 && r < T)
        mn_attn_store_stats<MODE == MN_ATTN_STATS_DELTA>(io, sb + r, m[i], l[i], dsum[i]);
    }
  }
}

// dQ over one (query tile, head, batch) block, grid (ceil(T / BR), H, B); io = q, k, v, dy,
// m, inv_l, delta (from the MN_ATTN_STATS_DELTA pre-pass), dq. dS = P (dy . v - delta) and
// dq = scale * sum_s dS k_s.
template <int HD, int HDP, int RM, int BC, long long T, long long S, int H, int KVH, int MASK,
          class IO>
__device__ void mn_attn_bwd_dq(const IO &io) {
  constexpr int BR = 16 * RM, LDA = HDP + 4, LDP = BC + 4, CN = BC / 8, DN4 = HDP / 32;
  constexpr int HDQ = (HD + 3) / 4 * 4;
  extern __shared__ __align__(16) float mn_attn_smem[];
  float *qs = mn_attn_smem;   // [BR][LDA]
  float *dys = qs + BR * LDA; // [BR][LDA]
  float *ks = dys + BR * LDA; // [BC][LDA]
  float *vs = ks + BC * LDA;  // [BC][LDA]
  float *ps = vs + BC * LDA;  // [BR][LDP]

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK>(io);
  const long long q0 = qt.q0;
  const int lane = threadIdx.x & 31, cg = lane & 7;
  const int rbase = (threadIdx.x >> 5) * 4 * RM + (lane >> 3) * RM;
  const float scale = 1.0f / sqrtf((float)HD);

  mn_attn_load_q<HD, HDP, BR, LDA, T, H, true>(qs, dys, io, qt.qoff, q0);
  float acc[RM][DN4][4], rm[RM], ril[RM], rdelta[RM];
  long long lo[RM];
  const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
#pragma unroll
  for (int i = 0; i < RM; i++) {
    mn_attn_load_stats<T, true>(io, sb, q0 + rbase + i, rm[i], ril[i], rdelta[i]);
    lo[i] = mn_attn_seg_lo<T, MASK>(io, qt.b, q0 + rbase + i);
    mn_attn_fill(acc[i], 0.0f);
  }

  const long long kend = mn_attn_kend<BR, S, MASK>(q0);
  for (long long c0 = mn_attn_kstart<BR, BC, T, MASK>(io, qt.b, q0); c0 < kend; c0 += BC) {
    __syncthreads();
    mn_attn_load_kv<HD, HDP, BC, LDA, S, KVH, true>(ks, vs, qt.kb, qt.vb, c0);
    __syncthreads();
    float s[RM][CN], dp[RM][CN];
    mn_attn_dot<RM, CN, HDQ, LDA, LDA>(s, qs + rbase * LDA, ks + cg * LDA);
    mn_attn_dot<RM, CN, HDQ, LDA, LDA>(dp, dys + rbase * LDA, vs + cg * LDA);
#pragma unroll
    for (int i = 0; i < RM; i++) {
      const long long r = q0 + rbase + i;
#pragma unroll
      for (int j = 0; j < CN; j++) {
        const bool ok = mn_attn_visible<T, S, MASK>(r, c0 + cg + 8 * j, lo[i]);
        const float p = ok ? expf(s[i][j] * scale - rm[i]) * ril[i] : 0.0f;
        ps[(rbase + i) * LDP + cg + 8 * j] = p * (dp[i][j] - rdelta[i]);
      }
    }
    __syncwarp();
    mn_attn_acc<RM, DN4, BC, LDP, LDA>(acc, ps + rbase * LDP, ks + cg * 4);
  }

  const auto dqb = mn_out<7>(io) + qt.qoff;
#pragma unroll
  for (int i = 0; i < RM; i++) {
    const long long r = q0 + rbase + i;
    if (r < T) mn_attn_store_row<HD, DN4>(dqb + r * H * HD, acc[i], scale, cg);
  }
}

// dK (GRAD_K) or dV over one (key tile, kv head, batch) block, grid (ceil(S / BR), KVH, B);
// io = q, k, v, dy, m, inv_l, delta, out (and the positions, packed); output rows are OS floats
// apart (KVH * HD, or twice that when dK and dV share rows). The block loops over the query heads
// of its kv head's group and over query tiles, so each gradient element is summed by one thread in
// a fixed order (no atomics): dv_s = sum P_s dy, dk_s = scale * sum dS_s q.
template <int HD, int HDP, int RM, int BC, long long T, long long S, int H, int KVH, int MASK,
          bool GRAD_K, long long OS, class IO>
__device__ void mn_attn_bwd_dkv(const IO &io) {
  constexpr int BR = 16 * RM, LDA = HDP + 4, LDP = BC + 4, CN = BC / 8, DN4 = HDP / 32;
  constexpr int HDQ = (HD + 3) / 4 * 4, G = H / KVH;
  extern __shared__ __align__(16) float mn_attn_smem[];
  float *ks = mn_attn_smem;                       // [BR][LDA]
  float *vs = ks + BR * LDA;                      // [BR][LDA], GRAD_K only
  float *qs = vs + (GRAD_K ? BR * LDA : 0);       // [BC][LDA]
  float *dys = qs + BC * LDA;                     // [BC][LDA]
  float *ps = dys + BC * LDA;                     // [BR][LDP]
  float *st = ps + BR * LDP;                      // m, inv_l, delta: [3][BC]
  int *lo = reinterpret_cast<int *>(st + 3 * BC); // packed: each query's first key, [BC]

  const mn_attn_kvtile kt = mn_attn_kvtile_of<BR, HD, S, KVH>();
  const long long c0 = kt.c0;
  const int lane = threadIdx.x & 31, cg = lane & 7;
  const int rbase = (threadIdx.x >> 5) * 4 * RM + (lane >> 3) * RM;
  const float scale = 1.0f / sqrtf((float)HD);

  mn_attn_load_kv<HD, HDP, BR, LDA, S, KVH, GRAD_K>(ks, vs, mn_in<1>(io) + kt.kvoff,
                                                    mn_in<2>(io) + kt.kvoff, c0);
  float acc[RM][DN4][4];
  mn_attn_fill(acc, 0.0f);

  mn_attn_for_q_tiles<HD, HDP, BR, BC, LDA, T, S, H, G, MASK, GRAD_K>(
      kt, qs, dys, st, lo, io, [&](long long r0) {
        float s[RM][CN];
        mn_attn_dot<RM, CN, HDQ, LDA, LDA>(s, ks + rbase * LDA, qs + cg * LDA);
        if constexpr (GRAD_K) {
          float dp[RM][CN];
          mn_attn_dot<RM, CN, HDQ, LDA, LDA>(dp, vs + rbase * LDA, dys + cg * LDA);
#pragma unroll
          for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < CN; j++)
              s[i][j] = (dp[i][j] - st[2 * BC + cg + 8 * j]) *
                        (expf(s[i][j] * scale - st[cg + 8 * j]) * st[BC + cg + 8 * j]);
        } else {
#pragma unroll
          for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < CN; j++)
              s[i][j] = expf(s[i][j] * scale - st[cg + 8 * j]) * st[BC + cg + 8 * j];
        }
#pragma unroll
        for (int i = 0; i < RM; i++) {
          const long long c = c0 + rbase + i;
#pragma unroll
          for (int j = 0; j < CN; j++) {
            const bool ok = mn_attn_visible<T, S, MASK>(
                r0 + cg + 8 * j, c, MASK == MN_ATTN_MASK_SEGMENTS ? lo[cg + 8 * j] : 0);
            ps[(rbase + i) * LDP + cg + 8 * j] = ok ? s[i][j] : 0.0f;
          }
        }
        __syncwarp();
        mn_attn_acc<RM, DN4, BC, LDP, LDA>(acc, ps + rbase * LDP, (GRAD_K ? qs : dys) + cg * 4);
      });

  const auto ob = mn_out<7>(io) + kt.b * S * OS + kt.kvh * HD;
#pragma unroll
  for (int i = 0; i < RM; i++) {
    const long long c = c0 + rbase + i;
    if (c < S) mn_attn_store_row<HD, DN4>(ob + c * OS, acc[i], GRAD_K ? scale : 1.0f, cg);
  }
}
