/* Attention reading its fused projection in place (optimizer/attention_qkv.h): where q, k and v
 * are slices of one projection, as GPT-2's c_attn, a low-precision training plan runs
 * qkv_causal_attention and qkv_attention_grad_saved instead of the slices, the separate
 * gradients and their sum. On the CPU: where the pass fires and where it must not, that the
 * step is bit for bit the sliced one (the same values, read and written through wider rows),
 * and that a cached plan keeps the rewrite. On CUDA (skipped without a device): the pipelined
 * kernels with wide rows give the sliced plan's weights bit for bit and match the CPU at bf16's
 * level, for head dims 64 (dK and dV in one pass) and 128 (two), grouped heads, and a sequence
 * that ends inside a tile. */
#include <stdio.h>
#include <stdlib.h>

#include "host/plan.h"
#include "optimizer/report.h"
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

typedef struct block_shape {
  int64_t b, t, d, heads, kv_heads, hd;
} block_shape;

static const block_shape tiny = {.b = 2, .t = 37, .d = 32, .heads = 4, .kv_heads = 2, .hd = 16};

/* x -> qkv = x W + bias (one projection, q | k | v per row) -> the three slices -> causal
 * attention -> an output projection, trained to t by MSE. With q_out, q is also a graph
 * output (then it must stay a tensor of its own); with leaf, qkv is a parameter of its own
 * (stored in fp32, which the wide-row kernels do not read). */
static mn_graph *qkv_block_of(const block_shape *s, bool q_out, bool leaf) {
  mn_graph *g = mn_graph_new();
  int64_t qw = s->heads * s->hd, kw = s->kv_heads * s->hd, width = qw + 2 * kw;
  mn_node x = mn_input(g, "x", MN_SHAPE(s->b, s->t, s->d));
  mn_node t = mn_input(g, "t", MN_SHAPE(s->b, s->t, s->d));
  mn_node qkv =
      leaf
          ? mn_parameter(g, "qkv", MN_SHAPE(s->b, s->t, width))
          : mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, "c_attn.weight", MN_SHAPE(s->d, width))),
                        mn_parameter(g, "c_attn.bias", MN_SHAPE(width)));
  mn_node q = mn_slice_last(g, qkv, 0, qw), k = mn_slice_last(g, qkv, qw, kw);
  mn_node v = mn_slice_last(g, qkv, qw + kw, kw);
  mn_node a = mn_causal_attention(g, q, k, v, (int)s->heads, (int)s->kv_heads, (int)s->hd);
  mn_node y = mn_matmul(g, a, mn_parameter(g, "c_proj.weight", MN_SHAPE(qw, s->d)));
  mn_node outs[2] = {mn_mse_loss(g, leaf ? mn_add(g, y, x) : y, t), q};
  mn_set_outputs(g, outs, q_out ? 2 : 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static void adamw(mn_session *s) {
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK, "%s",
               mn_last_error());
}

static mn_graph *qkv_block(const block_shape *s, bool q_out) {
  return qkv_block_of(s, q_out, false);
}

/* MN_OPTIMIZE_OFF=attention_qkv while the session is built, when `off`. */
static mn_session *build(const mn_graph *g, mn_backend backend, mn_precision prec, bool off,
                         mn_optimize_report **report) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.precision = prec;
  if (off) setenv("MN_OPTIMIZE_OFF", "fusion_x,attention_qkv", 1);
  mn_session *s = NULL;
  mn_status st =
      report ? mn_build_session_with_report(g, &o, &s, report) : mn_build_session(g, &o, &s);
  unsetenv("MN_OPTIMIZE_OFF");
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  adamw(s);
  return s;
}

static size_t count_op(const mn_plan *p, mn_op op) { return mn_test_count_op(p->graph, op); }

static size_t qkv_ops(const mn_plan *p) {
  return count_op(p, MN_OP_QKV_CAUSAL_ATTENTION) + count_op(p, MN_OP_QKV_ATTENTION_GRAD_SAVED);
}

/* The same parameters and data into every session. */
static void feed(const mn_graph *g, mn_session *const *s, size_t n, const block_shape *sh) {
  mn_rng r = mn_rng_new(23);
  mn_test_init_normal(g, s, n, &r, 0.3f, false);
  size_t count = (size_t)(sh->b * sh->t * sh->d);
  float *x = malloc(count * sizeof *x), *t = malloc(count * sizeof *t);
  cr_assert(x && t);
  mn_rng_fill(&r, x, count, -1.0f, 1.0f);
  mn_rng_fill(&r, t, count, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(s[i], "t", t, count), MN_OK, "%s", mn_last_error());
  }
  free(x);
  free(t);
}

Test(attention_qkv, low_precision_plans_read_the_projection_in_place) {
  mn_graph *g = qkv_block(&tiny, false);
  const mn_precision low[] = {MN_PRECISION_BF16, MN_PRECISION_F16};
  for (size_t i = 0; i < 2; i++) {
    mn_optimize_report *r = NULL;
    mn_session *s = build(g, MN_BACKEND_CPU, low[i], false, &r);
    cr_assert_eq(r->stage[MN_OPTIMIZE_FULL].qkv_attentions, 1);
    const mn_plan *p = s->plan;
    cr_assert_eq(count_op(p, MN_OP_QKV_CAUSAL_ATTENTION), 1);
    cr_assert_eq(count_op(p, MN_OP_QKV_ATTENTION_GRAD_SAVED), 1);
    cr_assert_eq(count_op(p, MN_OP_SLICE_LAST) + count_op(p, MN_OP_SLICE_LAST_GRAD) +
                     count_op(p, MN_OP_CAUSAL_ATTENTION) +
                     count_op(p, MN_OP_ATTENTION_GRAD_Q_SAVED) +
                     count_op(p, MN_OP_ATTENTION_GRAD_KV_SAVED),
                 0, "a slice or a separate attention op is left");
    /* The gradient reads the projection itself and has its shape. */
    for (size_t n = 0; n < p->graph->num_nodes; n++) {
      const mn_node_rec *rec = &p->graph->nodes[n];
      if (rec->op != MN_OP_QKV_ATTENTION_GRAD_SAVED) continue;
      cr_assert(mn_type_same_shape(&rec->type, &p->graph->nodes[rec->inputs[0]].type));
      cr_assert_eq(mn_plan_buffer_of(p, mn_plan_extra_output(p, rec->inputs[2], 1))->storage,
                   MN_F32, "the statistics stay fp32");
    }
    mn_session_free(s);
    mn_optimize_report_free(r);
  }
  mn_graph_free(g);
}

/* fp32 plans (no saved statistics), the pass turned off, head dims the wide-row kernels do not
 * take, a slice read outside the attention, and slices of a parameter keep the slices. */
Test(attention_qkv, the_pass_stays_away_where_it_must) {
  block_shape odd = tiny;
  odd.hd = 8;
  struct {
    block_shape shape;
    bool q_out, off, leaf;
    mn_precision prec;
  } cases[] = {{tiny, false, false, false, MN_PRECISION_F32},
               {tiny, false, true, false, MN_PRECISION_BF16},
               {odd, false, false, false, MN_PRECISION_BF16},
               {tiny, true, false, false, MN_PRECISION_BF16},
               {tiny, false, false, true, MN_PRECISION_BF16}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mn_graph *g = qkv_block_of(&cases[i].shape, cases[i].q_out, cases[i].leaf);
    mn_session *s = build(g, MN_BACKEND_CPU, cases[i].prec, cases[i].off, NULL);
    cr_assert_eq(qkv_ops(s->plan), 0, "case %zu", i);
    cr_assert_geq(count_op(s->plan, MN_OP_SLICE_LAST), 3, "case %zu", i);
    mn_session_free(s);
    mn_graph_free(g);
  }
}

/* Three AdamW steps of the in-place plan and of the sliced one (the pass turned off), each in
 * `backend`: the same losses and weights, bit for bit. */
static void same_steps(const block_shape *sh, mn_backend backend) {
  mn_graph *g = qkv_block(sh, false);
  mn_session *s[2] = {build(g, backend, MN_PRECISION_BF16, false, NULL),
                      build(g, backend, MN_PRECISION_BF16, true, NULL)};
  cr_assert_eq(qkv_ops(s[0]->plan), 2);
  cr_assert_eq(qkv_ops(s[1]->plan), 0);
  feed(g, s, 2, sh);
  for (int step = 0; step < 3; step++) {
    float a = mn_test_step_loss(s[0]), b = mn_test_step_loss(s[1]);
    cr_assert_eq(a, b, "step %d: loss %.9g in place, %.9g sliced", step, (double)a, (double)b);
  }
  mn_test_assert_same_params(g, s[0], s[1], 0.0, "after 3 steps");
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

Test(attention_qkv, the_step_is_bitwise_the_sliced_one) { same_steps(&tiny, MN_BACKEND_CPU); }

Test(attention_qkv, cached_plans_keep_the_rewrite) {
  mn_graph *g = qkv_block(&tiny, false);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_attention_qkv");
  const char *path = mn_tmp_path(&dir, "plan.json");
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = MN_PRECISION_BF16;
  mn_session *s[3] = {build(g, MN_BACKEND_CPU, MN_PRECISION_BF16, false, NULL), NULL, NULL};
  for (int i = 1; i < 3; i++)
    cr_assert_eq(mn_build_session_cached(g, path, &o, &s[i]), MN_OK, "%s", mn_last_error());
  for (int i = 1; i < 3; i++)
    adamw(s[i]);
  cr_assert_eq(qkv_ops(s[2]->plan), 2, "the plan read from the cache");
  feed(g, s, 3, &tiny);
  for (int i = 0; i < 3; i++)
    mn_test_step_loss(s[i]);
  for (int i = 1; i < 3; i++)
    mn_test_assert_same_params(g, s[i], s[0], 0.0, "after a step of a cached plan");
  for (int i = 0; i < 3; i++)
    mn_session_free(s[i]);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

/* The wide-row kernels compile for sm_90 (NVRTC; no device needed). */
Test(attention_qkv, the_wide_row_kernels_compile) {
  mn_test_require_cuda_build();
  const block_shape shapes[] = {{2, 150, 64, 4, 4, 64}, {2, 70, 64, 4, 2, 128}};
  for (size_t i = 0; i < 2; i++) {
    mn_graph *g = qkv_block(&shapes[i], false);
    mn_test_assert_compiles_precision(g, true, MN_PRECISION_BF16);
    mn_graph_free(g);
  }
}

/* Head dim 64 (dK | dV in one launch), all heads their own, a sequence of 2 tiles and a part. */
Test(attention_qkv, cuda_hd64_is_bitwise_the_sliced_step) {
  mn_test_require_cuda_device();
  same_steps(&(block_shape){2, 150, 64, 4, 4, 64}, MN_BACKEND_CUDA);
}

/* Head dim 128 (dK, then dV), two query heads a kv head. */
Test(attention_qkv, cuda_hd128_gqa_is_bitwise_the_sliced_step) {
  mn_test_require_cuda_device();
  same_steps(&(block_shape){2, 70, 64, 4, 2, 128}, MN_BACKEND_CUDA);
}

/* The qkv ops on CUDA against the CPU's, every gradient of one bf16 step at MN_TEST_BF16_TOL
 * (both plans read the projection in place). */
Test(attention_qkv, cuda_qkv_ops_match_the_cpu) {
  mn_test_require_cuda_device();
  const block_shape shapes[] = {{2, 150, 64, 4, 4, 64}, {2, 70, 64, 4, 2, 128}};
  for (size_t i = 0; i < 2; i++) {
    mn_graph *g = qkv_block(&shapes[i], false);
    mn_session *s = build(g, MN_BACKEND_CPU, MN_PRECISION_BF16, false, NULL);
    cr_assert_eq(qkv_ops(s->plan), 2, "shape %zu: the plan reads the projection in place", i);
    mn_session_free(s);
    double e =
        mn_test_compare_cuda_precision(g, true, MN_PRECISION_BF16, MN_TEST_BF16_TOL, NULL, 61 + i);
    cr_log_info("shape %zu: largest relative error against the CPU %.3g", i, e);
    mn_graph_free(g);
  }
}
