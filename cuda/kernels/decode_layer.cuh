// A Llama decoder layer for one token a sequence (llama_decode_layer, host/decode_layer.h) in
// five kernels, launched by cuda/lower_decode_layer.c:
//   1. mn_dl_qkv: rms_norm, the q, k and v products, RoPE; k and v into row pos of the caches
//   2. mn_attn_decode_part (attention_decode.cuh): the cached attention, split along the cache, the
//      last split of each head merging the splits
//   3. mn_dl_residual_product: the o product, the residual
//   4. mn_dl_mlp_up: rms_norm, the gate and up products, SwiGLU
//   5. mn_dl_residual_product: the down product, the residual
// Kernels 1, 3, 4 and 5 start as programmatic dependents of the kernel before them (common.cuh
// mn_overlap_begin / mn_overlap_wait): each loads its weight rows and norm weights, which
// nothing writes, while that kernel finishes, and waits before it reads anything else. After the
// wait a kernel issues every load it needs at once (its input rows, the position, the
// residual), so that it pays one trip to L2, not one per value it reads.
// At batch 1-8 every product is a matrix-vector product bound by reading the weights once:
// one warp computes one output feature (two in the first kernel: a RoPE pair; two at batch 4
// and more in the residual products) for all B rows, each lane reading 16-byte chunks of the
// weight row, with the B normalized input rows in shared memory. Intermediates stay in fp32
// (scratch); what the unfused layer rounds to the session's precision between its ops, this one
// does not.

#define MN_DL_WARPS 8

template <int S> __device__ __forceinline__ float mn_dl_load1(const void *w, long long at) {
  if constexpr (S == MN_DEV_F32)
    return static_cast<const float *>(w)[at];
  else
    return mn_lp_load<S>(static_cast<const unsigned short *>(w)[at]);
}

// This lane's share of one weight row of K values stored as S, loaded into registers before its
// products are needed (the weights do not depend on the layer's input, so their loads overlap
// the norm or the attention merge that comes first). With K a multiple of 8 a lane holds
// 16-byte chunks c = lane, lane + 32, ..; else it loads nothing and dot() reads as it goes.
template <int K, int S> struct mn_dl_wrow {
  static constexpr bool VEC = K % 8 == 0;
  static constexpr int CH = K / 8, NIT = VEC ? (CH + 31) / 32 : 1;
  static constexpr int WORDS = S == MN_DEV_F32 ? 2 : 1; // uint4s a chunk
  static constexpr int ROW_K = K;
  static constexpr bool CHUNKED = VEC;
  uint4 u[NIT * WORDS];
  const void *w;
  long long row;

  __device__ __forceinline__ void load(const void *wp, long long r) {
    w = wp;
    row = r;
    if constexpr (VEC) {
      const int lane = threadIdx.x & 31;
#pragma unroll
      for (int it = 0; it < NIT; it++) {
        const int c = it * 32 + lane;
        if (CH % 32 == 0 || c < CH) {
#pragma unroll
          for (int j = 0; j < WORDS; j++)
            u[it * WORDS + j] = reinterpret_cast<const uint4 *>(
                static_cast<const char *>(wp) + (row * K + (long long)c * 8) * (WORDS * 2))[j];
        }
      }
    }
  }

  __device__ __forceinline__ void settle() {} // 16-bit weights convert where they are used

  // Chunk it of this lane: whether it is in the row, where its two runs of four weights sit
  // in the row (e0, e1), and the weights as floats.
  __device__ __forceinline__ bool has(int it) const {
    return CH % 32 == 0 || it * 32 + (int)(threadIdx.x & 31) < CH;
  }
  __device__ __forceinline__ void runs(int it, int &e0, int &e1) const {
    e0 = (it * 32 + (int)(threadIdx.x & 31)) * 8;
    e1 = e0 + 4;
  }
  __device__ __forceinline__ void weights(int it, float f[8]) const {
    if constexpr (S == MN_DEV_F32) {
      const uint4 p = u[it * WORDS], q = u[it * WORDS + 1];
      f[0] = __uint_as_float(p.x), f[1] = __uint_as_float(p.y), f[2] = __uint_as_float(p.z);
      f[3] = __uint_as_float(p.w), f[4] = __uint_as_float(q.x), f[5] = __uint_as_float(q.y);
      f[6] = __uint_as_float(q.z), f[7] = __uint_as_float(q.w);
    } else {
      const unsigned words[4] = {u[it].x, u[it].y, u[it].z, u[it].w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        f[2 * j] = mn_lp_load<S>((unsigned short)(words[j] & 0xffffu));
        f[2 * j + 1] = mn_lp_load<S>((unsigned short)(words[j] >> 16));
      }
    }
  }

  // K not a multiple of 8: acc[b] += this lane's share of the row . a[b, :], read as it goes.
  template <int B> __device__ __forceinline__ void dot_scalar(const float *a, float acc[B]) const {
    for (int i = threadIdx.x & 31; i < K; i += 32) {
      const float wv = mn_dl_load1<S>(w, row * K + i);
#pragma unroll
      for (int b = 0; b < B; b++)
        acc[b] = fmaf(wv, a[b * K + i], acc[b]);
    }
  }
};

// A quantized weight row (host/quant.h: FMT an mn_quant, GROUP the affine group), with the
// interface of mn_dl_wrow: the row read as chunks of 8 weights, 4 or 8 bytes of codes and the
// block's f16 scale (and minimum or bias) each, lane l taking chunks l, l + 32, ..; load() reads
// every chunk of the lane into registers at once, so that a warp's row is a few coalesced
// transactions in flight before the activations are ready, and dot() dequantizes them there.
// A chunk's weights are two runs of four: consecutive for 8-bit codes; for 4-bit codes, the low
// and high nibbles of its bytes (GGML blocks: weights j and j + 16; affine groups: j and
// j + GROUP / 2).
template <int K, int FMT, int GROUP> struct mn_dl_qrow {
  static constexpr int BLOCK = FMT == 3 || FMT == 4 ? GROUP : 32;
  static constexpr int BLOCK_BYTES = FMT == 1   ? 34
                                     : FMT == 2 ? 18
                                     : FMT == 5 ? 20
                                     : FMT == 3 ? 4 + GROUP
                                                : 4 + GROUP / 2;
  static constexpr long long ROW_BYTES = ((long long)K / BLOCK * BLOCK_BYTES + 3) / 4 * 4;
  static constexpr bool WIDE = FMT == 1 || FMT == 3; // 8-bit codes: 8 bytes a chunk
  static constexpr int CPB = BLOCK / 8, NCH = K / 8, NIT = (NCH + 31) / 32, ROW_K = K;
  static constexpr bool CHUNKED = true;
  float wf[NIT][8]; // the lane's weights, dequantized as soon as they arrive

  // One chunk: its block's scale (and minimum or bias) and its codes, as loaded.
  struct chunk {
    unsigned head, code[WIDE ? 2 : 1];
  };
  static __device__ __forceinline__ unsigned u16(const unsigned char *p) {
    return *reinterpret_cast<const unsigned short *>(p);
  }
  static __device__ __forceinline__ unsigned u32(const unsigned char *p) {
    return *reinterpret_cast<const unsigned *>(p);
  }

  // Chunk c of the row at row (ROW_BYTES bytes).
  static __device__ __forceinline__ chunk load_chunk(const unsigned char *row, int c) {
    const int t = c % CPB;
    const unsigned char *b = row + (long long)(c / CPB) * BLOCK_BYTES;
    chunk k;
    if constexpr (FMT == 1) { // Q8_0: f16 scale, 32 int8 (2-byte aligned)
      k.head = u16(b);
      k.code[0] = u16(b + 2 + 8 * t) | (u16(b + 4 + 8 * t) << 16);
      k.code[1] = u16(b + 6 + 8 * t) | (u16(b + 8 + 8 * t) << 16);
    } else if constexpr (FMT == 2) { // Q4_0: f16 scale, 16 bytes of nibbles
      k.head = u16(b);
      k.code[0] = u16(b + 2 + 4 * t) | (u16(b + 4 + 4 * t) << 16);
    } else if constexpr (FMT == 5) { // Q4_1: f16 scale and minimum, 16 bytes of nibbles
      k.head = u32(b);
      k.code[0] = u32(b + 4 + 4 * t);
    } else if constexpr (FMT == 3) { // affine int8: f16 scale and bias, GROUP bytes
      k.head = u32(b);
      k.code[0] = u32(b + 4 + 8 * t);
      k.code[1] = u32(b + 8 + 8 * t);
    } else { // affine int4: f16 scale and bias, GROUP / 2 bytes of nibbles
      k.head = u32(b);
      k.code[0] = u32(b + 4 + 4 * t);
    }
    return k;
  }

  // Where chunk c's two runs of four weights sit in the row.
  static __device__ __forceinline__ void chunk_runs(int c, int &e0, int &e1) {
    const int t = c % CPB;
    e0 = (c / CPB) * BLOCK + (WIDE ? 8 * t : 4 * t);
    e1 = e0 + (WIDE ? 4 : BLOCK / 2);
  }

  // A chunk's eight weights, rounded as the CPU reference rounds them.
  static __device__ __forceinline__ void dequant(const chunk &k, float w[8]) {
    const float d = mn_qmm_half(k.head);
    const float m = FMT == 2 || FMT == 1 ? 0.0f : mn_qmm_half(k.head >> 16);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if constexpr (WIDE) {
        const unsigned lo = (k.code[0] >> (8 * j)) & 255u, hi = (k.code[1] >> (8 * j)) & 255u;
        if constexpr (FMT == 1) {
          w[j] = __fmul_rn((float)(signed char)lo, d);
          w[j + 4] = __fmul_rn((float)(signed char)hi, d);
        } else {
          w[j] = __fadd_rn(__fmul_rn(d, (float)lo), m);
          w[j + 4] = __fadd_rn(__fmul_rn(d, (float)hi), m);
        }
      } else {
        const unsigned byte = (k.code[0] >> (8 * j)) & 255u;
        const int lo = (int)(byte & 15u), hi = (int)(byte >> 4);
        if constexpr (FMT == 2) {
          w[j] = __fmul_rn(d, (float)(lo - 8));
          w[j + 4] = __fmul_rn(d, (float)(hi - 8));
        } else {
          w[j] = __fadd_rn(__fmul_rn(d, (float)lo), m);
          w[j + 4] = __fadd_rn(__fmul_rn(d, (float)hi), m);
        }
      }
    }
  }

  __device__ __forceinline__ void load(const void *wp, long long r) {
    const unsigned char *row = static_cast<const unsigned char *>(wp) + r * ROW_BYTES;
    const int lane = threadIdx.x & 31;
    chunk k[NIT];
#pragma unroll
    for (int it = 0; it < NIT; it++)
      if (has(it)) k[it] = load_chunk(row, it * 32 + lane);
#pragma unroll
    for (int it = 0; it < NIT; it++)
      if (has(it)) dequant(k[it], wf[it]);
  }

  // Makes the dequantized weights exist here, before the programmatic wait that the caller
  // comes to next: the compiler would otherwise leave the dequantization where the weights are
  // used, after the wait, on the path of every kernel before the next.
  __device__ __forceinline__ void settle() {
#pragma unroll
    for (int it = 0; it < NIT; it++)
#pragma unroll
      for (int j = 0; j < 8; j++)
        asm volatile("" : "+f"(wf[it][j]));
  }
  __device__ __forceinline__ void weights(int it, float w[8]) const {
#pragma unroll
    for (int j = 0; j < 8; j++)
      w[j] = wf[it][j];
  }
  __device__ __forceinline__ bool has(int it) const {
    return NCH % 32 == 0 || it * 32 + (int)(threadIdx.x & 31) < NCH;
  }
  __device__ __forceinline__ void runs(int it, int &e0, int &e1) const {
    chunk_runs(it * 32 + (int)(threadIdx.x & 31), e0, e1);
  }
};

// acc_r[b] += this lane's share of row r . a[b, :] for the B rows of a ([B][K] floats, 16-byte
// aligned) and the R weight rows w[0..R-1] of one type (mn_dl_wrow or mn_dl_qrow, loaded); each
// activation read from shared memory serves all R rows. The caller sums the warp.
template <int B, int R, class W>
__device__ __forceinline__ void mn_dl_dot(const W *const (&w)[R], const float *a,
                                          float (&acc)[R][B]) {
  constexpr int K = W::ROW_K;
  if constexpr (!W::CHUNKED) {
#pragma unroll
    for (int k = 0; k < R; k++)
      w[k]->template dot_scalar<B>(a, acc[k]);
  } else {
#pragma unroll
    for (int it = 0; it < W::NIT; it++) {
      if (!w[0]->has(it)) continue;
      int e0, e1;
      w[0]->runs(it, e0, e1);
      float f[R][8];
#pragma unroll
      for (int k = 0; k < R; k++)
        w[k]->weights(it, f[k]);
#pragma unroll
      for (int b = 0; b < B; b++) {
        const float4 x0 = *reinterpret_cast<const float4 *>(a + b * K + e0);
        const float4 x1 = *reinterpret_cast<const float4 *>(a + b * K + e1);
#pragma unroll
        for (int k = 0; k < R; k++) {
          float t = acc[k][b];
          t = fmaf(f[k][0], x0.x, t);
          t = fmaf(f[k][1], x0.y, t);
          t = fmaf(f[k][2], x0.z, t);
          t = fmaf(f[k][3], x0.w, t);
          t = fmaf(f[k][4], x1.x, t);
          t = fmaf(f[k][5], x1.y, t);
          t = fmaf(f[k][6], x1.z, t);
          acc[k][b] = fmaf(f[k][7], x1.w, t);
        }
      }
    }
  }
}

// The row type of a weight stored as S (FMT 0) or quantized in format FMT.
template <int K, int S, int FMT, int GROUP, bool Q = (FMT != 0)> struct mn_dl_row {
  using type = mn_dl_wrow<K, S>;
};
template <int K, int S, int FMT, int GROUP> struct mn_dl_row<K, S, FMT, GROUP, true> {
  using type = mn_dl_qrow<K, FMT, GROUP>;
};

template <int B> __device__ __forceinline__ void mn_dl_warp_sums(float acc[B]) {
#pragma unroll
  for (int b = 0; b < B; b++)
    acc[b] = mn_warp_sum(acc[b]);
}

// dst[0, N) = src[0, N) (a global array of any storage) in shared memory, by the whole block: a
// thread's loads are issued in batches of eight before their stores, as a generic pointer
// might alias the shared array and would otherwise order each load after the store before it.
template <int N, class P> __device__ __forceinline__ void mn_dl_stage(float *dst, P src) {
  constexpr int T = MN_DL_WARPS * 32, VEC = N % 4 == 0 ? 4 : 1, NV = N / VEC;
  constexpr int IT = (NV + T - 1) / T, BATCH = 8;
#pragma unroll 1
  for (int it0 = 0; it0 < IT; it0 += BATCH) {
    float4 v[BATCH];
#pragma unroll
    for (int u = 0; u < BATCH; u++) {
      const int q = (it0 + u) * T + (int)threadIdx.x;
      if (it0 + u < IT && (NV % T == 0 || q < NV)) {
        if constexpr (VEC == 4)
          v[u] = mn_ld4(src, q);
        else
          v[u].x = src[q];
      }
    }
#pragma unroll
    for (int u = 0; u < BATCH; u++) {
      const int q = (it0 + u) * T + (int)threadIdx.x;
      if (it0 + u < IT && (NV % T == 0 || q < NV)) {
        if constexpr (VEC == 4)
          reinterpret_cast<float4 *>(dst)[q] = v[u];
        else
          dst[q] = v[u].x;
      }
    }
  }
}

// a[b, :] = rms_norm(a[b, :]) * w in place for the B rows of a [B][C] in shared memory (staged
// and synchronized by the caller): warp b normalizes row b. w: the norm's weights, in shared
// memory or global. The caller synchronizes the block before reading a.
template <int C, int B, class WP>
__device__ __forceinline__ void mn_dl_rms_rows(WP w, float eps, float *a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int b = warp; b < B; b += MN_DL_WARPS) {
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32)
      ss = fmaf(a[b * C + i], a[b * C + i], ss);
    const float inv = rsqrtf(mn_warp_sum(ss) / (float)C + eps);
    for (int i = lane; i < C; i += 32)
      a[b * C + i] = a[b * C + i] * inv * w[i];
  }
}

// out[b, r + k] = res[b, r + k] + row k of the warp (w[k]) . a[b, :] for the B rows of a; rv[k]:
// res[lane, r + k] for lanes below B, read early by the caller.
template <int C, int B, int R, class WR, class OP>
__device__ __forceinline__ void mn_dl_residual_rows(const WR (&w)[R], const float *a,
                                                    const float (&rv)[R], OP out, long long r) {
  float y[R][B];
  mn_attn_fill(y, 0.0f);
  const WR *rows[R];
#pragma unroll
  for (int k = 0; k < R; k++)
    rows[k] = &w[k];
  mn_dl_dot<B>(rows, a, y);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < R; k++) {
    mn_dl_warp_sums<B>(y[k]);
#pragma unroll
    for (int b = 0; b < B; b++)
      if (lane == b && r + k < C) out[(long long)b * C + r + k] = rv[k] + y[k][b];
  }
}

// The normalized rows of a kernel's input: x [B][C] (argument 0) staged into a, then
// rms_norm(x) * w in place, with w (argument 1) staged at a + B * C before the wait when NWS
// (the host found room for it), else read from global memory after. stage_norm_w() before the
// wait, normalize() after it; the block is synchronized when normalize() returns.
template <int C, int B, bool NWS, class IO> struct mn_dl_norm_input {
  static __device__ __forceinline__ void stage_norm_w(const IO &io, float *a) {
    if constexpr (NWS) mn_dl_stage<C>(a + B * C, mn_in<1>(io));
  }
  static __device__ __forceinline__ void normalize(const IO &io, float eps, float *a) {
    mn_dl_stage<B * C>(a, mn_in<0>(io));
    __syncthreads();
    if constexpr (NWS)
      mn_dl_rms_rows<C, B>(static_cast<const float *>(a + B * C), eps, a);
    else
      mn_dl_rms_rows<C, B>(mn_in<1>(io), eps, a);
    __syncthreads();
  }
};

// Rows ra and rb (a RoPE pair) of sequence b's q (sec 0), or of row pos of its k or v cache (sec
// 1, 2), from the pair's products u0, u1 rotated by the angle whose cosine and sine are cs, sn.
template <int Q, int KV, long long MAXS, class IO>
__device__ __forceinline__ void mn_dl_qkv_store(const IO &io, int sec, int b, unsigned int pos,
                                                long long ra, long long rb, double u0, double u1,
                                                double cs, double sn) {
  const float o0 = (float)(u0 * cs - u1 * sn), o1 = (float)(u1 * cs + u0 * sn);
  if (sec == 0) {
    const auto q = mn_out<8>(io) + (long long)b * Q;
    q[ra] = o0;
    q[rb] = o1;
  } else {
    const auto cache =
        (sec == 1 ? mn_out<5>(io) : mn_out<6>(io)) + ((long long)b * MAXS + pos) * KV;
    cache[ra] = o0;
    cache[rb] = o1;
  }
}

// What either q/k/v kernel does after its wait: reads pos, zeroes the attention's NCNT merge
// counters (block 0), normalizes its input into a. False when pos is past the cache, reported
// once (thread 0 of block 0).
template <int NCNT, long long MAXS, class NORM, class IO>
__device__ __forceinline__ bool mn_dl_qkv_after_wait(const IO &io, float eps, float *a,
                                                     unsigned int &pos) {
  pos = *mn_arg<const unsigned int>(io, 7);
  if (blockIdx.x == 0)
    for (int j = threadIdx.x; j < NCNT; j += MN_DL_WARPS * 32)
      mn_arg<unsigned int>(io, 10)[j] = 0u;
  NORM::normalize(io, eps, a);
  if (pos < (unsigned long long)MAXS) return true;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    mn_report(mn_arg<mn_dev_error>(io, 9), MN_DEV_ERR_KV_POS, mn_arg_value(io, 11), pos, 0, MAXS);
  return false;
}

// 1. io = x [B, C], input_layernorm [C], wq [Q, C], wk [KV, C], wv [KV, C], k_cache, v_cache
// [B, MAXS, KV], pos U32, q [B, Q] (fp32 scratch), error, the NCNT counters of the attention's
// merge (zeroed here, as this kernel is the one before it), the node id (a value). Warp p of the
// grid computes rows i and i + HD/2 of one head of q, k or v (the pairs RoPE rotates together), for
// every sequence.
template <int C, int Q, int KV, int HD, long long MAXS, int B, unsigned EPS_BITS,
          unsigned THETA_BITS, int FMT, int GROUP, bool NWS, int NCNT, class IO>
__device__ void mn_dl_qkv(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  float *a = reinterpret_cast<float *>(mn_dl_smem);
  using NORM = mn_dl_norm_input<C, B, NWS, IO>;
  constexpr int HALF = HD / 2, QP = Q / 2, KP = KV / 2, NP = QP + 2 * KP;
  constexpr int SQ = mn_io_storage<IO, 2>::value, SKV = mn_io_storage<IO, 3>::value;
  static_assert(SKV == mn_io_storage<IO, 4>::value, "k and v stored alike");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int p = blockIdx.x * MN_DL_WARPS + warp;
  const int sec = p < QP ? 0 : p < QP + KP ? 1 : 2;
  const int pp = sec == 0 ? p : sec == 1 ? p - QP : p - QP - KP;
  const int head = pp / HALF, i = pp % HALF;
  const long long r0 = (long long)head * HD + i, r1 = r0 + HALF;
  mn_overlap_begin();
  typename mn_dl_row<C, SQ, FMT, GROUP>::type q0, q1;
  typename mn_dl_row<C, SKV, FMT, GROUP>::type k0, k1;
  if (p < NP) {
    if (sec == 0) {
      q0.load(mn_arg<const void>(io, 2), r0);
      q1.load(mn_arg<const void>(io, 2), r1);
    } else {
      k0.load(mn_arg<const void>(io, sec == 1 ? 3 : 4), r0);
      k1.load(mn_arg<const void>(io, sec == 1 ? 3 : 4), r1);
    }
  }
  NORM::stage_norm_w(io, a);
  // RoPE's frequency needs no earlier kernel's result: taken while those finish.
  const double freq =
      sec < 2 ? pow((double)__int_as_float((int)THETA_BITS), -2.0 * (double)i / (double)HD) : 0.0;
  q0.settle();
  q1.settle();
  k0.settle();
  k1.settle();
  mn_overlap_wait();
  unsigned int pos;
  if (!mn_dl_qkv_after_wait<NCNT, MAXS, NORM>(io, __int_as_float((int)EPS_BITS), a, pos) || p >= NP)
    return;
  float y[2][B];
  mn_attn_fill(y, 0.0f);
  if (sec == 0) {
    const decltype(q0) *rows[2] = {&q0, &q1};
    mn_dl_dot<B>(rows, a, y);
  } else {
    const decltype(k0) *rows[2] = {&k0, &k1};
    mn_dl_dot<B>(rows, a, y);
  }
  mn_dl_warp_sums<B>(y[0]);
  mn_dl_warp_sums<B>(y[1]);
  double cs = 1.0, sn = 0.0;
  if (sec < 2) sincos((double)pos * freq, &sn, &cs);
#pragma unroll
  for (int b = 0; b < B; b++)
    if (lane == b) mn_dl_qkv_store<Q, KV, MAXS>(io, sec, b, pos, r0, r1, y[0][b], y[1][b], cs, sn);
}

// 3 and 5. io = res [B, C], in [B, K] (fp32 scratch), w [C, K], out [B, C]: out = res + in w^T,
// R rows of w a warp (two from batch 4, where the products read the shared rows of `in` more
// often than the weights).
template <int C, int K, int B, int R, int FMT, int GROUP, class IO>
__device__ void mn_dl_residual_product(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  float *xs = reinterpret_cast<float *>(mn_dl_smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long r = ((long long)blockIdx.x * MN_DL_WARPS + warp) * R;
  mn_overlap_begin();
  typename mn_dl_row<K, mn_io_storage<IO, 2>::value, FMT, GROUP>::type w[R];
#pragma unroll
  for (int k = 0; k < R; k++)
    w[k].load(mn_arg<const void>(io, 2), r + k < C ? r + k : C - 1); // a row past C: unused
#pragma unroll
  for (int k = 0; k < R; k++)
    w[k].settle();
  mn_overlap_wait();
  const auto res = mn_in<0>(io);
  float rv[R];
#pragma unroll
  for (int k = 0; k < R; k++)
    rv[k] = r + k < C && lane < B ? (float)res[(long long)lane * C + r + k] : 0.0f;
  mn_dl_stage<B * K>(xs, mn_in<1>(io));
  __syncthreads();
  if (r < C) mn_dl_residual_rows<C, B, R>(w, xs, rv, mn_out<3>(io), r);
}

// 4. io = x1 [B, C], post_attention_layernorm [C], wgate [F, C], wup [F, C], h [B, F] (fp32
// scratch): h = silu(a wgate^T) * (a wup^T), a = rms_norm(x1).
template <int C, int F, int B, unsigned EPS_BITS, int FMT, int GROUP, bool NWS, class IO>
__device__ void mn_dl_mlp_up(const IO &io) {
  extern __shared__ float4 mn_dl_smem[];
  float *a = reinterpret_cast<float *>(mn_dl_smem);
  using NORM = mn_dl_norm_input<C, B, NWS, IO>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long r = (long long)blockIdx.x * MN_DL_WARPS + warp;
  mn_overlap_begin();
  typename mn_dl_row<C, mn_io_storage<IO, 2>::value, FMT, GROUP>::type wg;
  typename mn_dl_row<C, mn_io_storage<IO, 3>::value, FMT, GROUP>::type wu;
  if (r < F) {
    wg.load(mn_arg<const void>(io, 2), r);
    wu.load(mn_arg<const void>(io, 3), r);
  }
  NORM::stage_norm_w(io, a);
  wg.settle();
  wu.settle();
  mn_overlap_wait();
  NORM::normalize(io, __int_as_float((int)EPS_BITS), a);
  if (r >= F) return;
  float gu[2][B];
  mn_attn_fill(gu, 0.0f);
  const decltype(wg) *rows[2] = {&wg, &wu};
  mn_dl_dot<B>(rows, a, gu);
  float *g = gu[0], *u = gu[1];
  mn_dl_warp_sums<B>(g);
  mn_dl_warp_sums<B>(u);
  const auto h = mn_out<4>(io);
#pragma unroll
  for (int b = 0; b < B; b++)
    if (lane == b) h[(long long)b * F + r] = g[b] / (1.0f + expf(-g[b])) * u[b];
}
