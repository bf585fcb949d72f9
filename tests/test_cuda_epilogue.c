/* The matrix products with a cuBLASLt epilogue (matmul_bias_act, matmul_dgelu,
 * matmul_at_bgrad and its extra_output) and group_norm's fused silu, on CUDA against the
 * reference backend. The optimizer's full stage makes these ops; here each graph is built
 * node by node and its sessions are built with the optimizer off, so the ops run as built.
 * Every graph's kernels are compiled with NVRTC (no device needed) and its lowering is
 * checked to offer the epilogue with a fallback; on a GPU both backends run it on the same
 * random data, in fp32 at 1e-5 and with TF32 products at the documented 2e-3. Whether
 * cuBLASLt fused each epilogue or the fallback kernels ran is logged (both are correct). */
#include <stdio.h>
#include <stdlib.h>

#include "host/graph.h"
#include "host/plan.h"
#include "session/session.h"
#include "tests/support/cuda_check.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/emit.h"
#endif

#define FP32_TOL 1e-5
#define TF32_TOL 2e-3

static mn_node raw(mn_graph *g, mn_op op, const mn_node *ins, int n, const int64_t *shape, int rank,
                   mn_op_attrs attrs) {
  mn_tensor_type t = mn_type_make(MN_F32, shape, rank);
  mn_node id = mn_graph_append(g, op, ins, n, &t, &attrs, NULL);
  cr_assert_neq(id, MN_NO_NODE, "%s", mn_graph_error(g));
  return id;
}

static void set_outputs(mn_graph *g, const mn_node *outs, size_t n) {
  mn_set_outputs(g, outs, n);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
}

/* act(a op(b) + bias) with a of shape sa [.., K], N outputs; bias [N], or [1, N] when
 * bias_2d. variant 1 stores b as [N, K]. */
static mn_graph *bias_act_graph(const int64_t *sa, int ra, int64_t n, int variant, mn_act act,
                                bool bias_2d) {
  mn_graph *g = mn_graph_new();
  int64_t k = sa[ra - 1];
  mn_node a = mn_input(g, "a", sa, ra);
  mn_node b = variant ? mn_input(g, "b", MN_SHAPE(n, k)) : mn_input(g, "b", MN_SHAPE(k, n));
  mn_node bias = bias_2d ? mn_input(g, "bias", MN_SHAPE(1, n)) : mn_input(g, "bias", MN_SHAPE(n));
  int64_t so[MN_MAX_RANK];
  for (int i = 0; i < ra - 1; i++)
    so[i] = sa[i];
  so[ra - 1] = n;
  mn_node y = raw(g, MN_OP_MATMUL_BIAS_ACT, (mn_node[]){a, b, bias}, 3, so, ra,
                  (mn_op_attrs){.variant = variant, .act = act});
  set_outputs(g, &y, 1);
  return g;
}

/* op (matmul_dgelu: gelu_grad(pre, a op(b)); matmul_drelu: relu_grad(x, a op(b))), pre or x
 * of the product's shape. */
static mn_graph *gated_graph(mn_op op, const int64_t *sa, int ra, int64_t n, int variant) {
  mn_graph *g = mn_graph_new();
  int64_t k = sa[ra - 1];
  int64_t so[MN_MAX_RANK];
  for (int i = 0; i < ra - 1; i++)
    so[i] = sa[i];
  so[ra - 1] = n;
  mn_node a = mn_input(g, "a", sa, ra);
  mn_node b = variant ? mn_input(g, "b", MN_SHAPE(n, k)) : mn_input(g, "b", MN_SHAPE(k, n));
  mn_node pre = mn_input(g, "pre", so, ra);
  mn_node y = raw(g, op, (mn_node[]){a, b, pre}, 3, so, ra, (mn_op_attrs){.variant = variant});
  set_outputs(g, &y, 1);
  return g;
}
static mn_graph *dgelu_graph(const int64_t *sa, int ra, int64_t n, int variant) {
  return gated_graph(MN_OP_MATMUL_DGELU, sa, ra, n, variant);
}

/* matmul_drelu_bgrad: relu_grad(x, a op(b)) and its column sums, both outputs. */
static mn_graph *drelu_bgrad_graph(const int64_t *sa, int ra, int64_t n, int variant) {
  mn_graph *g = gated_graph(MN_OP_MATMUL_DRELU_BGRAD, sa, ra, n, variant);
  mn_node y = g->outputs[0];
  mn_node sums = raw(g, MN_OP_EXTRA_OUTPUT, &y, 1, &n, 1, (mn_op_attrs){.variant = 1});
  set_outputs(g, (mn_node[]){y, sums}, 2);
  return g;
}

/* a [.., M]^T b [.., N] and the column sums of a (variant 0) or b (variant 1), both outputs. */
static mn_graph *at_bgrad_graph(const int64_t *sa, int ra, const int64_t *sb, int rb, int variant) {
  mn_graph *g = mn_graph_new();
  int64_t m = sa[ra - 1], n = sb[rb - 1];
  mn_node a = mn_input(g, "a", sa, ra), b = mn_input(g, "b", sb, rb);
  mn_node y = raw(g, MN_OP_MATMUL_AT_BGRAD, (mn_node[]){a, b}, 2, MN_SHAPE(m, n),
                  (mn_op_attrs){.variant = variant});
  int64_t sums_len = variant ? n : m;
  mn_node sums = raw(g, MN_OP_EXTRA_OUTPUT, &y, 1, &sums_len, 1, (mn_op_attrs){.variant = 1});
  set_outputs(g, (mn_node[]){y, sums}, 2);
  return g;
}

/* gelu_grad(pre, dy) of shape s and its column sums, outputs; with_gelu (variant 1) gelu(pre)
 * too. */
static mn_graph *gelu_bgrad_graph_with(const int64_t *s, int rank, bool with_gelu) {
  mn_graph *g = mn_graph_new();
  mn_node pre = mn_input(g, "pre", s, rank), dy = mn_input(g, "dy", s, rank);
  mn_node y = raw(g, MN_OP_GELU_GRAD_BGRAD, (mn_node[]){pre, dy}, 2, s, rank,
                  (mn_op_attrs){.variant = with_gelu});
  mn_node sums = raw(g, MN_OP_EXTRA_OUTPUT, &y, 1, &s[rank - 1], 1, (mn_op_attrs){.variant = 1});
  mn_node act = with_gelu ? raw(g, MN_OP_EXTRA_OUTPUT, &y, 1, s, rank, (mn_op_attrs){.variant = 2})
                          : MN_NO_NODE;
  set_outputs(g, (mn_node[]){y, sums, act}, with_gelu ? 3 : 2);
  return g;
}
static mn_graph *gelu_bgrad_graph(const int64_t *s, int rank) {
  return gelu_bgrad_graph_with(s, rank, false);
}

/* silu(group_norm(x)) as one node. */
static mn_graph *gn_silu_graph(int64_t n, int64_t c, int64_t h, int64_t w, int groups) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(n, c, h, w));
  mn_node wt = mn_input(g, "w", MN_SHAPE(c)), b = mn_input(g, "bias", MN_SHAPE(c));
  mn_node y = raw(g, MN_OP_GROUP_NORM, (mn_node[]){x, wt, b}, 3, MN_SHAPE(n, c, h, w),
                  (mn_op_attrs){.groups = groups, .eps = 1e-5f, .act = MN_ACT_SILU});
  set_outputs(g, &y, 1);
  return g;
}

#ifdef MN_WITH_CUDA
static mn_session_options options(mn_backend backend, bool tf32) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.allow_tf32 = tf32;
  o.optimize = false;
  return o;
}

static mn_plan *lower(const mn_graph *g) {
  mn_session_options o = options(MN_BACKEND_CPU, false);
  mn_plan *plan = NULL;
  mn_status st = mn_lower_inference("test", g, &o, &plan);
  cr_assert_eq(st, MN_OK, "lowering failed: %s", mn_last_error());
  return plan;
}
#endif

/* The graph's kernels, fallbacks included, compile for sm_90. */
static void assert_compiles(const mn_graph *g) {
#ifdef MN_WITH_CUDA
  mn_plan *plan = lower(g);
  mn_cu_binary bin;
  mn_status st = mn_cuda_compile_plan(plan, "sm_90", false, false, "", &bin);
  mn_plan_free(plan);
  cr_assert_eq(st, MN_OK, "kernels do not compile: %s", mn_last_error());
  cr_assert_gt(bin.size, 0u, "empty cubin");
  mn_cu_binary_free(&bin);
#else
  (void)g;
#endif
}

#ifdef MN_WITH_CUDA
/* The dispatch of the graph's one `op` node lowers to `cmds` commands: a matmul offering
 * `epi` (writing or reading the vector of a node of op `vector_of`, unless that is
 * MN_OP_COUNT), then kernels that are all its fallback, or (no epilogue) none of them. */
static void assert_lowering(const mn_graph *g, mn_op op, mn_cu_epilogue epi, mn_op vector_of,
                            size_t cmds) {
  mn_plan *plan = lower(g);
  mn_cu_program prog;
  cr_assert_eq(mn_cu_program_build(plan, false, &prog), MN_OK, "%s", mn_last_error());
  const mn_graph *pg = plan->graph;
  size_t first = prog.num_cmds, count = 0;
  for (size_t i = 0; i < prog.num_cmds; i++)
    if (pg->nodes[prog.cmds[i].node].op == op) {
      first = first < i ? first : i;
      count++;
    }
  cr_assert_eq(count, cmds, "%s lowers to %zu commands", mn_op_name(op), count);
  const mn_cu_cmd *mm = &prog.cmds[first];
  cr_assert_eq(mm->kind, MN_CU_CMD_MATMUL, "%s starts with a command of kind %d", mn_op_name(op),
               (int)mm->kind);
  cr_assert_eq(mm->mm.epilogue, epi, "epilogue %s", mn_cu_epilogue_name(mm->mm.epilogue));
  cr_assert_eq(mm->mm.fallback_cmds, epi == MN_CU_EPI_NONE ? 0u : (uint32_t)(cmds - 1));
  if (vector_of != MN_OP_COUNT) {
    const mn_cu_arg *v = epi == MN_CU_EPI_DGELU ? &mm->mm.aux : &mm->mm.bias;
    cr_assert_eq(v->kind, MN_CU_ARG_NODE);
    cr_assert_eq(pg->nodes[v->node].op, vector_of, "the epilogue's vector is a %s",
                 mn_op_name(pg->nodes[v->node].op));
  }
  mn_cu_program_free(&prog);
  mn_plan_free(plan);
}
#endif

#ifdef MN_WITH_CUDA
static mn_session *build(const mn_graph *g, mn_backend backend, bool tf32) {
  mn_session_options o = options(backend, tf32);
  mn_session *s = NULL;
  mn_status st = mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "building the %s session failed: %s",
               backend == MN_BACKEND_CPU ? "CPU" : "CUDA", mn_last_error());
  return s;
}

/* Every input uniform in [-1, 1), but the gelu input wider so both tails of gelu' show. */
static void feed_both(const mn_graph *g, mn_session *cpu, mn_session *gpu, mn_rng *rng) {
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_INPUT) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *f = malloc(count * sizeof *f);
    float span = strcmp(n->name, "pre") == 0 ? 4.0f : 1.0f;
    mn_rng_fill(rng, f, count, -span, span);
    cr_assert_eq(mn_session_set_input(cpu, n->name, f, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_set_input(gpu, n->name, f, count), MN_OK, "%s", mn_last_error());
    free(f);
  }
}

/* The profile's line saying how many epilogues cuBLASLt fused, into the test log. */
static void log_epilogues(mn_session *gpu, const char *what) {
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  cr_assert_eq(mn_cuda_profile_step(gpu, 1, f), MN_OK, "%s", mn_last_error());
  char line[256];
  rewind(f);
  while (fgets(line, sizeof line, f))
    if (strstr(line, "epilogues:")) cr_log_info("%s: %s", what, line);
  fclose(f);
}
#endif

/* Runs g on both backends (poisoning the CUDA buffers first) and compares every output. */
static void compare(const mn_graph *g, bool tf32, const char *what, uint64_t seed) {
  mn_test_require_cuda_device();
#ifdef MN_WITH_CUDA
  mn_session *cpu = build(g, MN_BACKEND_CPU, false), *gpu = build(g, MN_BACKEND_CUDA, tf32);
  mn_rng rng = mn_rng_new(seed);
  feed_both(g, cpu, gpu, &rng);
  cr_assert_eq(mn_cuda_poison(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(cpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(cpu), MN_OK, "cpu: %s", mn_last_error());
  cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(gpu), MN_OK, "cuda: %s", mn_last_error());
  double tol = tf32 ? TF32_TOL : FP32_TOL;
  for (size_t i = 0; i < mn_session_num_outputs(cpu); i++) {
    size_t count = (size_t)mn_tensor_type_numel(&g->nodes[g->outputs[i]].type);
    float *got = malloc(count * sizeof *got), *want = malloc(count * sizeof *want);
    cr_assert_eq(mn_session_read_output_by_index(gpu, i, got, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_output_by_index(cpu, i, want, count), MN_OK, "%s",
                 mn_last_error());
    double err = mn_test_rel_err(got, want, count);
    size_t worst = 0;
    for (size_t k = 1; k < count; k++)
      if (!(fabsf(got[k] - want[k]) <= fabsf(got[worst] - want[worst]))) worst = k;
    cr_assert(err <= tol,
              "%s%s, output %zu: relative error %.3g > %.3g (element %zu: cuda %.9g, cpu %.9g)",
              what, tf32 ? " (tf32)" : "", i, err, tol, worst, (double)got[worst],
              (double)want[worst]);
    free(got);
    free(want);
  }
  if (!tf32) log_epilogues(gpu, what);
  mn_session_free(cpu);
  mn_session_free(gpu);
#else
  (void)g, (void)tf32, (void)what, (void)seed;
#endif
}

/* Compiles g, then compares it on a GPU in fp32 and with TF32. */
static void check(mn_graph *g, const char *what, uint64_t seed) {
  assert_compiles(g);
  if (mn_test_cuda_device_present()) {
    compare(g, false, what, seed);
    compare(g, true, what, seed);
  }
  mn_graph_free(g);
}

static const char *act_name(mn_act act) {
  static const char *names[MN_ACT_COUNT] = {"none", "relu", "gelu", "silu"};
  return names[act];
}

/* ------------------------------------------------------------------ lowering (no GPU) */

Test(cuda_epilogue, lowering_offers_each_epilogue_with_its_fallback) {
  mn_test_require_cuda_build();
#ifdef MN_WITH_CUDA
  /* The bias add, then the activation's kernel; silu has no epilogue and always runs them. */
  static const mn_cu_epilogue bias_epi[MN_ACT_COUNT] = {MN_CU_EPI_BIAS, MN_CU_EPI_BIAS_RELU,
                                                        MN_CU_EPI_BIAS_GELU, MN_CU_EPI_NONE};
  for (int act = 0; act < MN_ACT_COUNT; act++) {
    mn_graph *g = bias_act_graph(MN_SHAPE(37, 29), 64, act % 2, (mn_act)act, false);
    assert_lowering(g, MN_OP_MATMUL_BIAS_ACT, bias_epi[act],
                    act == MN_ACT_SILU ? MN_OP_COUNT : MN_OP_INPUT, act == MN_ACT_NONE ? 2 : 3);
    mn_graph_free(g);
  }
  mn_graph *g = dgelu_graph(MN_SHAPE(37, 29), 64, 1);
  assert_lowering(g, MN_OP_MATMUL_DGELU, MN_CU_EPI_DGELU, MN_OP_INPUT, 2);
  mn_graph_free(g);
  /* The column sums of a [K, M] (the stored A, transposed) or of b [K, N] (the stored B);
   * sum_rows over 33 rows takes one launch, over 300 two (row chunks, then their sums). */
  for (int variant = 0; variant < 2; variant++) {
    g = at_bgrad_graph(MN_SHAPE(3, 11, 17), MN_SHAPE(33, 9), variant);
    assert_lowering(g, MN_OP_MATMUL_AT_BGRAD, variant ? MN_CU_EPI_BGRAD_B : MN_CU_EPI_BGRAD_A,
                    MN_OP_EXTRA_OUTPUT, 2);
    mn_graph_free(g);
    g = at_bgrad_graph(MN_SHAPE(3, 100, 17), MN_SHAPE(300, 9), variant);
    assert_lowering(g, MN_OP_MATMUL_AT_BGRAD, variant ? MN_CU_EPI_BGRAD_B : MN_CU_EPI_BGRAD_A,
                    MN_OP_EXTRA_OUTPUT, 3);
    mn_graph_free(g);
  }
#endif
}

#ifdef MN_WITH_CUDA
/* The fp32 scratch that the fallback of g's one product of op `op` needs in a bf16 session,
 * and what the session reserves when its epilogue fuses and when it does not. */
static void bf16_scratch(const mn_graph *g, mn_op op, size_t *fallback, size_t *if_fused,
                         size_t *if_not) {
  mn_plan *plan = lower(g);
  cr_assert_eq(mn_plan_set_precision(plan, MN_PRECISION_BF16), MN_OK, "%s", mn_last_error());
  mn_cu_program prog;
  cr_assert_eq(mn_cu_program_build(plan, false, &prog), MN_OK, "%s", mn_last_error());
  bool *fused = calloc(prog.num_cmds, sizeof *fused);
  *fallback = 0;
  for (size_t i = 0; i < prog.num_cmds; i++) {
    const mn_cu_cmd *c = &prog.cmds[i];
    if (c->kind != MN_CU_CMD_MATMUL || plan->graph->nodes[c->node].op != op) continue;
    cr_assert_eq(c->mm.c_fallback.kind, MN_CU_ARG_SCRATCH, "the plain product goes to scratch");
    *fallback = c->mm.fallback_scratch;
    fused[i] = true;
  }
  *if_fused = mn_cu_program_scratch_bytes(&prog, fused);
  *if_not = mn_cu_program_scratch_bytes(&prog, NULL);
  free(fused);
  mn_cu_program_free(&prog);
  mn_plan_free(plan);
}
#endif

/* In low precision an epilogue that cuBLASLt does not fuse computes the plain product into
 * fp32 scratch; that scratch is the session's only when the epilogue falls back (GPT-2's MLP
 * projection reserved 201 MB while cuBLASLt fused it). relu and silu never fuse in bf16. */
Test(cuda_epilogue, fallback_scratch_only_when_the_epilogue_falls_back) {
  mn_test_require_cuda_build();
#ifdef MN_WITH_CUDA
  for (int act = 0; act < MN_ACT_COUNT; act++) {
    mn_graph *g = bias_act_graph(MN_SHAPE(37, 29), 64, 0, (mn_act)act, false);
    size_t fallback, if_fused, if_not;
    bf16_scratch(g, MN_OP_MATMUL_BIAS_ACT, &fallback, &if_fused, &if_not);
    size_t product = (37 * 64 * sizeof(float) + 255) / 256 * 256;
    cr_expect_eq(fallback, product, "%s: fallback scratch %zu", act_name((mn_act)act), fallback);
    cr_expect_eq(if_not, product, "%s: not fused", act_name((mn_act)act));
    bool never_fuses = act == MN_ACT_RELU || act == MN_ACT_SILU;
    cr_expect_eq(if_fused, never_fuses ? product : 0u, "%s: fused, %zu bytes",
                 act_name((mn_act)act), if_fused);
    mn_graph_free(g);
  }
  mn_graph *g = dgelu_graph(MN_SHAPE(37, 29), 64, 1);
  size_t fallback, if_fused, if_not;
  bf16_scratch(g, MN_OP_MATMUL_DGELU, &fallback, &if_fused, &if_not);
  cr_expect_eq(fallback, (37 * 64 * sizeof(float) + 255) / 256 * 256);
  cr_expect_eq(if_not, fallback);
  cr_expect_eq(if_fused, 0u);
  mn_graph_free(g);
#endif
}

/* ------------------------------------------------------------------ matmul_bias_act */

static void bias_act_cases(const int64_t *sa, int ra, int64_t n, bool bias_2d, uint64_t seed) {
  for (int variant = 0; variant < 2; variant++)
    for (int act = 0; act < MN_ACT_COUNT; act++) {
      char what[96];
      snprintf(what, sizeof what, "matmul_bias_act variant %d act %s n %lld", variant,
               act_name((mn_act)act), (long long)n);
      check(bias_act_graph(sa, ra, n, variant, (mn_act)act, bias_2d), what,
            seed + (uint64_t)(variant * MN_ACT_COUNT + act));
    }
}

/* M 37: not a multiple of 16. */
Test(cuda_epilogue, matmul_bias_act_every_variant_and_act) {
  mn_test_require_cuda_build();
  bias_act_cases(MN_SHAPE(37, 29), 64, false, 100);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Leading dims flattened into M (10 rows), an odd N and a [1, N] bias. */
Test(cuda_epilogue, matmul_bias_act_leading_dims_odd_n) {
  mn_test_require_cuda_build();
  bias_act_cases(MN_SHAPE(2, 5, 24), 9, true, 200);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* A transformer MLP's first projection: [B, T, D] activations. */
Test(cuda_epilogue, matmul_bias_act_projection_shape) {
  mn_test_require_cuda_build();
  check(bias_act_graph(MN_SHAPE(2, 64, 256), 1024, 0, MN_ACT_GELU, false), "gelu projection", 300);
  check(bias_act_graph(MN_SHAPE(2, 64, 1024), 256, 1, MN_ACT_NONE, false), "bt projection", 301);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Two fused products in a row: the second reads what the first's epilogue (or its fallback)
 * wrote, so a fallback skipped or run in the wrong place shows. */
Test(cuda_epilogue, matmul_bias_act_chain) {
  mn_test_require_cuda_build();
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(3, 7, 16));
  mn_node w1 = mn_input(g, "w1", MN_SHAPE(16, 40)), b1 = mn_input(g, "b1", MN_SHAPE(40));
  mn_node w2 = mn_input(g, "w2", MN_SHAPE(5, 40)), b2 = mn_input(g, "b2", MN_SHAPE(1, 5));
  mn_node h = raw(g, MN_OP_MATMUL_BIAS_ACT, (mn_node[]){x, w1, b1}, 3, MN_SHAPE(3, 7, 40),
                  (mn_op_attrs){.act = MN_ACT_GELU});
  mn_node y = raw(g, MN_OP_MATMUL_BIAS_ACT, (mn_node[]){h, w2, b2}, 3, MN_SHAPE(3, 7, 5),
                  (mn_op_attrs){.variant = 1, .act = MN_ACT_RELU});
  set_outputs(g, (mn_node[]){y, h}, 2);
  check(g, "chain", 400);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ matmul_dgelu */

/* N 64 meets cuBLASLt's rule for the gelu input (leading dimension a multiple of 8); N 9
 * does not, so its fallback runs. */
Test(cuda_epilogue, matmul_dgelu_every_variant) {
  mn_test_require_cuda_build();
  for (int variant = 0; variant < 2; variant++) {
    char what[64];
    snprintf(what, sizeof what, "matmul_dgelu variant %d", variant);
    check(dgelu_graph(MN_SHAPE(37, 29), 64, variant), what, 500 + (uint64_t)variant);
    check(dgelu_graph(MN_SHAPE(2, 5, 24), 9, variant), what, 510 + (uint64_t)variant);
    check(dgelu_graph(MN_SHAPE(4, 33, 96), 128, variant), what, 520 + (uint64_t)variant);
  }
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ matmul_at_bgrad */

#ifdef MN_WITH_CUDA
/* The matrix products and kernel launches of g's program (fp32). */
static void program_counts(const mn_graph *g, size_t *products, size_t *launches) {
  mn_plan *plan = lower(g);
  mn_cu_program prog;
  cr_assert_eq(mn_cu_program_build(plan, false, &prog), MN_OK, "%s", mn_last_error());
  *products = *launches = 0;
  for (size_t i = 0; i < prog.num_cmds; i++) {
    *products += prog.cmds[i].kind == MN_CU_CMD_MATMUL;
    *launches += prog.cmds[i].kind == MN_CU_CMD_LAUNCH;
  }
  mn_cu_program_free(&prog);
  mn_plan_free(plan);
}
#endif

/* A product gated by relu_grad: a of shape a[0..rank), n outputs, b stored [n, k] for variant
 * 1; whether a skinny kernel runs it, and the launches its lowering makes. */
typedef struct drelu_case {
  int64_t a[3];
  int rank;
  int64_t n;
  int variant;
  bool skinny;
  size_t launches;
} drelu_case;

/* Each case as matmul_drelu (or, with sums, matmul_drelu_bgrad): its program's products and
 * launches, then its values against the CPU. */
static void check_drelu_cases(const drelu_case *cases, size_t count, bool sums, uint64_t seed) {
  for (size_t i = 0; i < count; i++) {
    const drelu_case *c = &cases[i];
    mn_graph *g = sums ? drelu_bgrad_graph(c->a, c->rank, c->n, c->variant)
                       : gated_graph(MN_OP_MATMUL_DRELU, c->a, c->rank, c->n, c->variant);
#ifdef MN_WITH_CUDA
    size_t products = 0, launches = 0;
    program_counts(g, &products, &launches);
    cr_assert_eq(products, c->skinny ? 0u : 1u, "case %zu", i);
    cr_assert_eq(launches, c->launches, "case %zu: %zu launches", i, launches);
#endif
    char what[64];
    snprintf(what, sizeof what, "%s case %zu", sums ? "drelu_bgrad" : "drelu", i);
    check(g, what, seed + (uint64_t)i);
  }
}

/* relu_grad(x, a op(b)): one skinny kernel where a side is at most 16 (the MLP classifier's
 * input gradient [128, 10] x [512, 10]^T, k 10; a 9-wide product, n 9), else cuBLASLt's
 * product and the relu_grad kernel; against the CPU in fp32 and TF32. */
Test(cuda_epilogue, matmul_drelu_skinny_and_not) {
  mn_test_require_cuda_build();
  static const drelu_case cases[] = {{{128, 10}, 2, 512, 1, true, 1},
                                     {{37, 29}, 2, 9, 0, true, 1},
                                     {{4, 33, 96}, 3, 128, 0, false, 1},
                                     {{4, 33, 96}, 3, 128, 1, false, 1}};
  check_drelu_cases(cases, sizeof cases / sizeof cases[0], false, 530);
}

/* matmul_drelu with its column sums: the gated skinny kernel then sum_rows (one kernel up to
 * 256 rows, else two), or cuBLASLt's product then the ReLU gradient's kernel summing the columns
 * (one pass up to 256 rows, 1 column a thread; past that 8 a thread in row chunks added by a second
 * kernel); against the CPU in fp32 and TF32, and the cuBLASLt path in bf16. */
Test(cuda_epilogue, matmul_drelu_bgrad_values_and_sums) {
  mn_test_require_cuda_build();
  static const drelu_case cases[] = {
      {{128, 10}, 2, 512, 1, true, 2},    {{37, 29}, 2, 9, 0, true, 2},
      {{4, 33, 96}, 3, 128, 0, false, 1}, {{4, 33, 96}, 3, 128, 1, false, 1},
      {{3, 200, 40}, 3, 96, 0, false, 2}, {{300, 24}, 2, 41, 1, false, 2},
      {{300, 24}, 2, 13, 1, true, 3}};
  check_drelu_cases(cases, sizeof cases / sizeof cases[0], true, 540);
  /* bf16: 132 rows (one pass of 32 row lanes) and 600 (row chunks). */
  const int64_t lead[2] = {4, 3}, rows[2] = {33, 200}, k[2] = {96, 40}, n[2] = {128, 96};
  for (int i = 0; i < 2; i++) {
    mn_graph *g = drelu_bgrad_graph(MN_SHAPE(lead[i], rows[i], k[i]), n[i], i);
    mn_test_assert_compiles_precision(g, false, MN_PRECISION_BF16);
    if (mn_test_cuda_device_present()) {
      double err = mn_test_compare_cuda_precision(g, false, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL,
                                                  NULL, 549 + (uint64_t)i);
      cr_log_info("matmul_drelu_bgrad of %lld rows in bf16: largest norm-wise difference %.3g",
                  (long long)(lead[i] * rows[i]), err);
    }
    mn_graph_free(g);
  }
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* Every variant's shapes twice: with cuBLASLt's BGRAD epilogue (MN_CUDA_BGRAD_PLAIN_MIN past
 * any dy here) and as the plain product and sum_rows that a large dy takes (the line at one
 * value: widths of 8k only), then one dy of 4M values (4096 x 1024) past the default line. */
Test(cuda_epilogue, matmul_at_bgrad_every_variant) {
  mn_test_require_cuda_build();
  static const char *lines[2] = {"1e18", "1"};
  for (int plain = 0; plain < 2; plain++) {
    setenv("MN_CUDA_BGRAD_PLAIN_MIN", lines[plain], 1);
    for (int variant = 0; variant < 2; variant++) {
      char what[64];
      snprintf(what, sizeof what, "matmul_at_bgrad variant %d%s", variant, plain ? ", plain" : "");
      uint64_t seed = 600 + (uint64_t)variant + 100 * (uint64_t)plain;
      /* K 37, M 24, N 40. */
      check(at_bgrad_graph(MN_SHAPE(37, 24), MN_SHAPE(37, 40), variant), what, seed);
      /* Leading dims flattened into K (33), laid out differently on the two sides; M 17. */
      check(at_bgrad_graph(MN_SHAPE(3, 11, 17), MN_SHAPE(33, 9), variant), what, seed + 10);
      /* A weight gradient's shape: K = B * T rows. */
      check(at_bgrad_graph(MN_SHAPE(2, 64, 256), MN_SHAPE(2, 64, 96), variant), what, seed + 20);
    }
  }
  unsetenv("MN_CUDA_BGRAD_PLAIN_MIN");
  check(at_bgrad_graph(MN_SHAPE(4, 1024, 64), MN_SHAPE(4, 1024, 1024), 1),
        "matmul_at_bgrad of a 4096 x 1024 dy (b)", 630);
  check(at_bgrad_graph(MN_SHAPE(4, 1024, 1024), MN_SHAPE(4, 1024, 64), 0),
        "matmul_at_bgrad of a 4096 x 1024 dy (a)", 631);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ gelu_grad_bgrad */

/* Rows of 8k columns (8 a thread) and of odd length (one a thread); under 64 rows summed in one
 * pass ([37, 24], [5, 9, 13], [3, 40]), from 64 through per-chunk partials ([2, 64, 256],
 * [256, 13], [1024, 3072]: GPT-2's row of 3072); with and without gelu(x) as value 2. */
Test(cuda_epilogue, gelu_grad_bgrad_values_and_sums) {
  mn_test_require_cuda_build();
  check(gelu_bgrad_graph(MN_SHAPE(37, 24)), "gelu_grad_bgrad [37, 24]", 700);
  check(gelu_bgrad_graph(MN_SHAPE(5, 9, 13)), "gelu_grad_bgrad [5, 9, 13]", 701);
  check(gelu_bgrad_graph(MN_SHAPE(3, 40)), "gelu_grad_bgrad [3, 40]", 702);
  check(gelu_bgrad_graph(MN_SHAPE(2, 64, 256)), "gelu_grad_bgrad [2, 64, 256]", 703);
  check(gelu_bgrad_graph(MN_SHAPE(1024, 3072)), "gelu_grad_bgrad [1024, 3072]", 704);
  check(gelu_bgrad_graph_with(MN_SHAPE(37, 24), true), "gelu_grad_bgrad and gelu [37, 24]", 706);
  check(gelu_bgrad_graph_with(MN_SHAPE(5, 9, 13), true), "gelu_grad_bgrad and gelu [5, 9, 13]",
        707);
  check(gelu_bgrad_graph_with(MN_SHAPE(3, 40), true), "gelu_grad_bgrad and gelu [3, 40]", 708);
  check(gelu_bgrad_graph(MN_SHAPE(256, 13)), "gelu_grad_bgrad [256, 13]", 709);
  check(gelu_bgrad_graph_with(MN_SHAPE(256, 13), true), "gelu_grad_bgrad and gelu [256, 13]", 710);
  check(gelu_bgrad_graph_with(MN_SHAPE(1024, 3072), true), "gelu_grad_bgrad and gelu [1024, 3072]",
        711);
  /* The gradient and the sums stored as bf16 (8 values an access through the 2-byte stores). */
  mn_graph *g = gelu_bgrad_graph(MN_SHAPE(1024, 3072));
  mn_test_assert_compiles_precision(g, false, MN_PRECISION_BF16);
  if (mn_test_cuda_device_present()) {
    double err = mn_test_compare_cuda_precision(g, false, MN_PRECISION_BF16, 2 * MN_TEST_BF16_TOL,
                                                NULL, 705);
    cr_log_info("gelu_grad_bgrad in bf16: largest norm-wise difference %.3g", err);
  }
  mn_graph_free(g);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

#ifdef MN_WITH_CUDA
/* The nodes of g's CUDA step graph under MN_CUDA_EPILOGUES_OFF=`off` (NULL: unset). */
static size_t graph_nodes_with(const mn_graph *g, const char *off) {
  if (off)
    setenv("MN_CUDA_EPILOGUES_OFF", off, 1);
  else
    unsetenv("MN_CUDA_EPILOGUES_OFF");
  mn_session *s = build(g, MN_BACKEND_CUDA, false);
  mn_rng rng = mn_rng_new(1);
  mn_test_init_uniform(g, s, &rng, -1.0f, 1.0f, true);
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  mn_session_stats st;
  cr_assert_eq(mn_session_get_stats(s, &st), MN_OK);
  mn_session_free(s);
  unsetenv("MN_CUDA_EPILOGUES_OFF");
  return st.graph_nodes;
}
#endif

/* MN_CUDA_EPILOGUES_OFF=all (for timing an epilogue against its fallback): every product runs
 * plain and the fallback commands compute the epilogue, with the same results; and the switch
 * takes: the step graph gains the fallback's nodes. */
Test(cuda_epilogue, every_epilogue_switched_off_runs_its_fallback) {
  mn_test_require_cuda_build();
  setenv("MN_CUDA_EPILOGUES_OFF", "all", 1);
  bias_act_cases(MN_SHAPE(37, 29), 64, false, 800);
  for (int variant = 0; variant < 2; variant++) {
    check(dgelu_graph(MN_SHAPE(4, 33, 96), 128, variant), "dgelu, epilogues off",
          810 + (uint64_t)variant);
    check(at_bgrad_graph(MN_SHAPE(2, 64, 256), MN_SHAPE(2, 64, 96), variant),
          "matmul_at_bgrad, epilogues off", 820 + (uint64_t)variant);
  }
  setenv("MN_CUDA_EPILOGUES_OFF", "bias_gelu,bgrad", 1);
  check(bias_act_graph(MN_SHAPE(2, 64, 256), 1024, 0, MN_ACT_GELU, false), "gelu, listed off", 830);
  check(at_bgrad_graph(MN_SHAPE(37, 24), MN_SHAPE(37, 40), 1), "bgrad, listed off", 831);
  unsetenv("MN_CUDA_EPILOGUES_OFF");
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
#ifdef MN_WITH_CUDA
  /* 300 rows: sum_rows in row chunks and their sums, a kernel more than the fused product's
   * (up to 256 rows sum_rows is one kernel, as many as cuBLASLt's BGRAD kernel in fp32). */
  mn_graph *g = at_bgrad_graph(MN_SHAPE(3, 100, 256), MN_SHAPE(3, 100, 96), 1);
  size_t fused = graph_nodes_with(g, NULL), other = graph_nodes_with(g, "dgelu"),
         off = graph_nodes_with(g, "bgrad");
  cr_expect_eq(other, fused, "switching off another epilogue changed the graph: %zu -> %zu nodes",
               fused, other);
  cr_expect_gt(off, fused, "bgrad switched off: %zu nodes, fused %zu", off, fused);
  mn_graph_free(g);
#endif
}

/* ------------------------------------------------------------------ group_norm + silu */

Test(cuda_epilogue, group_norm_silu) {
  mn_test_require_cuda_build();
  check(gn_silu_graph(2, 12, 7, 5, 4), "group_norm silu odd", 700);
  check(gn_silu_graph(2, 12, 8, 8, 4), "group_norm silu vec4", 701);
  check(gn_silu_graph(2, 64, 16, 16, 32), "group_norm silu 32 groups", 702);
  check(gn_silu_graph(3, 8, 1, 1, 4), "group_norm silu unit spatial", 703);
  mn_test_require_cuda_device(); /* reports the GPU comparisons as skipped */
}

/* ------------------------------------------------------------------ GPT-2 with gelu_grad_bgrad */

/* GPT-2 wide enough that gelu_grad stays a kernel of its own (test_recompute.c): c_fc's bias
 * gradient rides on it and layer 0's recomputed GELU is its value 2. bf16 training on CUDA
 * follows the CPU's, and is bit for bit that of the plan that recomputes the GELU apart
 * (MN_OPTIMIZE_OFF=recompute_gelu_in_gradient). */
Test(cuda_epilogue, gpt2_with_gelu_grad_bgrad_trains_as_on_the_cpu) {
  mn_test_require_cuda_build();
  mn_model_config c = mn_test_wide_mlp_gpt2();
  mn_graph *g = NULL;
  cr_assert_eq(mn_model_build(&c, 1, 128, NULL, &g), MN_OK, "%s", mn_last_error());
  if (!mn_test_cuda_device_present()) {
    mn_graph_free(g);
    mn_test_require_cuda_device();
  }
  const mn_test_range ranges[] = {
      {"input_ids", 0, 50}, {"labels", 0, 50}, {"position_ids", 0, 128}, {NULL, 0, 0}};
  mn_test_check_cuda_model(g, true, ranges, 41);
  mn_session *s[2];
  for (int i = 0; i < 2; i++) {
    if (i) setenv("MN_OPTIMIZE_OFF", "recompute_gelu_in_gradient", 1);
    s[i] = mn_test_session_precision(g, MN_BACKEND_CUDA, MN_PRECISION_BF16, true);
    unsetenv("MN_OPTIMIZE_OFF");
    /* the plans differ as they should: layer 0's GELU in the kernel (variant 1), or apart */
    const mn_graph *pg = mn_session_plan(s[i])->graph;
    size_t joined = 0, plain = 0;
    for (size_t n = 0; n < pg->num_nodes; n++)
      if (pg->nodes[n].op == MN_OP_GELU_GRAD_BGRAD) {
        joined += pg->nodes[n].attrs.variant == 1;
        plain += pg->nodes[n].attrs.variant == 0;
      }
    cr_assert_eq(joined, i ? 0u : 1u, "plan %d: %zu gelu_grad_bgrad with gelu(x)", i, joined);
    cr_assert_eq(plain, i ? 2u : 1u, "plan %d: %zu gelu_grad_bgrad alone", i, plain);
  }
  mn_rng r = mn_rng_new(43);
  mn_test_init_normal(g, s, 2, &r, 0.02f, true);
  uint32_t ids[128], pos[128], labels[128];
  for (uint32_t t = 0; t < 128; t++) {
    ids[t] = (t * 7u + 3u) % 50u;
    labels[t] = (t * 11u + 5u) % 50u;
    pos[t] = t;
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mn_session_set_input_u32(s[i], "input_ids", ids, 128), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "position_ids", pos, 128), MN_OK);
    cr_assert_eq(mn_session_set_input_u32(s[i], "labels", labels, 128), MN_OK);
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f), MN_OK);
  }
  for (int step = 0; step < 3; step++) {
    float a = mn_test_step_loss(s[0]), b = mn_test_step_loss(s[1]);
    cr_assert(a == b, "step %d: loss %.9g vs %.9g", step, (double)a, (double)b);
  }
  mn_test_assert_same_params(g, s[0], s[1], 0, "after 3 steps, GELU recomputed apart");
  for (int i = 0; i < 2; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
}
