// Attention on tensor cores: the flash-style forward, its statistics pre-pass and the dQ,
// dK and dV kernels of attention.cuh rewritten around mma.sync, with FP32 accumulation.
// Two operand kinds share the kernel bodies (mn_attn_tc_*), through an operand policy
// (mn_attn_tf32_ops, mn_attn_lp_ops) that says how a tile sits in shared memory and how two
// tiles multiply:
//
// - TF32, for head dims that are multiples of 32 up to 128 (mn_attn_mma_*): m16n8k8 on float
//   tiles. PREC (an mn_attn_prec of cuda/device_abi.h) MN_ATTN_TF32 rounds each operand to TF32
//   once (sessions with allow_tf32). MN_ATTN_3XTF32 splits each operand x into hi = tf32(x) and
//   lo = tf32(x - hi) and sums lo*hi + hi*lo + hi*hi, which keeps about FP32 accuracy (the
//   lo*lo term is below FP32 rounding) at three times the tensor-core work; FP32 sessions use
//   it.
// - 16-bit operands, for bf16 / fp16 sessions where q, k or v is stored in 16 bits and head
//   dims that are multiples of 16 up to 128 (mn_attn_lp_*): m16n8k16 on tiles of 16-bit values
//   (LP, an mn_dev_storage: MN_DEV_BF16 or MN_DEV_F16). Q, K, V and dY tiles are copied to
//   shared memory as stored (an fp32 argument is rounded once as it is loaded); the
//   probabilities P and dS = P (dP - delta) are rounded to LP for their products, as
//   FlashAttention does. Scores, statistics and every sum stay fp32.
//
// Tiles: MN_ATTN_BLOCK = 128 threads = 4 warps, MN_ATTN_MMA_ROWS = 64 rows per block (16 per warp:
// the m of the mma), 64 columns per streamed tile. In a warp, g = lane / 4 and t = lane % 4.
//
// TF32 fragments (PTX ISA, m16n8k8 .tf32) are A: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4);
// B: (t, g), (t + 4, g); C: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). A product whose A
// operand is a C tile (P V, dS K, ...) reads k = 2t and 2t + 1 where the mma expects t and
// t + 4: the reduction order within a group of 8 is permuted, the same way for A and B, so
// no shuffle is needed. Float tiles have a row stride of HD + 4 floats, so every fragment
// read touches 32 distinct banks.
//
// 16-bit fragments (PTX ISA, m16n8k16 .bf16 / .f16): every register holds two values, the one
// of lower index in its low half. A (16 x 16, row-major), 4 registers: a0 = (g, 2t..2t+1),
// a1 = (g + 8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g + 8, 2t+8..2t+9); B (16 x 8, k x n),
// 2 registers: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g); C (fp32) as in m16n8k8. So the
// C tiles 2j and 2j + 1 of a 16 x 64 fp32 tile (columns 16j .. 16j + 15), rounded in pairs,
// are exactly the A fragment of k block j: a0 = (c0, c1) of tile 2j, a1 = (c2, c3) of tile 2j,
// a2 = (c0, c1) of tile 2j + 1, a3 = (c2, c3) of tile 2j + 1, with no permutation. 16-bit tiles
// have a row stride of HD + 8 values (a multiple of 16 bytes), so that the 32-bit fragment
// reads and the 8 rows of 16 bytes of each ldmatrix phase touch distinct banks.
//
// Statistics are kept in base 2: m is the row max of scale * log2(e) * q.k and P =
// exp2(that - m) * inv_l. The pre-pass and the dQ kernel compute scores with the same
// fragment code, so they agree bit for bit.

constexpr float mn_attn_log2e = 1.4426950408889634f;

// Round to nearest TF32 (10 mantissa bits), ties away from zero, as cvt.rna.tf32.f32 does;
// inf and NaN pass unchanged.
__device__ __forceinline__ unsigned mn_tf32(float x) {
#if __CUDA_ARCH__ >= 800
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#else
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
#endif
}

template <int PREC> struct mn_frag_a { unsigned hi[4], lo[4]; };
template <int PREC> struct mn_frag_b { unsigned hi[2], lo[2]; };

template <int PREC> __device__ __forceinline__ void mn_split(float x, unsigned &hi, unsigned &lo) {
  hi = mn_tf32(x);
  if constexpr (PREC == MN_ATTN_3XTF32) lo = mn_tf32(x - __uint_as_float(hi));
}

// c += a * b for one m16n8k8 tile.
__device__ __forceinline__ void mn_mma_tf32(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                            unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  // Before Ampere: the same product from the same fragments, gathered with shuffles.
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const int src = k & 3;
    const bool upper = k >= 4;
    const float ag = __uint_as_float(__shfl_sync(0xffffffffu, upper ? a[2] : a[0], g * 4 + src));
    const float ag8 = __uint_as_float(__shfl_sync(0xffffffffu, upper ? a[3] : a[1], g * 4 + src));
    const float bc0 = __uint_as_float(__shfl_sync(0xffffffffu, upper ? b1 : b0, 8 * t + src));
    const float bc1 = __uint_as_float(__shfl_sync(0xffffffffu, upper ? b1 : b0, 8 * t + 4 + src));
    r[0] = fmaf(ag, bc0, r[0]);
    r[1] = fmaf(ag, bc1, r[1]);
    r[2] = fmaf(ag8, bc0, r[2]);
    r[3] = fmaf(ag8, bc1, r[3]);
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
    c[i] += r[i];
#endif
}

template <int PREC>
__device__ __forceinline__ void mn_mma(float (&c)[4], const mn_frag_a<PREC> &a,
                                       const mn_frag_b<PREC> &b) {
  if constexpr (PREC == MN_ATTN_3XTF32) {
    mn_mma_tf32(c, a.lo, b.hi[0], b.hi[1]);
    mn_mma_tf32(c, a.hi, b.lo[0], b.lo[1]);
  }
  mn_mma_tf32(c, a.hi, b.hi[0], b.hi[1]);
}

// A fragment of the 16 x 8 block at base (row 0, column k0) of a row-major shared tile.
template <int PREC, int LD>
__device__ __forceinline__ mn_frag_a<PREC> mn_load_a(const float *base, int g, int t) {
  mn_frag_a<PREC> f;
  mn_split<PREC>(base[g * LD + t], f.hi[0], f.lo[0]);
  mn_split<PREC>(base[(g + 8) * LD + t], f.hi[1], f.lo[1]);
  mn_split<PREC>(base[g * LD + t + 4], f.hi[2], f.lo[2]);
  mn_split<PREC>(base[(g + 8) * LD + t + 4], f.hi[3], f.lo[3]);
  return f;
}

// A fragment from a C tile in registers (k permuted: see the top of this file).
template <int PREC> __device__ __forceinline__ mn_frag_a<PREC> mn_c_as_a(const float (&c)[4]) {
  mn_frag_a<PREC> f;
  mn_split<PREC>(c[0], f.hi[0], f.lo[0]);
  mn_split<PREC>(c[2], f.hi[1], f.lo[1]);
  mn_split<PREC>(c[1], f.hi[2], f.lo[2]);
  mn_split<PREC>(c[3], f.hi[3], f.lo[3]);
  return f;
}

// B fragment where B(k, n) = base[n * LD + k] (B^T row-major: K for Q K^T).
template <int PREC, int LD>
__device__ __forceinline__ mn_frag_b<PREC> mn_load_b_nk(const float *base, int g, int t) {
  mn_frag_b<PREC> f;
  mn_split<PREC>(base[g * LD + t], f.hi[0], f.lo[0]);
  mn_split<PREC>(base[g * LD + t + 4], f.hi[1], f.lo[1]);
  return f;
}

// B fragment where B(k, n) = base[k * LD + n], k permuted to match mn_c_as_a (V for P V).
template <int PREC, int LD>
__device__ __forceinline__ mn_frag_b<PREC> mn_load_b_kn(const float *base, int g, int t) {
  mn_frag_b<PREC> f;
  mn_split<PREC>(base[2 * t * LD + g], f.hi[0], f.lo[0]);
  mn_split<PREC>(base[(2 * t + 1) * LD + g], f.hi[1], f.lo[1]);
  return f;
}

// acc[n] (16 x 64 C tiles, NT = 8) = A rows of `a` (16 x HD) times B^T rows of `b` (64 x HD).
template <int PREC, int HD, int LD, int NT>
__device__ __forceinline__ void mn_mma_abt(float (&acc)[NT][4], const float *a, const float *b,
                                           int g, int t) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      acc[n][e] = 0.0f;
#pragma unroll 2
  for (int k = 0; k < HD; k += 8) {
    const mn_frag_a<PREC> fa = mn_load_a<PREC, LD>(a + k, g, t);
#pragma unroll
    for (int n = 0; n < NT; n++)
      mn_mma<PREC>(acc[n], fa, mn_load_b_nk<PREC, LD>(b + n * 8 * LD + k, g, t));
  }
}

// acc[n] (16 x HD) += P (16 x 64, C tiles in registers) times the 64 x HD rows of `b`.
template <int PREC, int HD, int LD, int KT>
__device__ __forceinline__ void mn_mma_pb(float (&acc)[HD / 8][4], const float (&p)[KT][4],
                                          const float *b, int g, int t) {
#pragma unroll
  for (int k = 0; k < KT; k++) {
    const mn_frag_a<PREC> fa = mn_c_as_a<PREC>(p[k]);
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      mn_mma<PREC>(acc[n], fa, mn_load_b_kn<PREC, LD>(b + k * 8 * LD + n * 8, g, t));
  }
}

__device__ __forceinline__ float mn_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float mn_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Writes a 16 x HD accumulator (rows `row0` + g and + g + 8 of a head whose row 0 is at
// dst, rows `stride` elements apart; rows at or past `rows` are skipped) times mul[0] / mul[1].
// dst: a float pointer or a low-precision view (each value rounded once).
template <int HD, class P>
__device__ __forceinline__ void mn_mma_store(P dst, long long stride, long long row0,
                                             long long rows, const float (&acc)[HD / 8][4],
                                             float mul0, float mul1, int g, int t) {
  const long long r0 = row0 + g, r1 = row0 + g + 8;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    const int d = n * 8 + 2 * t;
    if (r0 < rows) {
      const float v[2] = {acc[n][0] * mul0, acc[n][1] * mul0};
      mn_st_vec<2>(dst + r0 * stride + d, v);
    }
    if (r1 < rows) {
      const float v[2] = {acc[n][2] * mul1, acc[n][3] * mul1};
      mn_st_vec<2>(dst + r1 * stride + d, v);
    }
  }
}

// ---- 16-bit operands (m16n8k16)

// c += a * b for one m16n8k16 tile with LP operands (fragments: see the top of this file).
template <int LP>
__device__ __forceinline__ void mn_mma_lp(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (LP == MN_DEV_BF16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two consecutive 16-bit values of a shared tile (at an even index) as one register.
__device__ __forceinline__ unsigned mn_lp_pair(const unsigned short *p) {
  return *reinterpret_cast<const unsigned *>(p);
}

// Four 8 x 8 matrices of 16-bit values, transposed (ldmatrix .trans): lanes 8i .. 8i + 7 give
// the addresses of rows 0 .. 7 of matrix i (16 bytes each, 16-byte aligned), and r[i] gets
// (row 2t, column g) in its low half and (row 2t + 1, column g) in its high half: a B
// fragment register when the rows are k and the columns n.
__device__ __forceinline__ void mn_ldsm_x4_trans(unsigned (&r)[4], const unsigned short *row) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// Whether a pointer of type P reads values stored as LP (then tiles copy them unchanged).
template <int LP, class P> struct mn_attn_lp_same { static constexpr bool value = false; };
template <int LP> struct mn_attn_lp_same<LP, mn_lp_ptr<LP, true>> {
  static constexpr bool value = true;
};

// Copies rows first .. first + ROWS - 1 of one head (src: row 0 at the head's first column, rows
// `stride` elements apart) into dst[r * LD + d] as LP values, 8 per 16-byte chunk: unchanged
// when src stores LP, else each value rounded once. Rows at or past `count` become zeros.
// HD is a multiple of 16 and every head's row starts at a multiple of HD elements.
template <int LP, int HD, int ROWS, int LD, class P>
__device__ __forceinline__ void mn_attn_lp_load(unsigned short *dst, P src, long long stride,
                                                long long first, long long count) {
  constexpr int C8 = HD / 8;
  for (int i = threadIdx.x; i < ROWS * C8; i += MN_ATTN_BLOCK) {
    const int r = i / C8, c = (i - r * C8) * 8;
    const long long row = first + r;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (row < count) {
      const auto p = src + row * stride + c;
      if constexpr (mn_attn_lp_same<LP, P>::value) {
        w = *reinterpret_cast<const uint4 *>(p.p);
      } else {
        const float4 lo = mn_ld4(p, 0), hi = mn_ld4(p, 1);
        w = make_uint4(mn_lp_round2<LP>(lo.x, lo.y), mn_lp_round2<LP>(lo.z, lo.w),
                       mn_lp_round2<LP>(hi.x, hi.y), mn_lp_round2<LP>(hi.z, hi.w));
      }
    }
    *reinterpret_cast<uint4 *>(dst + r * LD + c) = w;
  }
}

// acc[n] (16 x 8 NT C tiles) = the 16 rows of `a` (16 x HD) times the transposed NT * 8 rows of
// `b`: B(k, n) = b[n * LD + k], so b0 = b[g * LD + k0 + 2t ..] and b1 = b[g * LD + k0 + 2t + 8 ..].
template <int LP, int HD, int LD, int NT>
__device__ __forceinline__ void mn_lp_mma_abt(float (&acc)[NT][4], const unsigned short *a,
                                              const unsigned short *b, int g, int t) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      acc[n][e] = 0.0f;
#pragma unroll
  for (int k = 0; k < HD; k += 16) {
    const unsigned short *a0 = a + g * LD + k + 2 * t, *a8 = a0 + 8 * LD;
    const unsigned fa[4] = {mn_lp_pair(a0), mn_lp_pair(a8), mn_lp_pair(a0 + 8), mn_lp_pair(a8 + 8)};
#pragma unroll
    for (int n = 0; n < NT; n++) {
      const unsigned short *bn = b + (n * 8 + g) * LD + k + 2 * t;
      mn_mma_lp<LP>(acc[n], fa, mn_lp_pair(bn), mn_lp_pair(bn + 8));
    }
  }
}

// acc[n] (16 x HD) += P (16 x 8 KT, C tiles in registers, rounded to LP) times the KT * 8 x HD
// rows of `b` (B(k, n) = b[k * LD + n], read with ldmatrix .trans: for k block j and the dims
// n0 .. n0 + 15, matrix 0 is rows 16j .. 16j + 7 at dim n0 (b0 of tile n0 / 8), matrix 1 rows
// 16j + 8 .. 16j + 15 (its b1), matrices 2 and 3 the same at dim n0 + 8).
template <int LP, int HD, int LD, int KT>
__device__ __forceinline__ void mn_lp_mma_pb(float (&acc)[HD / 8][4], const float (&p)[KT][4],
                                             const unsigned short *b, int lane) {
  const int mrow = (lane & 7) + 8 * ((lane >> 3) & 1), mcol = 8 * (lane >> 4);
#pragma unroll
  for (int j = 0; j < KT / 2; j++) {
    const unsigned fa[4] = {mn_lp_round2<LP>(p[2 * j][0], p[2 * j][1]),
                            mn_lp_round2<LP>(p[2 * j][2], p[2 * j][3]),
                            mn_lp_round2<LP>(p[2 * j + 1][0], p[2 * j + 1][1]),
                            mn_lp_round2<LP>(p[2 * j + 1][2], p[2 * j + 1][3])};
    const unsigned short *row = b + (16 * j + mrow) * LD + mcol;
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      unsigned fb[4];
      mn_ldsm_x4_trans(fb, row + n * 8);
      mn_mma_lp<LP>(acc[n], fa, fb[0], fb[1]);
      mn_mma_lp<LP>(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// ---- Operand policies of the kernel bodies below: the element type of shared tiles, their row
// stride LD, the loader of a head's rows, and the two products (abt: scores from two row tiles;
// pb: C tiles in registers times a row tile).

template <int PREC, int HD> struct mn_attn_tf32_ops {
  using elem = float;
  static constexpr int LD = HD + 4;
  template <int ROWS, class P>
  static __device__ __forceinline__ void load(float *dst, P src, long long stride, long long first,
                                              long long count) {
    mn_attn_load<HD, HD, ROWS, LD>(dst, src, stride, first, count);
  }
  template <int NT>
  static __device__ __forceinline__ void abt(float (&acc)[NT][4], const float *a, const float *b,
                                             int lane) {
    mn_mma_abt<PREC, HD, LD, NT>(acc, a, b, lane >> 2, lane & 3);
  }
  template <int KT>
  static __device__ __forceinline__ void pb(float (&acc)[HD / 8][4], const float (&p)[KT][4],
                                            const float *b, int lane) {
    mn_mma_pb<PREC, HD, LD, KT>(acc, p, b, lane >> 2, lane & 3);
  }
};

template <int LP, int HD> struct mn_attn_lp_ops {
  static_assert(HD % 16 == 0 && HD <= 128, "16-bit attention: head dims of 16 .. 128");
  using elem = unsigned short;
  static constexpr int LD = HD + 8;
  template <int ROWS, class P>
  static __device__ __forceinline__ void load(unsigned short *dst, P src, long long stride,
                                              long long first, long long count) {
    mn_attn_lp_load<LP, HD, ROWS, LD>(dst, src, stride, first, count);
  }
  template <int NT>
  static __device__ __forceinline__ void abt(float (&acc)[NT][4], const unsigned short *a,
                                             const unsigned short *b, int lane) {
    mn_lp_mma_abt<LP, HD, LD, NT>(acc, a, b, lane >> 2, lane & 3);
  }
  template <int KT>
  static __device__ __forceinline__ void pb(float (&acc)[HD / 8][4], const float (&p)[KT][4],
                                            const unsigned short *b, int lane) {
    mn_lp_mma_pb<LP, HD, LD, KT>(acc, p, b, lane);
  }
};

// Forward over one (query tile, head, batch) block: grid (ceil(T / 64), H, B); O: an operand
// policy. MODE MN_ATTN_OUTPUT writes the output: io = q, k, v, out; MN_ATTN_OUTPUT_STATS also
// the row statistics m and inv_l below: io = q, k, v, out, m, inv_l.
// MN_ATTN_STATS_DELTA and MN_ATTN_STATS, the backward pre-pass: io = q, k, v, dy, m, inv_l,
// delta; per (b, h, t) at (b * H + h) * T + t they write the base-2 row max m and 1 / sum,
// and MN_ATTN_STATS_DELTA also delta = sum_s P_s dP_s with dP_s = dy . v_s.
template <class O, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, class IO>
__device__ __forceinline__ void mn_attn_tc_fwd(const IO &io) {
  using E = typename O::elem;
  constexpr int BR = MN_ATTN_MMA_ROWS, BC = 64, LD = O::LD, NT = BC / 8;
  constexpr bool OUT = MODE == MN_ATTN_OUTPUT || MODE == MN_ATTN_OUTPUT_STATS;
  extern __shared__ __align__(16) float mn_attn_smem[];
  E *qs = reinterpret_cast<E *>(mn_attn_smem); // [BR][LD]
  E *ks = qs + BR * LD;                        // [BC][LD]
  E *vs = ks + BC * LD;                        // [BC][LD], all but MN_ATTN_STATS
  E *dys = vs + BC * LD;                       // [BR][LD], MN_ATTN_STATS_DELTA

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK>(io);
  const long long q0 = qt.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow = warp * 16;
  const float scale2 = mn_attn_log2e / sqrtf((float)HD);

  O::template load<BR>(qs, mn_in<0>(io) + qt.qoff, (long long)H * HD, q0, T);
  if constexpr (MODE == MN_ATTN_STATS_DELTA)
    O::template load<BR>(dys, mn_in<3>(io) + qt.qoff, (long long)H * HD, q0, T);
  float acc[OUT ? HD / 8 : 1][4], m[2], l[2], dsum[2];
  mn_attn_fill(m, mn_attn_neg_inf());
  mn_attn_fill(l, 0.0f);
  mn_attn_fill(dsum, 0.0f);
  mn_attn_fill(acc, 0.0f);
  const long long lo[2] = {mn_attn_seg_lo<T, MASK>(io, qt.b, q0 + wrow + g),
                           mn_attn_seg_lo<T, MASK>(io, qt.b, q0 + wrow + g + 8)};

  const long long kend = mn_attn_kend<BR, S, MASK>(q0);
  for (long long c0 = mn_attn_kstart<BR, BC, T, MASK>(io, qt.b, q0); c0 < kend; c0 += BC) {
    __syncthreads();
    O::template load<BC>(ks, qt.kb, (long long)KVH * HD, c0, S);
    if constexpr (MODE != MN_ATTN_STATS)
      O::template load<BC>(vs, qt.vb, (long long)KVH * HD, c0, S);
    __syncthreads();
    float s[NT][4], dp[MODE == MN_ATTN_STATS_DELTA ? NT : 1][4];
    O::abt(s, qs + wrow * LD, ks, lane);
    if constexpr (MODE == MN_ATTN_STATS_DELTA) O::abt(dp, dys + wrow * LD, vs, lane);
    float mx[2] = {mn_attn_neg_inf(), mn_attn_neg_inf()};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const long long r = q0 + wrow + g + (e >= 2 ? 8 : 0), c = c0 + n * 8 + 2 * t + (e & 1);
        const bool ok = c < S && (MASK == MN_ATTN_MASK_NONE || (c <= r && c >= lo[e >> 1]));
        s[n][e] = ok ? s[n][e] * scale2 : mn_attn_neg_inf();
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float alpha[2], m_sub[2], sum[2] = {0.0f, 0.0f}, dpart[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; i++) {
      // Key 0 is in the first tile and visible to every row, so m_new is finite, except for a
      // packed row whose segment starts in a later tile: it subtracts 0 until then (its l and
      // acc stay 0), so that -inf - -inf makes no NaN.
      const float m_new = fmaxf(m[i], mn_quad_max(mx[i]));
      m_sub[i] = MASK == MN_ATTN_MASK_SEGMENTS && m_new == mn_attn_neg_inf() ? 0.0f : m_new;
      alpha[i] = exp2f(m[i] - m_sub[i]);
      m[i] = m_new;
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        s[n][e] = exp2f(s[n][e] - m_sub[e >> 1]);
        sum[e >> 1] += s[n][e];
        if constexpr (MODE == MN_ATTN_STATS_DELTA)
          dpart[e >> 1] = fmaf(s[n][e], dp[n][e], dpart[e >> 1]);
      }
#pragma unroll
    for (int i = 0; i < 2; i++) {
      l[i] = l[i] * alpha[i] + mn_quad_sum(sum[i]);
      if constexpr (MODE == MN_ATTN_STATS_DELTA)
        dsum[i] = dsum[i] * alpha[i] + mn_quad_sum(dpart[i]);
    }
    if constexpr (OUT) {
#pragma unroll
      for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          acc[n][e] *= alpha[e >> 1];
      O::pb(acc, s, vs, lane);
    }
  }

  if constexpr (OUT) {
    mn_mma_store<HD>(mn_out<3>(io) + qt.qoff, (long long)H * HD, q0 + wrow, T, acc, 1.0f / l[0],
                     1.0f / l[1], g, t);
  }
  if constexpr (MODE != MN_ATTN_OUTPUT) {
    if (t == 0) {
      const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const long long r = q0 + wrow + g + 8 * i;
        if (r < T)
          mn_attn_store_stats<MODE == MN_ATTN_STATS_DELTA>(io, sb + r, m[i], l[i], dsum[i]);
      }
    }
  }
}

// dQ over one (query tile, head, batch) block, grid (ceil(T / 64), H, B); O: an operand policy;
// io = q, k, v, dy, m, inv_l, delta (MN_ATTN_STATS_DELTA pre-pass), dq. dS = P (dy . v - delta),
// dq = scale * sum dS k.
template <class O, int HD, long long T, long long S, int H, int KVH, int MASK, class IO>
__device__ __forceinline__ void mn_attn_tc_dq(const IO &io) {
  using E = typename O::elem;
  constexpr int BR = MN_ATTN_MMA_ROWS, BC = 64, LD = O::LD, NT = BC / 8;
  extern __shared__ __align__(16) float mn_attn_smem[];
  E *qs = reinterpret_cast<E *>(mn_attn_smem); // [BR][LD]
  E *dys = qs + BR * LD;                       // [BR][LD]
  E *ks = dys + BR * LD;                       // [BC][LD]
  E *vs = ks + BC * LD;                        // [BC][LD]

  const auto qt = mn_attn_qtile_of<BR, HD, T, S, H, KVH, MASK>(io);
  const long long q0 = qt.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow = warp * 16;
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;

  O::template load<BR>(qs, mn_in<0>(io) + qt.qoff, (long long)H * HD, q0, T);
  O::template load<BR>(dys, mn_in<3>(io) + qt.qoff, (long long)H * HD, q0, T);
  const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
  float rm[2], ril[2], rdelta[2], acc[HD / 8][4];
  long long lo[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mn_attn_load_stats<T, true>(io, sb, q0 + wrow + g + 8 * i, rm[i], ril[i], rdelta[i]);
    lo[i] = mn_attn_seg_lo<T, MASK>(io, qt.b, q0 + wrow + g + 8 * i);
  }
  mn_attn_fill(acc, 0.0f);

  const long long kend = mn_attn_kend<BR, S, MASK>(q0);
  for (long long c0 = mn_attn_kstart<BR, BC, T, MASK>(io, qt.b, q0); c0 < kend; c0 += BC) {
    __syncthreads();
    O::template load<BC>(ks, qt.kb, (long long)KVH * HD, c0, S);
    O::template load<BC>(vs, qt.vb, (long long)KVH * HD, c0, S);
    __syncthreads();
    float s[NT][4], dp[NT][4];
    O::abt(s, qs + wrow * LD, ks, lane);
    O::abt(dp, dys + wrow * LD, vs, lane);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = e >> 1;
        const bool ok =
            mn_attn_visible<T, S, MASK>(q0 + wrow + g + 8 * i, c0 + n * 8 + 2 * t + (e & 1), lo[i]);
        const float p = ok ? exp2f(s[n][e] * scale2 - rm[i]) * ril[i] : 0.0f;
        s[n][e] = p * (dp[n][e] - rdelta[i]);
      }
    O::pb(acc, s, ks, lane);
  }
  mn_mma_store<HD>(mn_out<7>(io) + qt.qoff, (long long)H * HD, q0 + wrow, T, acc, scale, scale, g,
                   t);
}

// dV (OUT MN_ATTN_DV), dK (MN_ATTN_DK) or both (MN_ATTN_DK_DV) over one (key tile, kv head, batch)
// block, grid (ceil(S / 64), KVH, B); O: an operand policy; io = q, k, v, dy, m, inv_l, delta, out.
// PACKED output rows hold the key's dK then its dV (attention_grad_kv). The block loops over its
// kv head's query heads and their query tiles (causal: from the tile holding query c0, since
// earlier queries never see these keys; packed: skipping the tiles that start past them), so
// every element is summed by one thread in a fixed order. Packed (MASK
// MN_ATTN_MASK_SEGMENTS): the positions are argument MN_ATTN_POSITIONS_ARG of every kernel here.
template <class O, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          class IO>
__device__ __forceinline__ void mn_attn_tc_dkv(const IO &io) {
  using E = typename O::elem;
  constexpr int BR = MN_ATTN_MMA_ROWS, BC = 64, LD = O::LD, NT = BC / 8, G = H / KVH;
  constexpr bool WANT_K = OUT != MN_ATTN_DV, WANT_V = OUT != MN_ATTN_DK;
  constexpr long long OS = (PACKED ? 2 : 1) * KVH * HD; // output row stride
  extern __shared__ __align__(16) float mn_attn_smem[];
  E *ks = reinterpret_cast<E *>(mn_attn_smem); // [BR][LD]
  E *vs = ks + BR * LD;                        // [BR][LD], dK only
  E *qs = vs + (WANT_K ? BR * LD : 0);         // [BC][LD]
  E *dys = qs + BC * LD;                       // [BC][LD]
  float *st =
      reinterpret_cast<float *>(dys + BC * LD);   // m, inv_l, delta of the query tile: [3][BC]
  int *lo = reinterpret_cast<int *>(st + 3 * BC); // packed: each query's first key, [BC]

  const mn_attn_kvtile kt = mn_attn_kvtile_of<BR, HD, S, KVH>();
  const long long c0 = kt.c0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wrow = warp * 16;
  const float scale = 1.0f / sqrtf((float)HD), scale2 = mn_attn_log2e * scale;

  O::template load<BR>(ks, mn_in<1>(io) + kt.kvoff, (long long)KVH * HD, c0, S);
  if constexpr (WANT_K)
    O::template load<BR>(vs, mn_in<2>(io) + kt.kvoff, (long long)KVH * HD, c0, S);
  float dk[WANT_K ? HD / 8 : 1][4], dv[WANT_V ? HD / 8 : 1][4];
  mn_attn_fill(dk, 0.0f);
  mn_attn_fill(dv, 0.0f);

  const long long r_start = MASK != MN_ATTN_MASK_NONE ? c0 / BC * BC : 0;
  const long long c_last = (c0 + BR < S ? c0 + BR : S) - 1;
  for (int gq = 0; gq < G; gq++) {
    const mn_attn_head qh = mn_attn_head_of<HD, T, H>(kt.b, kt.kvh * G + gq);
    for (long long r0 = r_start; r0 < T; r0 += BC) {
      // Packed: a tile whose queries all start past these keys is skipped.
      if (!mn_attn_q_tile_live<BC, T, MASK>(io, kt.b, r0, c_last)) continue;
      __syncthreads(); // every thread is done with the previous query tile
      O::template load<BC>(qs, mn_in<0>(io) + qh.qoff, (long long)H * HD, r0, T);
      O::template load<BC>(dys, mn_in<3>(io) + qh.qoff, (long long)H * HD, r0, T);
      for (int j = threadIdx.x; j < BC; j += MN_ATTN_BLOCK) {
        mn_attn_load_stats<T, WANT_K>(io, qh.sb, r0 + j, st[j], st[BC + j], st[2 * BC + j]);
        if constexpr (MASK == MN_ATTN_MASK_SEGMENTS)
          lo[j] = (int)mn_attn_seg_lo<T, MASK>(io, kt.b, r0 + j);
      }
      __syncthreads();
      // Transposed scores: rows are this warp's keys, columns the tile's queries.
      float p[NT][4];
      O::abt(p, ks + wrow * LD, qs, lane);
      float dp[WANT_K ? NT : 1][4];
      if constexpr (WANT_K) O::abt(dp, vs + wrow * LD, dys, lane);
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int j = n * 8 + 2 * t + (e & 1);
          const long long c = c0 + wrow + g + (e >= 2 ? 8 : 0);
          const bool ok =
              mn_attn_visible<T, S, MASK>(r0 + j, c, MASK == MN_ATTN_MASK_SEGMENTS ? lo[j] : 0);
          p[n][e] = ok ? exp2f(p[n][e] * scale2 - st[j]) * st[BC + j] : 0.0f;
        }
      if constexpr (WANT_V) O::pb(dv, p, dys, lane);
      if constexpr (WANT_K) {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            p[n][e] *= dp[n][e] - st[2 * BC + n * 8 + 2 * t + (e & 1)];
        O::pb(dk, p, qs, lane);
      }
    }
  }
  const auto out = mn_out<7>(io) + kt.b * S * OS + kt.kvh * HD;
  if constexpr (WANT_K) mn_mma_store<HD>(out, OS, c0 + wrow, S, dk, scale, scale, g, t);
  if constexpr (WANT_V)
    mn_mma_store<HD>(out + (PACKED ? KVH * HD : 0), OS, c0 + wrow, S, dv, 1.0f, 1.0f, g, t);
}

// ---- The kernels: TF32 (PREC, an mn_attn_prec) and 16-bit operands (LP: MN_DEV_BF16 or
// MN_DEV_F16), each over the bodies above.

template <int PREC, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, class IO>
__device__ void mn_attn_mma_fwd(const IO &io) {
  mn_attn_tc_fwd<mn_attn_tf32_ops<PREC, HD>, HD, T, S, H, KVH, MASK, MODE>(io);
}
template <int PREC, int HD, long long T, long long S, int H, int KVH, int MASK, class IO>
__device__ void mn_attn_mma_dq(const IO &io) {
  mn_attn_tc_dq<mn_attn_tf32_ops<PREC, HD>, HD, T, S, H, KVH, MASK>(io);
}
template <int PREC, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT,
          bool PACKED, class IO>
__device__ void mn_attn_mma_dkv(const IO &io) {
  mn_attn_tc_dkv<mn_attn_tf32_ops<PREC, HD>, HD, T, S, H, KVH, MASK, OUT, PACKED>(io);
}

template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, class IO>
__device__ void mn_attn_lp_fwd(const IO &io) {
  mn_attn_tc_fwd<mn_attn_lp_ops<LP, HD>, HD, T, S, H, KVH, MASK, MODE>(io);
}
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, class IO>
__device__ void mn_attn_lp_dq(const IO &io) {
  mn_attn_tc_dq<mn_attn_lp_ops<LP, HD>, HD, T, S, H, KVH, MASK>(io);
}
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int OUT, bool PACKED,
          class IO>
__device__ void mn_attn_lp_dkv(const IO &io) {
  mn_attn_tc_dkv<mn_attn_lp_ops<LP, HD>, HD, T, S, H, KVH, MASK, OUT, PACKED>(io);
}
