/* Moving named tensors in and out of a session: inputs and parameters, the latter by the
 * names users gave them even where the optimizer concatenated several into one derived
 * parameter (the plan's table of them, host/param_layout.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "session/session.h"

mn_status mn_session_find_param(const char *fn, mn_session *s, const char *name, const void *ptr,
                                size_t n, mn_param_view *out) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!name) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
  const mn_param_source *src = mn_param_layout_find(&s->plan->layout, name);
  if (!src) {
    mn_node id = MN_NO_NODE;
    mn_status st = mn_session_find_leaf(fn, s, MN_OP_PARAMETER, MN_F32, name, ptr, n, &id);
    if (st != MN_OK) return st;
    const mn_node_rec *r = &s->plan->graph->nodes[id];
    *out = (mn_param_view){.name = r->name, .type = &r->type, .numel = n, .node = id};
    return MN_OK;
  }
  if (!ptr) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: \"%s\": data is NULL", fn, name);
  size_t numel = (size_t)mn_tensor_type_numel(&src->type);
  char shape[96];
  if (n != numel)
    return mn_fail(MN_ERR_SHAPE, "%s: \"%s\" %s has %zu elements, n is %zu", fn, name,
                   mn_shape_str(&src->type, shape, sizeof shape), numel, n);
  *out = (mn_param_view){
      .name = src->name, .type = &src->type, .numel = n, .node = src->node, .offset = src->offset};
  return MN_OK;
}

mn_status mn_session_read_range(mn_session *s, uint32_t buffer, size_t buffer_numel, size_t offset,
                                float *dst, size_t n) {
  if (offset == 0 && n == buffer_numel)
    return s->backend->read_buffer(s, buffer, dst, n * sizeof *dst);
  float *all = malloc(buffer_numel * sizeof *all);
  if (!all) return mn_fail(MN_ERR_OUT_OF_MEMORY, "out of memory staging %zu floats", buffer_numel);
  mn_status st = s->backend->read_buffer(s, buffer, all, buffer_numel * sizeof *all);
  if (st == MN_OK) memcpy(dst, all + offset, n * sizeof *dst);
  free(all);
  return st;
}

mn_status mn_session_write_range(mn_session *s, uint32_t buffer, size_t buffer_numel, size_t offset,
                                 const float *src, size_t n) {
  if (offset == 0 && n == buffer_numel)
    return s->backend->write_buffer(s, buffer, src, n * sizeof *src);
  float *all = malloc(buffer_numel * sizeof *all);
  if (!all) return mn_fail(MN_ERR_OUT_OF_MEMORY, "out of memory staging %zu floats", buffer_numel);
  mn_status st = s->backend->read_buffer(s, buffer, all, buffer_numel * sizeof *all);
  if (st == MN_OK) {
    memcpy(all + offset, src, n * sizeof *src);
    st = s->backend->write_buffer(s, buffer, all, buffer_numel * sizeof *all);
  }
  free(all);
  return st;
}

mn_status mn_session_read_moment_range(mn_session *s, size_t slot, int which, size_t slot_numel,
                                       size_t offset, float *dst, size_t n) {
  if (offset == 0 && n == slot_numel) return s->backend->read_optim_state(s, slot, which, dst, n);
  float *all = malloc(slot_numel * sizeof *all);
  if (!all) return mn_fail(MN_ERR_OUT_OF_MEMORY, "out of memory staging %zu floats", slot_numel);
  mn_status st = s->backend->read_optim_state(s, slot, which, all, slot_numel);
  if (st == MN_OK) memcpy(dst, all + offset, n * sizeof *dst);
  free(all);
  return st;
}

mn_status mn_session_write_moment_range(mn_session *s, size_t slot, int which, size_t slot_numel,
                                        size_t offset, const float *src, size_t n) {
  if (offset == 0 && n == slot_numel) return s->backend->write_optim_state(s, slot, which, src, n);
  float *all = malloc(slot_numel * sizeof *all);
  if (!all) return mn_fail(MN_ERR_OUT_OF_MEMORY, "out of memory staging %zu floats", slot_numel);
  mn_status st = s->backend->read_optim_state(s, slot, which, all, slot_numel);
  if (st == MN_OK) {
    memcpy(all + offset, src, n * sizeof *src);
    st = s->backend->write_optim_state(s, slot, which, all, slot_numel);
  }
  free(all);
  return st;
}

mn_status mn_session_find_leaf(const char *fn, mn_session *s, mn_op op, mn_dtype dt,
                               const char *name, const void *ptr, size_t n, mn_node *out) {
  if (!s) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
  if (!name) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
  if (!ptr) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: \"%s\": data is NULL", fn, name);
  const mn_graph *g = s->plan->graph;
  mn_node id = mn_graph_find_leaf(g, op, name);
  if (id != MN_NO_NODE && mn_param_is_derived(&g->nodes[id])) id = MN_NO_NODE;
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

static size_t numel_of(const mn_session *s, mn_node id) {
  return (size_t)mn_tensor_type_numel(&s->plan->graph->nodes[id].type);
}

mn_status mn_session_set_parameter(mn_session *s, const char *name, const float *data, size_t n) {
  mn_param_view v = {0};
  mn_status st = mn_session_find_param("mn_session_set_parameter", s, name, data, n, &v);
  if (st != MN_OK) return st;
  return mn_session_write_range(s, s->plan->node_buffer[v.node], numel_of(s, v.node), v.offset,
                                data, n);
}

mn_status mn_session_read_param(mn_session *s, const char *name, float *out, size_t n) {
  mn_param_view v = {0};
  mn_status st = mn_session_find_param("mn_session_read_param", s, name, out, n, &v);
  if (st != MN_OK) return st;
  return mn_session_read_range(s, s->plan->node_buffer[v.node], numel_of(s, v.node), v.offset, out,
                               n);
}
