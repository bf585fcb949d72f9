/* Matrix products with a cuBLASLt epilogue (host/ops.h; exact semantics in
 * host/reference/ref_epilogue.c). Each is one matmul command that offers its epilogue,
 * followed by the commands that the unfused ops would run after a plain product, made by
 * those ops' own lowerings. matmul_lt.c decides at session build: when cuBLASLt has an
 * algorithm for the epilogue, the matmul applies it and the fallback commands are skipped;
 * when it has none, the product runs plain and they run. Their kernels are compiled either
 * way (small instances, mostly shared with other ops), so that decision never needs a
 * second compile. */
#include "cuda/emit.h"
#include "cuda/lower_colsum.h"
#include "cuda/lower_skinny.h"
#include "host/error.h"
#include "host/pointwise.h"

#define PW_BLOCK      256
#define PW_MAX_BLOCKS 4096

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* a [.., K] times b [K, N] (variant 0) or b [N, K] transposed (variant 1) into the node. */
static mn_cu_matmul_desc product(const mn_cu_op_ctx *c) {
  const mn_tensor_type *ta = mn_cu_in_type(c, 0), *tb = mn_cu_in_type(c, 1);
  bool bt = c->node->attrs.variant == 1;
  int64_t k = last_dim(ta);
  return (mn_cu_matmul_desc){.a = mn_cu_in(c, 0),
                             .b = mn_cu_in(c, 1),
                             .c = mn_cu_out(c),
                             .trans_b = bt,
                             .m = mn_tensor_type_numel(ta) / k,
                             .n = bt ? tb->shape[0] : tb->shape[1],
                             .k = k,
                             .batch = 1,
                             .alpha = 1.0f};
}

/* Appends the commands that op's lowering makes for a node of these inputs whose value is
 * the buffer of `out`: the fallback is then by construction what the unfused op computes.
 * The commands are credited to this dispatch's node, for messages and profiles. */
static mn_status lower_as(const mn_cu_op_ctx *c, mn_op op, mn_node out, const mn_node *inputs,
                          int n) {
  mn_node_rec rec = {.op = op, .num_inputs = n, .type = c->g->nodes[out].type};
  for (int i = 0; i < n; i++)
    rec.inputs[i] = inputs[i];
  mn_cu_op_ctx sub = *c;
  sub.id = out;
  sub.node = &rec;
  size_t first = c->prog->num_cmds;
  mn_status st = mn_cu_lowerers[op](&sub);
  for (size_t i = first; i < c->prog->num_cmds; i++)
    c->prog->cmds[i].node = c->id;
  return st;
}

/* Low-precision sessions: the fused product rounds once, after its epilogue, so a fallback
 * must too. Its plain product goes to fp32 scratch (mn_cu_matmul_desc.c_fallback) and the
 * epilogue's kernels read it there and store the node's value once. */
static bool low_precision(const mn_cu_op_ctx *c) {
  return mn_cu_low_storage(c->plan) != MN_DEV_F32;
}

static unsigned pw_blocks(int64_t groups) {
  unsigned b = mn_cu_blocks(groups, PW_BLOCK);
  return b > PW_MAX_BLOCKS ? PW_MAX_BLOCKS : b;
}

/* out = x + bias[i % ncol] (mn_pw_add_row). */
static mn_status add_bias(const mn_cu_op_ctx *c, mn_cu_arg out, mn_cu_arg x, mn_cu_arg bias) {
  int64_t n = mn_cu_numel(c), ncol = last_dim(&c->node->type);
  int k = mn_cu_kernel(c, PW_BLOCK, "mn_pw_add_row<%lldLL, %lldLL>", (long long)n, (long long)ncol);
  mn_cu_arg args[3] = {out, x, bias};
  return mn_cu_launch(c, k, pw_blocks(ncol % 4 == 0 ? n / 4 : n), 1, 1, 0, 3, args);
}

/* out = row `op`(a[, b]) element-wise (mn_pw_map), no attribute. */
static mn_status pointwise(const mn_cu_op_ctx *c, mn_op op, int nargs, const mn_cu_arg *args) {
  int64_t n = mn_cu_numel(c);
  int k =
      mn_cu_kernel(c, PW_BLOCK, "mn_pw_map<%d, %lldLL, 0u>", mn_pw_code_of_op(op), (long long)n);
  return mn_cu_launch(c, k, pw_blocks((n + 3) / 4), 1, 1, 0, nargs, args);
}

/* The matmul command at index `at` offers its epilogue in place of every command after it. */
static void seal_fallback(const mn_cu_op_ctx *c, size_t at) {
  c->prog->cmds[at].mm.fallback_cmds = (uint32_t)(c->prog->num_cmds - at - 1);
}

/* act(a op(b) + bias). SiLU has no cuBLASLt epilogue: its product runs plain, always
 * followed by the bias add and the activation. */
mn_status mn_cu_lower_MATMUL_BIAS_ACT(const mn_cu_op_ctx *c) {
  mn_act act = (mn_act)c->node->attrs.act;
  mn_cu_matmul_desc d = product(c);
  switch (act) {
  case MN_ACT_NONE: d.epilogue = MN_CU_EPI_BIAS; break;
  case MN_ACT_RELU: d.epilogue = MN_CU_EPI_BIAS_RELU; break;
  case MN_ACT_GELU: d.epilogue = MN_CU_EPI_BIAS_GELU; break;
  case MN_ACT_SILU: break;
  default:
    return mn_fail(MN_ERR_UNSUPPORTED, "cuda backend: node %u (%s): unknown activation %d", c->id,
                   mn_op_name(c->node->op), (int)act);
  }
  d.bias = mn_cu_in(c, 2);
  if (act != MN_ACT_SILU && mn_cu_skinny_applies(c, &d)) return mn_cu_skinny_matmul(c, &d);
  bool low = low_precision(c);
  /* cuBLASLt's bf16 relu epilogue measured off the storage table where the biased sum cancels
   * (relu masks moved; 5.5% norm-wise in an MLP's weight gradient, docs/performance.md): in low
   * precision relu runs as the exact fallback. gelu and identity are continuous there. */
  if (low && act == MN_ACT_RELU) d.epilogue = MN_CU_EPI_NONE;
  /* The storage table reads the bias in low precision, as a product operand. */
  if (low) {
    mn_status st =
        mn_cu_low_operand(c, &d.bias, 1, mn_tensor_type_numel(mn_cu_in_type(c, 2)), 0, 1, 0);
    if (st != MN_OK) return st;
  }
  if (low) mn_cu_fallback_scratch(&d, (size_t)mn_cu_numel(c) * sizeof(float));
  mn_status st = mn_cu_matmul(c, &d);
  if (st != MN_OK) return st;
  size_t at = c->prog->num_cmds - 1;
  mn_node self = c->id;
  static const mn_op act_op[MN_ACT_COUNT] = {
      [MN_ACT_RELU] = MN_OP_RELU, [MN_ACT_GELU] = MN_OP_GELU, [MN_ACT_SILU] = MN_OP_SILU};
  if (low && act == MN_ACT_NONE) {
    st = add_bias(c, mn_cu_out(c), d.c_fallback, d.bias);
  } else if (low) {
    st = add_bias(c, d.c_fallback, d.c_fallback, d.bias);
    if (st == MN_OK)
      st = pointwise(c, act_op[act], 2, (const mn_cu_arg[]){mn_cu_out(c), d.c_fallback});
  } else {
    st = lower_as(c, MN_OP_BIAS_ADD, self, (const mn_node[]){self, c->node->inputs[2]}, 2);
    if (st == MN_OK && act != MN_ACT_NONE) st = lower_as(c, act_op[act], self, &self, 1);
  }
  if (st != MN_OK) return st;
  if (d.epilogue != MN_CU_EPI_NONE) seal_fallback(c, at);
  return MN_OK;
}

/* gelu_grad(pre, a op(b)): the product times gelu'(pre), pre [M, N] read densely. */
mn_status mn_cu_lower_MATMUL_DGELU(const mn_cu_op_ctx *c) {
  mn_cu_matmul_desc d = product(c);
  d.epilogue = MN_CU_EPI_DGELU;
  d.aux = mn_cu_in(c, 2);
  d.aux_ld = d.n;
  bool low = low_precision(c);
  if (low) mn_cu_fallback_scratch(&d, (size_t)mn_cu_numel(c) * sizeof(float));
  mn_status st = mn_cu_matmul(c, &d);
  if (st != MN_OK) return st;
  size_t at = c->prog->num_cmds - 1;
  mn_node self = c->id;
  if (low)
    st = pointwise(c, MN_OP_GELU_GRAD, 3,
                   (const mn_cu_arg[]){mn_cu_out(c), mn_cu_in(c, 2), d.c_fallback});
  else
    st = lower_as(c, MN_OP_GELU_GRAD, self, (const mn_node[]){c->node->inputs[2], self}, 2);
  if (st != MN_OK) return st;
  seal_fallback(c, at);
  return MN_OK;
}

/* relu_grad(x, a op(b)): in the skinny kernel where it runs one (lower_skinny.h); cuBLASLt has
 * no epilogue that reads x, so otherwise the product and then relu_grad over it, which is what
 * the two ops compute (relu_grad selects values, so rounding the product to a low-precision
 * storage before or after it gives the same bits). */
mn_status mn_cu_lower_MATMUL_DRELU(const mn_cu_op_ctx *c) {
  mn_cu_matmul_desc d = product(c);
  if (mn_cu_skinny_applies(c, &d))
    return mn_cu_skinny_matmul_gated(c, &d, MN_OP_RELU_GRAD, mn_cu_in(c, 2));
  mn_status st = mn_cu_matmul(c, &d);
  mn_node self = c->id;
  if (st == MN_OK)
    st = lower_as(c, MN_OP_RELU_GRAD, self, (const mn_node[]){c->node->inputs[2], self}, 2);
  return st;
}

/* matmul_drelu and the column sums of its value into the extra_output node of value 1: where
 * a skinny kernel runs the product, it gates the product as matmul_drelu's does and sum_rows
 * reads the value after it (a kernel that reads, which the products reading the gradient need
 * not wait for); otherwise cuBLASLt's product, then the ReLU gradient's kernel, which sums the
 * columns as it writes them, so that the weight gradient's product needs no bias-gradient
 * kernel after it. */
mn_status mn_cu_lower_MATMUL_DRELU_BGRAD(const mn_cu_op_ctx *c) {
  mn_node sums = mn_plan_extra_output(c->plan, c->id, 1);
  if (sums == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (%s) has no extra_output for its sums",
                   c->id, mn_op_name(c->node->op));
  mn_cu_matmul_desc d = product(c);
  mn_node self = c->id;
  if (mn_cu_skinny_applies(c, &d)) {
    /* The sums stay this node's command, which the stream schedule counts as writing the
     * value: the products that read it wait for them on the same stream. Credited to the sums
     * node instead (a read of the value), they went beside the input-gradient chain, and the
     * MLP TF32 step measured 0.0531-0.0542 ms against 0.0503-0.0507 (H200, docs/performance.md). */
    mn_status st = mn_cu_skinny_matmul_gated(c, &d, MN_OP_RELU_GRAD, mn_cu_in(c, 2));
    return st != MN_OK ? st : lower_as(c, MN_OP_SUM_ROWS, sums, &self, 1);
  }
  mn_status st = mn_cu_matmul(c, &d);
  return st != MN_OK ? st
                     : mn_cu_pointwise_colsum(c, MN_PW_RELU_GRAD, mn_cu_in(c, 2), mn_cu_out(c),
                                              sums, MN_NO_NODE);
}

/* a [.., M]^T b [.., N] as matmul_at (no row-pitch padding of a: the epilogue reads a or b
 * as stored), and the column sums of a (variant 0) or b (variant 1) into the buffer of the
 * extra_output node holding value 1. */
mn_status mn_cu_lower_MATMUL_AT_BGRAD(const mn_cu_op_ctx *c) {
  const mn_tensor_type *ta = mn_cu_in_type(c, 0), *tb = mn_cu_in_type(c, 1);
  mn_node sums = mn_plan_extra_output(c->plan, c->id, 1);
  if (sums == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (%s) has no extra_output for its sums",
                   c->id, mn_op_name(c->node->op));
  bool of_b = c->node->attrs.variant == 1;
  int64_t m = last_dim(ta);
  mn_cu_matmul_desc d = {.a = mn_cu_in(c, 0),
                         .b = mn_cu_in(c, 1),
                         .c = mn_cu_out(c),
                         .trans_a = true,
                         .m = m,
                         .n = last_dim(tb),
                         .k = mn_tensor_type_numel(ta) / m,
                         .batch = 1,
                         .alpha = 1.0f,
                         .epilogue = of_b ? MN_CU_EPI_BGRAD_B : MN_CU_EPI_BGRAD_A,
                         .bias = mn_cu_node_arg(sums)};
  mn_status st = mn_cu_matmul(c, &d);
  if (st != MN_OK) return st;
  size_t at = c->prog->num_cmds - 1;
  st = lower_as(c, MN_OP_SUM_ROWS, sums, &c->node->inputs[of_b ? 1 : 0], 1);
  if (st != MN_OK) return st;
  seal_fallback(c, at);
  return MN_OK;
}

mn_status mn_cu_lower_EXTRA_OUTPUT(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_STATE, "node %u: extra_output is written by its input's dispatch", c->id);
}
