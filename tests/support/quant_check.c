#include "tests/support/quant_check.h"

#include <stdlib.h>

#include "host/quant.h"
#include "tests/support/mn_test.h"

const mn_test_qcase mn_test_qcases[] = {
    {MN_QUANT_Q8_0, 0},         {MN_QUANT_Q4_0, 0},         {MN_QUANT_Q4_1, 0},
    {MN_QUANT_AFFINE_INT8, 32}, {MN_QUANT_AFFINE_INT8, 64}, {MN_QUANT_AFFINE_INT8, 128},
    {MN_QUANT_AFFINE_INT4, 32}, {MN_QUANT_AFFINE_INT4, 64}, {MN_QUANT_AFFINE_INT4, 128},
};
const int mn_test_num_qcases = (int)(sizeof mn_test_qcases / sizeof mn_test_qcases[0]);

uint32_t *mn_test_qweights(mn_quant q, int group, int64_t out, int64_t in, uint64_t seed,
                           size_t *row_words) {
  mn_rng r = mn_rng_new(seed);
  float *w = malloc((size_t)(out * in) * sizeof *w);
  cr_assert(w);
  for (int64_t i = 0; i < out * in; i++)
    w[i] = (float)(0.5 * mn_rng_normal(&r));
  *row_words = mn_quant_row_words(q, group, in);
  uint32_t *wq = malloc((size_t)out * *row_words * sizeof *wq);
  cr_assert(wq);
  mn_quantize(q, group, w, (size_t)out, (size_t)in, wq);
  free(w);
  return wq;
}

float *mn_test_qproduct(mn_backend b, mn_precision p, mn_quant q, int group, const uint32_t *wq,
                        int64_t rows, int64_t in, int64_t out, uint64_t seed, float **x_out) {
  size_t rw = mn_quant_row_words(q, group, in);
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(rows, in));
  mn_node w = mn_input_u32(g, "wq", MN_SHAPE(out, (int64_t)rw));
  mn_node y = mn_matmul_quant(g, x, w, q, group, out, in);
  mn_set_outputs(g, &y, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options o = mn_session_options_default();
  o.backend = b;
  o.precision = p;
  mn_session *s = NULL;
  if (mn_build_inference_session(g, &o, &s) != MN_OK) {
    mn_graph_free(g);
    return NULL;
  }
  mn_rng r = mn_rng_new(seed);
  float *xs = malloc((size_t)(rows * in) * sizeof *xs), *ys = malloc((size_t)(rows * out) * 4);
  cr_assert(xs && ys);
  mn_rng_fill(&r, xs, (size_t)(rows * in), -1, 1);
  cr_assert_eq(mn_session_set_input(s, "x", xs, (size_t)(rows * in)), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_input_u32(s, "wq", wq, (size_t)out * rw), MN_OK, "%s",
               mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_output_by_index(s, 0, ys, (size_t)(rows * out)), MN_OK, "%s",
               mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
  if (x_out)
    *x_out = xs;
  else
    free(xs);
  return ys;
}
