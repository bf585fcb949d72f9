// The backward of attention_pipe.cuh with warpgroup products (see attention_wgmma.cuh): the block
// of 64 queries (dQ) or 64 keys (dK / dV) is the m64 of every product, the streamed tiles and the
// block's own rows sit in shared memory in the swizzled layout, and P and dS go from the
// accumulators to the A fragments of the next products in registers.
//
// Products are issued in groups so that the exponentials of P run while the tensor cores work on
// dP (and, in dK / dV, on dV += P^T dY). The scores are the same sums as the forward's in another
// order, so P here can differ from the forward's in the last bits of fp32, as between the mma
// and the wgmma kernels.

// dQ (see mn_attn_pipe_dq_mma): the block's q and dy tiles, then two stages of K and V.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int WARPS, int QKV,
          class IO>
__device__ void mn_attn_wg_dq(const IO &io) {
  constexpr int BR = 64, BC = 64, NTH = 32 * WARPS, TILE = BC * HD * 2;
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  static_assert(WARPS == 4 && HD == 64, "one warpgroup, head dim 64");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned char *qs = mn_wg_smem(mn_attn_smem), *dys = qs + TILE;
  unsigned char *kv = dys + TILE; // per stage: K, V

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK, QS, KS>(io);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rw = (int)qt.q0 + 16 * warp;
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;
  const int kend = (int)mn_attn_kend<BR, S, MASK>(qt.q0);
  const int tiles = (kend + BC - 1) / BC;
  auto load_kv = [&](int j) {
    unsigned char *ks = kv + (j & 1) * 2 * TILE;
    mn_wg_load_tile<HD, NTH, S>(ks, qt.kb, KS, (long long)j * BC);
    mn_wg_load_tile<HD, NTH, S>(ks + TILE, qt.vb, KS, (long long)j * BC);
  };

  mn_wg_load_tile<HD, NTH, T>(qs, mn_in<0>(io) + qt.qoff, QS, qt.q0);
  mn_wg_load_tile<HD, NTH, T>(dys, mn_in<3>(io) + qt.yoff, (long long)H * HD, qt.q0);
  mn_cp_commit();
  load_kv(0);
  mn_cp_commit();
  const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
  float rm[2], ril[2], rdelta[2], acc[32];
#pragma unroll
  for (int i = 0; i < 2; i++)
    mn_attn_load_stats<T, true>(io, sb, rw + g + 8 * i, rm[i], ril[i], rdelta[i]);
  mn_attn_fill(acc, 0.0f);

  for (int j = 0; j < tiles; j++) {
    if (j + 1 < tiles) load_kv(j + 1);
    mn_cp_commit();
    mn_wg_tile_ready();
    const int c0 = j * BC;
    const unsigned char *ks = kv + (j & 1) * 2 * TILE, *vs = ks + TILE;
    float s[32], dp[32];
    mn_wg_fence();
    mn_wg_abt<LP, HD>(s, qs, ks);
    mn_wg_commit();
    mn_wg_abt<LP, HD>(dp, dys, vs);
    mn_wg_commit();
    mn_wg_wait<1>();
    mn_wg_pin(s);
    float(&p)[8][4] = mn_wg_tiles(s);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        p[n][e] = mn_ex2(fmaf(p[n][e], scale2, -rm[e >> 1])) * ril[e >> 1];
    if (c0 + BC > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && c0 + BC - 1 > rw))
      mn_pipe_set_unseen(
          p, rw, c0, lane, [](int r, int c) { return mn_pipe_sees<MASK>(r, c, (int)S); }, 0.0f);
    mn_wg_wait<0>();
    mn_wg_pin(dp);
#pragma unroll
    for (int i = 0; i < 32; i++)
      s[i] *= dp[i] - rdelta[(i >> 1) & 1];
    unsigned ds[4][4];
    mn_wg_pack<LP>(ds, s);
    mn_wg_fence();
    mn_wg_pb<LP, HD>(acc, ds, ks);
    mn_wg_commit();
    mn_wg_wait<0>();
    mn_wg_pin(acc);
    __syncthreads();
  }
  // dQ has q's layout: in a QKV launch, the q block of the gradient's wider rows.
  mn_mma_store<HD>(mn_out<7>(io) + qt.qoff, QS, rw, T, mn_wg_tiles(acc), scale, scale, g, t);
}

// dK / dV (see mn_attn_pipe_dkv_mma): the block's k and v tiles, then two stages of q, dy and their
// statistics. Transposed scores: rows are the block's keys,
// columns the tile's queries.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          int WARPS, int QKV, class IO>
__device__ void mn_attn_wg_dkv(const IO &io) {
  constexpr int BR = 64, BC = 64, NTH = 32 * WARPS, G = H / KVH, TILE = BC * HD * 2;
  constexpr bool WANT_K = OUT != MN_ATTN_DV, WANT_V = OUT != MN_ATTN_DK;
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  constexpr long long OS = QKV ? QS : (PACKED ? 2 : 1) * KVH * HD;
  static_assert(!QKV || PACKED, "a QKV launch writes dK and dV side by side");
  // A stage: q, dy, then m, inv_l, delta [3][BC] (floats) in 1 KB, so that tiles stay aligned.
  constexpr int STAGE = 2 * TILE + 1024;
  static_assert(WARPS == 4 && HD == 64 && 3 * BC * 4 <= 1024, "one warpgroup, head dim 64");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned char *ks = mn_wg_smem(mn_attn_smem), *vs = ks + TILE;
  unsigned char *stages = vs + TILE;

  const mn_attn_kvtile kt = mn_attn_kvtile_of<BR, HD, S, KVH>();
  const int c0 = (int)kt.c0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int cw = c0 + 16 * warp; // the warp's first key
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;
  mn_attn_qtile_walk<T, BC, MASK, G> loads(c0), uses(c0);
  const int tiles = loads.count;
  auto load_q = [&](int stage) {
    unsigned char *qt = stages + stage * STAGE;
    int hg, r0;
    loads.next(hg, r0);
    const int h = kt.kvh * G + hg;
    const mn_attn_head qh = mn_attn_head_of<HD, T, H>(kt.b, h);
    mn_wg_load_tile<HD, NTH, T>(qt, mn_in<0>(io) + (kt.b * T * QS + h * HD), QS, r0);
    mn_wg_load_tile<HD, NTH, T>(qt + TILE, mn_in<3>(io) + qh.qoff, (long long)H * HD, r0);
    mn_pipe_load_stats<T, BC, NTH, WANT_K ? 3 : 2>(reinterpret_cast<float *>(qt + 2 * TILE), io,
                                                   qh.sb, r0);
  };

  const long long kvoff = kt.b * S * KS + kt.kvh * HD;
  mn_wg_load_tile<HD, NTH, S>(ks, mn_in<1>(io) + kvoff, KS, kt.c0);
  if constexpr (WANT_K) mn_wg_load_tile<HD, NTH, S>(vs, mn_in<2>(io) + kvoff, KS, kt.c0);
  mn_cp_commit();
  if (tiles > 0) load_q(0);
  mn_cp_commit();
  float dk[WANT_K ? 32 : 1], dv[WANT_V ? 32 : 1];
  mn_attn_fill(dk, 0.0f);
  mn_attn_fill(dv, 0.0f);

  for (int i = 0; i < tiles; i++) {
    if (i + 1 < tiles) load_q((i + 1) & 1);
    mn_cp_commit();
    mn_wg_tile_ready();
    int hg, r0;
    uses.next(hg, r0);
    const unsigned char *qs = stages + (i & 1) * STAGE, *dys = qs + TILE;
    const float *st = reinterpret_cast<const float *>(qs + 2 * TILE);
    float s[32], dp[WANT_K ? 32 : 1];
    mn_wg_fence();
    mn_wg_abt<LP, HD>(s, ks, qs);
    mn_wg_commit();
    if constexpr (WANT_K) {
      mn_wg_abt<LP, HD>(dp, vs, dys);
      mn_wg_commit();
      mn_wg_wait<1>();
    } else {
      mn_wg_wait<0>();
    }
    mn_wg_pin(s);
    float(&p)[8][4] = mn_wg_tiles(s);
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
    if (r0 + BC > (int)T || cw + 16 > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && cw + 15 > r0))
      mn_pipe_set_unseen(
          p, cw, r0, lane,
          [](int key, int query) {
            return query < (int)T && mn_pipe_sees<MASK>(query, key, (int)S);
          },
          0.0f);
    if constexpr (WANT_V) {
      unsigned pa[4][4];
      mn_wg_pack<LP>(pa, s);
      mn_wg_fence();
      mn_wg_pb<LP, HD>(dv, pa, dys);
      mn_wg_commit();
    }
    if constexpr (WANT_K) {
      mn_wg_wait<WANT_V ? 1 : 0>(); // dP is done; dV += P^T dy may still run
      mn_wg_pin(dp);
#pragma unroll
      for (int n = 0; n < 8; n++) {
        const float2 d2 = *reinterpret_cast<const float2 *>(st + 2 * BC + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e++)
          p[n][e] *= dp[4 * n + e] - (e & 1 ? d2.y : d2.x);
      }
      unsigned ds[4][4];
      mn_wg_pack<LP>(ds, s);
      mn_wg_fence();
      mn_wg_pb<LP, HD>(dk, ds, qs);
      mn_wg_commit();
    }
    mn_wg_wait<0>();
    if constexpr (WANT_K) mn_wg_pin(dk);
    if constexpr (WANT_V) mn_wg_pin(dv);
    __syncthreads();
  }
  const auto out = mn_out<7>(io) + kt.b * S * OS + kt.kvh * HD;
  if constexpr (WANT_K) mn_mma_store<HD>(out, OS, cw, S, mn_wg_tiles(dk), scale, scale, g, t);
  if constexpr (WANT_V)
    mn_mma_store<HD>(out + (PACKED ? KVH * HD : 0), OS, cw, S, mn_wg_tiles(dv), 1.0f, 1.0f, g, t);
}
