/* Reference kernel of fused nodes: interprets the node's program (host/graph.h) a tile of
 * elements at a time, one instruction over the whole tile, with each op's formula written
 * exactly as its own reference kernel computes it (ref_math.c, ref_backward_math.c,
 * ref_transformer.c, ref_backward_transformer.c) and every result rounded to float as those
 * kernels store it. A fused graph therefore gives bit for bit what the unfused graph
 * gives, which is what the fusion tests check. */
#include <math.h>
#include <stdlib.h>

#include "ref_shared.h"

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

mn_status mn_ref_FUSED(const mn_ref_ctx *c) {
  const mn_fused_prog *p = c->node->fused;
  char why[128];
  if (!p || !mn_fused_prog_check(p, c->node->num_inputs, why, sizeof why))
    return mn_ref_fail(c, MN_ERR_STATE, "bad fused program: %s", p ? why : "none");
  int ni = c->node->num_inputs, nr = p->num_instrs;
  /* Results but the last live in tiles; the last goes straight to the output. */
  float *tmp = malloc((size_t)(nr > 1 ? nr - 1 : 1) * TILE * sizeof *tmp);
  if (!tmp) return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory");
  float *out = mn_ref_out_f32(c);
  for (size_t at = 0, total = mn_ref_numel(c); at < total; at += TILE) {
    size_t n = total - at < TILE ? total - at : TILE;
    const float *slot[MN_MAX_INPUTS + MN_FUSED_MAX_INSTRS];
    for (int k = 0; k < ni; k++)
      slot[k] = mn_ref_in_f32(c, k) + at;
    for (int r = 0; r < nr; r++) {
      const mn_fused_instr *in = &p->instrs[r];
      float *o = r == nr - 1 ? out + at : tmp + (size_t)r * TILE;
      apply(in, slot[in->args[0]], slot[in->args[1]], slot[in->args[2]], o, n);
      slot[ni + r] = o;
    }
  }
  free(tmp);
  return MN_OK;
}
