/* Gradient checks of the vision ops: conv2d, group_norm, concat, split_a, split_b,
 * upsample_2x, add_per_channel, and a small conv block through all of them. */
#include <stdio.h>

#include "tests/support/gradcheck.h"

/* A fixed random constant built inside the expression, so that only the other operands
 * are parameters and the rules' "is this input wanted" branches are exercised. */
static mn_node random_constant(mn_graph *g, const int64_t *shape, int rank, uint64_t seed) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  float *v = malloc(n * sizeof *v);
  mn_rng r = mn_rng_new(seed);
  mn_rng_fill(&r, v, n, -1.0f, 1.0f);
  mn_node c = mn_constant(g, v, shape, rank);
  free(v);
  return c;
}

/* ---- conv2d ---- */

enum { BOTH = 0, X_ONLY = 1, KERNEL_ONLY = 2 };

typedef struct conv_case {
  int stride, padding;
  int64_t h, w, kh, kw;
  int which; /* BOTH, X_ONLY (constant kernel) or KERNEL_ONLY (constant x) */
} conv_case;

static mn_node build_conv(mn_graph *g, const mn_node *x, void *u) {
  const conv_case *cc = u;
  int64_t xs[4] = {2, 2, cc->h, cc->w}, ks[4] = {3, 2, cc->kh, cc->kw};
  mn_node in = cc->which == KERNEL_ONLY ? random_constant(g, xs, 4, 7) : x[0];
  mn_node k = cc->which == X_ONLY        ? random_constant(g, ks, 4, 9)
              : cc->which == KERNEL_ONLY ? x[0]
                                         : x[1];
  return mn_conv2d(g, in, k, cc->stride, cc->padding);
}

static void check_conv(conv_case cc) {
  char what[96];
  snprintf(what, sizeof what, "conv2d %lldx%lld k%lldx%lld s%d p%d which %d", (long long)cc.h,
           (long long)cc.w, (long long)cc.kh, (long long)cc.kw, cc.stride, cc.padding, cc.which);
  mn_gc_leaf x = MN_GC_LEAF("x", -1, 1, 2, 2, cc.h, cc.w),
             k = MN_GC_LEAF("k", -1, 1, 3, 2, cc.kh, cc.kw);
  mn_gc_leaf both[2] = {x, k};
  if (cc.which == BOTH) mn_gradcheck(what, both, 2, build_conv, &cc, NULL);
  if (cc.which == X_ONLY) mn_gradcheck(what, &x, 1, build_conv, &cc, NULL);
  if (cc.which == KERNEL_ONLY) mn_gradcheck(what, &k, 1, build_conv, &cc, NULL);
}

Test(grad_vision, conv2d_stride1) {
  static const int64_t kernels[3][2] = {{3, 3}, {3, 2}, {1, 1}};
  for (int k = 0; k < 3; k++)
    for (int p = 0; p <= 1; p++)
      check_conv((conv_case){1, p, 5, 4, kernels[k][0], kernels[k][1], BOTH});
}

/* 5x4 at stride 2 and no padding: a 3x3 kernel never reads column 3, a 1x1 kernel never
 * reads rows 1 and 3 nor columns 1 and 3; those gradients must match the finite
 * differences' 0 (conv2d_unread_input_is_zero checks them exactly). */
Test(grad_vision, conv2d_stride2) {
  static const int64_t kernels[3][2] = {{3, 3}, {3, 2}, {1, 1}};
  for (int k = 0; k < 3; k++)
    for (int p = 0; p <= 1; p++)
      check_conv((conv_case){2, p, 5, 4, kernels[k][0], kernels[k][1], BOTH});
}

Test(grad_vision, conv2d_odd_and_unit_sizes) {
  check_conv((conv_case){1, 0, 1, 1, 1, 1, BOTH});
  check_conv((conv_case){1, 1, 1, 3, 3, 3, BOTH});
  check_conv((conv_case){2, 1, 7, 1, 3, 1, BOTH});
  check_conv((conv_case){3, 0, 7, 5, 2, 2, BOTH});
}

Test(grad_vision, conv2d_one_operand_wanted) {
  check_conv((conv_case){2, 1, 5, 4, 3, 3, X_ONLY});
  check_conv((conv_case){2, 1, 5, 4, 3, 3, KERNEL_ONLY});
}

/* 5x4 at stride 2 without padding: no window reads column 3, so its gradient must be
 * exactly 0 (the kernel has to write it), while every other element has a nonzero one. */
Test(grad_vision, conv2d_unread_input_is_zero) {
  int64_t xs[4] = {2, 2, 5, 4}, ks[4] = {3, 2, 3, 3};
  mn_graph *g = mn_graph_new();
  mn_node xp = mn_parameter(g, "x", xs, 4), kp = mn_parameter(g, "k", ks, 4);
  mn_node loss = mn_sum_all(g, mn_conv2d(g, xp, kp, 2, 0));
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &so, &s), MN_OK, "%s", mn_last_error());
  float xv[80], kv[54], dx[80];
  mn_rng r = mn_rng_new(3);
  mn_rng_fill(&r, xv, 80, -1, 1);
  mn_rng_fill(&r, kv, 54, -1, 1);
  cr_assert_eq(mn_session_set_parameter(s, "x", xv, 80), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_set_parameter(s, "k", kv, 54), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_read_grad(s, "x", dx, 80), MN_OK, "%s", mn_last_error());
  for (int i = 0; i < 80; i++) {
    bool unread = i % 4 == 3;
    if (unread)
      cr_assert_eq(dx[i], 0.0f, "dx[%d] = %g, column 3 is read by no window", i, (double)dx[i]);
    else
      cr_assert_neq(dx[i], 0.0f, "dx[%d] is 0 but a window reads it", i);
  }
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---- group_norm ---- */

typedef struct gn_case {
  int groups;
  int which; /* BOTH: x, w, b all parameters; X_ONLY: constant w and b */
} gn_case;

static mn_node build_group_norm(mn_graph *g, const mn_node *x, void *u) {
  const gn_case *gc = u;
  if (gc->which == X_ONLY) {
    mn_node_info info;
    mn_graph_node(g, x[0], &info);
    int64_t cs[1] = {info.type.shape[1]};
    return mn_group_norm(g, x[0], random_constant(g, cs, 1, 5), random_constant(g, cs, 1, 6),
                         gc->groups, 1e-5f);
  }
  return mn_group_norm(g, x[0], x[1], x[2], gc->groups, 1e-5f);
}

static void check_group_norm(int64_t n, int64_t ch, int64_t h, int64_t w, gn_case gc) {
  char what[96];
  snprintf(what, sizeof what, "group_norm [%lld,%lld,%lld,%lld] groups %d which %d", (long long)n,
           (long long)ch, (long long)h, (long long)w, gc.groups, gc.which);
  mn_gc_leaf l[3] = {MN_GC_LEAF("x", -1, 1, n, ch, h, w), MN_GC_LEAF("w", 0.5f, 1.5f, ch),
                     MN_GC_LEAF("b", -1, 1, ch)};
  mn_gradcheck(what, l, gc.which == X_ONLY ? 1 : 3, build_group_norm, &gc, NULL);
}

Test(grad_vision, group_norm) {
  for (int groups = 1; groups <= 2; groups++) {
    check_group_norm(2, 4, 3, 5, (gn_case){groups, BOTH});
    check_group_norm(1, 2, 5, 3, (gn_case){groups, BOTH});
    check_group_norm(2, 4, 1, 3, (gn_case){groups, BOTH});
  }
  check_group_norm(2, 6, 2, 3, (gn_case){3, BOTH});
  check_group_norm(2, 4, 3, 3, (gn_case){2, X_ONLY});
}

/* ---- channel ops ---- */

static mn_node build_concat(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_concat(g, x[0], x[1]);
}
Test(grad_vision, concat) {
  mn_gc_leaf l1[] = {MN_GC_LEAF("a", -1, 1, 2, 3, 3, 2), MN_GC_LEAF("b", -1, 1, 2, 2, 3, 2)};
  mn_gradcheck("concat", l1, 2, build_concat, NULL, NULL);
  mn_gc_leaf l2[] = {MN_GC_LEAF("a", -1, 1, 1, 1, 1, 5), MN_GC_LEAF("b", -1, 1, 1, 4, 1, 5)};
  mn_gradcheck("concat unit dims", l2, 2, build_concat, NULL, NULL);
}

/* concat(x, x): both halves of the gradient land on the same input. */
static mn_node build_concat_self(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_concat(g, x[0], x[0]);
}
Test(grad_vision, concat_same_input_twice) {
  mn_gc_leaf l[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 2, 3)};
  mn_gradcheck("concat(x, x)", l, 1, build_concat_self, NULL, NULL);
}

static mn_node build_split_a(mn_graph *g, const mn_node *x, void *u) {
  return mn_split_a(g, x[0], *(const int *)u);
}
static mn_node build_split_b(mn_graph *g, const mn_node *x, void *u) {
  return mn_split_b(g, x[0], *(const int *)u);
}
Test(grad_vision, split) {
  mn_gc_leaf l5[] = {MN_GC_LEAF("x", -1, 1, 2, 5, 3, 2)};
  mn_gc_leaf l2[] = {MN_GC_LEAF("x", -1, 1, 1, 2, 1, 1)};
  for (int ca = 1; ca <= 4; ca++) {
    mn_gradcheck("split_a", l5, 1, build_split_a, &ca, NULL);
    mn_gradcheck("split_b", l5, 1, build_split_b, &ca, NULL);
  }
  int one = 1;
  mn_gradcheck("split_a unit dims", l2, 1, build_split_a, &one, NULL);
  mn_gradcheck("split_b unit dims", l2, 1, build_split_b, &one, NULL);
}

/* Both halves of one split used: their gradients must add up on x. */
static mn_node build_split_both(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node a = mn_split_a(g, x[0], 2), b = mn_split_b(g, x[0], 2);
  return mn_concat(g, mn_silu(g, b), mn_scale(g, a, 3.0f));
}
Test(grad_vision, split_both_halves) {
  mn_gc_leaf l[] = {MN_GC_LEAF("x", -1, 1, 2, 5, 3, 3)};
  mn_gradcheck("split_a + split_b", l, 1, build_split_both, NULL, NULL);
}

static mn_node build_upsample(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_upsample_2x(g, x[0]);
}
Test(grad_vision, upsample_2x) {
  mn_gc_leaf l1[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 3, 2)};
  mn_gradcheck("upsample_2x", l1, 1, build_upsample, NULL, NULL);
  mn_gc_leaf l2[] = {MN_GC_LEAF("x", -1, 1, 1, 1, 1, 1)};
  mn_gradcheck("upsample_2x unit", l2, 1, build_upsample, NULL, NULL);
  mn_gc_leaf l3[] = {MN_GC_LEAF("x", -1, 1, 1, 2, 1, 5)};
  mn_gradcheck("upsample_2x 1x5", l3, 1, build_upsample, NULL, NULL);
}

static mn_node build_add_per_channel(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  return mn_add_per_channel(g, x[0], x[1]);
}
Test(grad_vision, add_per_channel) {
  mn_gc_leaf l1[] = {MN_GC_LEAF("x", -1, 1, 2, 3, 3, 5), MN_GC_LEAF("b", -1, 1, 3)};
  mn_gradcheck("add_per_channel", l1, 2, build_add_per_channel, NULL, NULL);
  mn_gc_leaf l2[] = {MN_GC_LEAF("x", -1, 1, 1, 1, 1, 1), MN_GC_LEAF("b", -1, 1, 1)};
  mn_gradcheck("add_per_channel unit", l2, 2, build_add_per_channel, NULL, NULL);
  mn_gc_leaf l3[] = {MN_GC_LEAF("x", -1, 1, 3, 2, 1, 4), MN_GC_LEAF("b", -1, 1, 2)};
  mn_gradcheck("add_per_channel H=1", l3, 2, build_add_per_channel, NULL, NULL);
}

/* ---- a decoder-style block ---- */

/* conv -> group_norm -> silu -> upsample -> +bias -> concat with a skip -> strided conv:
 * every gradient of the block passes through each rule of this area at least once. */
static mn_node build_block(mn_graph *g, const mn_node *x, void *u) {
  (void)u;
  mn_node h = mn_conv2d(g, x[0], x[1], 1, 1);
  h = mn_group_norm(g, h, x[2], x[3], 2, 1e-5f);
  h = mn_silu(g, h);
  h = mn_add_per_channel(g, mn_upsample_2x(g, h), x[5]);
  h = mn_concat(g, h, x[4]);
  return mn_conv2d(g, h, x[6], 2, 1);
}
Test(grad_vision, conv_block) {
  mn_gc_leaf l[] = {
      MN_GC_LEAF("x", -1, 1, 2, 2, 5, 3),        MN_GC_LEAF("k1", -0.5f, 0.5f, 4, 2, 3, 3),
      MN_GC_LEAF("gn_w", 0.5f, 1.5f, 4),         MN_GC_LEAF("gn_b", -1, 1, 4),
      MN_GC_LEAF("skip", -1, 1, 2, 3, 10, 6),    MN_GC_LEAF("bias", -1, 1, 4),
      MN_GC_LEAF("k2", -0.5f, 0.5f, 2, 7, 3, 2),
  };
  mn_gc_options o = {.max_probes = 24};
  mn_gradcheck("conv block", l, 7, build_block, NULL, &o);
}
