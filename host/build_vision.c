/* Builders for 4-D NCHW vision ops. Every size comes from the input shapes; the only
 * integer arguments are the op's own hyper-parameters (stride, padding, groups, split). */
#include <math.h>

#include "host/build_util.h"

/* Same bound as leaves: results of conv2d and upsample_2x may grow past their inputs, and
 * their byte counts must still fit size_t. */
#define MN_VISION_MAX_NUMEL ((int64_t)1 << 40)

static bool require_nchw(mn_graph *g, const char *fn, const char *what, mn_node x) {
  return mn_require_dtype(g, fn, what, x, MN_F32) && mn_require_rank(g, fn, what, x, 4, 4);
}

/* A [C] vector matching the channels of x (weight, bias of group_norm, add_per_channel). */
static bool require_channel_vector(mn_graph *g, const char *fn, const char *what, mn_node v,
                                   mn_node x) {
  if (!mn_require_dtype(g, fn, what, v, MN_F32)) return false;
  const mn_tensor_type *tv = mn_type_of(g, v), *tx = mn_type_of(g, x);
  if (tv->rank == 1 && tv->shape[0] == tx->shape[1]) return true;
  char dv[128], dx[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected [%lld] (the channels of x %s)", fn, what,
                MN_DESC(g, v, dv), (long long)tx->shape[1], MN_DESC(g, x, dx));
  return false;
}

static bool check_numel(mn_graph *g, const char *fn, const mn_tensor_type *t) {
  int64_t numel = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->shape[i] > MN_VISION_MAX_NUMEL / numel) {
      char s[96];
      mn_graph_fail(g, MN_ERR_SHAPE, "%s: result %s would have more than %lld elements", fn,
                    mn_shape_str(t, s, sizeof s), (long long)MN_VISION_MAX_NUMEL);
      return false;
    }
    numel *= t->shape[i];
  }
  return true;
}

mn_node mn_conv2d(mn_graph *g, mn_node x, mn_node kernel, int stride, int padding) {
  const char *fn = "mn_conv2d";
  mn_node ins[2] = {x, kernel};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !require_nchw(g, fn, "x", x) ||
      !require_nchw(g, fn, "kernel", kernel))
    return MN_NO_NODE;
  const mn_tensor_type *tx = mn_type_of(g, x), *tk = mn_type_of(g, kernel);
  char dx[128], dk[128];
  if (tk->shape[1] != tx->shape[1])
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: x %s has %lld channels but kernel %s expects %lld (kernel is "
                         "[Co,Ci,kh,kw])",
                         fn, MN_DESC(g, x, dx), (long long)tx->shape[1], MN_DESC(g, kernel, dk),
                         (long long)tk->shape[1]);
  if (stride < 1)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: stride is %d, must be >= 1", fn, stride);
  if (padding < 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: padding is %d, must be >= 0", fn,
                         padding);
  int64_t padded[2] = {tx->shape[2] + 2 * (int64_t)padding, tx->shape[3] + 2 * (int64_t)padding};
  static const char *const axis[2] = {"height", "width"};
  for (int i = 0; i < 2; i++)
    if (padded[i] < tk->shape[2 + i])
      return mn_graph_fail(g, MN_ERR_SHAPE,
                           "%s: padded %s %lld of x %s (padding %d) is smaller than kernel %s's "
                           "%lld",
                           fn, axis[i], (long long)padded[i], MN_DESC(g, x, dx), padding,
                           MN_DESC(g, kernel, dk), (long long)tk->shape[2 + i]);
  int64_t shape[4] = {tx->shape[0], tk->shape[0], (padded[0] - tk->shape[2]) / stride + 1,
                      (padded[1] - tk->shape[3]) / stride + 1};
  mn_tensor_type t = mn_type_make(MN_F32, shape, 4);
  if (!check_numel(g, fn, &t)) return MN_NO_NODE;
  mn_op_attrs attrs = {.stride = stride, .padding = padding};
  return mn_graph_append(g, MN_OP_CONV2D, ins, 2, &t, &attrs, NULL);
}

mn_node mn_group_norm(mn_graph *g, mn_node x, mn_node weight, mn_node bias, int groups, float eps) {
  const char *fn = "mn_group_norm";
  mn_node ins[3] = {x, weight, bias};
  if (!mn_graph_check_inputs(g, fn, ins, 3) || !require_nchw(g, fn, "x", x) ||
      !require_channel_vector(g, fn, "weight", weight, x) ||
      !require_channel_vector(g, fn, "bias", bias, x))
    return MN_NO_NODE;
  const mn_tensor_type *tx = mn_type_of(g, x);
  if (groups < 1)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: groups is %d, must be >= 1", fn, groups);
  if (tx->shape[1] % groups != 0) {
    char dx[128];
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: groups %d does not divide the %lld channels of x %s", fn, groups,
                         (long long)tx->shape[1], MN_DESC(g, x, dx));
  }
  if (!isfinite(eps) || eps < 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: eps is %g, must be finite and >= 0", fn,
                         (double)eps);
  mn_op_attrs attrs = {.groups = groups, .eps = eps};
  return mn_graph_append(g, MN_OP_GROUP_NORM, ins, 3, tx, &attrs, NULL);
}

mn_node mn_concat(mn_graph *g, mn_node a, mn_node b) {
  const char *fn = "mn_concat";
  mn_node ins[2] = {a, b};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !require_nchw(g, fn, "a", a) ||
      !require_nchw(g, fn, "b", b))
    return MN_NO_NODE;
  const mn_tensor_type *ta = mn_type_of(g, a), *tb = mn_type_of(g, b);
  if (ta->shape[0] != tb->shape[0] || ta->shape[2] != tb->shape[2] ||
      ta->shape[3] != tb->shape[3]) {
    char da[128], db[128];
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: %s and %s: batch, height and width must be equal (only channels may "
                         "differ)",
                         fn, MN_DESC(g, a, da), MN_DESC(g, b, db));
  }
  mn_tensor_type t = *ta;
  t.shape[1] = ta->shape[1] + tb->shape[1];
  return mn_graph_append(g, MN_OP_CONCAT, ins, 2, &t, NULL, NULL);
}

static mn_node split(mn_graph *g, const char *fn, mn_op op, mn_node x, int channels_a) {
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !require_nchw(g, fn, "x", x)) return MN_NO_NODE;
  const mn_tensor_type *tx = mn_type_of(g, x);
  if (channels_a < 1 || channels_a >= tx->shape[1]) {
    char dx[128];
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: channels_a is %d, must be in 1..%lld (x %s has %lld channels)", fn,
                         channels_a, (long long)tx->shape[1] - 1, MN_DESC(g, x, dx),
                         (long long)tx->shape[1]);
  }
  mn_tensor_type t = *tx;
  t.shape[1] = op == MN_OP_SPLIT_A ? channels_a : tx->shape[1] - channels_a;
  mn_op_attrs attrs = {.channels_a = channels_a};
  return mn_graph_append(g, op, &x, 1, &t, &attrs, NULL);
}

mn_node mn_split_a(mn_graph *g, mn_node x, int channels_a) {
  return split(g, "mn_split_a", MN_OP_SPLIT_A, x, channels_a);
}
mn_node mn_split_b(mn_graph *g, mn_node x, int channels_a) {
  return split(g, "mn_split_b", MN_OP_SPLIT_B, x, channels_a);
}

mn_node mn_upsample_2x(mn_graph *g, mn_node x) {
  const char *fn = "mn_upsample_2x";
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !require_nchw(g, fn, "x", x)) return MN_NO_NODE;
  mn_tensor_type t = *mn_type_of(g, x);
  t.shape[2] *= 2;
  t.shape[3] *= 2;
  if (!check_numel(g, fn, &t)) return MN_NO_NODE;
  return mn_graph_append(g, MN_OP_UPSAMPLE_2X, &x, 1, &t, NULL, NULL);
}

mn_node mn_add_per_channel(mn_graph *g, mn_node x, mn_node bias) {
  const char *fn = "mn_add_per_channel";
  mn_node ins[2] = {x, bias};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !require_nchw(g, fn, "x", x) ||
      !require_channel_vector(g, fn, "bias", bias, x))
    return MN_NO_NODE;
  return mn_graph_append(g, MN_OP_ADD_PER_CHANNEL, ins, 2, mn_type_of(g, x), NULL, NULL);
}
