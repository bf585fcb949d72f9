// Rotary position embedding, HF "rotate-half" convention: within each head of HD dims,
// dims i and i + HD/2 rotate together by the angle pos * theta^(-2i/HD), pos being the
// row's index within its sequence of SEQ rows plus an offset (static, or read from a U32
// device scalar so that changing it never re-captures the graph), or with PER_ROW the row's
// own entry of a U32 positions tensor (packed sequences: one position per row). DIR -1 rotates
// by the negated angle: the transpose, i.e. the gradient.
//
// The angle, its sine and cosine and the rotation are computed in double as the
// reference does (float sin/cos of angles of a thousand radians or more would be off
// in the fourth digit); one thread per (row, i) computes them once and applies them to
// every head of the row, so a warp reads and writes 32 consecutive floats per head half.
// theta arrives as the bits of the float attribute.

// p[0] x, p[1] out, p[2] the U32 offset (DYN) or positions [ROWS] (PER_ROW). ROWS rows of D
// floats.
template <long long ROWS, long long SEQ, long long D, int HD, int DIR, int OFFSET, bool DYN,
          bool PER_ROW, unsigned THETA_BITS, class IO>
__device__ void mn_rope_apply(const IO &io) {
  constexpr int HALF = HD / 2;
  auto x = mn_in<0>(io);
  auto out = mn_out<1>(io);
  double offset = (double)OFFSET;
  if constexpr (DYN) offset = (double)*mn_arg<const unsigned int>(io, 2);
  const double theta = (double)__int_as_float((int)THETA_BITS);
  MN_FOR_EACH(p, ROWS * HALF) {
    const long long r = p / HALF;
    const int i = (int)(p % HALF);
    const double pos =
        PER_ROW ? (double)mn_arg<const unsigned int>(io, 2)[r] : (double)(r % SEQ) + offset;
    const double angle = pos * pow(theta, -2.0 * (double)i / (double)HD);
    const double cs = cos(angle), sn = (double)DIR * sin(angle);
    const auto xr = x + r * D + i;
    const auto orow = out + r * D + i;
#pragma unroll 4
    for (long long h = 0; h < D; h += HD) {
      const double a = xr[h], b = xr[h + HALF];
      orow[h] = (float)(a * cs - b * sn);
      orow[h + HALF] = (float)(b * cs + a * sn);
    }
  }
}
