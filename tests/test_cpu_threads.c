/* The CPU backend's matrix products split their output elements over threads
 * (MN_CPU_THREADS, default the cores online); each element is the same sum in the same order
 * whichever thread computes it, so any thread count gives bitwise the result of one thread:
 * forward and gradients of all three product forms, and a GEMV (one row, the decode shape). */
#include <stdlib.h>
#include <string.h>

#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"

enum { M = 33, K = 40, N = 257 };

static mn_graph *products(int64_t rows) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(rows, K));
  mn_node w = mn_parameter(g, "w", MN_SHAPE(K, N)), v = mn_parameter(g, "v", MN_SHAPE(K, N));
  mn_node y = mn_matmul(g, x, w);    /* [rows, N] */
  mn_node z = mn_matmul_bt(g, y, v); /* [rows, K] */
  mn_node t = mn_matmul_at(g, z, y); /* [K, N] */
  mn_set_outputs(g, (mn_node[]){mn_mean_all(g, mn_mul(g, t, t)), y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

/* Loss, output 1 and both gradients after one SGD step with `threads` threads. */
static float *run(const mn_graph *g, int64_t rows, const char *threads, size_t *count) {
  setenv("MN_CPU_THREADS", threads, 1);
  mn_session *s = mn_test_session(g, MN_BACKEND_CPU, true);
  mn_rng r = mn_rng_new(3);
  mn_test_init_normal(g, &s, 1, &r, 0.3f, false);
  float x[M * K];
  mn_rng_fill(&r, x, (size_t)(rows * K), -1, 1);
  cr_assert_eq(mn_session_set_input(s, "x", x, (size_t)(rows * K)), MN_OK);
  size_t n = 1 + (size_t)(rows * N) + 2 * K * N;
  float *out = malloc(n * sizeof *out);
  out[0] = mn_test_step_loss(s);
  cr_assert_eq(mn_session_read_output_by_index(s, 1, out + 1, (size_t)(rows * N)), MN_OK);
  cr_assert_eq(mn_session_read_grad(s, "w", out + 1 + rows * N, K * N), MN_OK);
  cr_assert_eq(mn_session_read_grad(s, "v", out + 1 + rows * N + K * N, K * N), MN_OK);
  mn_session_free(s);
  unsetenv("MN_CPU_THREADS");
  *count = n;
  return out;
}

static void same_for_any_thread_count(int64_t rows) {
  mn_graph *g = products(rows);
  size_t n1 = 0, n = 0;
  float *one = run(g, rows, "1", &n1);
  const char *counts[] = {"2", "3", "7", "16"};
  for (int i = 0; i < 4; i++) {
    float *many = run(g, rows, counts[i], &n);
    cr_assert_eq(n, n1);
    cr_assert(memcmp(one, many, n * sizeof *one) == 0, "%s threads differ from one (rows %lld)",
              counts[i], (long long)rows);
    free(many);
  }
  free(one);
  mn_graph_free(g);
}

Test(cpu_threads, products_are_bitwise_the_same_on_any_thread_count) {
  same_for_any_thread_count(M);
}

Test(cpu_threads, a_gemv_splits_its_columns_bitwise_too) { same_for_any_thread_count(1); }
