#include "optimizer/cost.h"

/* Multiply-adds of the products: 2 flops for each output element per reduced element. */
static double flops(mn_op op, const mn_tensor_type *out, const mn_tensor_type *const *ins, int n) {
  if (n < 2) return 0;
  double outs = (double)mn_tensor_type_numel(out);
  const mn_tensor_type *a = ins[0], *b = ins[1];
  switch (op) {
  case MN_OP_MATMUL:
  case MN_OP_MATMUL_BT:
  case MN_OP_MATMUL_BIAS_ACT:
  case MN_OP_MATMUL_DRELU:
  case MN_OP_MATMUL_DRELU_BGRAD: return 2.0 * outs * (double)(a->rank ? a->shape[a->rank - 1] : 1);
  case MN_OP_MATMUL_DGELU:
    return MN_COST_DGELU_SLOWDOWN * 2.0 * outs * (double)(a->rank ? a->shape[a->rank - 1] : 1);
  case MN_OP_MATMUL_AT:
  case MN_OP_MATMUL_AT_BGRAD: {
    int64_t m = a->rank ? a->shape[a->rank - 1] : 1;
    return 2.0 * outs * (double)(m ? mn_tensor_type_numel(a) / m : 0);
  }
  case MN_OP_CONV2D: {
    int64_t co = b->rank ? b->shape[0] : 1;
    return 2.0 * outs * (double)(co ? mn_tensor_type_numel(b) / co : 0);
  }
  default: return 0;
  }
}

double mn_cost_op(mn_op op, const mn_tensor_type *out, const mn_tensor_type *const *ins, int n) {
  if (mn_op_flags(op) & MN_OPF_LEAF) return 0;
  /* An extra value is written by its producer's launch: its bytes, no launch of its own. */
  if (mn_op_flags(op) & MN_OPF_EXTRA_OUTPUT) return (double)mn_tensor_type_bytes(out);
  double bytes = (double)mn_tensor_type_bytes(out);
  for (int i = 0; i < n; i++)
    bytes += (double)mn_tensor_type_bytes(ins[i]);
  return bytes + flops(op, out, ins, n) * MN_COST_BYTES_PER_FLOP + MN_COST_LAUNCH_BYTES;
}

double mn_cost_graph(const mn_graph *g) {
  double total = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *r = &g->nodes[i];
    const mn_tensor_type *ins[MN_MAX_INPUTS];
    for (int k = 0; k < r->num_inputs; k++)
      ins[k] = &g->nodes[r->inputs[k]].type;
    total += mn_cost_op(r->op, &r->type, ins, r->num_inputs);
  }
  return total;
}
