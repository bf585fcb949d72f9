// The decode layer's products on tensor cores (mma.sync m16n8k16, attention_mma.cuh mn_mma_lp),
// for 2 to 8 sequences and bf16 weights: the kernels of decode_layer.cuh with the same
// arguments and results, chosen by cuda/lower_decode_layer.c. With one warp a weight row, B
// sequences cost B FMAs a weight, B shared-memory reads of the activations and B warp sums;
// here the B activations of a batch are the eight columns of an mma, one weight costs an eighth
// of an instruction, a lane reads each activation it needs once, and the sums over k stay in
// the accumulators. The activations are rounded to bf16 for the tensor cores, as the unfused
// layer rounds them between its ops; the sums are fp32.
//
// A block computes T tiles of 16 weight rows for every sequence. Its warps split K into units of
// 32 (unit u to warp u % MN_DL_WARPS); in a unit, lane 4g + t holds chunk t (8 weights) of rows
// g and g + 8 of each tile. An mma takes k in a lane-local order, which is free to choose as
// long as weights and activations agree: its k 2t, 2t+1, 2t+8, 2t+9 are weights 0-3 of the
// lane's chunks (the second mma of a unit: weights 4-7), so that the lane's 16-byte weight
// loads are the A fragments as they are, and its B fragments are activations 8t .. 8t+7 of
// sequence g of the unit, two 16-byte shared-memory reads. The warps' 16 x 8 results meet in
// shared memory and are summed in warp order.

template <int K> struct mn_dl_mma_shape {
  static_assert(K % 32 == 0, "the tensor-core products take k in units of 32");
  static constexpr int NU = K / 32, UPW = (NU + MN_DL_WARPS - 1) / MN_DL_WARPS;
};

// Chunk c of a weight row, its two runs of four weights (decode_layer.cuh mn_dl_qrow): eight
// consecutive weights for bf16 rows (FMT 0), the format's runs for quantized ones.
template <int K, int FMT, int GROUP>
__device__ __forceinline__ void mn_dl_mma_runs(int c, int &e0, int &e1) {
  if constexpr (FMT == 0) {
    e0 = 8 * c;
    e1 = e0 + 4;
  } else {
    mn_dl_qrow<K, FMT, GROUP>::chunk_runs(c, e0, e1);
  }
}

// T tiles of 16 rows of a weight [*, K], bf16 (FMT 0) or quantized in format FMT (host/quant.h):
// this lane's chunk t of rows g and g + 8 of each tile in each of its warp's units, as bf16
// pairs (weights 0-3 are the first run of the chunk, 4-7 the second). Quantized chunks are
// dequantized as they arrive and rounded to bf16, before the wait (settle()).
template <int K, int T, int FMT = 0, int GROUP = 0> struct mn_dl_mma_tiles {
  using SH = mn_dl_mma_shape<K>;
  uint4 w[T][SH::UPW][2];

  // f(i, j, h, u) for chunk (i, j, h) of the lane: tile i, its warp's j-th unit u, row g + 8 h.
  template <class F> static __device__ __forceinline__ void each_chunk(F f) {
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
      for (int j = 0; j < SH::UPW; j++) {
        const int u = warp + MN_DL_WARPS * j;
        if (SH::NU % MN_DL_WARPS != 0 && u >= SH::NU) continue;
#pragma unroll
        for (int h = 0; h < 2; h++)
          f(i, j, h, u);
      }
  }

  // Tile i: rows row0[i] .. row0[i] + 15 of the weight at base[i].
  __device__ __forceinline__ void load(const void *const (&base)[T], const long long (&row0)[T]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if constexpr (FMT == 0) {
      each_chunk([&](int i, int j, int h, int u) {
        const uint4 *row = reinterpret_cast<const uint4 *>(
            static_cast<const unsigned short *>(base[i]) + (row0[i] + g + 8 * h) * K);
        w[i][j][h] = row[u * 4 + t];
      });
    } else {
      using QR = mn_dl_qrow<K, FMT, GROUP>;
      typename QR::chunk k[T][SH::UPW][2];
      each_chunk([&](int i, int j, int h, int u) {
        k[i][j][h] = QR::load_chunk(static_cast<const unsigned char *>(base[i]) +
                                        (row0[i] + g + 8 * h) * QR::ROW_BYTES,
                                    u * 4 + t);
      });
      each_chunk([&](int i, int j, int h, int) {
        float f[8];
        QR::dequant(k[i][j][h], f);
        w[i][j][h] = make_uint4(
            mn_lp_round2<MN_DEV_BF16>(f[0], f[1]), mn_lp_round2<MN_DEV_BF16>(f[2], f[3]),
            mn_lp_round2<MN_DEV_BF16>(f[4], f[5]), mn_lp_round2<MN_DEV_BF16>(f[6], f[7]));
      });
    }
  }

  // Quantized tiles: the dequantized weights made to exist here, before the programmatic wait
  // that the caller comes to next (as mn_dl_qrow::settle).
  __device__ __forceinline__ void settle() {
    if constexpr (FMT != 0)
      each_chunk([&](int i, int j, int h, int) {
        asm volatile(""
                     : "+r"(w[i][j][h].x), "+r"(w[i][j][h].y), "+r"(w[i][j][h].z),
                       "+r"(w[i][j][h].w));
      });
  }

  // acc[i] += this warp's share of tile i . a^T: a [B][K] fp32 in shared memory; acc[i] is the
  // C fragment (rows g and g + 8, sequences 2t and 2t + 1).
  template <int B>
  __device__ __forceinline__ void product(const float *a, float (&acc)[T][4]) const {
    static_assert(B >= 1 && B <= 8, "the sequences are the eight columns of an mma");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < SH::UPW; j++) {
      const int u = warp + MN_DL_WARPS * j;
      if (SH::NU % MN_DL_WARPS != 0 && u >= SH::NU) continue;
      unsigned b[4] = {0u, 0u, 0u, 0u};
      if (g < B) {
        int e0, e1;
        mn_dl_mma_runs<K, FMT, GROUP>(u * 4 + t, e0, e1);
        const float4 x0 = *reinterpret_cast<const float4 *>(a + g * K + e0);
        const float4 x1 = *reinterpret_cast<const float4 *>(a + g * K + e1);
        b[0] = mn_lp_round2<MN_DEV_BF16>(x0.x, x0.y);
        b[1] = mn_lp_round2<MN_DEV_BF16>(x0.z, x0.w);
        b[2] = mn_lp_round2<MN_DEV_BF16>(x1.x, x1.y);
        b[3] = mn_lp_round2<MN_DEV_BF16>(x1.z, x1.w);
      }
#pragma unroll
      for (int i = 0; i < T; i++) {
        const uint4 r0 = w[i][j][0], r1 = w[i][j][1];
        const unsigned lo[4] = {r0.x, r1.x, r0.y, r1.y}, hi[4] = {r0.z, r1.z, r0.w, r1.w};
        mn_mma_lp<MN_DEV_BF16>(acc[i], lo, b[0], b[1]);
        mn_mma_lp<MN_DEV_BF16>(acc[i], hi, b[2], b[3]);
      }
    }
  }
};

// The warps' results summed: red [MN_DL_WARPS][T][128] in shared memory gets every warp's C
// fragments; after the barrier, threads e < 128 of the block each own (row e / 8 of a tile,
// sequence e % 8) and sum() gives tile i's value there, the warps added in order.
template <int T> struct mn_dl_mma_sums {
  float (*red)[T][128];
  __device__ __forceinline__ void put(const float (&acc)[T][4]) const {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < T; i++)
#pragma unroll
      for (int c = 0; c < 4; c++)
        red[warp][i][(g + 8 * (c >> 1)) * 8 + 2 * t + (c & 1)] = acc[i][c];
  }
  __device__ __forceinline__ float sum(int i) const {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < MN_DL_WARPS; w++)
      s += red[w][i][threadIdx.x];
    return s;
  }
};

// The block's tiles w . a^T for B sequences, summed over its warps through red: every thread
// of the block calls it (it ends in a barrier), and threads below 128 read their sums from the
// result.
template <int B, int K, int T, int FMT, int GROUP>
__device__ __forceinline__ mn_dl_mma_sums<T>
mn_dl_mma_block_product(const mn_dl_mma_tiles<K, T, FMT, GROUP> &w, const float *a,
                        float (*red)[T][128]) {
  float acc[T][4];
  mn_attn_fill(acc, 0.0f);
  w.template product<B>(a, acc);
  const mn_dl_mma_sums<T> sums{red};
  sums.put(acc);
  __syncthreads();
  return sums;
}

// mn_dl_qkv on tensor cores: block p computes rows i0 .. i0 + 15 and i0 + HD/2 .. of one head of
// q, k or v (tiles 0 and 1: the pairs RoPE rotates together), HD a multiple of 32.
template <int C, int Q, int KV, int HD, long long MAXS, int B, unsigned EPS_BITS,
          unsigned THETA_BITS, int FMT, int GROUP, bool NWS, int NCNT, class IO>
__device__ void mn_dl_qkv_mma(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  __shared__ float red[MN_DL_WARPS][2][128];
  float *a = reinterpret_cast<float *>(mn_dl_smem);
  using NORM = mn_dl_norm_input<C, B, NWS, IO>;
  constexpr int HALF = HD / 2, TPH = HALF / 16, QT = Q / HD * TPH, KT = KV / HD * TPH;
  static_assert(HALF % 16 == 0, "a tile of 16 rows within half a head");
  const int p = blockIdx.x;
  const int sec = p < QT ? 0 : p < QT + KT ? 1 : 2;
  const int pp = sec == 0 ? p : sec == 1 ? p - QT : p - QT - KT;
  const long long r0 = (long long)(pp / TPH) * HD + (pp % TPH) * 16;
  mn_overlap_begin();
  mn_dl_mma_tiles<C, 2, FMT, GROUP> w;
  {
    const void *wp = mn_arg<const void>(io, 2 + sec);
    const void *const base[2] = {wp, wp};
    const long long rows[2] = {r0, r0 + HALF};
    w.load(base, rows);
  }
  NORM::stage_norm_w(io, a);
  const int e = threadIdx.x, row = e >> 3, seq = e & 7;
  const int i = (int)(r0 % HD) + row;
  const double freq = sec < 2 && e < 128 ? pow((double)__int_as_float((int)THETA_BITS),
                                               -2.0 * (double)i / (double)HD)
                                         : 0.0;
  w.settle();
  mn_overlap_wait();
  unsigned int pos;
  if (!mn_dl_qkv_after_wait<NCNT, MAXS, NORM>(io, __int_as_float((int)EPS_BITS), a, pos)) return;
  const mn_dl_mma_sums<2> sums = mn_dl_mma_block_product<B>(w, a, red);
  if (e >= 128 || seq >= B) return;
  double cs = 1.0, sn = 0.0;
  if (sec < 2) sincos((double)pos * freq, &sn, &cs);
  mn_dl_qkv_store<Q, KV, MAXS>(io, sec, seq, pos, r0 + row, r0 + row + HALF, sums.sum(0),
                               sums.sum(1), cs, sn);
}

// mn_dl_residual_product on tensor cores: block p computes rows 16p .. 16p + 15 of the output.
template <int C, int K, int B, int FMT, int GROUP, class IO>
__device__ void mn_dl_residual_product_mma(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  __shared__ float red[MN_DL_WARPS][1][128];
  float *xs = reinterpret_cast<float *>(mn_dl_smem);
  const long long r0 = (long long)blockIdx.x * 16;
  mn_overlap_begin();
  mn_dl_mma_tiles<K, 1, FMT, GROUP> w;
  {
    const void *const base[1] = {mn_arg<const void>(io, 2)};
    const long long rows[1] = {r0};
    w.load(base, rows);
  }
  w.settle();
  mn_overlap_wait();
  const int e = threadIdx.x, seq = e & 7;
  const long long r = r0 + (e >> 3);
  const bool mine = e < 128 && seq < B;
  const float rv = mine ? (float)mn_in<0>(io)[(long long)seq * C + r] : 0.0f;
  mn_dl_stage<B * K>(xs, mn_in<1>(io));
  __syncthreads();
  const mn_dl_mma_sums<1> sums = mn_dl_mma_block_product<B>(w, xs, red);
  if (mine) mn_out<3>(io)[(long long)seq * C + r] = rv + sums.sum(0);
}

// mn_dl_mlp_up on tensor cores: block p computes rows 16p .. 16p + 15 of the gate (tile 0) and
// of the up product (tile 1).
template <int C, int F, int B, unsigned EPS_BITS, int FMT, int GROUP, bool NWS, class IO>
__device__ void mn_dl_mlp_up_mma(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  __shared__ float red[MN_DL_WARPS][2][128];
  float *a = reinterpret_cast<float *>(mn_dl_smem);
  using NORM = mn_dl_norm_input<C, B, NWS, IO>;
  const long long r0 = (long long)blockIdx.x * 16;
  mn_overlap_begin();
  mn_dl_mma_tiles<C, 2, FMT, GROUP> w;
  {
    const void *const base[2] = {mn_arg<const void>(io, 2), mn_arg<const void>(io, 3)};
    const long long rows[2] = {r0, r0};
    w.load(base, rows);
  }
  NORM::stage_norm_w(io, a);
  w.settle();
  mn_overlap_wait();
  NORM::normalize(io, __int_as_float((int)EPS_BITS), a);
  const mn_dl_mma_sums<2> sums = mn_dl_mma_block_product<B>(w, a, red);
  const int e = threadIdx.x, seq = e & 7;
  if (e >= 128 || seq >= B) return;
  const float g = sums.sum(0), u = sums.sum(1);
  mn_out<4>(io)[(long long)seq * F + r0 + (e >> 3)] = g / (1.0f + expf(-g)) * u;
}
