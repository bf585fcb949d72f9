/* Moving named tensors in and out of a session: inputs and parameters. */
#include <stdio.h>

#include "error.h"
#include "session.h"

mn_status mn_session_find_leaf(const char *fn, mn_session *s, mn_op op, mn_dtype dt,
                               const char *name, const void *ptr, size_t n, mn_node *out) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!name) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
  if (!ptr) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: \"%s\": data is NULL", fn, name);
  const mn_graph *g = s->plan->graph;
  mn_node id = mn_graph_find_leaf(g, op, name);
  if (id == MN_NO_NODE)
    return mn_fail(MN_ERR_NOT_FOUND, "%s: no %s named \"%s\"", fn,
                   op == MN_OP_INPUT ? "input" : "parameter", name);
  const mn_tensor_type *t = &g->nodes[id].type;
  char shape[96];
  if (t->dtype != dt)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: input \"%s\" %s is %s; use %s", fn, name,
                   mn_shape_str(t, shape, sizeof shape), t->dtype == MN_U32 ? "u32" : "f32",
                   t->dtype == MN_U32 ? "mn_session_set_input_u32" : "mn_session_set_input");
  size_t numel = (size_t)mn_tensor_type_numel(t);
  if (n != numel)
    return mn_fail(MN_ERR_SHAPE, "%s: \"%s\" %s has %zu elements, n is %zu", fn, name,
                   mn_shape_str(t, shape, sizeof shape), numel, n);
  *out = id;
  return MN_OK;
}

static mn_status write_named(const char *fn, mn_session *s, mn_op op, mn_dtype dt, const char *name,
                             const void *data, size_t n) {
  mn_node id = MN_NO_NODE;
  mn_status st = mn_session_find_leaf(fn, s, op, dt, name, data, n, &id);
  if (st != MN_OK) return st;
  return s->backend->write_buffer(s, s->plan->node_buffer[id], data, n * 4);
}

mn_status mn_session_set_input(mn_session *s, const char *name, const float *data, size_t n) {
  return write_named("mn_session_set_input", s, MN_OP_INPUT, MN_F32, name, data, n);
}

mn_status mn_session_set_input_u32(mn_session *s, const char *name, const uint32_t *data,
                                   size_t n) {
  return write_named("mn_session_set_input_u32", s, MN_OP_INPUT, MN_U32, name, data, n);
}

mn_status mn_session_set_parameter(mn_session *s, const char *name, const float *data, size_t n) {
  return write_named("mn_session_set_parameter", s, MN_OP_PARAMETER, MN_F32, name, data, n);
}

mn_status mn_session_read_param(mn_session *s, const char *name, float *out, size_t n) {
  mn_node id = MN_NO_NODE;
  mn_status st =
      mn_session_find_leaf("mn_session_read_param", s, MN_OP_PARAMETER, MN_F32, name, out, n, &id);
  if (st != MN_OK) return st;
  return s->backend->read_buffer(s, s->plan->node_buffer[id], out, n * sizeof(float));
}
