/* Builders for the transformer ops: SwiGLU, norms, RoPE, embedding and scatter_add. */
#include <math.h>
#include <stdint.h>

#include "host/build_util.h"

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

mn_node mn_swiglu(mn_graph *g, mn_node gate, mn_node up) {
  const char *fn = "mn_swiglu";
  mn_node ins[2] = {gate, up};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !mn_require_dtype(g, fn, "gate", gate, MN_F32) ||
      !mn_require_dtype(g, fn, "up", up, MN_F32) || !mn_require_same_shape(g, fn, gate, up))
    return MN_NO_NODE;
  return mn_graph_append(g, MN_OP_SWIGLU, ins, 2, mn_type_of(g, gate), NULL, NULL);
}

static bool check_eps(mn_graph *g, const char *fn, float eps) {
  if (isfinite(eps) && eps >= 0) return true;
  mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: eps is %g, must be finite and >= 0", fn,
                (double)eps);
  return false;
}

/* A per-feature vector of a norm (weight or bias): F32 [N] with N the last dim of x. */
static bool check_feature_vector(mn_graph *g, const char *fn, const char *what, mn_node v,
                                 mn_node x) {
  if (!mn_require_dtype(g, fn, what, v, MN_F32)) return false;
  const mn_tensor_type *tv = mn_type_of(g, v), *tx = mn_type_of(g, x);
  int64_t n = last_dim(tx);
  if (tv->rank == 1 && tv->shape[0] == n) return true;
  char dv[128], dx[128];
  mn_graph_fail(g, MN_ERR_SHAPE, "%s: %s is %s, expected [%lld] (the last dim of x %s)", fn, what,
                MN_DESC(g, v, dv), (long long)n, MN_DESC(g, x, dx));
  return false;
}

mn_node mn_rms_norm(mn_graph *g, mn_node x, mn_node weight, float eps) {
  const char *fn = "mn_rms_norm";
  mn_node ins[2] = {x, weight};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !mn_require_dtype(g, fn, "x", x, MN_F32) ||
      !mn_require_rank(g, fn, "x", x, 1, MN_MAX_RANK) ||
      !check_feature_vector(g, fn, "weight", weight, x) || !check_eps(g, fn, eps))
    return MN_NO_NODE;
  mn_op_attrs attrs = {.eps = eps};
  return mn_graph_append(g, MN_OP_RMS_NORM, ins, 2, mn_type_of(g, x), &attrs, NULL);
}

mn_node mn_layer_norm(mn_graph *g, mn_node x, mn_node weight, mn_node bias, float eps) {
  const char *fn = "mn_layer_norm";
  mn_node ins[3] = {x, weight, bias};
  if (!mn_graph_check_inputs(g, fn, ins, 3) || !mn_require_dtype(g, fn, "x", x, MN_F32) ||
      !mn_require_rank(g, fn, "x", x, 1, MN_MAX_RANK) ||
      !check_feature_vector(g, fn, "weight", weight, x) ||
      !check_feature_vector(g, fn, "bias", bias, x) || !check_eps(g, fn, eps))
    return MN_NO_NODE;
  mn_op_attrs attrs = {.eps = eps};
  return mn_graph_append(g, MN_OP_LAYER_NORM, ins, 3, mn_type_of(g, x), &attrs, NULL);
}

/* Checks shared by the RoPE builders once the inputs are known to exist. */
static bool check_rope(mn_graph *g, const char *fn, mn_node x, float theta, int head_dim) {
  if (!mn_require_dtype(g, fn, "x", x, MN_F32) || !mn_require_rank(g, fn, "x", x, 2, 3))
    return false;
  if (!(isfinite(theta) && theta > 0)) {
    mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: theta is %g, must be finite and > 0", fn,
                  (double)theta);
    return false;
  }
  if (!mn_require_positive(g, fn, "head_dim", head_dim)) return false;
  if (head_dim % 2 != 0) {
    mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: head_dim is %d, must be even", fn, head_dim);
    return false;
  }
  int64_t d = last_dim(mn_type_of(g, x));
  if (d % head_dim != 0) {
    char dx[128];
    mn_graph_fail(g, MN_ERR_SHAPE,
                  "%s: x is %s: its last dim %lld is not a multiple of head_dim %d", fn,
                  MN_DESC(g, x, dx), (long long)d, head_dim);
    return false;
  }
  return true;
}

static mn_node rope_static(mn_graph *g, const char *fn, mn_node x, float theta, int pos_offset,
                           int head_dim) {
  if (!mn_graph_check_inputs(g, fn, &x, 1) || !check_rope(g, fn, x, theta, head_dim))
    return MN_NO_NODE;
  if (pos_offset < 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: pos_offset is %d, must be >= 0", fn,
                         pos_offset);
  mn_op_attrs attrs = {.theta = theta, .head_dim = head_dim, .pos_offset = pos_offset};
  return mn_graph_append(g, MN_OP_ROPE, &x, 1, mn_type_of(g, x), &attrs, NULL);
}

mn_node mn_rope(mn_graph *g, mn_node x, float theta, int head_dim) {
  return rope_static(g, "mn_rope", x, theta, 0, head_dim);
}

mn_node mn_rope_with_offset(mn_graph *g, mn_node x, float theta, int pos_offset, int head_dim) {
  return rope_static(g, "mn_rope_with_offset", x, theta, pos_offset, head_dim);
}

mn_node mn_rope_dynamic_offset(mn_graph *g, mn_node x, float theta, mn_node offset_u32,
                               int head_dim) {
  const char *fn = "mn_rope_dynamic_offset";
  mn_node ins[2] = {x, offset_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !check_rope(g, fn, x, theta, head_dim) ||
      !mn_require_dtype(g, fn, "offset", offset_u32, MN_U32))
    return MN_NO_NODE;
  const mn_tensor_type *to = mn_type_of(g, offset_u32);
  if (to->rank != 1 || to->shape[0] != 1) {
    char d[128];
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: offset is %s, expected [1] u32", fn,
                         MN_DESC(g, offset_u32, d));
  }
  mn_op_attrs attrs = {.theta = theta, .head_dim = head_dim};
  return mn_graph_append(g, MN_OP_ROPE_DYNAMIC, ins, 2, mn_type_of(g, x), &attrs, NULL);
}

mn_node mn_rope_positions(mn_graph *g, mn_node x, float theta, mn_node positions_u32,
                          int head_dim) {
  const char *fn = "mn_rope_positions";
  mn_node ins[2] = {x, positions_u32};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !check_rope(g, fn, x, theta, head_dim) ||
      !mn_require_positions(g, fn, positions_u32, x))
    return MN_NO_NODE;
  mn_op_attrs attrs = {.theta = theta, .head_dim = head_dim};
  return mn_graph_append(g, MN_OP_ROPE_POSITIONS, ins, 2, mn_type_of(g, x), &attrs, NULL);
}

/* Index tensors leave one dim free for the row width. */
static bool check_indices(mn_graph *g, const char *fn, mn_node idx) {
  return mn_require_dtype(g, fn, "indices", idx, MN_U32) &&
         mn_require_rank(g, fn, "indices", idx, 1, MN_MAX_RANK - 1);
}

mn_node mn_embedding(mn_graph *g, mn_node indices_u32, mn_node table) {
  const char *fn = "mn_embedding";
  mn_node ins[2] = {indices_u32, table};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !check_indices(g, fn, indices_u32) ||
      !mn_require_dtype(g, fn, "table", table, MN_F32) ||
      !mn_require_rank(g, fn, "table", table, 2, 2))
    return MN_NO_NODE;
  mn_tensor_type t = *mn_type_of(g, indices_u32);
  t.dtype = MN_F32;
  t.shape[t.rank++] = mn_type_of(g, table)->shape[1];
  return mn_graph_append(g, MN_OP_EMBEDDING, ins, 2, &t, NULL, NULL);
}

mn_node mn_scatter_add(mn_graph *g, mn_node indices_u32, mn_node src, int64_t num_rows) {
  const char *fn = "mn_scatter_add";
  mn_node ins[2] = {indices_u32, src};
  if (!mn_graph_check_inputs(g, fn, ins, 2) || !check_indices(g, fn, indices_u32) ||
      !mn_require_dtype(g, fn, "src", src, MN_F32) ||
      !mn_require_positive(g, fn, "num_rows", num_rows))
    return MN_NO_NODE;
  const mn_tensor_type *ti = mn_type_of(g, indices_u32), *ts = mn_type_of(g, src);
  bool ok = ts->rank == ti->rank + 1;
  for (int i = 0; ok && i < ti->rank; i++)
    ok = ts->shape[i] == ti->shape[i];
  if (!ok) {
    char di[128], ds[128];
    return mn_graph_fail(g, MN_ERR_SHAPE,
                         "%s: src is %s, expected the shape of indices %s plus a row dim", fn,
                         MN_DESC(g, src, ds), MN_DESC(g, indices_u32, di));
  }
  int64_t d = last_dim(ts);
  if (d > 0 && num_rows > INT64_MAX / d) {
    char ds[128];
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: num_rows %lld times the row width of src %s overflows", fn,
                         (long long)num_rows, MN_DESC(g, src, ds));
  }
  mn_op_attrs attrs = {.num_rows = num_rows};
  mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){num_rows, d}, 2);
  return mn_graph_append(g, MN_OP_SCATTER_ADD, ins, 2, &t, &attrs, NULL);
}
