/* Leaf builders: inputs, parameters, constants. */
#include <stdlib.h>
#include <string.h>

#include "host/build_util.h"
#include "host/error.h"

/* Elements of a leaf may not exceed this, so byte counts never overflow size_t. */
#define MN_MAX_NUMEL ((int64_t)1 << 40)

static bool check_shape(mn_graph *g, const char *fn, const char *name, const int64_t *shape,
                        int rank) {
  const char *who = name ? name : "(constant)";
  if (!shape && rank != 0)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: \"%s\": shape is NULL", fn, who), false;
  if (rank < 1 || rank > MN_MAX_RANK)
    return mn_graph_fail(g, MN_ERR_SHAPE, "%s: \"%s\": rank %d, must be 1 to %d", fn, who, rank,
                         MN_MAX_RANK),
           false;
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 1)
      return mn_graph_fail(g, MN_ERR_SHAPE, "%s: \"%s\": dimension %d is %lld, must be >= 1", fn,
                           who, i, (long long)shape[i]),
             false;
    if (shape[i] > MN_MAX_NUMEL / numel)
      return mn_graph_fail(g, MN_ERR_SHAPE, "%s: \"%s\": more than %lld elements", fn, who,
                           (long long)MN_MAX_NUMEL),
             false;
    numel *= shape[i];
  }
  return true;
}

static mn_node named_leaf(mn_graph *g, const char *fn, mn_op op, mn_dtype dt, const char *name,
                          const int64_t *shape, int rank) {
  if (!mn_graph_check_inputs(g, fn, NULL, 0)) return MN_NO_NODE;
  if (!name || !*name)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: name is %s", fn, name ? "empty" : "NULL");
  /* The library names its own leaves (the loss scale, derived parameters) with a leading '#'. */
  if (name[0] == '#')
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: name \"%s\" starts with '#', which the library keeps for its own "
                         "leaves",
                         fn, name);
  if (!check_shape(g, fn, name, shape, rank)) return MN_NO_NODE;
  mn_node prior = mn_graph_find_leaf(g, MN_OP_INPUT, name);
  if (prior == MN_NO_NODE) prior = mn_graph_find_leaf(g, MN_OP_PARAMETER, name);
  if (prior != MN_NO_NODE)
    return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT,
                         "%s: name \"%s\" is already used by node %u (%s)", fn, name, prior,
                         mn_op_name(g->nodes[prior].op));
  mn_tensor_type t = mn_type_make(dt, shape, rank);
  return mn_graph_append(g, op, NULL, 0, &t, NULL, name);
}

mn_node mn_input(mn_graph *g, const char *name, const int64_t *shape, int rank) {
  return named_leaf(g, "mn_input", MN_OP_INPUT, MN_F32, name, shape, rank);
}

mn_node mn_input_u32(mn_graph *g, const char *name, const int64_t *shape, int rank) {
  return named_leaf(g, "mn_input_u32", MN_OP_INPUT, MN_U32, name, shape, rank);
}

mn_node mn_parameter(mn_graph *g, const char *name, const int64_t *shape, int rank) {
  return named_leaf(g, "mn_parameter", MN_OP_PARAMETER, MN_F32, name, shape, rank);
}

mn_node mn_constant(mn_graph *g, const float *data, const int64_t *shape, int rank) {
  const char *fn = "mn_constant";
  if (!mn_graph_check_inputs(g, fn, NULL, 0)) return MN_NO_NODE;
  if (!data) return mn_graph_fail(g, MN_ERR_INVALID_ARGUMENT, "%s: data is NULL", fn);
  if (!check_shape(g, fn, NULL, shape, rank)) return MN_NO_NODE;
  mn_tensor_type t = mn_type_make(MN_F32, shape, rank);
  size_t bytes = (size_t)mn_tensor_type_numel(&t) * sizeof(float);
  float *copy = malloc(bytes);
  if (!copy)
    return mn_graph_fail(g, MN_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes)", fn, bytes);
  memcpy(copy, data, bytes);
  mn_node id = mn_graph_append(g, MN_OP_CONSTANT, NULL, 0, &t, NULL, NULL);
  if (id == MN_NO_NODE) {
    free(copy);
    return MN_NO_NODE;
  }
  g->nodes[id].data = copy;
  return id;
}

mn_node mn_scalar(mn_graph *g, float value) { return mn_constant(g, &value, MN_SHAPE(1)); }
