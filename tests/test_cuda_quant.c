/* mn_matmul_quant on CUDA against the CPU reference: every format, f32 and bf16 sessions,
 * 1, 4, 8 and 64 rows; the quantized generator's greedy tokens against the CPU's; the kernels
 * compile without a device (NVRTC). Prints the largest errors and the time of one decode-size
 * product beside the plain f32 one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/quant.h"
#include "tests/support/cuda_check.h"
#include "tests/support/generator_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/quant_check.h"
#include "tests/support/tmp_dir.h"

Test(cuda_quant, kernels_compile) {
  mn_test_require_cuda_build();
  for (int c = 0; c < mn_test_num_qcases; c++) {
    mn_quant q = mn_test_qcases[c].format;
    int gs = mn_test_qcases[c].group;
    /* 4 rows: the decoding kernel; 32: a prefill's dequantization and GEMM */
    for (int64_t rows = 4; rows <= 32; rows *= 8) {
      mn_graph *g = mn_graph_new();
      mn_node x = mn_input(g, "x", MN_SHAPE(rows, 256));
      mn_node w = mn_input_u32(g, "wq", MN_SHAPE(40, (int64_t)mn_quant_row_words(q, gs, 256)));
      mn_node y = mn_matmul_quant(g, x, w, q, gs, 40, 256);
      mn_set_outputs(g, &y, 1);
      cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
      mn_test_assert_compiles(g, false);
      mn_graph_free(g);
    }
  }
}

/* ||a - b|| / ||b||. */
static double rel(const float *a, const float *b, size_t n) { return mn_test_rel_err(a, b, n); }

Test(cuda_quant, product_equals_cpu) {
  mn_test_require_cuda_device();
  const int64_t IN = 512, OUT = 72, rows[4] = {1, 4, 8, 64};
  const mn_precision precs[2] = {MN_PRECISION_F32, MN_PRECISION_BF16};
  for (int p = 0; p < 2; p++) {
    double worst = 0;
    for (int c = 0; c < mn_test_num_qcases; c++)
      for (int r = 0; r < 4; r++) {
        mn_quant q = mn_test_qcases[c].format;
        int gs = mn_test_qcases[c].group;
        size_t rw = 0;
        uint32_t *wq = mn_test_qweights(q, gs, OUT, IN, 40 + (uint64_t)c, &rw);
        float *cpu =
            mn_test_qproduct(MN_BACKEND_CPU, precs[p], q, gs, wq, rows[r], IN, OUT, 3, NULL);
        float *gpu =
            mn_test_qproduct(MN_BACKEND_CUDA, precs[p], q, gs, wq, rows[r], IN, OUT, 3, NULL);
        cr_assert(cpu && gpu, "%s", mn_last_error());
        double e = rel(gpu, cpu, (size_t)(rows[r] * OUT));
        worst = fmax(worst, e);
        /* f32: float sums in another order; bf16: the output rounded to 8 bits, where one
         * element may round the other way, and past 16 rows (a prefill's GEMM,
         * cuda/lower_quant.c) the weights rounded to bf16 as well. */
        double tol = p == 0 ? 1e-6 : rows[r] > 16 ? 8e-3 : 4e-3;
        cr_assert_leq(e, tol, "%s %s group %d rows %lld: relative error %g",
                      mn_test_precision_name(precs[p]), mn_quant_name(q), gs, (long long)rows[r],
                      e);
        free(wq);
        free(cpu);
        free(gpu);
      }
    printf("cuda_quant: %s: largest norm-wise relative error against the CPU %.3g\n",
           mn_test_precision_name(precs[p]), worst);
  }
}

static double now_ms(void) {
  struct timespec t;
  timespec_get(&t, TIME_UTC);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* One decode-size product, [1, 2048] x [8192, 2048]^T, quantized and plain: ms per step. */
static double time_product(mn_quant q) {
  const int64_t IN = 2048, OUT = 8192;
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(1, IN)), y;
  size_t rw = 0;
  uint32_t *wq = NULL;
  if (q == MN_QUANT_NONE) {
    y = mn_matmul_bt(g, x, mn_parameter(g, "w", MN_SHAPE(OUT, IN)));
  } else {
    wq = mn_test_qweights(q, 64, OUT, IN, 1, &rw);
    y = mn_matmul_quant(g, x, mn_input_u32(g, "wq", MN_SHAPE(OUT, (int64_t)rw)), q, 64, OUT, IN);
  }
  mn_set_outputs(g, &y, 1);
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CUDA;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_inference_session(g, &o, &s), MN_OK, "%s", mn_last_error());
  if (wq) mn_session_set_input_u32(s, "wq", wq, (size_t)OUT * rw);
  const int N = 200;
  double t0 = 0;
  for (int i = 0; i < N + 10; i++) {
    if (i == 10) {
      mn_session_wait(s);
      t0 = now_ms();
    }
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  }
  mn_session_wait(s);
  double ms = (now_ms() - t0) / N;
  mn_session_free(s);
  mn_graph_free(g);
  free(wq);
  return ms;
}

Test(cuda_quant, decode_product_time) {
  mn_test_require_cuda_device();
  const mn_quant qs[6] = {MN_QUANT_NONE, MN_QUANT_Q8_0,        MN_QUANT_Q4_0,
                          MN_QUANT_Q4_1, MN_QUANT_AFFINE_INT8, MN_QUANT_AFFINE_INT4};
  for (int i = 0; i < 6; i++) {
    double ms = time_product(qs[i]);
    double bytes = qs[i] == MN_QUANT_NONE
                       ? 8192.0 * 2048 * 4
                       : 8192.0 * (double)mn_quant_row_words(qs[i], 64, 2048) * 4;
    printf("cuda_quant: [1,2048] x [8192,2048]^T %-5s %.4f ms per step (one launch), %.0f GB/s "
           "of weights\n",
           mn_quant_name(qs[i]), ms, bytes / (ms * 1e6));
  }
}

static void gen_tokens(mn_backend b, const mn_model_config *c, const char *path, mn_quant q,
                       uint32_t *out) {
  mn_generator_options o = mn_generator_options_default();
  o.session.backend = b;
  o.quant = q;
  o.group_size = 32;
  o.max_seq = 24;
  mn_generator *g = NULL;
  cr_assert_eq(mn_generator_new(c, path, &o, &g), MN_OK, "%s", mn_last_error());
  const uint32_t prompt[3] = {3, 17, 5};
  cr_assert_eq(mn_generator_generate(g, prompt, 3, NULL, out, 12), MN_OK, "%s", mn_last_error());
  mn_generator_free(g);
}

Test(cuda_quant, generator_tokens_equal_cpu) {
  mn_test_require_cuda_device();
  mn_tmp_dir dir = mn_tmp_dir_make("mn_cuda_quant");
  const mn_model_family fams[2] = {MN_MODEL_GPT2, MN_MODEL_LLAMA};
  const mn_quant qs[3] = {MN_QUANT_Q8_0, MN_QUANT_Q4_0, MN_QUANT_AFFINE_INT4};
  for (int f = 0; f < 2; f++) {
    mn_model_config c = mn_test_gen_config(fams[f]);
    c.hidden_size = 64;
    c.num_heads = 4;
    c.num_kv_heads = fams[f] == MN_MODEL_GPT2 ? 4 : 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
    c.max_positions = 32;
    char path[512];
    snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, f ? "llama.st" : "gpt2.st"));
    mn_test_gen_write_weights(&c, path, 9);
    for (int i = 0; i < 3; i++) {
      uint32_t cpu[12], gpu[12];
      gen_tokens(MN_BACKEND_CPU, &c, path, qs[i], cpu);
      gen_tokens(MN_BACKEND_CUDA, &c, path, qs[i], gpu);
      cr_assert_arr_eq(cpu, gpu, sizeof cpu, "%s %s: CUDA tokens differ from the CPU's",
                       f ? "llama" : "gpt2", mn_quant_name(qs[i]));
    }
  }
  mn_tmp_dir_remove(&dir);
}
