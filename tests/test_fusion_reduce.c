/* Reduction prologues and epilogues (optimizer/fusion.h): a row op (layer_norm, rms_norm and
 * their x gradients) joins a fused group with the pointwise ops that compute its x and dy
 * (its prologue, values also read elsewhere written as extra values) and those that consume
 * its result (its epilogue). Where they form and where they must not (a path that leaves the
 * group and comes back, another shape, a computed weight, a second row op, too many inputs);
 * fused sessions compute bit for bit what unfused ones do (each row op alone, a GPT-2 style
 * stack and an MLP with a norm over three AdamW steps, against the optimized session without
 * fusion); dispatches go down; the plan cache keeps the programs and its reader checks them;
 * the generated kernels compile (NVRTC, no device) and, with a device, agree with the CPU. */
#include <stdio.h>
#include <stdlib.h>

#include "benchmarks/gpt_graph.h"
#include "io/plan_cache.h"
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/fusion_check.h"
#include "tests/support/graph_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

enum { STEPS = 3 };

static const mn_op row_ops[] = {MN_OP_LAYER_NORM, MN_OP_RMS_NORM, MN_OP_LAYER_NORM_GRAD_X,
                                MN_OP_RMS_NORM_GRAD_X};

/* Row op `op` over x [.., N] (dy of x's shape for the gradients), reading weight w and, for
 * layer_norm, bias b, all given; built past the builders, which do not make gradients. */
static mn_node row_op(mn_graph *g, mn_op op, mn_node x, mn_node w, mn_node b, mn_node dy) {
  mn_op_attrs a = {.eps = 1e-5f};
  mn_node ins[3] = {x, w, op == MN_OP_LAYER_NORM ? b : dy};
  int n = op == MN_OP_RMS_NORM ? 2 : 3;
  mn_node id = mn_graph_append(g, op, ins, n, &g->nodes[x].type, &a, NULL);
  cr_assert_neq(id, MN_NO_NODE);
  return id;
}

/* The leaves of a row op over [rows, n]: x, w [n], b [n], dy. */
typedef struct leaves {
  mn_node x, w, b, dy;
} leaves;

static leaves leaves_of(mn_graph *g, int64_t rows, int64_t n) {
  return (leaves){mn_input(g, "x", MN_SHAPE(rows, n)), mn_input(g, "w", MN_SHAPE(n)),
                  mn_input(g, "b", MN_SHAPE(n)), mn_input(g, "dy", MN_SHAPE(rows, n))};
}

static size_t count_pointwise(const mn_graph *g) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += (mn_op_flags(g->nodes[i].op) & MN_OPF_POINTWISE) && g->nodes[i].op != MN_OP_FUSED;
  return n;
}

/* The fused nodes of the lowered inference graph of g: their programs' ops, one string per
 * node ("add layer_norm"), compared with `want` (NULL-terminated). */
static void expect_programs(const mn_graph *g, bool training, const char *const *want,
                            size_t pointwise_left) {
  mn_plan *p = mn_fz_lower(g, training);
  const mn_graph *lg = p->graph;
  size_t k = 0;
  for (size_t i = 0; i < lg->num_nodes; i++) {
    const mn_fused_prog *f = lg->nodes[i].fused;
    if (!f) continue;
    char why[128] = "", ops[512] = "";
    cr_assert(mn_fused_prog_check(f, lg->nodes[i].num_inputs, why, sizeof why), "%s", why);
    for (int r = 0; r < f->num_instrs; r++)
      snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", r ? " " : "",
               mn_op_name(f->instrs[r].op));
    cr_assert_not_null(want[k], "unexpected fused node [%s]", ops);
    cr_assert_str_eq(ops, want[k], "fused node %zu is [%s], expected [%s]", k, ops, want[k]);
    k++;
  }
  cr_assert_null(want[k], "%zu fused nodes, expected more: [%s]", k, want[k]);
  cr_assert_eq(count_pointwise(lg), pointwise_left, "%zu pointwise ops left, expected %zu",
               count_pointwise(lg), pointwise_left);
  mn_plan_free(p);
}
#define PROGRAMS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The fused node of the lowered inference graph of g, which must hold exactly one. */
static const mn_node_rec *only_fused(const mn_plan *p) {
  const mn_node_rec *found = NULL;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    if (p->graph->nodes[i].op == MN_OP_FUSED) {
      cr_assert_null(found, "two fused nodes");
      found = &p->graph->nodes[i];
    }
  cr_assert_not_null(found);
  return found;
}

/* ---------------------------------------------------------------- where they form */

Test(fusion_reduce, epilogue_of_each_row_op) {
  for (size_t i = 0; i < sizeof row_ops / sizeof row_ops[0]; i++) {
    mn_graph *g = mn_graph_new();
    leaves l = leaves_of(g, 6, 8);
    mn_node z = mn_input(g, "z", MN_SHAPE(6, 8));
    mn_node r = row_op(g, row_ops[i], l.x, l.w, l.b, l.dy);
    MN_TEST_OUTPUTS(g, mn_tanh(g, mn_add(g, r, z)));
    char want[64];
    snprintf(want, sizeof want, "%s add tanh", mn_op_name(row_ops[i]));
    expect_programs(g, false, PROGRAMS(want), 0);
    mn_plan *p = mn_fz_lower(g, false);
    cr_assert_eq(p->num_dispatches, 1);
    mn_plan_free(p);
    mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 20 + i, -2, 2);
    mn_graph_free(g);
  }
}

/* The residual sum is read by the norm and is an output: the fused kernel writes it as
 * extra value 1 while the norm reads it. */
Test(fusion_reduce, prologue_of_each_row_op_writes_its_value) {
  for (size_t i = 0; i < sizeof row_ops / sizeof row_ops[0]; i++) {
    mn_graph *g = mn_graph_new();
    leaves l = leaves_of(g, 5, 12);
    mn_node h = mn_add(g, l.x, mn_input(g, "a", MN_SHAPE(5, 12)));
    MN_TEST_OUTPUTS(g, row_op(g, row_ops[i], h, l.w, l.b, l.dy), h);
    char want[64];
    snprintf(want, sizeof want, "add %s", mn_op_name(row_ops[i]));
    expect_programs(g, false, PROGRAMS(want), 0);
    mn_plan *p = mn_fz_lower(g, false);
    const mn_node_rec *f = only_fused(p);
    cr_assert_eq(f->fused->instrs[0].out, 1);
    cr_assert_eq(mn_node_num_extra_outputs(f), 1);
    cr_assert_eq(p->num_dispatches, 1);
    mn_plan_free(p);
    mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 30 + i, -2, 2);
    mn_graph_free(g);
  }
}

/* The gradients with both operands computed, and an epilogue: x = a + b, dy = tanh(d). */
Test(fusion_reduce, gradient_prologue_on_x_and_dy) {
  for (size_t i = 2; i < sizeof row_ops / sizeof row_ops[0]; i++) {
    mn_graph *g = mn_graph_new();
    mn_node a = mn_input(g, "a", MN_SHAPE(4, 6)), b = mn_input(g, "b", MN_SHAPE(4, 6));
    mn_node w = mn_input(g, "w", MN_SHAPE(6)), d = mn_input(g, "d", MN_SHAPE(4, 6));
    mn_node x = mn_add(g, a, b), dy = mn_tanh(g, d);
    mn_node r = row_op(g, row_ops[i], x, w, MN_NO_NODE, dy);
    MN_TEST_OUTPUTS(g, mn_scale(g, r, 0.5f));
    char want[64];
    snprintf(want, sizeof want, "add tanh %s scale", mn_op_name(row_ops[i]));
    expect_programs(g, false, PROGRAMS(want), 0);
    mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 40 + i, -2, 2);
    mn_graph_free(g);
  }
}

/* A value that both the prologue and the epilogue read (sigmoid(a)), the norm's own result
 * read outside (an extra value between the two), and rows of 7 floats (one per access). */
Test(fusion_reduce, prologue_and_epilogue_share_values) {
  for (size_t i = 0; i < 2; i++) {
    mn_graph *g = mn_graph_new();
    leaves l = leaves_of(g, 3, 7);
    mn_node s = mn_sigmoid(g, mn_input(g, "a", MN_SHAPE(3, 7)));
    mn_node r = row_op(g, row_ops[i], mn_mul(g, s, l.x), l.w, l.b, l.dy);
    MN_TEST_OUTPUTS(g, mn_add(g, mn_relu(g, r), s), r);
    char want[64];
    snprintf(want, sizeof want, "sigmoid mul %s relu add", mn_op_name(row_ops[i]));
    expect_programs(g, false, PROGRAMS(want), 0);
    mn_plan *p = mn_fz_lower(g, false);
    cr_assert_eq(only_fused(p)->fused->instrs[2].out, 1, "the norm's result is written out");
    mn_plan_free(p);
    mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 50 + i, -2, 2);
    mn_graph_free(g);
  }
}

/* ---------------------------------------------------------------- where they must not */

/* The norm's result feeds a matmul whose product the epilogue reads. */
Test(fusion_reduce, no_epilogue_where_a_path_comes_back) {
  mn_graph *g = mn_graph_new();
  leaves l = leaves_of(g, 4, 4);
  mn_node y = row_op(g, MN_OP_LAYER_NORM, l.x, l.w, l.b, l.dy);
  MN_TEST_OUTPUTS(g, mn_add(g, y, mn_matmul(g, y, mn_input(g, "m", MN_SHAPE(4, 4)))));
  expect_programs(g, false, PROGRAMS(NULL), 1);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 60, -2, 2);
  mn_graph_free(g);
}

/* A consumer that reads the norm's [2,4] result as [8] is not elementwise over its rows. */
Test(fusion_reduce, no_epilogue_of_another_shape) {
  mn_graph *g = mn_graph_new();
  leaves l = leaves_of(g, 2, 4);
  mn_node y = row_op(g, MN_OP_RMS_NORM, l.x, l.w, l.b, l.dy);
  mn_tensor_type t = mn_type_make(MN_F32, MN_SHAPE(8));
  mn_node e = mn_graph_append(g, MN_OP_EXP, &y, 1, &t, NULL, NULL);
  MN_TEST_OUTPUTS(g, e);
  expect_programs(g, false, PROGRAMS(NULL), 1);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 61, -2, 2);
  mn_graph_free(g);
}

/* Rows of one: the weight has x's type, and a weight computed by relu must stay a buffer
 * the kernel reads whole (the epilogue still fuses). */
Test(fusion_reduce, computed_weight_stays_out) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8)), w = mn_relu(g, mn_input(g, "w", MN_SHAPE(8)));
  MN_TEST_OUTPUTS(g, mn_exp(g, mn_rms_norm(g, x, w, 1e-5f)));
  expect_programs(g, false, PROGRAMS("rms_norm exp"), 1);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 62, -2, 2);
  mn_graph_free(g);
}

Test(fusion_reduce, one_row_op_per_group) {
  mn_graph *g = mn_graph_new();
  leaves l = leaves_of(g, 4, 8);
  mn_node y = mn_layer_norm(g, l.x, l.w, l.b, 1e-5f);
  mn_node h = mn_add(g, y, mn_input(g, "z", MN_SHAPE(4, 8)));
  MN_TEST_OUTPUTS(g, mn_rms_norm(g, h, l.w, 1e-5f));
  expect_programs(g, false, PROGRAMS("add rms_norm"), 0);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 63, -2, 2);
  mn_graph_free(g);
}

/* (a + b) + c, w and the bias are five values: the prologue keeps the second add only. */
Test(fusion_reduce, prologue_within_four_inputs) {
  mn_graph *g = mn_graph_new();
  leaves l = leaves_of(g, 4, 8);
  mn_node s =
      mn_add(g, mn_add(g, l.x, mn_input(g, "a", MN_SHAPE(4, 8))), mn_input(g, "c", MN_SHAPE(4, 8)));
  MN_TEST_OUTPUTS(g, mn_layer_norm(g, s, l.w, l.b, 1e-5f));
  expect_programs(g, false, PROGRAMS("add layer_norm"), 1);
  mn_fz_agree_inference(g, MN_FZ_UNOPTIMIZED, 64, -2, 2);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- models */

/* A GPT-2 style stack over an F32 input (benchmarks/gpt_graph.h's blocks): pre-norm causal
 * attention and a GELU MLP with biases, residual sums, a final layer norm. */
static mn_graph *gpt_stack(int layers, int64_t d) {
  mn_graph *g = mn_graph_new();
  mn_node h = mn_input(g, "h", MN_SHAPE(2, 5, d)), t = mn_input(g, "t", MN_SHAPE(2, 5, d));
  for (int l = 0; l < layers; l++) {
    mn_node a = gpt_norm(g, h, l, "ln_1", d);
    /* The key projection has no bias: that bias's exact gradient is 0 (a softmax row does
     * not change when one constant is added to all its scores), so both backends give only
     * rounding noise there, and a relative error between two noises means nothing. */
    char kname[64];
    snprintf(kname, sizeof kname, "transformer.h.%d.attn.k.weight", l);
    mn_node q = gpt_linear(g, a, l, "attn.q", d, d),
            k = mn_matmul(g, a, mn_parameter(g, kname, MN_SHAPE(d, d)));
    mn_node v = gpt_linear(g, a, l, "attn.v", d, d);
    h = mn_add(
        g, h,
        gpt_linear(g, mn_causal_attention(g, q, k, v, 2, 2, (int)(d / 2)), l, "attn.c_proj", d, d));
    mn_node m = mn_gelu(g, gpt_linear(g, gpt_norm(g, h, l, "ln_2", d), l, "mlp.c_fc", d, 2 * d));
    h = mn_add(g, h, gpt_linear(g, m, l, "mlp.c_proj", 2 * d, d));
  }
  mn_node y = mn_layer_norm(g, h, mn_parameter(g, "ln_f.weight", MN_SHAPE(d)),
                            mn_parameter(g, "ln_f.bias", MN_SHAPE(d)), 1e-5f);
  return MN_TEST_OUTPUTS(g, mn_mse_loss(g, y, t));
}

/* x -> linear -> layer_norm of (it + x) -> relu -> linear, trained to t. */
static mn_graph *norm_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(8, 12)), t = mn_input(g, "t", MN_SHAPE(8, 12));
  mn_node h = mn_bias_add(g, mn_matmul(g, x, mn_parameter(g, "w1", MN_SHAPE(12, 12))),
                          mn_parameter(g, "b1", MN_SHAPE(12)));
  h = mn_layer_norm(g, mn_add(g, h, x), mn_parameter(g, "ln.weight", MN_SHAPE(12)),
                    mn_parameter(g, "ln.bias", MN_SHAPE(12)), 1e-5f);
  mn_node y = mn_matmul(g, mn_relu(g, h), mn_parameter(g, "w2", MN_SHAPE(12, 12)));
  return MN_TEST_OUTPUTS(g, mn_mse_loss(g, mn_tanh(g, y), t));
}

static size_t dispatches(const mn_graph *g, bool fused) {
  mn_session_options o = mn_fz_cpu(true);
  o.fusion = fused ? MN_FUSION_AUTO : MN_FUSION_OFF;
  mn_plan *p = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  size_t n = p->num_dispatches;
  mn_plan_free(p);
  return n;
}

/* Fused nodes holding a row op in the lowered training graph of g. */
static size_t row_fusions(const mn_graph *g) {
  mn_plan *p = mn_fz_lower(g, true);
  size_t n = 0;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    n += p->graph->nodes[i].fused && mn_fused_prog_row(p->graph->nodes[i].fused) >= 0;
  mn_plan_free(p);
  return n;
}

/* Forward: every norm but the first layer's ln_1 (which reads the input) takes the residual
 * sum before it as its prologue, 2 per layer. Backward: every norm's x gradient but ln_f's
 * (the first, with nothing to add to) and the first ln_1's (the input has no gradient) adds
 * the residual gradient as its epilogue, 2 per layer less one. */
Test(fusion_reduce, gpt_stack_trains_bit_for_bit) {
  enum { LAYERS = 2 };
  mn_graph *g = gpt_stack(LAYERS, 8);
  size_t rows = row_fusions(g);
  cr_assert_eq(rows, 4 * LAYERS - 1, "%zu fused row ops", rows);
  size_t unfused = dispatches(g, false), fused = dispatches(g, true);
  cr_assert_lt(fused + rows, unfused + 1, "%zu dispatches fused, %zu without fusion", fused,
               unfused);
  mn_fz_agree_training(g, MN_FZ_OPTIMIZED_UNFUSED, STEPS, 13, -1, 1);
  mn_graph_free(g);
}

Test(fusion_reduce, norm_mlp_trains_bit_for_bit) {
  mn_graph *g = norm_mlp();
  cr_assert_gt(row_fusions(g), 0);
  cr_assert_lt(dispatches(g, true), dispatches(g, false));
  mn_fz_agree_training(g, MN_FZ_OPTIMIZED_UNFUSED, STEPS, 14, -1, 1);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- plan cache */

static float *train_losses(const mn_graph *g, mn_session *s) {
  mn_rng r = mn_rng_new(5);
  mn_test_init_uniform(g, s, &r, -1, 1, true);
  cr_assert_eq(mn_session_set_adamw(s, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f), MN_OK);
  float *out = malloc((STEPS + mn_test_param_count(g)) * sizeof *out);
  for (int t = 0; t < STEPS; t++) {
    cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
    out[t] = mn_session_read_loss(s);
  }
  float *params = mn_test_read_params(g, s);
  memcpy(out + STEPS, params, mn_test_param_count(g) * sizeof *out);
  free(params);
  mn_session_free(s);
  return out;
}

/* text with its first occurrence of `from` replaced by `to`; malloc'd. */
static char *replaced(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  cr_assert_not_null(at, "no %s in the plan", from);
  size_t head = (size_t)(at - text);
  char *s = malloc(strlen(text) + strlen(to) + 1);
  memcpy(s, text, head);
  strcpy(s + head, to);
  strcat(s, at + strlen(from));
  return s;
}

Test(fusion_reduce, plan_cache_keeps_row_programs) {
  mn_graph *g = norm_mlp();
  mn_tmp_dir t = mn_tmp_dir_make("mn_fusion_reduce_cache");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&t, "plan.json"));
  size_t n = STEPS + mn_test_param_count(g);
  float *ref = train_losses(g, mn_fz_build(g, MN_FZ_FUSED, true));
  mn_session_options o = mn_fz_cpu(true);
  for (int pass = 0; pass < 2; pass++) {
    mn_session *s = NULL;
    cr_assert_eq(mn_build_session_cached(g, path, &o, &s), MN_OK, "%s", mn_last_error());
    float *got = train_losses(g, s);
    cr_assert(memcmp(ref, got, n * sizeof *got) == 0, "pass %d differs", pass);
    free(got);
  }
  char *text = mn_test_read_file(path, NULL);
  /* The residual sum (extra value 1), then the norm over it with inputs 2 and 3 as rows. */
  const char *prog = "\"program\":[{\"op\":\"add\",\"args\":[0,1],\"out\":1},"
                     "{\"op\":\"layer_norm\",\"args\":[4,2,3],\"attrs\":{\"eps\":";
  cr_assert_not_null(strstr(text, prog), "%s", text);

  /* The reader checks the new parts of programs. */
  const char *from[] = {"\"out\":1}", "\"out\":1}", "\"args\":[4,2,3]", "\"args\":[4,2,3]",
                        "{\"op\":\"add\",\"args\":[0,1]"};
  const char *to[] = {"\"out\":4}", "\"out\":1,\"attrs\":{\"eps\":1}}", "\"args\":[4,4,3]",
                      "\"args\":[4,0,3]", "{\"op\":\"rms_norm\",\"args\":[0,1]"};
  const char *why_part[] = {"bad out", "bad attrs", "row operand 4 is not an input",
                            "read both as a row and elementwise", "second row op"};
  for (size_t k = 0; k < sizeof from / sizeof from[0]; k++) {
    char *edited = replaced(text, from[k], to[k]);
    mn_plan *plan = NULL;
    char why[256] = "";
    cr_assert_eq(mn_plan_cache_parse(edited, strlen(edited), g, &o, 0, &plan, why, sizeof why),
                 MN_ERR_FORMAT, "edit %zu accepted", k);
    cr_assert(strstr(why, why_part[k]), "\"%s\" lacks \"%s\"", why, why_part[k]);
    cr_assert_null(plan);
    free(edited);
  }
  free(text);
  free(ref);
  mn_tmp_dir_remove(&t);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- CUDA */

/* Every row op with a prologue (written out) and an epilogue, over rows of 8 (warp per row),
 * 6 (two floats per access), 7 (one) and 65536 floats (too wide for registers: re-read per
 * pass). */
static mn_graph *row_zoo(void) {
  static const int64_t widths[] = {8, 6, 7, 65536};
  mn_graph *g = mn_graph_new();
  mn_node outs[32];
  size_t n = 0;
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (size_t i = 0; i < sizeof row_ops / sizeof row_ops[0]; i++) {
      char name[4][32];
      const char *what[4] = {"x", "w", "b", "d"};
      for (int k = 0; k < 4; k++)
        snprintf(name[k], sizeof name[k], "%s%zu_%zu", what[k], wi, i);
      int64_t rows = widths[wi] > 1000 ? 2 : 5, c = widths[wi];
      mn_node x = mn_input(g, name[0], MN_SHAPE(rows, c));
      mn_node h = mn_sigmoid(g, x);
      mn_node r = row_op(g, row_ops[i], h, mn_input(g, name[1], MN_SHAPE(c)),
                         mn_input(g, name[2], MN_SHAPE(c)),
                         mn_tanh(g, mn_input(g, name[3], MN_SHAPE(rows, c))));
      outs[n++] = mn_add(g, mn_scale(g, r, 0.5f), x);
      outs[n++] = h;
    }
  return mn_test_with_outputs(g, outs, n);
}

Test(fusion_reduce_cuda, row_kernels_compile) {
  mn_test_require_cuda_build();
  mn_graph *zoo = row_zoo();
  mn_test_assert_compiles(zoo, false);
  mn_graph_free(zoo);
  mn_graph *models[] = {gpt_stack(2, 8), norm_mlp()};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    mn_test_assert_compiles(models[i], true);
    mn_graph_free(models[i]);
  }
}

Test(fusion_reduce_cuda, row_kernels_match_the_cpu) {
  mn_test_require_cuda_device();
  mn_graph *zoo = row_zoo();
  mn_test_check_cuda(zoo, false, NULL, 71);
  mn_graph_free(zoo);
  mn_graph *models[] = {gpt_stack(2, 8), gpt_stack(1, 64), norm_mlp()};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    mn_test_check_cuda_model(models[i], true, NULL, 72 + i);
    mn_graph_free(models[i]);
  }
}
