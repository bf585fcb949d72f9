/* Reference kernel of fused nodes: interprets the node's program (host/graph.h) a chunk of
 * elements at a time, one instruction over the whole chunk, with each pointwise op's formula
 * written exactly as its own reference kernel computes it (ref_math.c, ref_backward_math.c,
 * ref_transformer.c, ref_backward_transformer.c) and every result rounded to float as those
 * kernels store it. A row op (a norm or its x gradient) runs its own reference kernel over
 * the chunk's rows, so chunks are whole rows then. A fused graph therefore gives bit for bit
 * what the unfused graph gives, which is what the fusion tests check. */
#include <math.h>
#include <stdlib.h>

#include "host/reference/ref_shared.h"

enum { TILE = 256 };

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* o[i] = op(a[i], b[i], c[i]) for i < n; operands past the op's arity are not read. */
static void apply(const mn_fused_instr *in, const float *a, const float *b, const float *c,
                  float *o, size_t n) {
  double s = (double)in->scale;
  switch (in->op) {
#define BINARY(E, expr)                                                                            \
  case MN_OP_##E:                                                                                  \
    for (size_t i = 0; i < n; i++)                                                                 \
      o[i] = (expr);                                                                               \
    return;
    BINARY(ADD, a[i] + b[i])
    BINARY(MUL, a[i] * b[i])
    BINARY(DIV, a[i] / b[i])
    BINARY(GREATER, a[i] > b[i] ? 1.0f : 0.0f)
#undef BINARY
#define UNARY(E, expr)                                                                             \
  case MN_OP_##E:                                                                                  \
    for (size_t i = 0; i < n; i++) {                                                               \
      double x = a[i];                                                                             \
      o[i] = (float)(expr);                                                                        \
    }                                                                                              \
    return;
    UNARY(SCALE, x * s)
    UNARY(RELU, x > 0 ? x : 0.0)
    UNARY(SIGMOID, sigmoid(x))
    UNARY(TANH, tanh(x))
    UNARY(NEG, -x)
    UNARY(ABS, fabs(x))
    UNARY(LOG, log(x))
    UNARY(EXP, exp(x))
    UNARY(RECIP, 1.0 / x)
    UNARY(SILU, x * sigmoid(x))
    UNARY(GELU, mn_ref_gelu_tanh(x))
    UNARY(SWIGLU, x / (1.0 + exp(-x)) * b[i])
#undef UNARY
/* (forward input or output v, dy): dy * f'(v) */
#define GRAD(E, dfdv)                                                                              \
  case MN_OP_##E:                                                                                  \
    for (size_t i = 0; i < n; i++) {                                                               \
      double v = a[i];                                                                             \
      o[i] = (float)((double)b[i] * (dfdv));                                                       \
    }                                                                                              \
    return;
    GRAD(RELU_GRAD, v > 0 ? 1.0 : 0.0)
    GRAD(SIGMOID_GRAD, v * (1.0 - v))
    GRAD(TANH_GRAD, 1.0 - v * v)
    GRAD(ABS_GRAD, v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0))
    GRAD(SILU_GRAD, sigmoid(v) * (1.0 + v * (1.0 - sigmoid(v))))
    GRAD(GELU_GRAD, mn_ref_gelu_tanh_grad(v))
#undef GRAD
  case MN_OP_SWIGLU_GRAD_GATE: /* (gate, up, dy) */
    for (size_t i = 0; i < n; i++) {
      double g = a[i], sg = 1.0 / (1.0 + exp(-g));
      o[i] = (float)((double)c[i] * b[i] * sg * (1.0 + g * (1.0 - sg)));
    }
    return;
  default:
    /* mn_fused_prog_check admits only the ops above; a NaN result makes a gap visible. */
    for (size_t i = 0; i < n; i++)
      o[i] = NAN;
    return;
  }
}

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
    const float *slot[MN_MAX_INPUTS + MN_FUSED_MAX_INSTRS];
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
        apply(in, ops[0], ops[1], ops[2], o, len);
      slot[ni + r] = o;
    }
  }
  free(tmp);
  return st;
}
