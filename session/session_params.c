#include "session/session_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"

mn_status mn_io_params(const char *fn, const mn_session *s, mn_io_param **out, size_t *n) {
  const mn_plan *p = s->plan;
  const mn_graph *g = p->graph;
  *out = NULL;
  *n = 0;
  size_t count = p->layout.num_sources;
  for (size_t i = 0; i < g->num_nodes; i++)
    count += g->nodes[i].op == MN_OP_PARAMETER && !mn_param_is_derived(&g->nodes[i]);
  mn_io_param *params = calloc(count ? count : 1, sizeof *params);
  if (!params) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  size_t k = 0, j = 0;
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *node = &g->nodes[i];
    if (node->op != MN_OP_PARAMETER) continue;
    long slot = -1;
    /* Training plans list their slots in node order too. */
    while (j < p->num_params && p->params[j].param < (mn_node)i)
      j++;
    if (j < p->num_params && p->params[j].param == (mn_node)i && p->params[j].grad != MN_NO_NODE)
      slot = (long)j;
    size_t all = (size_t)mn_tensor_type_numel(&node->type);
    const mn_param_source *src = NULL;
    bool derived = mn_param_is_derived(node);
    size_t ns = derived ? mn_param_layout_sources_of(&p->layout, (mn_node)i, &src) : 0;
    for (size_t m = 0; m < (derived ? ns : 1); m++) {
      mn_io_param *q = &params[k++];
      q->name = ns ? src[m].name : node->name;
      q->type = ns ? &src[m].type : &node->type;
      q->numel = (size_t)mn_tensor_type_numel(q->type);
      q->buffer = p->node_buffer[i];
      q->slot = slot;
      q->frozen = mn_param_is_frozen(node);
      q->offset = ns ? src[m].offset : 0;
      q->buffer_numel = all;
    }
  }
  *out = params;
  *n = k;
  return MN_OK;
}

mn_status mn_io_param_read(mn_session *s, const mn_io_param *p, float *dst) {
  return mn_session_read_range(s, p->buffer, p->buffer_numel, p->offset, dst, p->numel);
}

mn_status mn_io_param_write(mn_session *s, const mn_io_param *p, const float *src) {
  return mn_session_write_range(s, p->buffer, p->buffer_numel, p->offset, src, p->numel);
}

mn_status mn_io_moment_read(mn_session *s, const mn_io_param *p, int which, float *dst) {
  return mn_session_read_moment_range(s, (size_t)p->slot, which, p->buffer_numel, p->offset, dst,
                                      p->numel);
}

mn_status mn_io_moment_write(mn_session *s, const mn_io_param *p, int which, const float *src) {
  return mn_session_write_moment_range(s, (size_t)p->slot, which, p->buffer_numel, p->offset, src,
                                       p->numel);
}

long mn_io_param_index(const mn_io_param *params, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(params[i].name, name) == 0) return (long)i;
  return -1;
}

size_t mn_io_params_max_numel(const mn_io_param *params, size_t n) {
  size_t m = 1;
  for (size_t i = 0; i < n; i++)
    if (params[i].numel > m) m = params[i].numel;
  return m;
}

mn_status mn_io_rewrap(mn_status st, const char *fn) {
  char inner[1024];
  snprintf(inner, sizeof inner, "%s", mn_last_error());
  return mn_fail(st, "%s: %s", fn, inner);
}

bool mn_io_same_shape(const mn_tensor_type *t, int rank, const int64_t *shape) {
  if (t->rank != rank) return false;
  for (int i = 0; i < rank; i++)
    if (t->shape[i] != shape[i]) return false;
  return true;
}

const char *mn_io_shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
  mn_tensor_type t = mn_type_make(MN_F32, shape, rank < 0 ? 0 : rank);
  return mn_shape_str(&t, buf, size);
}

void mn_io_name_list_add(mn_io_name_list *l, const char *name) {
  size_t need = strlen(name) + (l->count ? 2 : 0);
  /* Room is kept for the " ... (N more)" tail. */
  if (l->dropped || l->len + need + 32 >= sizeof l->text) {
    l->dropped++;
    return;
  }
  int w = snprintf(l->text + l->len, sizeof l->text - l->len, "%s%s", l->count ? ", " : "", name);
  if (w > 0) l->len += (size_t)w;
  l->count++;
}

const char *mn_io_name_list_str(mn_io_name_list *l) {
  l->text[l->len] = '\0';
  if (l->dropped)
    snprintf(l->text + l->len, sizeof l->text - l->len, ", ... (%zu more)", l->dropped);
  return l->text;
}

mn_status mn_io_refuse_missing(const char *fn, const char *path, unsigned flags,
                               mn_io_name_list *missing, mn_io_name_list *missing_frozen) {
  mn_io_name_list *refused = (flags & MN_LOAD_STRICT)          ? missing
                             : (flags & MN_LOAD_STRICT_FROZEN) ? missing_frozen
                                                               : NULL;
  if (!refused || (!refused->count && !refused->dropped)) return MN_OK;
  size_t nm = refused->count + refused->dropped;
  return mn_fail(MN_ERR_NOT_FOUND, "%s: %s: strict load, but %zu %s%s not in the file: %s", fn,
                 path, nm, refused == missing ? "" : "frozen ",
                 nm == 1 ? "parameter is" : "parameters are", mn_io_name_list_str(refused));
}

mn_status mn_io_load_report(const char *fn, const char *path, mn_io_name_list *skipped,
                            mn_io_name_list *missing) {
  size_t ns = skipped->count + skipped->dropped, nm = missing->count + missing->dropped;
  if (!ns && !nm) {
    mn_set_last_error("");
    return MN_OK;
  }
  char kept[1600] = "";
  if (nm)
    snprintf(kept, sizeof kept, "%s%zu %s not in the file kept %s value: %s", ns ? "; " : "", nm,
             nm == 1 ? "parameter" : "parameters", nm == 1 ? "its" : "their",
             mn_io_name_list_str(missing));
  if (!ns) return mn_fail(MN_OK, "%s: %s: %s", fn, path, kept);
  return mn_fail(MN_OK, "%s: %s: skipped %zu %s not in the graph: %s%s", fn, path, ns,
                 ns == 1 ? "tensor" : "tensors", mn_io_name_list_str(skipped), kept);
}
