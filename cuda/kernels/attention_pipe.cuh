// Pipelined 16-bit attention: the forward, dQ and dK / dV kernels of attention_mma.cuh for
// unmasked and causal attention with q, k and v tiles of 16-bit values (LP: MN_DEV_BF16 or
// MN_DEV_F16), restructured the way FlashAttention-2 is on Ampere and Hopper:
//
// - The streamed tiles are double-buffered: cp.async copies tile j + 1 into shared memory while
//   the warps multiply tile j, so the loads of a block overlap its own work instead of relying
//   on other blocks of the SM to hide them (the mma kernels hold 160-230 registers a thread, so
//   an SM runs only 8-12 of their warps).
// - The operand rows that a block keeps (its queries and dY for the forward and dQ, its keys and
//   values for dK / dV) are read into mma fragments once, with ldmatrix; the streamed tiles are
//   read with ldmatrix too (plain for the B operand of products with a transposed tile, .trans
//   for the others), four 8 x 8 matrices an instruction instead of one 32-bit word.
// - Only tiles that cross the causal diagonal or the end of the sequence are masked; a warp
//   whose 16 rows see nothing of a tile skips its products (the tile loops of a block already
//   stop at the diagonal).
// - Positions in a head are ints (the lowering takes this path only for T and S below 2^31).
//
// Everything else is as in attention_mma.cuh: the fragment layouts and the k = 2t pairing of C
// and A fragments, P and dS rounded to LP for their products, statistics and sums in fp32 and in
// base 2, the same launch grids and statistics layout, so these kernels and the mma ones can be
// mixed (a pre-pass of attention_mma.cuh feeds the dQ and dK / dV here). Scores are computed by
// the same m16n8k16 products from the same values in the forward and in both backward kernels,
// so they agree bit for bit; P = exp2(s * scale2 - m) is one fused multiply-add before exp2 in
// all three. WARPS warps of 16 rows each own a block of 16 * WARPS rows (the forward's warps RW
// blocks of 16 rows each); tiles stream 64 rows.

// Row strides of q and of k and v. QKV: the three are column blocks q | k | v of one tensor's
// rows, (H + 2 KVH) * HD values wide (optimizer/attention_qkv.c), each argument pointing at its
// block's first column; dQ and dK | dV go to the same blocks of the gradient. Otherwise each is
// a tensor of its own heads.
template <int QKV, int HD, int H, int KVH> __device__ constexpr long long mn_attn_q_stride() {
  return QKV ? (long long)(H + 2 * KVH) * HD : (long long)H * HD;
}
template <int QKV, int HD, int H, int KVH> __device__ constexpr long long mn_attn_kv_stride() {
  return QKV ? (long long)(H + 2 * KVH) * HD : (long long)KVH * HD;
}

// Four 8 x 8 matrices of 16-bit values (ldmatrix, not transposed): lanes 8i .. 8i + 7 give the
// addresses of rows 0 .. 7 of matrix i, and r[i] gets (row g, columns 2t, 2t + 1).
__device__ __forceinline__ void mn_ldsm_x4(unsigned (&r)[4], const unsigned short *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// Rows first .. first + ROWS - 1 of one head (src: row 0 at the head's first column, rows
// `stride` elements apart; `first` a multiple of ROWS) into dst[r * LD + d] by NTH threads, rows
// at or past COUNT as zeros. When src stores LP the copy is asynchronous (cp.async: the caller
// commits and waits); other storage is read and rounded to LP at once.
template <int LP, int HD, int ROWS, int NTH, long long COUNT, class P>
__device__ __forceinline__ void mn_pipe_load(unsigned short *dst, P src, long long stride,
                                             long long first) {
  constexpr int LD = HD + 8, C8 = HD / 8, N = ROWS * C8;
  if constexpr (mn_attn_lp_same<LP, P>::value && NTH % C8 == 0 && N % NTH == 0) {
    // A thread keeps its column and steps NTH / C8 rows: one 64-bit address a call, the steps
    // as constant offsets from it. A tile that cannot reach past COUNT checks nothing.
    constexpr int STEP = NTH / C8;
    constexpr bool FULL = COUNT % ROWS == 0;
    const int r = (int)threadIdx.x / C8, c = ((int)threadIdx.x - r * C8) * 8;
    const auto base = src + (first + r) * stride + c;
#pragma unroll
    for (int k = 0; k < N / NTH; k++) {
      const bool ok = FULL || first + r + k * STEP < COUNT;
      mn_cp_async16(dst + (r + k * STEP) * LD + c, (ok ? base + k * STEP * stride : src).p, ok);
    }
  } else {
    for (int i = threadIdx.x; i < N; i += NTH) {
      const int r = i / C8, c = (i - r * C8) * 8;
      const long long row = first + r;
      const bool ok = row < COUNT;
      if constexpr (mn_attn_lp_same<LP, P>::value) {
        mn_cp_async16(dst + r * LD + c, (src + (ok ? row : 0) * stride + c).p, ok);
      } else {
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (ok) {
          const auto p = src + row * stride + c;
          const float4 lo = mn_ld4(p, 0), hi = mn_ld4(p, 1);
          w = make_uint4(mn_lp_round2<LP>(lo.x, lo.y), mn_lp_round2<LP>(lo.z, lo.w),
                         mn_lp_round2<LP>(hi.x, hi.y), mn_lp_round2<LP>(hi.z, hi.w));
        }
        *reinterpret_cast<uint4 *>(dst + r * LD + c) = w;
      }
    }
  }
}

// The A fragments of the warp's 16 rows of a shared tile (rows `rows`, stride LD) for every
// 16-dim step: a0 rows 0-7 / dims 0-7, a1 rows 8-15 / dims 0-7, a2 rows 0-7 / dims 8-15, a3
// rows 8-15 / dims 8-15 (matrix i = lane / 8 at row 8 (i & 1), dim 8 (i >> 1)).
template <int HD, int LD>
__device__ __forceinline__ void mn_pipe_frag_a(unsigned (&f)[HD / 16][4],
                                               const unsigned short *rows, int lane) {
  const unsigned short *p = rows + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
#pragma unroll
  for (int k = 0; k < HD / 16; k++)
    mn_ldsm_x4(f[k], p + 16 * k);
}

// acc[r] (16 x 64: 8 C tiles) = row block r of the warp (A fragments fa[r]) times the 64 rows
// of `b` transposed: B(k, n) = b[n * LD + k], each B fragment read once for the RW row blocks.
// For keys n0 .. n0 + 15 and dims k0 .. k0 + 15, matrix i = lane / 8 is at key 8 (i >> 1), dim
// 8 (i & 1): b0, b1 of tile n0 / 8, then of n0 / 8 + 1.
template <int LP, int HD, int LD, int RW>
__device__ __forceinline__ void mn_pipe_abt_rows(float (&acc)[RW][8][4],
                                                 const unsigned (&fa)[RW][HD / 16][4],
                                                 const unsigned short *b, int lane) {
  mn_attn_fill(acc, 0.0f);
  const unsigned short *p = b + ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int k = 0; k < HD / 16; k++)
#pragma unroll
    for (int n = 0; n < 8; n += 2) {
      unsigned fb[4];
      mn_ldsm_x4(fb, p + n * 8 * LD + 16 * k);
#pragma unroll
      for (int r = 0; r < RW; r++) {
        mn_mma_lp<LP>(acc[r][n], fa[r][k], fb[0], fb[1]);
        mn_mma_lp<LP>(acc[r][n + 1], fa[r][k], fb[2], fb[3]);
      }
    }
}

// One row block of mn_pipe_abt_rows.
template <int LP, int HD, int LD>
__device__ __forceinline__ void mn_pipe_abt(float (&acc)[8][4], const unsigned (&fa)[HD / 16][4],
                                            const unsigned short *b, int lane) {
  mn_pipe_abt_rows<LP, HD, LD, 1>(reinterpret_cast<float(&)[1][8][4]>(acc),
                                  reinterpret_cast<const unsigned(&)[1][HD / 16][4]>(fa), b, lane);
}

// acc[r] (16 x HD) += p[r] (16 x 64, C tiles rounded to LP) times the 64 x HD rows of `b`,
// B(k, n) = b[k * LD + n] read once for the RW row blocks with ldmatrix .trans, as in
// mn_lp_mma_pb.
template <int LP, int HD, int LD, int RW>
__device__ __forceinline__ void mn_pipe_pb_rows(float (&acc)[RW][HD / 8][4],
                                                const float (&p)[RW][8][4], const unsigned short *b,
                                                int lane) {
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mcol = 8 * (lane >> 4);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    unsigned fa[RW][4];
#pragma unroll
    for (int r = 0; r < RW; r++) {
      fa[r][0] = mn_lp_round2<LP>(p[r][2 * j][0], p[r][2 * j][1]);
      fa[r][1] = mn_lp_round2<LP>(p[r][2 * j][2], p[r][2 * j][3]);
      fa[r][2] = mn_lp_round2<LP>(p[r][2 * j + 1][0], p[r][2 * j + 1][1]);
      fa[r][3] = mn_lp_round2<LP>(p[r][2 * j + 1][2], p[r][2 * j + 1][3]);
    }
    const unsigned short *row = b + (16 * j + mrow) * LD + mcol;
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      unsigned fb[4];
      mn_ldsm_x4_trans(fb, row + n * 8);
#pragma unroll
      for (int r = 0; r < RW; r++) {
        mn_mma_lp<LP>(acc[r][n], fa[r], fb[0], fb[1]);
        mn_mma_lp<LP>(acc[r][n + 1], fa[r], fb[2], fb[3]);
      }
    }
  }
}

template <int MASK> __device__ __forceinline__ bool mn_pipe_sees(int r, int c, int s_len) {
  return c < s_len && (MASK == MN_ATTN_MASK_NONE || c <= r);
}

// Sets to `value` (-inf for scores, 0 for probabilities) the elements of a warp's 16 x 64 C tiles
// x whose row r0 + g (+ 8) and column c0 + 8n + 2t (+ 1) fail sees(row, column). Called only for
// the tiles that cross the diagonal or an end, so the comparisons are not paid on the others (an
// element's value was computed without the mask: the overwrite also drops what an unseen score
// made of it, infinities included).
template <class F>
__device__ __forceinline__ void mn_pipe_set_unseen(float (&x)[8][4], int r0, int c0, int lane,
                                                   F sees, float value) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      if (!sees(r0 + g + 8 * (e >> 1), c0 + n * 8 + 2 * t + (e & 1))) x[n][e] = value;
}

// One key tile of the online softmax over a warp's 16 rows (g and g + 8 of each C tile): s, the
// tile's scores, becomes P = exp2(s * scale2 - m) with m, the rows' running maximum in base 2,
// moved to include the tile; l, the rows' sums of P (each lane its own columns), and acc, the
// output accumulator, are rescaled to the new maximum and l takes the tile's P.
template <int N>
__device__ __forceinline__ void mn_pipe_softmax_tile(float (&s)[8][4], float (&acc)[N][4],
                                                     float (&m)[2], float (&l)[2], float scale2) {
  float mx[2] = {mn_attn_neg_inf(), mn_attn_neg_inf()};
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
  float m_sub[2], alpha[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const float m_new = fmaxf(m[i], mn_quad_max(mx[i]) * scale2);
    // A row that has seen no key yet subtracts 0, so that -inf - -inf makes no NaN.
    m_sub[i] = m_new == mn_attn_neg_inf() ? 0.0f : m_new;
    alpha[i] = mn_ex2(m[i] - m_sub[i]);
    m[i] = m_new;
    l[i] *= alpha[i];
  }
#pragma unroll
  for (int n = 0; n < 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s[n][e] = mn_ex2(fmaf(s[n][e], scale2, -m_sub[e >> 1]));
      l[e >> 1] += s[n][e];
    }
#pragma unroll
  for (int n = 0; n < N; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      acc[n][e] *= alpha[e >> 1];
}

// The statistics of query rows r0 .. r0 + BC - 1 of one head (sb: mn_attn_head) into st[NST][BC]:
// m, inv_l and, when NST is 3, delta; zeros past T. cp.async: the caller commits and waits.
template <long long T, int BC, int NTH, int NST, class IO>
__device__ __forceinline__ void mn_pipe_load_stats(float *st, const IO &io, long long sb, int r0) {
  const float *sm = mn_in<4>(io), *sil = mn_in<5>(io), *sdelta = mn_in<6>(io);
  if constexpr (T % 4 == 0) {
    // Rows of statistics start 16-byte aligned: 16 bytes a copy, the part past T zeros.
    static_assert(NST * BC / 4 <= NTH, "one copy a thread");
    const int x = threadIdx.x;
    if (x < NST * BC / 4) {
      const int which = x / (BC / 4), j = (x - which * (BC / 4)) * 4;
      const int bytes = T % BC == 0 ? 16 : 4 * max(0, min(4, (int)T - (r0 + j)));
      const long long at = sb + (bytes ? r0 + j : 0);
      const float *stat = which == 0 ? sm : which == 1 ? sil : sdelta;
      mn_cp_async16_part(st + which * BC + j, stat + at, bytes);
    }
  } else {
    for (int x = threadIdx.x; x < NST * BC; x += NTH) {
      const int which = x / BC, j = x - which * BC;
      const bool ok = r0 + j < T;
      const long long at = sb + (ok ? r0 + j : 0);
      mn_cp_async4(st + x, (which == 0 ? sm : which == 1 ? sil : sdelta) + at, ok);
    }
  }
}

// The query tiles a dK / dV block over keys c0 .. visits, in order: for each query head of its kv
// head, the tiles of BC rows from `first` (causal: the tile holding query c0, else 0). A walk
// gives them one at a time (the copies and the products each keep one, a stage apart).
template <long long T, int BC, int MASK, int G> struct mn_attn_qtile_walk {
  int first, per_head, count;
  int h = 0, t = 0; // the tile next() gives: head h of the group, its tile t
  __device__ explicit mn_attn_qtile_walk(int c0)
      : first(MASK == MN_ATTN_MASK_CAUSAL ? c0 / BC * BC : 0),
        per_head(((int)T - first + BC - 1) / BC), count(G * per_head) {}
  // The tile's head within the group, and its first row.
  __device__ void next(int &head, int &r0) {
    head = h;
    r0 = first + t * BC;
    if (++t == per_head) t = 0, h++;
  }
};

// The wgmma kernels of attention_wgmma.cuh and attention_wgmma_bwd.cuh, which take a launch's
// blocks where it fits (defined there; the dispatch is at the end of this file).
template <int LP, int HD, int WARPS, class... PS> __device__ constexpr bool mn_attn_wg_fits();
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, int WARPS,
          int RW, int QKV, class IO>
__device__ void mn_attn_wg_fwd(const IO &io);
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int WARPS, int QKV,
          class IO>
__device__ void mn_attn_wg_dq(const IO &io);
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          int WARPS, int QKV, class IO>
__device__ void mn_attn_wg_dkv(const IO &io);

// Forward over one (query block, head, batch): grid (ceil(T / BR), H, B), 32 * WARPS threads,
// each warp RW blocks of 16 rows (BR = 16 * RW * WARPS), which share every K and V fragment it
// reads. MODE MN_ATTN_OUTPUT (io = q, k, v, out) or MN_ATTN_OUTPUT_STATS (also m and inv_l, as
// the mma forward writes them). MASK: MN_ATTN_MASK_NONE or MN_ATTN_MASK_CAUSAL.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, int WARPS,
          int RW, int QKV, class IO>
__device__ void mn_attn_pipe_fwd_mma(const IO &io) {
  constexpr int BR = 16 * RW * WARPS, BC = 64, LD = HD + 8, NTH = 32 * WARPS, KD = HD / 16;
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  static_assert(MASK == MN_ATTN_MASK_NONE || MASK == MN_ATTN_MASK_CAUSAL, "no segments here");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned short *qs = reinterpret_cast<unsigned short *>(mn_attn_smem); // [BR][LD]
  unsigned short *kv = qs + BR * LD; // per stage: K [BC][LD], then V [BC][LD]

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK, QS, KS>(io);
  const int q0 = (int)qt.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rw = q0 + 16 * RW * warp; // the warp's first row
  const float scale2 = mn_attn_log2e / sqrtf((float)HD);
  const int kend = (int)mn_attn_kend<BR, S, MASK>(qt.q0);
  const int tiles = (kend + BC - 1) / BC;
  auto load_kv = [&](int j) {
    unsigned short *ks = kv + (j & 1) * 2 * BC * LD;
    mn_pipe_load<LP, HD, BC, NTH, S>(ks, qt.kb, KS, (long long)j * BC);
    mn_pipe_load<LP, HD, BC, NTH, S>(ks + BC * LD, qt.vb, KS, (long long)j * BC);
  };

  mn_pipe_load<LP, HD, BR, NTH, T>(qs, mn_in<0>(io) + qt.qoff, QS, qt.q0);
  mn_cp_commit();
  load_kv(0);
  mn_cp_commit();
  mn_cp_wait<1>();
  __syncthreads();
  unsigned qf[RW][KD][4];
#pragma unroll
  for (int r = 0; r < RW; r++)
    mn_pipe_frag_a<HD, LD>(qf[r], qs + (rw - q0 + 16 * r) * LD, lane);

  float acc[RW][HD / 8][4], m[RW][2], l[RW][2];
  mn_attn_fill(acc, 0.0f);
  mn_attn_fill(m, mn_attn_neg_inf());
  mn_attn_fill(l, 0.0f);
  for (int j = 0; j < tiles; j++) {
    if (j + 1 < tiles) load_kv(j + 1);
    mn_cp_commit();
    mn_cp_wait<1>();
    __syncthreads();
    const int c0 = j * BC;
    if (MASK == MN_ATTN_MASK_NONE || c0 <= rw + 16 * RW - 1) {
      const unsigned short *ks = kv + (j & 1) * 2 * BC * LD;
      float s[RW][8][4];
      mn_pipe_abt_rows<LP, HD, LD, RW>(s, qf, ks, lane);
      if (c0 + BC > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && c0 + BC - 1 > rw)) {
#pragma unroll
        for (int r = 0; r < RW; r++)
          mn_pipe_set_unseen(
              s[r], rw + 16 * r, c0, lane,
              [](int q, int c) { return mn_pipe_sees<MASK>(q, c, (int)S); }, mn_attn_neg_inf());
      }
#pragma unroll
      for (int r = 0; r < RW; r++)
        mn_pipe_softmax_tile(s[r], acc[r], m[r], l[r], scale2);
      mn_pipe_pb_rows<LP, HD, LD, RW>(acc, s, ks + BC * LD, lane);
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < RW; r++) {
    // Each lane summed its own columns of the rows: the row sums are over the 4 lanes of a quad.
    const float l0 = mn_quad_sum(l[r][0]), l1 = mn_quad_sum(l[r][1]);
    const int row = rw + 16 * r;
    mn_mma_store<HD>(mn_out<3>(io) + qt.yoff, (long long)H * HD, row, T, acc[r], 1.0f / l0,
                     1.0f / l1, g, t);
    if constexpr (MODE == MN_ATTN_OUTPUT_STATS) {
      if (t == 0) {
        const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
        if (row + g < T) mn_attn_store_stats<false>(io, sb + row + g, m[r][0], l0, 0.0f);
        if (row + g + 8 < T) mn_attn_store_stats<false>(io, sb + row + g + 8, m[r][1], l1, 0.0f);
      }
    }
  }
}

// dQ over one (query block, head, batch): grid (ceil(T / BR), H, B), 32 * WARPS threads; io = q,
// k, v, dy, m, inv_l, delta, dq. dS = P (dy . v - delta), dq = scale * sum dS k.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int WARPS, int QKV,
          class IO>
__device__ void mn_attn_pipe_dq_mma(const IO &io) {
  constexpr int BR = 16 * WARPS, BC = 64, LD = HD + 8, NTH = 32 * WARPS, KD = HD / 16;
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  static_assert(MASK == MN_ATTN_MASK_NONE || MASK == MN_ATTN_MASK_CAUSAL, "no segments here");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned short *qs = reinterpret_cast<unsigned short *>(mn_attn_smem); // [BR][LD]
  unsigned short *dys = qs + BR * LD;                                    // [BR][LD]
  unsigned short *kv = dys + BR * LD; // per stage: K [BC][LD], then V [BC][LD]

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK, QS, KS>(io);
  const int q0 = (int)qt.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rw = q0 + 16 * warp;
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;
  const int kend = (int)mn_attn_kend<BR, S, MASK>(qt.q0);
  const int tiles = (kend + BC - 1) / BC;
  auto load_kv = [&](int j) {
    unsigned short *ks = kv + (j & 1) * 2 * BC * LD;
    mn_pipe_load<LP, HD, BC, NTH, S>(ks, qt.kb, KS, (long long)j * BC);
    mn_pipe_load<LP, HD, BC, NTH, S>(ks + BC * LD, qt.vb, KS, (long long)j * BC);
  };

  mn_pipe_load<LP, HD, BR, NTH, T>(qs, mn_in<0>(io) + qt.qoff, QS, qt.q0);
  mn_pipe_load<LP, HD, BR, NTH, T>(dys, mn_in<3>(io) + qt.yoff, (long long)H * HD, qt.q0);
  mn_cp_commit();
  load_kv(0);
  mn_cp_commit();
  const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
  float rm[2], ril[2], rdelta[2], acc[HD / 8][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
    mn_attn_load_stats<T, true>(io, sb, rw + g + 8 * i, rm[i], ril[i], rdelta[i]);
  mn_attn_fill(acc, 0.0f);
  mn_cp_wait<1>();
  __syncthreads();
  unsigned qf[KD][4], dyf[KD][4];
  mn_pipe_frag_a<HD, LD>(qf, qs + 16 * warp * LD, lane);
  mn_pipe_frag_a<HD, LD>(dyf, dys + 16 * warp * LD, lane);

  for (int j = 0; j < tiles; j++) {
    if (j + 1 < tiles) load_kv(j + 1);
    mn_cp_commit();
    mn_cp_wait<1>();
    __syncthreads();
    const int c0 = j * BC;
    if (MASK == MN_ATTN_MASK_NONE || c0 <= rw + 15) {
      const unsigned short *ks = kv + (j & 1) * 2 * BC * LD;
      float s[8][4], dp[8][4];
      mn_pipe_abt<LP, HD, LD>(s, qf, ks, lane);
      mn_pipe_abt<LP, HD, LD>(dp, dyf, ks + BC * LD, lane);
      const bool masked = c0 + BC > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && c0 + BC - 1 > rw);
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          s[n][e] = mn_ex2(fmaf(s[n][e], scale2, -rm[e >> 1])) * ril[e >> 1];
      if (masked)
        mn_pipe_set_unseen(
            s, rw, c0, lane, [](int r, int c) { return mn_pipe_sees<MASK>(r, c, (int)S); }, 0.0f);
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          s[n][e] *= dp[n][e] - rdelta[e >> 1];
      mn_lp_mma_pb<LP, HD, LD, 8>(acc, s, ks, lane);
    }
    __syncthreads();
  }
  // dQ has q's layout: in a QKV launch, the q block of the gradient's wider rows.
  mn_mma_store<HD>(mn_out<7>(io) + qt.qoff, QS, rw, T, acc, scale, scale, g, t);
}

// dV (OUT MN_ATTN_DV), dK (MN_ATTN_DK) or both (MN_ATTN_DK_DV) over one (key block, kv head,
// batch): grid (ceil(S / BR), KVH, B), 32 * WARPS threads; io = q, k, v, dy, m, inv_l, delta,
// out. PACKED output rows hold the key's dK then its dV. The block streams the query tiles of
// each of its kv head's query heads (causal: from the tile holding query c0) through two stages
// of q, dy and their statistics, so every element is summed by one thread in a fixed order.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          int WARPS, int QKV, class IO>
__device__ void mn_attn_pipe_dkv_mma(const IO &io) {
  constexpr int BR = 16 * WARPS, BC = 64, LD = HD + 8, NTH = 32 * WARPS, KD = HD / 16, G = H / KVH;
  constexpr bool WANT_K = OUT != MN_ATTN_DV, WANT_V = OUT != MN_ATTN_DK;
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  // Output row stride: a QKV launch writes dK | dV into the k and v blocks of the wider rows.
  constexpr long long OS = QKV ? QS : (PACKED ? 2 : 1) * KVH * HD;
  static_assert(!QKV || PACKED, "a QKV launch writes dK and dV side by side");
  // A stage: q [BC][LD], dy [BC][LD] (16-bit), then m, inv_l, delta [3][BC] (floats).
  constexpr int STAGE = 2 * BC * LD + 3 * BC * 2;
  static_assert(MASK == MN_ATTN_MASK_NONE || MASK == MN_ATTN_MASK_CAUSAL, "no segments here");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned short *ks = reinterpret_cast<unsigned short *>(mn_attn_smem); // [BR][LD]
  unsigned short *vs = ks + BR * LD;                                     // [BR][LD]
  unsigned short *stages = vs + BR * LD;

  const mn_attn_kvtile kt = mn_attn_kvtile_of<BR, HD, S, KVH>();
  const int c0 = (int)kt.c0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int cw = c0 + 16 * warp; // the warp's first key
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;
  mn_attn_qtile_walk<T, BC, MASK, G> loads(c0), uses(c0);
  const int tiles = loads.count;
  auto load_q = [&](int stage) {
    unsigned short *qs = stages + stage * STAGE;
    int hg, r0;
    loads.next(hg, r0);
    const int h = kt.kvh * G + hg;
    const mn_attn_head qh = mn_attn_head_of<HD, T, H>(kt.b, h);
    mn_pipe_load<LP, HD, BC, NTH, T>(qs, mn_in<0>(io) + (kt.b * T * QS + h * HD), QS, r0);
    mn_pipe_load<LP, HD, BC, NTH, T>(qs + BC * LD, mn_in<3>(io) + qh.qoff, (long long)H * HD, r0);
    mn_pipe_load_stats<T, BC, NTH, WANT_K ? 3 : 2>(reinterpret_cast<float *>(qs + 2 * BC * LD), io,
                                                   qh.sb, r0);
  };

  const long long kvoff = kt.b * S * KS + kt.kvh * HD;
  mn_pipe_load<LP, HD, BR, NTH, S>(ks, mn_in<1>(io) + kvoff, KS, kt.c0);
  mn_pipe_load<LP, HD, BR, NTH, S>(vs, mn_in<2>(io) + kvoff, KS, kt.c0);
  mn_cp_commit();
  if (tiles > 0) load_q(0);
  mn_cp_commit();
  mn_cp_wait<1>();
  __syncthreads();
  unsigned kf[KD][4], vf[KD][4];
  mn_pipe_frag_a<HD, LD>(kf, ks + 16 * warp * LD, lane);
  if constexpr (WANT_K) mn_pipe_frag_a<HD, LD>(vf, vs + 16 * warp * LD, lane);
  float dk[WANT_K ? HD / 8 : 1][4], dv[WANT_V ? HD / 8 : 1][4];
  mn_attn_fill(dk, 0.0f);
  mn_attn_fill(dv, 0.0f);

  for (int i = 0; i < tiles; i++) {
    if (i + 1 < tiles) load_q((i + 1) & 1);
    mn_cp_commit();
    mn_cp_wait<1>();
    __syncthreads();
    int hg, r0;
    uses.next(hg, r0);
    // Causal: a warp whose keys all come after the tile's last query sees nothing of it.
    if (MASK == MN_ATTN_MASK_NONE || cw <= r0 + BC - 1) {
      const unsigned short *qs = stages + (i & 1) * STAGE, *dys = qs + BC * LD;
      const float *st = reinterpret_cast<const float *>(qs + 2 * BC * LD);
      // Transposed scores: rows are this warp's keys, columns the tile's queries.
      float p[8][4], dp[WANT_K ? 8 : 1][4];
      mn_pipe_abt<LP, HD, LD>(p, kf, qs, lane);
      if constexpr (WANT_K) mn_pipe_abt<LP, HD, LD>(dp, vf, dys, lane);
      const bool masked =
          r0 + BC > (int)T || cw + 16 > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && cw + 15 > r0);
#pragma unroll
      for (int n = 0; n < 8; n++) {
        // The lane's two columns 2t, 2t + 1 of tile n: one 8-byte read per statistic.
        const int j0 = n * 8 + 2 * t;
        const float2 sm2 = *reinterpret_cast<const float2 *>(st + j0),
                     il2 = *reinterpret_cast<const float2 *>(st + BC + j0);
#pragma unroll
        for (int e = 0; e < 4; e++)
          p[n][e] =
              mn_ex2(fmaf(p[n][e], scale2, -(e & 1 ? sm2.y : sm2.x))) * (e & 1 ? il2.y : il2.x);
      }
      // Rows are keys here, columns queries (rows past T have zero statistics: zeroed too).
      if (masked)
        mn_pipe_set_unseen(
            p, cw, r0, lane,
            [](int key, int query) {
              return query < (int)T && mn_pipe_sees<MASK>(query, key, (int)S);
            },
            0.0f);
      if constexpr (WANT_V) mn_lp_mma_pb<LP, HD, LD, 8>(dv, p, dys, lane);
      if constexpr (WANT_K) {
#pragma unroll
        for (int n = 0; n < 8; n++) {
          const float2 d2 = *reinterpret_cast<const float2 *>(st + 2 * BC + n * 8 + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; e++)
            p[n][e] *= dp[n][e] - (e & 1 ? d2.y : d2.x);
        }
        mn_lp_mma_pb<LP, HD, LD, 8>(dk, p, qs, lane);
      }
    }
    __syncthreads();
  }
  const auto out = mn_out<7>(io) + kt.b * S * OS + kt.kvh * HD;
  if constexpr (WANT_K) mn_mma_store<HD>(out, OS, cw, S, dk, scale, scale, g, t);
  if constexpr (WANT_V)
    mn_mma_store<HD>(out + (PACKED ? KVH * HD : 0), OS, cw, S, dv, 1.0f, 1.0f, g, t);
}

// The kernels the lowering launches: the wgmma version where the launch fits, else the mma.sync
// one; the other is not instantiated, so NVRTC compiles one body a launch.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, int WARPS,
          int RW, int QKV, class IO>
__device__ void mn_attn_pipe_fwd(const IO &io) {
  if constexpr (mn_attn_wg_fits<LP, HD, WARPS, decltype(mn_in<0>(io)), decltype(mn_in<1>(io)),
                                decltype(mn_in<2>(io))>())
    mn_attn_wg_fwd<LP, HD, T, S, H, KVH, MASK, MODE, WARPS, RW, QKV>(io);
  else
    mn_attn_pipe_fwd_mma<LP, HD, T, S, H, KVH, MASK, MODE, WARPS, RW, QKV>(io);
}
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int WARPS, int QKV,
          class IO>
__device__ void mn_attn_pipe_dq(const IO &io) {
  if constexpr (mn_attn_wg_fits<LP, HD, WARPS, decltype(mn_in<0>(io)), decltype(mn_in<1>(io)),
                                decltype(mn_in<2>(io)), decltype(mn_in<3>(io))>())
    mn_attn_wg_dq<LP, HD, T, S, H, KVH, MASK, WARPS, QKV>(io);
  else
    mn_attn_pipe_dq_mma<LP, HD, T, S, H, KVH, MASK, WARPS, QKV>(io);
}
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          int WARPS, int QKV, class IO>
__device__ void mn_attn_pipe_dkv(const IO &io) {
  if constexpr (mn_attn_wg_fits<LP, HD, WARPS, decltype(mn_in<0>(io)), decltype(mn_in<1>(io)),
                                decltype(mn_in<2>(io)), decltype(mn_in<3>(io))>())
    mn_attn_wg_dkv<LP, HD, T, S, H, KVH, MASK, OUT, PACKED, WARPS, QKV>(io);
  else
    mn_attn_pipe_dkv_mma<LP, HD, T, S, H, KVH, MASK, OUT, PACKED, WARPS, QKV>(io);
}
