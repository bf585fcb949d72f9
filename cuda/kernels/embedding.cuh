// Row gathers and scatters: embedding lookup, its transpose scatter_add, and the KV
// cache's in-place row write. Indices are U32 read from the device; an index out of
// range is reported through mn_report (the first failure of the step wins) and never
// used as an address. NODE is the dispatch's node id for the message.

// out[i, :] = table[idx[i], :] for the NI indices; the table has ROWS rows of D floats,
// moved VEC floats at a time (VEC divides D, so rows stay VEC-aligned). A bad index gives
// a row of NaN. p[0] indices, p[1] table, p[2] out, p[3] error record.
template <long long NI, long long D, long long ROWS, int VEC, unsigned NODE, class IO>
__device__ void mn_emb_gather(const IO &io) {
  constexpr long long DV = D / VEC;
  const unsigned int *idx = mn_arg<const unsigned int>(io, 0);
  auto table = mn_in<1>(io);
  auto out = mn_out<2>(io);
  MN_FOR_EACH(e, NI * DV) {
    const long long i = e / DV, j = e - i * DV;
    const unsigned int r = idx[i];
    float v[VEC];
    if ((long long)r < ROWS) {
      mn_ld_vec<VEC>(table + (long long)r * D + j * VEC, v);
    } else {
      if (j == 0) mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_INDEX, NODE, r, i, ROWS);
#pragma unroll
      for (int k = 0; k < VEC; k++)
        v[k] = mn_nan();
    }
    mn_st_vec<VEC>(out + e * VEC, v);
  }
}

// The positions of this block's chunk [base, base + BLOCK) of the NI indices whose entry
// `mine` says so, in index order (warps in order, lanes in order within a warp): hits[0, n)
// holds their thread numbers; returns n. Every thread of the block calls it.
template <int BLOCK>
__device__ __forceinline__ int mn_emb_hits(bool mine, int *hits, int *warp_hits) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned mask = __ballot_sync(0xffffffffu, mine);
  if (lane == 0) warp_hits[warp] = __popc(mask);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < BLOCK / 32; w++) {
    before += w < warp ? warp_hits[w] : 0;
    total += warp_hits[w];
  }
  if (mine) hits[before + __popc(mask & ((1u << lane) - 1u))] = (int)threadIdx.x;
  __syncthreads();
  return total;
}

// out[idx[i], :] += src[i, :] (the embedding gradient) into an output of ROWS rows of D floats,
// deterministically: block b owns rows [b * RPB, (b + 1) * RPB), zeroes them, and scans every
// index in order, adding the entries that hit its rows one after another, so each output
// element is one thread's sum in index order and a run repeats to the last bit (no atomics).
// The scan costs each block NI index reads, which RPB (about ROWS / 256) keeps near 256 NI in
// all. A bad index skips its entry; block 0 reports it. Launch 256 threads, ceil(ROWS / RPB)
// blocks. p[0] indices, p[1] src, p[2] out, p[3] error.
//
// An output stored in 2 bytes (the gradient of a table that is no parameter; a parameter's
// is fp32) must not hold the partial sums, which would round at every addition: there the
// block sums each of its rows in registers, a tile of 8 * BLOCK columns at a time, scanning
// the indices once per row and tile, and stores each sum once (the same additions in the
// same order, rounded once; slower, and rare).
template <long long NI, long long D, long long ROWS, long long RPB, unsigned NODE, class IO>
__device__ void mn_emb_scatter_add(const IO &io) {
  constexpr int BLOCK = 256;
  const unsigned int *idx = mn_arg<const unsigned int>(io, 0);
  auto src = mn_in<1>(io);
  auto out = mn_out<2>(io);
  const long long r0 = (long long)blockIdx.x * RPB, r1 = r0 + RPB < ROWS ? r0 + RPB : ROWS;
  __shared__ int hits[BLOCK];
  __shared__ int warp_hits[BLOCK / 32];
  if constexpr (mn_io_storage<IO, 2>::value != MN_DEV_F32) {
    constexpr int CT = 8; // columns per thread in a tile
    for (long long r = r0; r < r1; r++) {
      for (long long j0 = 0; j0 < D; j0 += (long long)CT * BLOCK) {
        float acc[CT];
#pragma unroll
        for (int t = 0; t < CT; t++)
          acc[t] = 0.0f;
        for (long long base = 0; base < NI; base += BLOCK) {
          const long long i = base + threadIdx.x;
          const unsigned int ri = i < NI ? idx[i] : 0u;
          if (r == r0 && j0 == 0 && i < NI && (long long)ri >= ROWS && blockIdx.x == 0)
            mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_INDEX, NODE, ri, i, ROWS);
          const int total = mn_emb_hits<BLOCK>(i < NI && (long long)ri == r, hits, warp_hits);
          for (int h = 0; h < total; h++) {
            const long long e = base + hits[h];
#pragma unroll
            for (int t = 0; t < CT; t++) {
              const long long j = j0 + (long long)t * BLOCK + threadIdx.x;
              if (j < D) acc[t] += src[e * D + j];
            }
          }
          __syncthreads();
        }
#pragma unroll
        for (int t = 0; t < CT; t++) {
          const long long j = j0 + (long long)t * BLOCK + threadIdx.x;
          if (j < D) out[r * D + j] = acc[t];
        }
      }
    }
  } else {
    for (long long r = r0; r < r1; r++)
      for (long long j = threadIdx.x; j < D; j += BLOCK)
        out[r * D + j] = 0.0f;
    for (long long base = 0; base < NI; base += BLOCK) {
      const long long i = base + threadIdx.x;
      const unsigned int r = i < NI ? idx[i] : 0u;
      if (i < NI && (long long)r >= ROWS && blockIdx.x == 0)
        mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_INDEX, NODE, r, i, ROWS);
      const bool mine = i < NI && (long long)r >= r0 && (long long)r < r1;
      const int total = mn_emb_hits<BLOCK>(mine, hits, warp_hits);
      for (int h = 0; h < total; h++) {
        const long long e = base + hits[h];
        const long long row = idx[e];
        for (long long j = threadIdx.x; j < D; j += BLOCK)
          out[row * D + j] += src[e * D + j];
      }
      __syncthreads();
    }
  }
}

// cache[b, kv_pos + r, :] = new_kv[b, r, :] for r < P in place for sequence b = blockIdx.y
// (the cache of ROWS rows of D floats per sequence is the node's own buffer, so the other rows
// keep what earlier steps wrote); kv_pos + P > ROWS writes nothing. p[0] new_kv, p[1] cache,
// p[2] kv_pos (U32 [1]), p[3] error record, p[4] the node id (a value: the layers of a model
// share the kernel).
template <long long ROWS, long long D, long long P, class IO>
__device__ void mn_emb_cache_write(const IO &io) {
  auto src = mn_in<0>(io) + (long long)blockIdx.y * P * D;
  auto cache = mn_out<1>(io) + (long long)blockIdx.y * ROWS * D;
  const unsigned int pos = *mn_arg<const unsigned int>(io, 2);
  if ((long long)pos + P > ROWS) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
      mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_KV_POS, mn_arg_value(io, 4), pos, 0,
                ROWS - P + 1);
    return;
  }
  MN_FOR_EACH(j, P * D) cache[(long long)pos * D + j] = src[j];
}
