/* Per-op checks of mixed precision on the CPU reference backend: one training step of an op in
 * an fp32 session and in a bf16 or fp16 session on the same data, the low-precision output and
 * leaf gradients compared with the fp32 ones against a bound in units of the storage type's
 * unit roundoff u (2^-8 for bf16, 2^-11 for fp16: half an ulp of p = 8 and 11 significant
 * bits, relative to the value; docs/precision.md, "Per-op bounds").
 *
 * The graph is gradcheck's (tests/support/gradcheck.h): each F32 leaf is a parameter p times a
 * random constant c in [0.5, 1.5], so the op reads a computed value, which a low-precision
 * session stores rounded, and the leaf's gradient passes through the op's backward result,
 * which it stores rounded too; the op's output y enters the loss as sum(y * R) with R random,
 * so the upstream gradient is not uniform.
 *
 * The low-precision session runs twice: with the graph optimizer off, every op is a kernel of
 * its own that reads stored (rounded) values and rounds what it stores, the case the per-op
 * bounds count; with the default options, fused pointwise groups keep their intermediates in
 * fp32 (a group may span the forward and the backward), which rounds less, and the same
 * bounds must hold. The fp32 reference uses the default options. */
#ifndef MN_TEST_PRECISION_CHECK_H
#define MN_TEST_PRECISION_CHECK_H

#include "tests/support/gradcheck.h"

typedef struct mn_pc_options {
  /* Bounds on the norm-wise relative error ||low - f32|| / ||f32||, as a number k of
   * roundings of relative size u: the check allows (1 + u)^k - 1 plus a small fp32 slack for
   * the two sessions' own fp32 evaluation. `forward` bounds the op's output y, `backward`
   * every F32 leaf's gradient. Both are required (> 0). */
  double forward, backward;
  /* Range R is drawn from; both 0: gradcheck's [-1, 1]. A positive range keeps reductions of
   * the upstream gradient (bias, weight and norm-weight gradients) free of cancellation. */
  float r_lo, r_hi;
  uint64_t seed; /* 0: 42 */
} mn_pc_options;

/* The errors seen, in units of u. */
typedef struct mn_pc_result {
  double forward;  /* the op output's norm-wise relative error / u */
  double backward; /* the largest leaf gradient's norm-wise relative error / u */
} mn_pc_result;

/* The storage type's unit roundoff: 2^-8 for BF16, 2^-11 for F16, 2^-24 for F32. */
double mn_precision_unit_roundoff(mn_precision prec);

/* Runs the check for prec (BF16 or F16) and fails the Criterion test naming `what`, the
 * precision, the plan ("per op" or "fused"), the value (the op's output or a leaf's gradient)
 * and its error when a bound is exceeded, when an output the storage table keeps low holds a
 * value the storage type cannot represent, or when every compared value of the per-op plan
 * equals the fp32 session's bit for bit (nothing was rounded).
 * An F16 session's first steps may overflow under dynamic loss scaling; those are skipped
 * (parameters untouched) and the step is repeated at the halved scale. With the environment
 * variable MN_PRECISION_CHECK_VERBOSE set, prints every error in units of u. */
mn_pc_result mn_precision_check(const char *what, mn_precision prec, const mn_gc_leaf *leaves,
                                int num_leaves, mn_gc_build build, void *user,
                                const mn_pc_options *opts);

/* The MLP of the whole-session precision tests: x [16, 8] -> relu(x w1 + b1) w2 + b2 -> mse
 * against t [16, 4]; outputs the loss and the prediction. */
mn_graph *mn_pc_mlp(void);
/* The same data into every session: x and t in [-1, 1) (t = 3000 everywhere when
 * `far_targets`, loss gradients of about 94 that overflow fp16 once scaled by 65536), and
 * parameters normal(0, 0.3). */
void mn_pc_fill_mlp(mn_session *const *s, size_t n, const mn_graph *g, bool far_targets);

#endif
