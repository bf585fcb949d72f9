// Row gathers and scatters: embedding lookup, its transpose scatter_add, and the KV
// cache's in-place row write. Indices are U32 read from the device; an index out of
// range is reported through mn_report (the first failure of the step wins) and never
// used as an address. NODE is the dispatch's node id for the message.

// out[i, :] = table[idx[i], :] for the NI indices; the table has ROWS rows of D floats,
// moved VEC floats at a time (VEC divides D, so rows stay VEC-aligned). A bad index gives
// a row of NaN. p[0] indices, p[1] table, p[2] out, p[3] error record.
template <long long NI, long long D, long long ROWS, int VEC, unsigned NODE>
__device__ void mn_emb_gather(const mn_ptrs &io) {
  constexpr long long DV = D / VEC;
  const unsigned int *idx = mn_arg<const unsigned int>(io, 0);
  const float *table = mn_arg<const float>(io, 1);
  float *out = mn_arg<float>(io, 2);
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

// out[idx[i], :] += src[i, :] into an output of ROWS rows of D floats that the launch
// before this one zeroed; a bad index skips its row. Float atomicAdd makes the order of
// the additions into a row, and so its last bits, vary from run to run: accepted for
// this op (the embedding gradient), whose sort-free deterministic alternatives cost far
// more than the gather it differentiates. p[0] indices, p[1] src, p[2] out, p[3] error.
template <long long NI, long long D, long long ROWS, unsigned NODE>
__device__ void mn_emb_scatter_add(const mn_ptrs &io) {
  const unsigned int *idx = mn_arg<const unsigned int>(io, 0);
  const float *src = mn_arg<const float>(io, 1);
  float *out = mn_arg<float>(io, 2);
  MN_FOR_EACH(e, NI * D) {
    const long long i = e / D, j = e - i * D;
    const unsigned int r = idx[i];
    if ((long long)r < ROWS)
      atomicAdd(out + (long long)r * D + j, src[e]);
    else if (j == 0)
      mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_INDEX, NODE, r, i, ROWS);
  }
}

// cache[kv_pos, :] = new_kv[0, :] in place (the cache of ROWS rows of D floats is the
// node's own buffer, so the other rows keep what earlier steps wrote); kv_pos >= ROWS
// writes nothing. p[0] new_kv, p[1] cache, p[2] kv_pos (U32 [1]), p[3] error record.
template <long long ROWS, long long D, unsigned NODE>
__device__ void mn_emb_cache_write(const mn_ptrs &io) {
  const float *src = mn_arg<const float>(io, 0);
  float *cache = mn_arg<float>(io, 1);
  const unsigned int pos = *mn_arg<const unsigned int>(io, 2);
  if ((long long)pos >= ROWS) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      mn_report(mn_arg<mn_dev_error>(io, 3), MN_DEV_ERR_KV_POS, NODE, pos, 0, ROWS);
    return;
  }
  MN_FOR_EACH(j, D) cache[(long long)pos * D + j] = src[j];
}
