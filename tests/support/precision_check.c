#include "tests/support/precision_check.h"
#include "tests/support/session_util.h"

#include <stdio.h>
#include <stdlib.h>

#include "host/storage.h"

enum { MAX_LEAVES = 16, MAX_F16_RETRIES = 32 };

/* Both sessions compute in fp32 (libm to about an ulp, sums of a few dozen terms), so the
 * fp32 values they round differ from exact ones by far less than 128 fp32 unit roundoffs
 * (2^-24 each): 1/512 of bf16's u and 1/64 of fp16's. */
#define FP32_SLACK 0x1p-17

/* Round to nearest with p significant bits is off by at most half an ulp, 2^-p relative to the
 * value (2^-p / (1 + 2^-p) at worst, just above a power of two): bf16 keeps p = 8 bits (7
 * stored), fp16 p = 11 (10 stored). A single bf16 rounding of 0.04625 (to 0.046142578, 1.48 x
 * 2^-5 cut to 189/128 x 2^-5) is off by 2.3e-3 relative, more than 2^-9 = 1.95e-3. */
double mn_precision_unit_roundoff(mn_precision prec) {
  switch (prec) {
  case MN_PRECISION_BF16: return 0x1p-8;
  case MN_PRECISION_F16: return 0x1p-11;
  case MN_PRECISION_F32: break;
  }
  return 0x1p-24;
}

static const char *precision_name(mn_precision prec) {
  return prec == MN_PRECISION_BF16 ? "bf16" : prec == MN_PRECISION_F16 ? "f16" : "f32";
}

/* The data both sessions get: each F32 leaf's parameter, each U32 leaf's values. */
typedef struct leaf_data {
  float *param[MAX_LEAVES];
  uint32_t *u32[MAX_LEAVES];
} leaf_data;

/* What one session computed: the op's output and every F32 leaf's gradient. */
typedef struct step_values {
  float *y;
  float *grad[MAX_LEAVES];
} step_values;

static step_values run_session(const char *what, const mn_graph *g, mn_precision prec,
                               bool optimize, const mn_gc_leaf *leaves, int num_leaves,
                               const leaf_data *data, size_t ny) {
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  so.precision = prec;
  so.optimize = optimize;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &so, &s), MN_OK, "%s (%s): build: %s", what,
               precision_name(prec), mn_last_error());
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    size_t n = mn_gc_leaf_numel(l);
    mn_status st = l->u32 ? mn_session_set_input_u32(s, l->name, data->u32[i], n)
                          : mn_session_set_parameter(s, l->name, data->param[i], n);
    cr_assert_eq(st, MN_OK, "%s (%s): leaf \"%s\": %s", what, precision_name(prec), l->name,
                 mn_last_error());
  }
  /* An F16 step whose scaled gradients overflow updates nothing and halves the loss scale:
   * the parameters are still the ones set above, so stepping again computes the same point. */
  for (int attempt = 0;; attempt++) {
    mn_session_stats before, after;
    cr_assert_eq(mn_session_get_stats(s, &before), MN_OK);
    cr_assert_eq(mn_session_step(s), MN_OK, "%s (%s): step: %s", what, precision_name(prec),
                 mn_last_error());
    cr_assert_eq(mn_session_wait(s), MN_OK, "%s (%s): wait: %s", what, precision_name(prec),
                 mn_last_error());
    cr_assert_eq(mn_session_get_stats(s, &after), MN_OK);
    if (after.skipped_steps == before.skipped_steps) break;
    cr_assert_lt(attempt, MAX_F16_RETRIES, "%s (%s): every step overflowed (loss scale %g)", what,
                 precision_name(prec), (double)after.loss_scale);
  }
  step_values v = {.y = malloc(ny * sizeof(float))};
  cr_assert_eq(mn_session_read_output_by_index(s, 1, v.y, ny), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < num_leaves; i++) {
    if (leaves[i].u32) continue;
    size_t n = mn_gc_leaf_numel(&leaves[i]);
    v.grad[i] = malloc(n * sizeof(float));
    cr_assert_eq(mn_session_read_grad(s, leaves[i].name, v.grad[i], n), MN_OK, "%s (%s): %s", what,
                 precision_name(prec), mn_last_error());
  }
  mn_session_free(s);
  return v;
}

static void free_values(step_values *v, int num_leaves) {
  free(v->y);
  for (int i = 0; i < num_leaves; i++)
    free(v->grad[i]);
}

static bool bitwise_equal(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The error a bound of k roundings of relative size u allows. */
static double allowed(double k, double u) { return pow(1 + u, k) - 1 + FP32_SLACK; }

/* Checks one low-precision session's values against the fp32 ones: the output is made of
 * storage-type values where the table stores it low, and the output and every F32 leaf's
 * gradient are within their bounds. Records the worst errors in res, and in *differs whether
 * any value differs from fp32 at all. */
static void compare(const char *what, mn_precision prec, const char *plan, const mn_node_info *info,
                    bool stored_low, const mn_gc_leaf *leaves, int num_leaves,
                    const step_values *ref, const step_values *low, size_t ny,
                    const mn_pc_options *opts, mn_pc_result *res, bool *differs) {
  const char *pn = precision_name(prec);
  double u = mn_precision_unit_roundoff(prec);
  bool verbose = getenv("MN_PRECISION_CHECK_VERBOSE") != NULL;
  mn_dtype storage = mn_precision_storage(prec);
  if (stored_low)
    for (size_t k = 0; k < ny; k++)
      cr_assert_eq(low->y[k], mn_storage_round(storage, low->y[k]),
                   "%s (%s, %s): output %s [%zu] = %.9g is no %s value: not rounded where stored",
                   what, pn, plan, info->op, k, (double)low->y[k], pn);
  double err = mn_test_rel_err(low->y, ref->y, ny) / u;
  if (err > res->forward) res->forward = err;
  if (differs) *differs |= !bitwise_equal(low->y, ref->y, ny);
  if (verbose)
    fprintf(stderr, "%-34s %-4s %-6s output %-16s %6.3f u (bound %g)\n", what, pn, plan, info->op,
            err, opts->forward);
  cr_assert(err * u <= allowed(opts->forward, u),
            "%s (%s, %s): output of %s: relative error %.3g = %.3f u > bound %g u", what, pn, plan,
            info->op, err * u, err, opts->forward);
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    if (l->u32) continue;
    size_t n = mn_gc_leaf_numel(l);
    err = mn_test_rel_err(low->grad[i], ref->grad[i], n) / u;
    if (differs) *differs |= !bitwise_equal(low->grad[i], ref->grad[i], n);
    if (err > res->backward) res->backward = err;
    if (verbose)
      fprintf(stderr, "%-34s %-4s %-6s grad   %-16s %6.3f u (bound %g)\n", what, pn, plan, l->name,
              err, opts->backward);
    cr_assert(err * u <= allowed(opts->backward, u),
              "%s (%s, %s): gradient of \"%s\": relative error %.3g = %.3f u > bound %g u", what,
              pn, plan, l->name, err * u, err, opts->backward);
  }
}

mn_pc_result mn_precision_check(const char *what, mn_precision prec, const mn_gc_leaf *leaves,
                                int num_leaves, mn_gc_build build, void *user,
                                const mn_pc_options *opts) {
  cr_assert(prec == MN_PRECISION_BF16 || prec == MN_PRECISION_F16, "%s: not a low precision", what);
  cr_assert(opts && opts->forward > 0 && opts->backward > 0, "%s: both bounds are required", what);
  cr_assert(num_leaves <= MAX_LEAVES);
  float r_lo = -1.0f, r_hi = 1.0f;
  if (opts->r_lo != 0 || opts->r_hi != 0) r_lo = opts->r_lo, r_hi = opts->r_hi;
  mn_rng rng = mn_rng_new(opts->seed ? opts->seed : 42);

  /* The graph of gradcheck: x = p * c with c in [0.5, 1.5], loss = sum(y * R); y is also an
   * output, so it is stored (not kept in a fused group's registers) and read back. */
  mn_node y, loss;
  leaf_data data = {0};
  mn_graph *g =
      mn_gc_graph(what, leaves, num_leaves, build, user, &rng, r_lo, r_hi, data.param, &y, &loss);
  for (int i = 0; i < num_leaves; i++) {
    const mn_gc_leaf *l = &leaves[i];
    if (!l->u32) continue;
    size_t n = mn_gc_leaf_numel(l);
    data.u32[i] = malloc(n * sizeof(uint32_t));
    for (size_t k = 0; k < n; k++)
      data.u32[i][k] = l->fixed_u32 ? l->fixed_u32[k] : (uint32_t)(mn_rng_uniform(&rng) * l->below);
  }
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK);
  size_t ny = (size_t)mn_tensor_type_numel(&info.type);
  mn_set_outputs(g, (mn_node[]){loss, y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s: loss: %s", what, mn_graph_error(g));
  /* The storage table keeps losses and single-element values fp32; any other output is
   * stored, and read back, as a value of the storage type. */
  size_t op_len = strlen(info.op);
  bool stored_low = ny > 1 && !(op_len >= 5 && strcmp(info.op + op_len - 5, "_loss") == 0);

  step_values ref = run_session(what, g, MN_PRECISION_F32, true, leaves, num_leaves, &data, ny);
  bool any_rounded = false;
  mn_pc_result res = {0};
  for (int optimized = 0; optimized <= 1; optimized++) {
    step_values low = run_session(what, g, prec, optimized, leaves, num_leaves, &data, ny);
    compare(what, prec, optimized ? "fused" : "per op", &info, stored_low, leaves, num_leaves, &ref,
            &low, ny, opts, &res, optimized ? NULL : &any_rounded);
    free_values(&low, num_leaves);
  }
  cr_assert(any_rounded,
            "%s (%s): the output and every gradient equal fp32 bit for bit: nothing was rounded",
            what, precision_name(prec));

  free_values(&ref, num_leaves);
  for (int i = 0; i < num_leaves; i++) {
    free(data.param[i]);
    free(data.u32[i]);
  }
  mn_graph_free(g);
  return res;
}

mn_graph *mn_pc_mlp(void) {
  mn_graph *g = mn_graph_new();
  mn_node x = mn_input(g, "x", MN_SHAPE(16, 8)), t = mn_input(g, "t", MN_SHAPE(16, 4));
  mn_node w1 = mn_parameter(g, "w1", MN_SHAPE(8, 32)), b1 = mn_parameter(g, "b1", MN_SHAPE(32));
  mn_node w2 = mn_parameter(g, "w2", MN_SHAPE(32, 4)), b2 = mn_parameter(g, "b2", MN_SHAPE(4));
  mn_node h = mn_relu(g, mn_bias_add(g, mn_matmul(g, x, w1), b1));
  mn_node y = mn_bias_add(g, mn_matmul(g, h, w2), b2);
  mn_set_outputs(g, (mn_node[]){mn_mse_loss(g, y, t), y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

void mn_pc_fill_mlp(mn_session *const *s, size_t n, const mn_graph *g, bool far_targets) {
  float x[16 * 8], t[16 * 4];
  mn_rng r = mn_rng_new(11);
  mn_rng_fill(&r, x, 16 * 8, -1, 1);
  mn_rng_fill(&r, t, 16 * 4, -1, 1);
  for (int i = 0; far_targets && i < 16 * 4; i++)
    t[i] = 3000.0f;
  mn_rng w = mn_rng_new(3);
  mn_test_init_normal(g, s, n, &w, 0.3f, false);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(mn_session_set_input(s[i], "x", x, 16 * 8), MN_OK);
    cr_assert_eq(mn_session_set_input(s[i], "t", t, 16 * 4), MN_OK);
  }
}
