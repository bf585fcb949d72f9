/* Reference kernel of fused nodes: interprets the node's program (host/graph.h) a chunk of
 * elements at a time, one instruction over the whole chunk, each pointwise instruction
 * through the loop of its op's row (host/pointwise.h, ref_pointwise.c) that the op's own
 * reference kernel runs, every result rounded to float as that kernel stores it. A row op (a
 * norm or its x gradient) runs its own reference kernel over the chunk's rows, so chunks are
 * whole rows then. A fused graph therefore gives bit for bit what the unfused graph gives,
 * which is what the fusion tests check. */
#include <stdlib.h>

#include "host/pointwise.h"
#include "host/reference/ref_shared.h"

enum { TILE = 256 };

/* The row op `in` over `rows` rows of n: its own reference kernel, run on a node of that
 * shape whose inputs are the operands' rows (weight and bias whole). */
static mn_status run_row(const mn_ref_ctx *c, const mn_fused_instr *in, const float *const *ops,
                         float *o, size_t rows, size_t n) {
  mn_node_rec node = {.op = in->op, .num_inputs = mn_op_table[in->op].arity};
  node.type = mn_type_make(MN_F32, (const int64_t[]){(int64_t)rows, (int64_t)n}, 2);
  node.attrs.eps = in->eps;
  mn_ref_ctx rc = *c;
  rc.node = &node;
  rc.out = o;
  for (int k = 0; k < node.num_inputs; k++)
    rc.in[k] = ops[k];
  return mn_ref_kernels[in->op](&rc);
}

/* Elements per chunk: TILE, or whole rows of n when the program has a row op. */
static size_t chunk_of(size_t n, bool rows) {
  if (!rows) return TILE;
  return n >= TILE ? n : TILE / n * n;
}

mn_status mn_ref_FUSED(const mn_ref_ctx *c) {
  const mn_fused_prog *p = c->node->fused;
  char why[128];
  if (!p || !mn_fused_prog_check(p, c->node->num_inputs, why, sizeof why))
    return mn_ref_fail(c, MN_ERR_STATE, "bad fused program: %s", p ? why : "none");
  int ni = c->node->num_inputs, nr = p->num_instrs, row = mn_fused_prog_row(p);
  const mn_tensor_type *t = &c->node->type;
  size_t n = row >= 0 ? (size_t)t->shape[t->rank - 1] : 1, chunk = chunk_of(n, row >= 0);
  /* Results that are neither the node's value nor an extra value live in chunks. */
  float *tmp = malloc((size_t)nr * chunk * sizeof *tmp);
  if (!tmp) return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory");
  float *out = mn_ref_out_f32(c);
  mn_status st = MN_OK;
  for (size_t at = 0, total = mn_ref_numel(c); st == MN_OK && at < total; at += chunk) {
    size_t len = total - at < chunk ? total - at : chunk;
    const float *slot[MN_FUSED_MAX_INPUTS + MN_FUSED_MAX_INSTRS];
    for (int k = 0; k < ni; k++)
      slot[k] = mn_ref_in_f32(c, k) + (mn_fused_input_is_row(p, k) ? 0 : at);
    for (int r = 0; st == MN_OK && r < nr; r++) {
      const mn_fused_instr *in = &p->instrs[r];
      float *extra = in->out ? c->extra_out[in->out - 1] : NULL;
      float *o = r == nr - 1 ? out + at : extra ? extra + at : tmp + (size_t)r * chunk;
      const float *ops[MN_FUSED_MAX_ARGS];
      for (int k = 0; k < MN_FUSED_MAX_ARGS; k++)
        ops[k] = slot[in->args[k]];
      if (r == row)
        st = run_row(c, in, ops, o, len / n, n);
      else
        mn_ref_pw_loop(mn_pw_code_of_op(in->op), ops[0], ops[1], ops[2], (double)in->scale, o, len);
      slot[ni + r] = o;
    }
  }
  free(tmp);
  return st;
}
