/* Types that the kernels of the optimizer-made ops rely on. The optimizer builds these nodes
 * right, but a plan may also come from a cache file on disk (io/plan_cache_read.c), whose
 * checksum anyone can recompute: the plan refuses a node whose buffers would not fit what its
 * kernel reads and writes, rather than run off the end of the arena. */
#include "host/plan_check.h"

#include "host/error.h"

static bool f32(const mn_tensor_type *t) { return t->dtype == MN_F32 && t->rank >= 1; }

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* a [.., K] times b ([K, N], or [N, K] when variant is 1) into [.., N]; *n gets N. */
static bool product_ok(const mn_graph *g, const mn_node_rec *r, int64_t *n) {
  const mn_tensor_type *a = &g->nodes[r->inputs[0]].type, *b = &g->nodes[r->inputs[1]].type;
  if (!f32(a) || !f32(b) || !f32(&r->type) || b->rank != 2 || r->attrs.variant < 0 ||
      r->attrs.variant > 1)
    return false;
  int64_t k = last_dim(a);
  *n = r->attrs.variant ? b->shape[0] : b->shape[1];
  if (k < 1 || *n < 1 || (r->attrs.variant ? b->shape[1] : b->shape[0]) != k) return false;
  return last_dim(&r->type) == *n &&
         mn_tensor_type_numel(&r->type) == mn_tensor_type_numel(a) / k * *n;
}

int64_t mn_attention_stats_numel(const mn_graph *g, const mn_node_rec *attention) {
  const mn_tensor_type *q = &g->nodes[attention->inputs[0]].type;
  int64_t batches = q->rank == 3 ? q->shape[0] : 1;
  return 2 * batches * attention->attrs.num_heads * q->shape[q->rank - 2];
}

/* (q, k, v, dy, y, stats[, positions]): y is the output of an attention over the same q, k and
 * v (and positions, for the packed gradients) with the same heads and masking, and stats is that
 * attention's extra value 1, so the kernels read the statistics of the very scores they
 * recompute. */
static bool saved_attention_grad_ok(const mn_graph *g, const mn_node_rec *r) {
  const mn_node_rec *y = &g->nodes[r->inputs[4]], *stats = &g->nodes[r->inputs[5]];
  if (!mn_op_is_attention(y->op) || y->attrs.variant != 1 || stats->op != MN_OP_EXTRA_OUTPUT ||
      stats->inputs[0] != r->inputs[4] || stats->attrs.variant != 1)
    return false;
  for (int k = 0; k < 3; k++)
    if (y->inputs[k] != r->inputs[k]) return false;
  bool packed = mn_op_is_packed_attention_grad(r->op);
  if ((y->op == MN_OP_CAUSAL_ATTENTION_PACKED) != packed ||
      (packed && y->inputs[3] != r->inputs[6]))
    return false;
  return (packed || (y->op == MN_OP_CAUSAL_ATTENTION) == (r->attrs.variant == 1)) &&
         y->attrs.num_heads == r->attrs.num_heads &&
         y->attrs.num_kv_heads == r->attrs.num_kv_heads && y->attrs.head_dim == r->attrs.head_dim &&
         mn_type_same_shape(&y->type, &g->nodes[r->inputs[3]].type);
}

/* qkv_causal_attention (qkv): qkv's rows are the blocks q | k | v of the attrs' heads, the
 * output's rows q's width. */
static bool qkv_attention_ok(const mn_graph *g, const mn_node_rec *r) {
  const mn_tensor_type *x = &g->nodes[r->inputs[0]].type;
  int64_t hd = r->attrs.head_dim, h = r->attrs.num_heads, kvh = r->attrs.num_kv_heads;
  if (hd < 1 || h < 1 || kvh < 1 || h % kvh || x->rank < 2 || x->rank != r->type.rank ||
      last_dim(x) != (h + 2 * kvh) * hd || last_dim(&r->type) != h * hd)
    return false;
  for (int i = 0; i + 1 < x->rank; i++)
    if (x->shape[i] != r->type.shape[i]) return false;
  return r->attrs.variant == 0 || r->attrs.variant == 1;
}

/* qkv_attention_grad_saved (qkv, dy, y, stats): y is a qkv_causal_attention of the same qkv and
 * heads that writes its statistics, stats that extra value, dy typed like y, and the gradient
 * typed like qkv. */
static bool qkv_attention_grad_ok(const mn_graph *g, const mn_node_rec *r) {
  const mn_node_rec *y = &g->nodes[r->inputs[2]], *stats = &g->nodes[r->inputs[3]];
  return y->op == MN_OP_QKV_CAUSAL_ATTENTION && y->attrs.variant == 1 &&
         y->inputs[0] == r->inputs[0] && stats->op == MN_OP_EXTRA_OUTPUT &&
         stats->inputs[0] == r->inputs[2] && stats->attrs.variant == 1 &&
         y->attrs.num_heads == r->attrs.num_heads &&
         y->attrs.num_kv_heads == r->attrs.num_kv_heads && y->attrs.head_dim == r->attrs.head_dim &&
         mn_type_same_shape(&y->type, &g->nodes[r->inputs[1]].type) &&
         mn_type_same_shape(&r->type, &g->nodes[r->inputs[0]].type);
}

static bool node_ok(const mn_graph *g, const mn_node_rec *r) {
  int64_t n = 0;
  switch (r->op) {
  case MN_OP_MATMUL_BIAS_ACT: {
    const mn_tensor_type *bias = &g->nodes[r->inputs[2]].type;
    return product_ok(g, r, &n) && f32(bias) && bias->rank <= 2 &&
           mn_tensor_type_numel(bias) == n && r->attrs.act >= 0 && r->attrs.act < MN_ACT_COUNT;
  }
  case MN_OP_MATMUL_DGELU:
  case MN_OP_MATMUL_DRELU:
  case MN_OP_MATMUL_DRELU_BGRAD:
    return product_ok(g, r, &n) && r->attrs.act == MN_ACT_NONE &&
           mn_type_same_shape(&g->nodes[r->inputs[2]].type, &r->type) &&
           g->nodes[r->inputs[2]].type.dtype == MN_F32;
  case MN_OP_MATMUL_AT_BGRAD: {
    const mn_tensor_type *a = &g->nodes[r->inputs[0]].type, *b = &g->nodes[r->inputs[1]].type;
    if (!f32(a) || !f32(b) || !f32(&r->type) || r->attrs.variant < 0 || r->attrs.variant > 1)
      return false;
    int64_t m = last_dim(a), cols = last_dim(b);
    return m >= 1 && cols >= 1 && mn_tensor_type_numel(a) / m == mn_tensor_type_numel(b) / cols &&
           mn_tensor_type_numel(&r->type) == m * cols;
  }
  case MN_OP_GELU_GRAD_BGRAD:
    return f32(&r->type) && (r->attrs.variant == 0 || r->attrs.variant == 1) && r->type.rank >= 1 &&
           last_dim(&r->type) >= 1 && mn_type_same_shape(&g->nodes[r->inputs[0]].type, &r->type) &&
           mn_type_same_shape(&g->nodes[r->inputs[1]].type, &r->type) &&
           f32(&g->nodes[r->inputs[0]].type) && f32(&g->nodes[r->inputs[1]].type);
  case MN_OP_GROUP_NORM: return r->attrs.act == MN_ACT_NONE || r->attrs.act == MN_ACT_SILU;
  case MN_OP_ATTENTION_GRAD_Q_SAVED:
  case MN_OP_ATTENTION_GRAD_KV_SAVED:
  case MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED:
  case MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED: return saved_attention_grad_ok(g, r);
  case MN_OP_QKV_CAUSAL_ATTENTION: return qkv_attention_ok(g, r);
  case MN_OP_QKV_ATTENTION_GRAD_SAVED: return qkv_attention_grad_ok(g, r);
  default: return true;
  }
}

mn_status mn_plan_check_optimizer_ops(const mn_graph *g) {
  for (size_t i = 0; i < g->num_nodes; i++)
    if (!node_ok(g, &g->nodes[i]))
      return mn_fail(MN_ERR_STATE, "mn_plan_build: node %zu (%s) has types its kernel cannot take",
                     i, mn_op_name(g->nodes[i].op));
  return MN_OK;
}

bool mn_plan_extra_type_ok(const mn_graph *g, const mn_node_rec *producer,
                           const mn_node_rec *extra) {
  if (extra->type.dtype != MN_F32) return false;
  switch (producer->op) {
  case MN_OP_FUSED: return mn_type_same_shape(&extra->type, &producer->type);
  case MN_OP_CAUSAL_ATTENTION:
  case MN_OP_FULL_ATTENTION:
  case MN_OP_CROSS_ATTENTION:
  case MN_OP_CAUSAL_ATTENTION_PACKED:
  case MN_OP_QKV_CAUSAL_ATTENTION:
    return mn_tensor_type_numel(&extra->type) == mn_attention_stats_numel(g, producer);
  case MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD:
    return mn_type_same_shape(&extra->type, &g->nodes[producer->inputs[0]].type);
  case MN_OP_MATMUL_AT_BGRAD: {
    const mn_tensor_type *summed =
        &g->nodes[producer->inputs[producer->attrs.variant ? 1 : 0]].type;
    return extra->type.rank >= 1 && extra->type.rank <= 2 &&
           mn_tensor_type_numel(&extra->type) == last_dim(summed);
  }
  case MN_OP_GELU_GRAD_BGRAD:
  case MN_OP_MATMUL_DRELU_BGRAD: {
    if (extra->attrs.variant == 2)
      return producer->op == MN_OP_GELU_GRAD_BGRAD &&
             mn_type_same_shape(&extra->type, &producer->type);
    int64_t n = last_dim(&producer->type);
    /* [N] or [1, N], as sum_rows makes it */
    return (extra->type.rank == 1 && extra->type.shape[0] == n) ||
           (extra->type.rank == 2 && extra->type.shape[0] == 1 && extra->type.shape[1] == n);
  }
  default: return false;
  }
}
