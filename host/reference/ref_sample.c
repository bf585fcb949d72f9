/* mn_sample on the CPU: the oracle of cuda/kernels/sample.cuh, which follows the same
 * steps (meganeura.h states them): argmax, or order-key thresholds for top-k and top-p found
 * bit by bit from the top, then one walk in index order against u times the kept weight. */
#include <math.h>
#include <string.h>

#include "host/pointwise.h"
#include "host/reference/ref_kernels.h"

static unsigned key_of(float x) {
  unsigned bits;
  memcpy(&bits, &x, sizeof bits);
  return mn_pw_order_key(bits);
}

static size_t argmax(const float *l, size_t v) {
  size_t best = 0;
  for (size_t i = 1; i < v; i++)
    if (l[i] > l[best]) best = i;
  return best;
}

static size_t count_at_least(const float *l, size_t v, unsigned t) {
  size_t n = 0;
  for (size_t i = 0; i < v; i++)
    n += key_of(l[i]) >= t;
  return n;
}

/* The weight of the logits whose key is at least t. */
static double mass_at_least(const float *l, size_t v, unsigned t, float mx, float temp) {
  double m = 0;
  for (size_t i = 0; i < v; i++)
    if (key_of(l[i]) >= t) m += expf((l[i] - mx) / temp);
  return m;
}

static uint32_t sample_row(const float *l, size_t v, const float *p, uint64_t seed, uint32_t pos,
                           size_t row) {
  float temp = p[0], top_p = p[2];
  long top_k = (long)p[1];
  size_t best = argmax(l, v);
  if (!(temp > 0) || top_k == 1) return (uint32_t)best;
  float mx = l[best];
  unsigned tk = 0, tp = 0;
  if (top_k > 0 && (size_t)top_k < v)
    for (int bit = 31; bit >= 0; bit--)
      if (count_at_least(l, v, tk | (1u << bit)) >= (size_t)top_k) tk |= 1u << bit;
  if (top_p < 1) {
    double need = (double)top_p * mass_at_least(l, v, tk, mx, temp);
    for (int bit = 31; bit >= 0; bit--) {
      unsigned cand = tp | (1u << bit);
      if (mass_at_least(l, v, cand > tk ? cand : tk, mx, temp) >= need) tp = cand;
    }
  }
  unsigned t = tp > tk ? tp : tk;
  double target = mn_pw_sample_uniform(seed, pos, row) * mass_at_least(l, v, t, mx, temp);
  double acc = 0;
  size_t last = best;
  for (size_t i = 0; i < v; i++) {
    if (key_of(l[i]) < t) continue;
    acc += expf((l[i] - mx) / temp);
    last = i;
    if (acc > target) return (uint32_t)i;
  }
  return (uint32_t)last;
}

mn_status mn_ref_SAMPLE(const mn_ref_ctx *c) {
  const mn_tensor_type *tl = mn_ref_in_type(c, 0);
  size_t v = (size_t)tl->shape[tl->rank - 1], rows = (size_t)tl->shape[0];
  const uint32_t *key = mn_ref_in_u32(c, 2);
  uint64_t seed = (uint64_t)key[0] | (uint64_t)key[1] << 32;
  uint32_t *out = (uint32_t *)c->out;
  for (size_t r = 0; r < rows; r++)
    out[r] = sample_row(mn_ref_in_f32(c, 0) + r * v, v, mn_ref_in_f32(c, 1), seed, key[2], r);
  return MN_OK;
}
