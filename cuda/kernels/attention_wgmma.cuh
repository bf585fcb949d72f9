// The pipelined forward of attention_pipe.cuh with Hopper's warpgroup products (wgmma): when the
// kernels are compiled for sm_90a and the shape fits (16-bit q, k and v, head dim 64, 4 warps),
// mn_attn_pipe_fwd hands its block to mn_attn_wg_fwd, same grid, same shared memory, same
// outputs and statistics.
//
// The 4 warps are one warpgroup; row block r of the block (RW of them, 64 rows each) is one
// m64 product, warp w holding its rows 16w .. 16w + 15 in the m16n8k16 layout the other kernels
// use (the Q fragments by ldmatrix as there; the scores and the output accumulate in the C
// fragment order, element 4n + e of a thread's 32 being C tile n, element e). K and V tiles are
// copied into shared memory as 8 x 8 core matrices of 16-byte rows, (key, dim) at byte
// (key / 8) * 16 HD + (dim / 8) * 128 + (key % 8) * 16 + (dim % 8) * 2, which the tensor cores
// read through a descriptor for both products: S = Q K^T with K-major B (the leading byte
// offset the 128 bytes between cores along the dims, the stride 16 HD between groups of 8 keys)
// and O += P V with the transposed, MN-major B (the leading offset 16 HD along the keys, the
// stride 128 along the dims); benchmarks/probes/wgmma_tile.cu checked both against the CPU.
// The B operand is read once for the warpgroup instead of once per warp by ldmatrix.
//
// P is rounded to LP in registers for the second product, as in attention_pipe.cuh. The scores
// are sums of the same products in another order than the mma.sync kernels' (the backward
// recomputes them with those), so P in the backward can differ from the forward's in the last
// bits of fp32.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MN_ATTN_WGMMA 1
#else
#define MN_ATTN_WGMMA 0
#endif

// A shared-memory matrix descriptor without swizzle: the start, the leading and the stride byte
// offsets, each in 16-byte units.
__device__ __forceinline__ unsigned long long mn_wg_desc(const void *smem, unsigned lbo,
                                                         unsigned sbo) {
  const unsigned long long a = (unsigned)__cvta_generic_to_shared(smem);
  return ((a & 0x3ffffull) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32);
}

__device__ __forceinline__ void mn_wg_fence() {
#if MN_ATTN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mn_wg_commit_wait() {
#if MN_ATTN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// d (the m64n64 f32 accumulator, 32 floats a thread) = a (registers) * B (desc) + (accumulate ?
// d : 0); TRANS_B: B stored MN-major.
#define MN_WG_D32                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MN_WG_D32_OUT(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
template <int LP, int TRANS_B>
__device__ __forceinline__ void mn_wg_m64n64k16(float (&d)[32], const unsigned (&a)[4],
                                                unsigned long long desc, int accumulate) {
#if MN_ATTN_WGMMA
  if constexpr (LP == MN_DEV_BF16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MN_WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate),
                   "n"(TRANS_B));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MN_WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate),
                   "n"(TRANS_B));
#else
  (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}
// The same with A in shared memory too (a_desc, K-major).
template <int LP>
__device__ __forceinline__ void mn_wg_m64n64k16_ss(float (&d)[32], unsigned long long a_desc,
                                                   unsigned long long b_desc, int accumulate) {
#if MN_ATTN_WGMMA
  if constexpr (LP == MN_DEV_BF16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MN_WG_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MN_WG_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
#else
  (void)d, (void)a_desc, (void)b_desc, (void)accumulate;
#endif
}
#undef MN_WG_D32
#undef MN_WG_D32_OUT

// Rows first .. first + 63 of one head of K or V (rows `stride` elements apart, `first` a
// multiple of 64) into the core-matrix order above, rows at or past COUNT as zeros; cp.async,
// committed by the caller.
template <int HD, int NTH, long long COUNT, class P>
__device__ __forceinline__ void mn_wg_load_tile(unsigned char *dst, P src, long long stride,
                                                long long first) {
  constexpr int C8 = HD / 8, N = 64 * C8, STEP = NTH / C8;
  static_assert(NTH % C8 == 0 && N % NTH == 0, "whole rows a step");
  constexpr bool FULL = COUNT % 64 == 0;
  const int r = (int)threadIdx.x / C8, c = (int)threadIdx.x - r * C8;
  const auto base = src + (first + r) * stride + 8 * c;
#pragma unroll
  for (int k = 0; k < N / NTH; k++) {
    const int row = r + k * STEP;
    const bool ok = FULL || first + row < COUNT;
    mn_cp_async16(dst + (row >> 3) * (16 * HD) + c * 128 + (row & 7) * 16,
                  (ok ? base + k * STEP * stride : src).p, ok);
  }
}

// Whether mn_attn_pipe_fwd takes the wgmma path for these arguments (P: q's pointer type).
template <int LP, int HD, int WARPS, class P> __device__ constexpr bool mn_attn_wg_fits() {
  return MN_ATTN_WGMMA && HD == 64 && WARPS == 4 && mn_attn_lp_same<LP, P>::value;
}

template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, int WARPS,
          int RW, int QKV, class IO>
__device__ void mn_attn_wg_fwd(const IO &io) {
  constexpr int BR = 64 * RW, BC = 64, LD = HD + 8, NTH = 32 * WARPS, KD = HD / 16;
  constexpr int TILE = BC * HD * 2; // bytes of one K or V tile
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  static_assert(WARPS == 4 && HD == 64, "one warpgroup, head dim 64");
  static_assert((BR * LD * 2) % 128 == 0 && RW * TILE <= BR * LD * 2,
                "Q in the core layout where the padded rows were; K and V 128-byte aligned");
  extern __shared__ __align__(128) float mn_attn_smem[];
  unsigned short *qs = reinterpret_cast<unsigned short *>(mn_attn_smem); // [BR][LD]
  unsigned char *kv = reinterpret_cast<unsigned char *>(qs + BR * LD);   // per stage: K, V

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK, QS, KS>(io);
  const int q0 = (int)qt.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float scale2 = mn_attn_log2e / sqrtf((float)HD);
  const int kend = (int)mn_attn_kend<BR, S, MASK>(qt.q0);
  const int tiles = (kend + BC - 1) / BC;
  auto load_kv = [&](int j) {
    unsigned char *ks = kv + (j & 1) * 2 * TILE;
    mn_wg_load_tile<HD, NTH, S>(ks, qt.kb, KS, (long long)j * BC);
    mn_wg_load_tile<HD, NTH, S>(ks + TILE, qt.vb, KS, (long long)j * BC);
  };

  // Q in the core layout too: S = Q K^T reads both operands through descriptors. (Held in
  // registers across the tile loop, Q's fragments had their registers reused for P by ptxas
  // 13.0, so A comes from registers only for P, which each tile makes anew.)
  unsigned char *qc = reinterpret_cast<unsigned char *>(qs);
#pragma unroll
  for (int r = 0; r < RW; r++)
    mn_wg_load_tile<HD, NTH, T>(qc + r * TILE, mn_in<0>(io) + qt.qoff, QS, qt.q0 + 64 * r);
  mn_cp_commit();
  load_kv(0);
  mn_cp_commit();

  float o[RW][32], m[RW][2], l[RW][2];
  mn_attn_fill(o, 0.0f);
  mn_attn_fill(m, mn_attn_neg_inf());
  mn_attn_fill(l, 0.0f);
  for (int j = 0; j < tiles; j++) {
    if (j + 1 < tiles) load_kv(j + 1);
    mn_cp_commit();
    mn_cp_wait<1>();
    // The tile was written through the generic proxy; the tensor cores read it through the
    // async one.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int c0 = j * BC;
    const unsigned char *ks = kv + (j & 1) * 2 * TILE, *vs = ks + TILE;
    // Every row block multiplies every tile (a block wholly before the tile masks it all):
    // products under a branch let ptxas reuse their A registers wrongly.
    float s[RW][32];
    mn_wg_fence();
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int k = 0; k < KD; k++)
        mn_wg_m64n64k16_ss<LP>(s[r], mn_wg_desc(qc + r * TILE + 256 * k, 128, 16 * HD),
                               mn_wg_desc(ks + 256 * k, 128, 16 * HD), k > 0);
    mn_wg_commit_wait();
    unsigned pa[RW][4][4];
#pragma unroll
    for (int r = 0; r < RW; r++) {
      const int rw = q0 + 64 * r + 16 * warp; // the warp's first row in block r
      if (c0 + BC > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && c0 + BC - 1 > rw)) {
#pragma unroll
        for (int i = 0; i < 32; i++)
          if (!mn_pipe_sees<MASK>(rw + g + 8 * ((i >> 1) & 1), c0 + (i >> 2) * 8 + 2 * t + (i & 1),
                                  (int)S))
            s[r][i] = mn_attn_neg_inf();
      }
      float mx[2] = {mn_attn_neg_inf(), mn_attn_neg_inf()};
#pragma unroll
      for (int i = 0; i < 32; i++)
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[r][i]);
      float m_sub[2], alpha[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const float m_new = fmaxf(m[r][h], mn_quad_max(mx[h]) * scale2);
        // A row that has seen no key yet subtracts 0, so that -inf - -inf makes no NaN.
        m_sub[h] = m_new == mn_attn_neg_inf() ? 0.0f : m_new;
        alpha[h] = mn_pipe_ex2(m[r][h] - m_sub[h]);
        m[r][h] = m_new;
        l[r][h] *= alpha[h];
      }
#pragma unroll
      for (int i = 0; i < 32; i++) {
        const int h = (i >> 1) & 1;
        s[r][i] = mn_pipe_ex2(fmaf(s[r][i], scale2, -m_sub[h]));
        l[r][h] += s[r][i];
        o[r][i] *= alpha[h];
      }
      // P as the A fragments of the keys 16k .. 16k + 15: C tiles 2k and 2k + 1.
#pragma unroll
      for (int k = 0; k < 4; k++) {
        pa[r][k][0] = mn_lp_round2<LP>(s[r][8 * k + 0], s[r][8 * k + 1]);
        pa[r][k][1] = mn_lp_round2<LP>(s[r][8 * k + 2], s[r][8 * k + 3]);
        pa[r][k][2] = mn_lp_round2<LP>(s[r][8 * k + 4], s[r][8 * k + 5]);
        pa[r][k][3] = mn_lp_round2<LP>(s[r][8 * k + 6], s[r][8 * k + 7]);
      }
    }
    mn_wg_fence();
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int k = 0; k < 4; k++)
        mn_wg_m64n64k16<LP, 1>(o[r], pa[r][k], mn_wg_desc(vs + 2 * 16 * HD * k, 16 * HD, 128), 1);
    mn_wg_commit_wait();
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < RW; r++) {
    // Each lane summed its own columns of the rows: the row sums are over the 4 lanes of a quad.
    const float l0 = mn_quad_sum(l[r][0]), l1 = mn_quad_sum(l[r][1]);
    const int row = q0 + 64 * r + 16 * warp;
    mn_mma_store<HD>(mn_out<3>(io) + qt.yoff, (long long)H * HD, row, T,
                     reinterpret_cast<const float(&)[HD / 8][4]>(o[r]), 1.0f / l0, 1.0f / l1, g, t);
    if constexpr (MODE == MN_ATTN_OUTPUT_STATS) {
      if (t == 0) {
        const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
        if (row + g < T) mn_attn_store_stats<false>(io, sb + row + g, m[r][0], l0, 0.0f);
        if (row + g + 8 < T) mn_attn_store_stats<false>(io, sb + row + g + 8, m[r][1], l1, 0.0f);
      }
    }
  }
}
