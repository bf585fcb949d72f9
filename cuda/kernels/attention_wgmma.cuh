// Hopper's warpgroup products (wgmma) for the pipelined attention kernels of attention_pipe.cuh,
// and the forward built on them. When the kernels are compiled for sm_90a and a launch fits (16-bit
// q, k, v (and dy) of the LP type, head dim 64, 4 warps), mn_attn_pipe_fwd, mn_attn_pipe_dq and
// mn_attn_pipe_dkv hand their block to the kernel here or in attention_wgmma_bwd.cuh: same grid,
// same shared memory (or less), same outputs and statistics.
//
// The 4 warps are one warpgroup; a product is m64 (the 64 rows of a block, or of one row block of
// the forward's), warp w holding its rows 16w .. 16w + 15 in the m16n8k16 layout the other
// kernels use: the accumulator of an m64n64 product is 32 floats a thread, element 4n + e being
// C tile n, element e (viewed as float[8][4], the mma kernels' fragments), and an A operand in
// registers is the m16n8k16 A fragment of each 16-wide k step.
//
// Every tile that a product reads through a descriptor is kept in shared memory in the 128-byte
// swizzle: row r (HD = 64 dims, 128 bytes) at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8),
// the tile 1024-byte aligned. The 8 threads that copy a row write 8 distinct bank groups, and the
// tile's reads from global memory are whole 128-byte rows. One copy serves both ways a tile is
// read: K-major with K the dims (S = Q K^T; a k step starts 32 bytes further into the rows, the
// stride between groups of 8 rows 1024 bytes), and as a transposed, MN-major B with K the rows
// (O += P V; a k step starts 16 rows further, the same stride). benchmarks/probes/wgmma_tile.cu
// checked both against the CPU, for A read from shared memory too, and measured the products at
// the rate of the unswizzled core layout (which, copied from global memory, took twice the L2
// requests or conflicting stores: docs/performance.md). B is read once for the warpgroup, where
// mma.sync has each warp read it by ldmatrix.
//
// Operands held in registers across the tile loop are not used as A (ptxas 13.0 gave such
// fragments' registers to P: the first wgmma forward, docs/performance.md); A comes from
// registers only for P and dS, made anew every tile. Accumulator registers are pinned after each
// wait (mn_wg_pin) so that no read of them is scheduled before the products are done.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MN_ATTN_WGMMA 1
#else
#define MN_ATTN_WGMMA 0
#endif

// A shared-memory matrix descriptor in the 128-byte swizzle (layout type 1, bits 62-63): the
// start, and the stride byte offset between groups of 8 rows, in 16-byte units; the leading
// offset is unused by these layouts (1).
__device__ __forceinline__ unsigned long long mn_wg_desc(const void *smem) {
  const unsigned long long a = (unsigned)__cvta_generic_to_shared(smem);
  return ((a & 0x3ffffull) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
         (1ull << 62);
}
// The k step k (16 wide) of a tile: read K-major along the dims, or as a transposed B along its
// rows.
__device__ __forceinline__ unsigned long long mn_wg_kmajor(const void *tile, int k) {
  return mn_wg_desc(static_cast<const unsigned char *>(tile) + 32 * k);
}
__device__ __forceinline__ unsigned long long mn_wg_rows(const void *tile, int k) {
  return mn_wg_desc(static_cast<const unsigned char *>(tile) + 2048 * k);
}
// The block's dynamic shared memory from its first 1024-byte boundary (the launches leave 1 KB
// spare for this).
__device__ __forceinline__ unsigned char *mn_wg_smem(float *smem) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
  return reinterpret_cast<unsigned char *>(smem) + ((1024 - (a & 1023)) & 1023);
}

__device__ __forceinline__ void mn_wg_fence() {
#if MN_ATTN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mn_wg_commit() {
#if MN_ATTN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of the warpgroup's committed groups of products are in flight.
template <int N> __device__ __forceinline__ void mn_wg_wait() {
#if MN_ATTN_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Waits for this thread's copies of the tile the loop reads now (all but the last committed
// group) and makes every thread's visible to the block and to the tensor cores: the copies
// wrote through the generic proxy, wgmma reads through the async one.
__device__ __forceinline__ void mn_wg_tile_ready() {
  mn_cp_wait<1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

// Orders every later use of the accumulator d after the preceding wait (and every earlier write
// before the products that follow): the compiler sees d rewritten here.
__device__ __forceinline__ void mn_wg_pin(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; i++)
    asm volatile("" : "+f"(d[i])::"memory");
}
// The accumulator's C tiles as the mma kernels' fragments.
__device__ __forceinline__ float (&mn_wg_tiles(float (&d)[32]))[8][4] {
  return reinterpret_cast<float(&)[8][4]>(d);
}

#define MN_WG_D32                                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MN_WG_D32_OUT(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
// d (m64n64, f32) = a (registers) * B (a transposed, MN-major descriptor) + (accumulate ? d : 0).
template <int LP>
__device__ __forceinline__ void mn_wg_rs(float (&d)[32], const unsigned (&a)[4],
                                         unsigned long long b, int accumulate) {
#if MN_ATTN_WGMMA
  if constexpr (LP == MN_DEV_BF16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MN_WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MN_WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}
// d (m64n64, f32) = A (a K-major descriptor) * B (K-major) + (accumulate ? d : 0).
template <int LP>
__device__ __forceinline__ void mn_wg_ss(float (&d)[32], unsigned long long a, unsigned long long b,
                                         int accumulate) {
#if MN_ATTN_WGMMA
  if constexpr (LP == MN_DEV_BF16)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MN_WG_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MN_WG_D32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : MN_WG_D32_OUT(d)
                 : "l"(a), "l"(b), "r"(accumulate));
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}
#undef MN_WG_D32
#undef MN_WG_D32_OUT

// d = the product of two tiles over all HD dims (A rows by B rows transposed).
template <int LP, int HD>
__device__ __forceinline__ void mn_wg_abt(float (&d)[32], const void *a, const void *b) {
#pragma unroll
  for (int k = 0; k < HD / 16; k++)
    mn_wg_ss<LP>(d, mn_wg_kmajor(a, k), mn_wg_kmajor(b, k), k > 0);
}
// d += p (a 64 x 64 accumulator, rounded to LP) times the 64 rows of a tile.
template <int LP, int HD>
__device__ __forceinline__ void mn_wg_pb(float (&d)[32], const unsigned (&p)[4][4], const void *b) {
  static_assert(HD == 64, "one m64n64 product a k step");
#pragma unroll
  for (int k = 0; k < 4; k++)
    mn_wg_rs<LP>(d, p[k], mn_wg_rows(b, k), 1);
}
// An accumulator's keys (or queries) 16k .. 16k + 15 as the A fragments of the next product:
// C tiles 2k and 2k + 1, rounded to LP.
template <int LP>
__device__ __forceinline__ void mn_wg_pack(unsigned (&a)[4][4], const float (&s)[32]) {
#pragma unroll
  for (int k = 0; k < 4; k++)
#pragma unroll
    for (int i = 0; i < 4; i++)
      a[k][i] = mn_lp_round2<LP>(s[8 * k + 2 * i], s[8 * k + 2 * i + 1]);
}

// Rows first .. first + 63 of one head (rows `stride` elements apart, `first` a multiple of 64)
// into a swizzled tile, rows at or past COUNT as zeros; cp.async, committed by the caller.
template <int HD, int NTH, long long COUNT, class P>
__device__ __forceinline__ void mn_wg_load_tile(unsigned char *dst, P src, long long stride,
                                                long long first) {
  static_assert(HD == 64 && NTH % 8 == 0 && 64 % (NTH / 8) == 0, "whole 128-byte rows a step");
  constexpr int STEP = NTH / 8; // rows a step
  constexpr bool FULL = COUNT % 64 == 0;
  const int r = (int)threadIdx.x >> 3, c = (int)threadIdx.x & 7;
  const auto base = src + (first + r) * stride + 8 * c;
  // STEP is a multiple of 8, so a row's place in its group of 8 is the same at every step.
  static_assert(STEP % 8 == 0, "the swizzle of a thread's chunk fixed across steps");
  unsigned char *d = dst + r * 128 + ((c ^ (r & 7)) << 4);
#pragma unroll
  for (int k = 0; k < 64 / STEP; k++) {
    const bool ok = FULL || first + r + k * STEP < COUNT;
    mn_cp_async16(d + k * STEP * 128, (ok ? base + k * STEP * stride : src).p, ok);
  }
}

// Whether the kernels of a launch can take the wgmma path: PS, the pointer types of their 16-bit
// operands, all LP's.
template <int LP, int HD, int WARPS, class... PS> __device__ constexpr bool mn_attn_wg_fits() {
  return MN_ATTN_WGMMA && HD == 64 && WARPS == 4 && (mn_attn_lp_same<LP, PS>::value && ...);
}

// The forward (see mn_attn_pipe_fwd_mma). Row block r of the block (RW of them, 64 rows each) is
// one m64 product. The products of every row block are issued at once, each its own group, so the
// softmax of block r runs while the tensor cores multiply the later blocks.
template <int LP, int HD, long long T, long long S, int H, int KVH, int MASK, int MODE, int WARPS,
          int RW, int QKV, class IO>
__device__ void mn_attn_wg_fwd(const IO &io) {
  constexpr int BR = 64 * RW, BC = 64, LD = HD + 8, NTH = 32 * WARPS;
  constexpr int TILE = BC * HD * 2; // bytes of one tile
  constexpr long long QS = mn_attn_q_stride<QKV, HD, H, KVH>(),
                      KS = mn_attn_kv_stride<QKV, HD, H, KVH>();
  static_assert(WARPS == 4 && HD == 64, "one warpgroup, head dim 64");
  static_assert((BR * LD * 2) % 1024 == 0 && RW * TILE <= BR * LD * 2,
                "Q where the padded rows were; K and V 1024-byte aligned");
  extern __shared__ __align__(16) float mn_attn_smem[];
  unsigned char *qc = mn_wg_smem(mn_attn_smem); // RW tiles
  unsigned char *kv = qc + BR * LD * 2;         // per stage: K, V

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
    mn_wg_tile_ready();
    const int c0 = j * BC;
    const unsigned char *ks = kv + (j & 1) * 2 * TILE, *vs = ks + TILE;
    // Every row block multiplies every tile (a block wholly before the tile masks it all).
    float s[RW][32];
    mn_wg_fence();
#pragma unroll
    for (int r = 0; r < RW; r++) {
      mn_wg_abt<LP, HD>(s[r], qc + r * TILE, ks);
      mn_wg_commit();
    }
    unsigned pa[RW][4][4];
#pragma unroll
    for (int r = 0; r < RW; r++) {
      // Done: the scores of blocks 0 .. r. In flight: those of the later blocks, and the P V
      // products of the earlier ones.
      mn_wg_wait<RW - 1>();
      mn_wg_pin(s[r]);
      const int rw = q0 + 64 * r + 16 * warp; // the warp's first row in block r
      if (c0 + BC > (int)S || (MASK == MN_ATTN_MASK_CAUSAL && c0 + BC - 1 > rw))
        mn_pipe_set_unseen(
            mn_wg_tiles(s[r]), rw, c0, lane,
            [](int q, int c) { return mn_pipe_sees<MASK>(q, c, (int)S); }, mn_attn_neg_inf());
      mn_pipe_softmax_tile(mn_wg_tiles(s[r]), mn_wg_tiles(o[r]), m[r], l[r], scale2);
      mn_wg_pack<LP>(pa[r], s[r]);
      mn_wg_fence();
      mn_wg_pb<LP, HD>(o[r], pa[r], vs);
      mn_wg_commit();
    }
    mn_wg_wait<0>();
#pragma unroll
    for (int r = 0; r < RW; r++)
      mn_wg_pin(o[r]);
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < RW; r++) {
    // Each lane summed its own columns of the rows: the row sums are over the 4 lanes of a quad.
    const float l0 = mn_quad_sum(l[r][0]), l1 = mn_quad_sum(l[r][1]);
    const int row = q0 + 64 * r + 16 * warp;
    mn_mma_store<HD>(mn_out<3>(io) + qt.yoff, (long long)H * HD, row, T, mn_wg_tiles(o[r]),
                     1.0f / l0, 1.0f / l1, g, t);
    if constexpr (MODE == MN_ATTN_OUTPUT_STATS) {
      if (t == 0) {
        const long long sb = mn_attn_sb<T, H>(qt.b, qt.h);
        if (row + g < T) mn_attn_store_stats<false>(io, sb + row + g, m[r][0], l0, 0.0f);
        if (row + g + 8 < T) mn_attn_store_stats<false>(io, sb + row + g + 8, m[r][1], l1, 0.0f);
      }
    }
  }
}
