// mn_sample: one block per row of logits, the steps of host/reference/ref_sample.c (the
// oracle). Thread t owns the contiguous chunk [t C, t C + C) of the row, so "index order" is
// chunk order and then order within a chunk. The top-k and top-p thresholds are order keys
// (mn_pw_order_key) found bit by bit from the top: each bit is one block-wide count or sum.
// io = logits, params (temperature, top_k, top_p), key U32 (seed lo, seed hi, position),
// ids U32 [rows].

__device__ __forceinline__ unsigned mn_sample_key(float x) {
  return mn_pw_order_key(__float_as_uint(x));
}

// The warp's best (value, index): the larger value, the lower index among equal values; an index
// of -1 is no candidate. Every lane ends with the same pair.
__device__ __forceinline__ void mn_sample_argmax_warp(float &v, long long &i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const long long oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

template <long long V, int BLOCK, class IO> __device__ void mn_sample_rows(const IO &io) {
  constexpr long long C = (V + BLOCK - 1) / BLOCK;
  __shared__ float redf[32];
  __shared__ double redd[32];
  __shared__ float best_v[BLOCK];
  __shared__ long long best_i[BLOCK];
  __shared__ double part[BLOCK];
  const long long row = blockIdx.x;
  const auto l = mn_in<0>(io) + row * V;
  const auto p = mn_in<1>(io);
  const unsigned *key = mn_arg<const unsigned>(io, 2);
  unsigned *out = mn_arg<unsigned>(io, 3);
  const int tid = threadIdx.x;
  const long long lo = tid * C, hi = lo + C < V ? lo + C : V;

  // The maximum (the lowest index among equal ones) over a coalesced stride, not the chunk:
  // a greedy step reads the row once, 8 loads a thread in flight.
  float bv = 0.0f;
  long long bi = -1;
#pragma unroll 8
  for (long long i = tid; i < V; i += BLOCK) {
    const float x = l[i];
    if (bi < 0 || x > bv) {
      bv = x;
      bi = i;
    }
  }
  mn_sample_argmax_warp(bv, bi);
  if ((tid & 31) == 0) {
    best_v[tid >> 5] = bv;
    best_i[tid >> 5] = bi;
  }
  __syncthreads();
  if (tid < 32) {
    bv = tid < BLOCK / 32 ? best_v[tid] : 0.0f;
    bi = tid < BLOCK / 32 ? best_i[tid] : -1;
    mn_sample_argmax_warp(bv, bi);
    if (tid == 0) {
      best_v[0] = bv;
      best_i[0] = bi;
    }
  }
  __syncthreads();
  const long long best = best_i[0];
  const float mx = best_v[0];
  const float temp = p[0], top_p = p[2];
  const long top_k = (long)p[1];
  if (!(temp > 0.0f) || top_k == 1) {
    if (tid == 0) out[row] = (unsigned)best;
    return;
  }

  unsigned tk = 0, tp = 0;
  if (top_k > 0 && top_k < V)
    for (int bit = 31; bit >= 0; bit--) {
      const unsigned cand = tk | (1u << bit);
      float n = 0.0f;
      for (long long i = lo; i < hi; i++)
        n += mn_sample_key(l[i]) >= cand ? 1.0f : 0.0f;
      if (mn_block_sum<BLOCK>(n, redf) >= (float)top_k) tk = cand;
    }
  if (top_p < 1.0f) {
    double m = 0.0;
    for (long long i = lo; i < hi; i++)
      if (mn_sample_key(l[i]) >= tk) m += (double)expf((l[i] - mx) / temp);
    const double need = (double)top_p * mn_block_sum_d<BLOCK>(m, redd);
    for (int bit = 31; bit >= 0; bit--) {
      const unsigned cand = tp | (1u << bit), t = cand > tk ? cand : tk;
      double mc = 0.0;
      for (long long i = lo; i < hi; i++)
        if (mn_sample_key(l[i]) >= t) mc += (double)expf((l[i] - mx) / temp);
      if (mn_block_sum_d<BLOCK>(mc, redd) >= need) tp = cand;
    }
  }
  const unsigned t = tp > tk ? tp : tk;
  double m = 0.0;
  for (long long i = lo; i < hi; i++)
    if (mn_sample_key(l[i]) >= t) m += (double)expf((l[i] - mx) / temp);
  part[tid] = m;
  __syncthreads();
  if (tid != 0) return;
  double total = 0.0;
  for (int j = 0; j < BLOCK; j++)
    total += part[j];
  const double target =
      mn_pw_sample_uniform((unsigned long long)key[0] | ((unsigned long long)key[1] << 32), key[2],
                           (unsigned long long)row) *
      total;
  double acc = 0.0;
  long long last = best;
  for (int j = 0; j < BLOCK; j++) {
    if (acc + part[j] <= target && j + 1 < BLOCK) {
      acc += part[j];
      continue;
    }
    const long long jl = j * C, jh = jl + C < V ? jl + C : V;
    for (long long i = jl; i < jh; i++) {
      if (mn_sample_key(l[i]) < t) continue;
      acc += (double)expf((l[i] - mx) / temp);
      last = i;
      if (acc > target) {
        out[row] = (unsigned)i;
        return;
      }
    }
  }
  out[row] = (unsigned)last;
}
