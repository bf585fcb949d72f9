/* Every differentiable op of the op table, forward and backward, in bf16 and f16 sessions of
 * the CPU backend against the fp32 session on the same data (tests/support/precision_check.h),
 * both with every op its own kernel and with the optimizer's fused groups. Each case gives its
 * bounds in units of the storage type's unit roundoff u (2^-8 for bf16, 2^-11 for fp16) as a
 * number of roundings; docs/precision.md ("Per-op bounds") derives them:
 *
 *   - every value the op reads was stored rounded (relative error u), and every result it
 *     stores is rounded once more (u); the upstream gradient is round(R) (u);
 *   - an input's rounding reaches the result scaled by the op's condition number there, so the
 *     input ranges below keep condition numbers near 1: away from zeros of a result or of a
 *     derivative (log near 1, silu and gelu near their minima), and with operands of one sign
 *     where a sum would cancel (products, bias and weight gradients, which use a positive R);
 *   - ops whose gradient is a projection (softmax, the norms, attention, cross-entropy: the
 *     gradient sums to zero along a row) cancel whatever the data; their bounds carry the
 *     factor rho = || |A| + |B| || / ||A - B|| of the two terms, taken as rho <= 2 for these
 *     random rows (about 1.3 to 1.7 expected).
 * The bounds are first-order worst cases, so the errors seen are well inside them; a value not
 * rounded is caught by the exact checks of the helper (stored values representable, and not
 * every value equal to fp32's). */
#include "tests/support/precision_check.h"

/* R from [0.5, 1.5]: reductions of the upstream gradient sum terms of one sign. */
#define POSITIVE_R .r_lo = 0.5f, .r_hi = 1.5f

/* The check in both low precisions: the bounds count roundings, the same for either type. */
static void check(const char *what, const mn_gc_leaf *leaves, int num_leaves, mn_gc_build build,
                  void *user, mn_pc_options o) {
  mn_precision_check(what, MN_PRECISION_BF16, leaves, num_leaves, build, user, &o);
  mn_precision_check(what, MN_PRECISION_F16, leaves, num_leaves, build, user, &o);
}

typedef mn_node (*unary_fn)(mn_graph *, mn_node);
typedef mn_node (*binary_fn)(mn_graph *, mn_node, mn_node);

static mn_node apply_unary(mn_graph *g, const mn_node *x, void *u) {
  return (*(unary_fn *)u)(g, x[0]);
}
static mn_node apply_binary(mn_graph *g, const mn_node *x, void *u) {
  return (*(binary_fn *)u)(g, x[0], x[1]);
}

static void check_unary(const char *what, unary_fn f, mn_gc_leaf x, mn_pc_options o) {
  check(what, &x, 1, apply_unary, &f, o);
}
static void check_binary(const char *what, binary_fn f, mn_gc_leaf a, mn_gc_leaf b,
                         mn_pc_options o) {
  mn_gc_leaf l[] = {a, b};
  check(what, l, 2, apply_binary, &f, o);
}

/* ---- matrix products ---------------------------------------------------------------------- */

/* Operands and R of one sign: sum_k |a_ik b_kj| = |c_ij|, so two operand roundings and the
 * store bound each element (3); the gradients are products of the same kind. K = 8. */
Test(precision_ops, matrix_products) {
  mn_pc_options o = {.forward = 3, .backward = 3, POSITIVE_R};
  check_binary("matmul [3,8]x[8,5]", mn_matmul, (mn_gc_leaf)MN_GC_LEAF("a", 0.5f, 1.5f, 3, 8),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 8, 5), o);
  check_binary("matmul [2,3,8]x[8,4]", mn_matmul, (mn_gc_leaf)MN_GC_LEAF("a", 0.5f, 1.5f, 2, 3, 8),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 8, 4), o);
  check_binary("matmul_at [8,3]^T[8,5]", mn_matmul_at,
               (mn_gc_leaf)MN_GC_LEAF("a", 0.5f, 1.5f, 8, 3),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 8, 5), o);
  check_binary("matmul_bt [2,3,8][5,8]^T", mn_matmul_bt,
               (mn_gc_leaf)MN_GC_LEAF("a", 0.5f, 1.5f, 2, 3, 8),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 5, 8), o);
}

/* ---- element-wise binary ------------------------------------------------------------------ */

Test(precision_ops, add_mul_div) {
  /* add: operands of one sign, so |da| + |db| = |a + b|: two roundings read, one stored. The
   * gradient is dy itself: round(R). */
  check_binary("add", mn_add, (mn_gc_leaf)MN_GC_LEAF("a", 0.5f, 1.5f, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 2, 3, 5),
               (mn_pc_options){.forward = 2, .backward = 1});
  /* mul: relative errors of factors add: a, b, store (3); da = dy b likewise (3). */
  check_binary("mul", mn_mul, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 33),
               (mn_gc_leaf)MN_GC_LEAF("b", -1, 1, 33),
               (mn_pc_options){.forward = 3, .backward = 3});
  /* div: y = a / b (3); da = dy / b (3); db = -(dy / b) y: the stored dy / b (3), the stored y
   * (3) and the store (1) = 7. */
  check_binary("div", mn_div, (mn_gc_leaf)MN_GC_LEAF("a", -1, 1, 4, 3),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 2, 4, 3),
               (mn_pc_options){.forward = 3, .backward = 7});
}

/* x + a row of one sign: forward as add (2); the row's gradient sums dy over rows, of one sign
 * with a positive R: the roundings of dy and the store (2). */
Test(precision_ops, row_and_channel_broadcasts) {
  mn_pc_options o = {.forward = 2, .backward = 2, POSITIVE_R};
  check_binary("bias_add", mn_bias_add, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 1.5f, 2, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("bias", 0.5f, 1.5f, 5), o);
  check_binary("broadcast_add", mn_broadcast_add, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 1.5f, 7, 5),
               (mn_gc_leaf)MN_GC_LEAF("row", 0.5f, 1.5f, 1, 5), o);
  check_binary("add_per_channel", mn_add_per_channel,
               (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 1.5f, 2, 3, 3, 5),
               (mn_gc_leaf)MN_GC_LEAF("b", 0.5f, 1.5f, 3), o);
}

/* ---- element-wise unary ------------------------------------------------------------------- */

static mn_node scale_by_m3(mn_graph *g, mn_node x) { return mn_scale(g, x, -3.0f); }

Test(precision_ops, element_wise_unary) {
  /* Exact in fp32 on a rounded input: relu, abs and neg store it unchanged (1); their
   * gradients are +-dy or 0 (1). Rounding keeps signs, so the masks agree. */
  mn_pc_options exact = {.forward = 1, .backward = 1};
  check_unary("relu", mn_relu, (mn_gc_leaf)MN_GC_LEAF("x", -2, 2, 5, 7), exact);
  check_unary("abs", mn_abs, (mn_gc_leaf)MN_GC_LEAF("x", -2, 2, 35), exact);
  check_unary("neg", mn_neg, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 3, 4), exact);
  /* scale by -3: the input and the store (2), dy and the store (2). */
  check_unary("scale", scale_by_m3, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 3, 4),
              (mn_pc_options){.forward = 2, .backward = 2});
  /* sigmoid on [-1, 1]: condition |x (1 - y)| <= 0.73 (2); the gradient dy y (1 - y) reads
   * the stored y (1.73 u), whose relative error reaches y (1 - y) amplified by
   * |1 - 2y| / (1 - y) <= 1.7 for y in [0.27, 0.73] (2.95), plus dy and the store: 5. On
   * [-4, 4] that factor is 50 (1 - y ~ 0.02 held in 8 bits) and the bound would test nothing. */
  check_unary("sigmoid", mn_sigmoid, (mn_gc_leaf)MN_GC_LEAF("x", -1, 1, 2, 17),
              (mn_pc_options){.forward = 2, .backward = 5});
  /* tanh on [-0.75, 0.75]: condition <= 1 (2); 1 - y^2 amplifies y's error by
   * 2y^2 / (1 - y^2) <= 1.35 (2.7), plus dy and the store: 5. */
  check_unary("tanh", mn_tanh, (mn_gc_leaf)MN_GC_LEAF("x", -0.75f, 0.75f, 33),
              (mn_pc_options){.forward = 2, .backward = 5});
  /* log on [2, 4]: condition 1 / |log x| <= 1.45 (2.5), away from the zero at 1; dx = dy / x
   * (3). */
  check_unary("log", mn_log, (mn_gc_leaf)MN_GC_LEAF("x", 2, 4, 12),
              (mn_pc_options){.forward = 2.5, .backward = 3});
  /* exp on [-2, 1]: condition |x| <= 2 (3); dx = dy y with the stored y (3) + dy + store: 5. */
  check_unary("exp", mn_exp, (mn_gc_leaf)MN_GC_LEAF("x", -2, 1, 12),
              (mn_pc_options){.forward = 3, .backward = 5});
  /* recip on [0.5, 2]: condition 1 (2); dx = -dy (y y): y y is 2 + 2 + 1, then dy and the
   * store: 7. */
  check_unary("recip", mn_recip, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 2, 12),
              (mn_pc_options){.forward = 2, .backward = 7});
  /* silu and gelu on [-0.25, 2]: their conditions 1 + x (1 - s(x)) and 1 + x phi / Phi stay
   * below 1.3 (2.5), and the derivatives stay away from their zeros near -1.28 and -0.75, where
   * |x f'' / f'| would grow without bound; it is <= 0.62 here, plus dy and the store: 3. */
  check_unary("silu", mn_silu, (mn_gc_leaf)MN_GC_LEAF("x", -0.25f, 2, 3, 11),
              (mn_pc_options){.forward = 2.5, .backward = 3});
  check_unary("gelu", mn_gelu, (mn_gc_leaf)MN_GC_LEAF("x", -0.25f, 2, 3, 11),
              (mn_pc_options){.forward = 2.5, .backward = 3});
}

/* ---- whole-tensor reductions -------------------------------------------------------------- */

/* Terms of one sign: the sum is within u of the exact one and is stored fp32 (a single
 * element); every element's gradient is R (or R / n) rounded once. */
Test(precision_ops, sum_and_mean) {
  mn_pc_options o = {.forward = 1, .backward = 1};
  check_unary("sum_all", mn_sum_all, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 1.5f, 2, 3, 5), o);
  check_unary("mean_all", mn_mean_all, (mn_gc_leaf)MN_GC_LEAF("x", 0.5f, 1.5f, 2, 3, 5), o);
}

/* ---- softmax family and losses ------------------------------------------------------------ */

static mn_node build_softmax(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_softmax(g, x[0]);
}
static mn_node build_log_softmax(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_log_softmax(g, x[0]);
}

/* Rows of 8 logits from [-1, 1]. softmax: condition sum_j |x_j (delta_ij - y_j)| <= 2 max|x|
 * (3). Its gradient y (dy - s), s = sum_j y_j dy_j, sums to zero along the row: the stored y
 * (3) and the store (1), plus dy (1) and s (3 + 1) relative to ||y|| max|dy||, which is the
 * cancellation factor rho <= 2 times ||dx||: 4 + 5 rho = 14.
 * log_softmax: y = x - lse(x) moves by at most 2u max|x| = 2u and |y| >= log(1 + 7 e^-2) =
 * 0.64 (3.1, + store: 4.5); its gradient dy - exp(y) sum(dy) reads exp of the stored y, off by
 * y's absolute error (2 + |y| <= 4.1: 6.1 u relative), and sum(dy) (1): dy and the store (2)
 * plus rho (6.1 + 1) = 16.5. */
Test(precision_ops, softmax_and_log_softmax) {
  mn_gc_leaf x[] = {MN_GC_LEAF("x", -1, 1, 3, 8)};
  check("softmax [3,8]", x, 1, build_softmax, NULL, (mn_pc_options){.forward = 3, .backward = 14});
  check("log_softmax [3,8]", x, 1, build_log_softmax, NULL,
        (mn_pc_options){.forward = 4.5, .backward = 16.5});
}

static mn_node build_loss(mn_graph *g, const mn_node *x, void *u) {
  return (*(binary_fn *)u)(g, x[0], x[1]);
}
static mn_node build_sparse(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_sparse_cross_entropy_loss(g, x[0], x[1]);
}

/* A loss is one fp32 value (not stored low) and its upstream gradient R is an exact fp32
 * scalar; the losses compute in fp32 from their rounded inputs.
 *   - cross_entropy, rows of 8 logits from [-1, 1], targets from [0, 1]: -t log_softmax(z)
 *     terms all of one sign, t (1) and log_softmax (3.1, as above) = 4.5; the logits' gradient
 *     softmax(z) sum(t) - t sums to zero: the store (1) + rho (softmax 2 + sum(t) 1) = 7; the
 *     target's is the stored log_softmax (4.5) times the stored -dy / rows (1), stored (1).
 *   - sparse_cross_entropy: -log_softmax at the label (3.1: 3.5); the gradient p - onehot is
 *     off by 2u p, relative to 1 - p >= 0.28 at the label (p <= 0.72 here): 5.1 + store = 6.5.
 *   - bce with p in [0.7, 0.8], t in [0, 0.2]: terms of one sign, t log p off by t (1) and log p
 *     (1 / |log 0.8| = 4.5): 5.5; d/dp = (p - t) / (p (1 - p)): p - t >= 0.5 (2), 1 - p reads
 *     p's rounding amplified by p / (1 - p) <= 4 (5), store (1) = 8; d/dt = log((1 - p) / p)
 *     moves by u / (1 - p) <= 5u against |log| >= 0.85 (5.9) + store = 7. On gradcheck's
 *     [0.1, 0.9] the log near 1/2 and 1 - p near 0.1 would need bounds of 30 u and more.
 *   - mse and l1 with p in [0.5, 1], t in [-1, -0.5]: p - t has no cancellation (1); mse
 *     squares it (2) and its gradient 2 (p - t) dy / n is stored (2); l1's sign is exact and
 *     its gradient sign dy / n is rounded once (1). */
Test(precision_ops, losses) {
  binary_fn ce = mn_cross_entropy_loss, bce = mn_bce_loss, mse = mn_mse_loss, l1 = mn_l1_loss;
  mn_gc_leaf ce_l[] = {MN_GC_LEAF("logits", -1, 1, 4, 8), MN_GC_LEAF("t", 0, 1, 4, 8)};
  check("cross_entropy [4,8]", ce_l, 2, build_loss, &ce,
        (mn_pc_options){.forward = 4.5, .backward = 7});
  mn_gc_leaf sp_l[] = {MN_GC_LEAF("logits", -1, 1, 4, 8), MN_GC_LABELS("labels", 8, 4)};
  check("sparse_cross_entropy [4,8]", sp_l, 2, build_sparse, NULL,
        (mn_pc_options){.forward = 3.5, .backward = 6.5});
  mn_gc_leaf bce_l[] = {MN_GC_LEAF("p", 0.7f, 0.8f, 3, 7), MN_GC_LEAF("t", 0, 0.2f, 3, 7)};
  check("bce [3,7]", bce_l, 2, build_loss, &bce, (mn_pc_options){.forward = 5.5, .backward = 8});
  mn_gc_leaf diff_l[] = {MN_GC_LEAF("p", 0.5f, 1, 3, 7), MN_GC_LEAF("t", -1, -0.5f, 3, 7)};
  check("mse [3,7]", diff_l, 2, build_loss, &mse, (mn_pc_options){.forward = 2, .backward = 2});
  check("l1 [3,7]", diff_l, 2, build_loss, &l1, (mn_pc_options){.forward = 1, .backward = 1});
}

/* ---- transformer ops ---------------------------------------------------------------------- */

static mn_node build_swiglu(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_swiglu(g, x[0], x[1]);
}
static mn_node build_rms_norm(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_rms_norm(g, x[0], x[1], 1e-5f);
}
static mn_node build_layer_norm(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_layer_norm(g, x[0], x[1], x[2], 1e-5f);
}
static mn_node build_rope(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_rope_with_offset(g, x[0], 10000.0f, 5, 8);
}
static mn_node build_rope_dynamic(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_rope_dynamic_offset(g, x[0], 10000.0f, x[1], 8);
}

/* swiglu = silu(gate) up with the gate on silu's range above: 1.3 + up (1) + store = 3.5; the
 * up gradient is dy times the stored silu(gate) (2.3): 4.5, the gate's dy up silu'(gate): 3.5.
 * rms_norm x w / r: x, w, r (mean x^2 has no cancellation, r = sqrt halves it: 1), store = 4;
 * its x gradient (w dy - x_hat mean(x_hat w dy)) / r is a projection: r and the store (2) plus
 * rho (w dy 2 + x_hat 2 + the mean's 2) = 14. layer_norm: x - mean(x) is off by at most
 * u ||x|| norm-wise, and ||x|| / ||x - mean|| <= 1.2 for rows of 16 from [-2, 2] (so x_hat and
 * sigma: 2.4), w (1), a small bias from [-0.2, 0.2] (0.2) and the store: 5; the x gradient is
 * a projection as rms_norm's with centred x_hat: 1.2 + 1 + rho (2 + 2.4 + 2) = 15. The weight
 * and bias gradients sum dy x_hat and dy over 3 rows: 1 + rho 3.4 = 8 at most. RoPE rotates
 * pairs by fp32 angles both sessions compute alike: a rotation keeps norms, so the input's
 * rounding and the store bound it norm-wise (2), and its gradient (the inverse rotation of
 * dy: 2), although single elements a cos - b sin may cancel. */
Test(precision_ops, swiglu_norms_rope) {
  mn_gc_leaf sw[] = {MN_GC_LEAF("gate", -0.25f, 2, 3, 11), MN_GC_LEAF("up", -1, 1, 3, 11)};
  check("swiglu [3,11]", sw, 2, build_swiglu, NULL,
        (mn_pc_options){.forward = 3.5, .backward = 4.5});
  mn_gc_leaf rms[] = {MN_GC_LEAF("x", -2, 2, 3, 16), MN_GC_LEAF("w", 0.5f, 1.5f, 16)};
  check("rms_norm [3,16]", rms, 2, build_rms_norm, NULL,
        (mn_pc_options){.forward = 4, .backward = 14});
  mn_gc_leaf ln[] = {MN_GC_LEAF("x", -2, 2, 3, 16), MN_GC_LEAF("w", 0.5f, 1.5f, 16),
                     MN_GC_LEAF("b", -0.2f, 0.2f, 16)};
  check("layer_norm [3,16]", ln, 3, build_layer_norm, NULL,
        (mn_pc_options){.forward = 5, .backward = 15});
  static const uint32_t seven[] = {7};
  mn_gc_leaf rope[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 24)};
  check("rope [2,3,24] hd 8 offset 5", rope, 1, build_rope, NULL,
        (mn_pc_options){.forward = 2, .backward = 2});
  mn_gc_leaf rope_d[] = {MN_GC_LEAF("x", -1, 1, 5, 24), MN_GC_U32_LEAF("offset", seven, 1)};
  check("rope_dynamic_offset [5,24] hd 8", rope_d, 2, build_rope_dynamic, NULL,
        (mn_pc_options){.forward = 2, .backward = 2});
}

typedef enum att_kind { CAUSAL, FULL, CROSS } att_kind;

static mn_node build_attention(mn_graph *g, const mn_node *x, void *u) {
  switch (*(const att_kind *)u) {
  case CAUSAL: return mn_causal_attention(g, x[0], x[1], x[2], 4, 2, 4);
  case FULL: return mn_full_attention(g, x[0], x[1], x[2], 4, 2, 4);
  case CROSS: break;
  }
  return mn_cross_attention(g, x[0], x[1], x[2], 4, 2, 4);
}

/* 4 heads over 2 KV heads of dimension 4 (grouped), 5 queries, 5 keys (3 for cross). With q
 * and k from [-0.5, 0.5] a score scale q.k (scale 1/2) moves by at most 2u scale sum|q k| = u,
 * so a probability by 2u relative (fp32 statistics); v from [0.5, 1.5] and a positive R leave
 * sum_j p_j v_j and dv = P^T dy without cancellation: 2 + 1 + store = 4. dq and dk go through
 * the softmax gradient P (dP - D), dP = dy v^T, then a sum against signed k or q: the store (1)
 * plus rho (P 2 + dP 2 + D 4 + k or q 1) = 19. With q, k from [-1, 1] the scores' error is 4u,
 * P's 8u, and the bound would be 40 u (16% in bf16): nothing. */
Test(precision_ops, attention) {
  mn_gc_leaf self[] = {MN_GC_LEAF("q", -0.5f, 0.5f, 5, 16), MN_GC_LEAF("k", -0.5f, 0.5f, 5, 8),
                       MN_GC_LEAF("v", 0.5f, 1.5f, 5, 8)};
  mn_gc_leaf cross[] = {MN_GC_LEAF("q", -0.5f, 0.5f, 5, 16), MN_GC_LEAF("k", -0.5f, 0.5f, 3, 8),
                        MN_GC_LEAF("v", 0.5f, 1.5f, 3, 8)};
  mn_pc_options o = {.forward = 4, .backward = 19, POSITIVE_R};
  att_kind causal = CAUSAL, full = FULL, cr = CROSS;
  check("causal_attention", self, 3, build_attention, &causal, o);
  check("full_attention", self, 3, build_attention, &full, o);
  check("cross_attention", cross, 3, build_attention, &cr, o);
}

static mn_node build_embedding(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_embedding(g, x[0], x[1]);
}
static mn_node build_scatter_add(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_scatter_add(g, x[0], x[1], 5);
}

/* Index 1 repeats: its table row's gradient, and scatter_add's row, are sums of two, of one
 * sign (positive values and R). embedding gathers rounded rows (1) and its gradient sums dy
 * (2); scatter_add sums rounded rows and stores (2), its gradient gathers dy (1). */
Test(precision_ops, embedding_and_scatter_add) {
  static const uint32_t repeated[] = {1, 3, 1, 0};
  mn_gc_leaf emb[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("table", 0.5f, 1.5f, 5, 6)};
  check("embedding [4] of [5,6]", emb, 2, build_embedding, NULL,
        (mn_pc_options){.forward = 1, .backward = 2, POSITIVE_R});
  mn_gc_leaf sc[] = {MN_GC_U32_LEAF("idx", repeated, 4), MN_GC_LEAF("src", 0.5f, 1.5f, 4, 6)};
  check("scatter_add [4,6] into 5 rows", sc, 2, build_scatter_add, NULL,
        (mn_pc_options){.forward = 2, .backward = 1, POSITIVE_R});
}

/* ---- vision and layout ops ---------------------------------------------------------------- */

static mn_node build_conv(mn_graph *g, const mn_node *x, void *u) {
  const int *stride_padding = u;
  return mn_conv2d(g, x[0], x[1], stride_padding[0], stride_padding[1]);
}
static mn_node build_group_norm(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_group_norm(g, x[0], x[1], x[2], 2, 1e-5f);
}

/* conv2d is a product (3, 3 with positive operands and R, as matmul); group_norm is
 * layer_norm over each group of channels (5, 15). */
Test(precision_ops, conv2d_and_group_norm) {
  mn_gc_leaf conv[] = {MN_GC_LEAF("x", 0.5f, 1.5f, 2, 2, 5, 4),
                       MN_GC_LEAF("k", 0.5f, 1.5f, 3, 2, 3, 3)};
  int s1p1[2] = {1, 1}, s2p0[2] = {2, 0};
  mn_pc_options o = {.forward = 3, .backward = 3, POSITIVE_R};
  check("conv2d 5x4 k3x3 s1 p1", conv, 2, build_conv, s1p1, o);
  check("conv2d 5x4 k3x3 s2 p0", conv, 2, build_conv, s2p0, o);
  mn_gc_leaf gn[] = {MN_GC_LEAF("x", -2, 2, 2, 4, 3, 3), MN_GC_LEAF("w", 0.5f, 1.5f, 4),
                     MN_GC_LEAF("b", -0.2f, 0.2f, 4)};
  check("group_norm [2,4,3,3] groups 2", gn, 3, build_group_norm, NULL,
        (mn_pc_options){.forward = 5, .backward = 15});
}

static mn_node build_concat(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_concat(g, x[0], x[1]);
}
static mn_node build_split_a(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_split_a(g, x[0], 2);
}
static mn_node build_split_b(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_split_b(g, x[0], 2);
}
static mn_node build_slice_last(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_slice_last(g, x[0], 2, 5);
}
static mn_node build_upsample(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_upsample_2x(g, x[0]);
}

/* Copies: the input's rounding (1) and the gradient's, a copy of round(R) (1); upsample's
 * gradient sums four values of dy, of one sign with a positive R, and stores the sum (2). */
Test(precision_ops, layout) {
  mn_pc_options copy = {.forward = 1, .backward = 1};
  mn_gc_leaf cat[] = {MN_GC_LEAF("a", -1, 1, 2, 3, 3, 2), MN_GC_LEAF("b", -1, 1, 2, 2, 3, 2)};
  check("concat", cat, 2, build_concat, NULL, copy);
  mn_gc_leaf x[] = {MN_GC_LEAF("x", -1, 1, 2, 5, 3, 2)};
  check("split_a", x, 1, build_split_a, NULL, copy);
  check("split_b", x, 1, build_split_b, NULL, copy);
  mn_gc_leaf wide[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 9)};
  check("slice_last", wide, 1, build_slice_last, NULL, copy);
  mn_gc_leaf up[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 3, 2)};
  check("upsample_2x", up, 1, build_upsample, NULL,
        (mn_pc_options){.forward = 1, .backward = 2, POSITIVE_R});
}
