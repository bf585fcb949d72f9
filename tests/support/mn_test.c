#include "tests/support/mn_test.h"

#include <stdlib.h>

double mn_test_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0, den_a = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(a[i]) || isnan(b[i])) return INFINITY;
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * b[i];
    den_a += (double)a[i] * a[i];
  }
  if (den == 0) den = den_a;
  if (den == 0) return 0;
  return sqrt(num / den);
}

double mn_test_max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) return INFINITY;
    if (d > m) m = d;
  }
  return m;
}

mn_rng mn_rng_new(uint64_t seed) { return (mn_rng){seed ? seed : 1}; }

static uint64_t next(mn_rng *r) {
  uint64_t x = r->state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return r->state = x;
}

double mn_rng_uniform(mn_rng *r) { return (double)(next(r) >> 11) * 0x1.0p-53; }

double mn_rng_normal(mn_rng *r) {
  double u1 = mn_rng_uniform(r), u2 = mn_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

void mn_rng_fill(mn_rng *r, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * (float)mn_rng_uniform(r);
}

void mn_rng_fill_u32(mn_rng *r, uint32_t *x, size_t n, uint32_t below) {
  for (size_t i = 0; i < n; i++)
    x[i] = (uint32_t)(next(r) % below);
}

mn_session *mn_test_run(const mn_graph *g, const mn_test_feed *feeds, size_t num_feeds) {
  cr_assert_eq(mn_graph_status(g), MN_OK, "graph in error: %s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  mn_status st = mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "build failed: %s", mn_last_error());
  for (size_t i = 0; i < num_feeds; i++) {
    const mn_test_feed *f = &feeds[i];
    if (f->u32_data)
      st = mn_session_set_input_u32(s, f->name, f->u32_data, f->n);
    else if (f->parameter)
      st = mn_session_set_parameter(s, f->name, f->data, f->n);
    else
      st = mn_session_set_input(s, f->name, f->data, f->n);
    cr_assert_eq(st, MN_OK, "feeding \"%s\" failed: %s", f->name, mn_last_error());
  }
  cr_assert_eq(mn_session_step(s), MN_OK, "step failed: %s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "wait failed: %s", mn_last_error());
  return s;
}

float *mn_test_read_output(mn_session *s, size_t index, size_t n) {
  float *out = malloc(n * sizeof *out);
  cr_assert_not_null(out);
  mn_status st = mn_session_read_output_by_index(s, index, out, n);
  cr_assert_eq(st, MN_OK, "read_output %zu failed: %s", index, mn_last_error());
  return out;
}

void mn_assert_close_impl(const float *got, const float *want, size_t n, double tol,
                          const char *what) {
  double err = mn_test_rel_err(got, want, n);
  if (err <= tol) return;
  size_t worst = 0;
  double worst_d = -1;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (isnan(d) || d > worst_d) {
      worst_d = isnan(d) ? INFINITY : d;
      worst = i;
      if (isnan(d)) break;
    }
  }
  cr_assert_fail("%s: relative error %.3g > %.3g; worst at [%zu]: got %.9g, want %.9g", what, err,
                 tol, worst, (double)got[worst], (double)want[worst]);
}
