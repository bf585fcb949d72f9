// Last-axis slices (host side: cuda/lower_slice.c). x is [ROWS, N] with the leading dims
// flattened into ROWS; the slice is columns [START, START + L). All sizes are in units of
// VEC floats: the host picks the widest VEC (4, 2 or 1) dividing N, L and START, so every
// vector access is aligned (node buffers start 256-byte aligned).

// y[r, j] = x[r, START + j]. io: x, y.
template <int VEC, long long ROWS, long long N, long long L, long long START, class IO>
__device__ void mn_slice_last_fwd(const IO &io) {
  auto x = mn_in<0>(io);
  auto y = mn_out<1>(io);
  MN_FOR_EACH(i, ROWS * L) {
    const long long r = i / L, j = i % L;
    float v[VEC];
    mn_ld_vec<VEC>(x + (r * N + START + j) * VEC, v);
    mn_st_vec<VEC>(y + i * VEC, v);
  }
}

// dx[r, c] = dy[r, c - START] inside the slice, 0 outside. One pass writes every element
// of dx, so the gradient needs no memset before it. io: dy, dx.
template <int VEC, long long ROWS, long long N, long long L, long long START, class IO>
__device__ void mn_slice_last_bwd(const IO &io) {
  auto dy = mn_in<0>(io);
  auto dx = mn_out<1>(io);
  MN_FOR_EACH(i, ROWS * N) {
    const long long r = i / N, j = i % N - START;
    float v[VEC];
    if (j >= 0 && j < L) {
      mn_ld_vec<VEC>(dy + (r * L + j) * VEC, v);
    } else {
      for (int e = 0; e < VEC; e++)
        v[e] = 0.0f;
    }
    mn_st_vec<VEC>(dx + i * VEC, v);
  }
}
