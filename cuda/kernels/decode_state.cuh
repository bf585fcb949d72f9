// The decode-state ops (host/ops.h's MN_STATE_OP_LIST): in-place writes to U32 inputs that
// persist across launches of the step graph, so a decode step advances its own position.

// dst row (row mod ROWS) = src, W values. p[0] src, p[1] dst (the node's buffer), p[2] row.
template <long long ROWS, long long W, class IO> __device__ void mn_state_store_row(const IO &io) {
  const unsigned *src = mn_arg<const unsigned>(io, 0);
  unsigned *dst = mn_arg<unsigned>(io, 1);
  const long long row = (long long)(*mn_arg<const unsigned>(io, 2) % (unsigned)ROWS);
  MN_FOR_EACH(j, W) dst[row * W + j] = src[j];
}

// counter[FIRST .. N-1] += 1. p[0] the counter (the node's buffer).
template <long long N, long long FIRST, class IO> __device__ void mn_state_increment(const IO &io) {
  unsigned *counter = mn_arg<unsigned>(io, 0);
  MN_FOR_EACH(j, N - FIRST) counter[FIRST + j] += 1u;
}
