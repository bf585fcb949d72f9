#include "host/param_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mn_status mn_param_layout_add(mn_param_layout *l, const char *derived, const char *name,
                              size_t offset, const mn_tensor_type *type) {
  if (l->num_sources == l->cap_sources) {
    size_t cap = l->cap_sources ? 2 * l->cap_sources : 8;
    mn_param_source *grown = realloc(l->sources, cap * sizeof *grown);
    if (!grown) return MN_ERR_OUT_OF_MEMORY;
    l->sources = grown;
    l->cap_sources = cap;
  }
  mn_param_source *s = &l->sources[l->num_sources];
  *s = (mn_param_source){.name = strdup(name),
                         .derived = strdup(derived),
                         .node = MN_NO_NODE,
                         .offset = offset,
                         .type = *type};
  if (!s->name || !s->derived) {
    free(s->name);
    free(s->derived);
    return MN_ERR_OUT_OF_MEMORY;
  }
  l->num_sources++;
  return MN_OK;
}

void mn_param_layout_clear(mn_param_layout *l) {
  for (size_t i = 0; i < l->num_sources; i++) {
    free(l->sources[i].name);
    free(l->sources[i].derived);
  }
  free(l->sources);
  *l = (mn_param_layout){0};
}

bool mn_param_layout_copy(mn_param_layout *dst, const mn_param_layout *src) {
  *dst = (mn_param_layout){0};
  for (size_t i = 0; i < src->num_sources; i++) {
    const mn_param_source *s = &src->sources[i];
    if (mn_param_layout_add(dst, s->derived, s->name, s->offset, &s->type) != MN_OK) {
      mn_param_layout_clear(dst);
      return false;
    }
    dst->sources[i].node = s->node;
  }
  return true;
}

static int by_node_then_offset(const void *a, const void *b) {
  const mn_param_source *x = a, *y = b;
  if (x->node != y->node) return x->node < y->node ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static bool valid_shape(const mn_tensor_type *t) {
  if (t->rank < 1 || t->rank > MN_MAX_RANK) return false;
  for (int k = 0; k < t->rank; k++)
    if (t->shape[k] < 1) return false;
  return true;
}

/* The sources [from, to) of derived node d tile its elements in order. */
static bool check_tiling(const mn_param_source *s, size_t from, size_t to, const mn_node_rec *d,
                         char *why, size_t why_size) {
  size_t total = (size_t)mn_tensor_type_numel(&d->type), next = 0;
  if (to - from < 2) {
    snprintf(why, why_size, "\"%.60s\" has %zu source", d->name, to - from);
    return false;
  }
  for (size_t i = from; i < to; i++) {
    if (s[i].type.dtype != d->type.dtype || !valid_shape(&s[i].type)) {
      snprintf(why, why_size, "source \"%.60s\" has a type \"%.60s\" cannot hold", s[i].name,
               d->name);
      return false;
    }
    size_t numel = (size_t)mn_tensor_type_numel(&s[i].type);
    if (s[i].offset != next || numel > total - next) {
      snprintf(why, why_size, "source \"%.60s\" is not at element %zu of \"%.60s\"", s[i].name,
               next, d->name);
      return false;
    }
    next += numel;
  }
  if (next != total) {
    snprintf(why, why_size, "the sources of \"%.60s\" fill %zu of its %zu elements", d->name, next,
             total);
    return false;
  }
  return true;
}

static bool check_names(const mn_param_layout *l, const mn_graph *g, char *why, size_t why_size) {
  for (size_t i = 0; i < l->num_sources; i++) {
    const char *name = l->sources[i].name;
    bool twice = false;
    for (size_t k = 0; k < i && !twice; k++)
      twice = strcmp(l->sources[k].name, name) == 0;
    if (!*name || twice || mn_graph_find_leaf(g, MN_OP_PARAMETER, name) != MN_NO_NODE ||
        mn_graph_find_leaf(g, MN_OP_INPUT, name) != MN_NO_NODE) {
      snprintf(why, why_size, "source \"%.60s\" is not the only tensor of its name", name);
      return false;
    }
  }
  return true;
}

bool mn_param_layout_bind(mn_param_layout *l, const mn_graph *g, char *why, size_t why_size) {
  for (size_t i = 0; i < l->num_sources; i++) {
    mn_param_source *s = &l->sources[i];
    s->node = mn_graph_find_leaf(g, MN_OP_PARAMETER, s->derived);
    if (s->node == MN_NO_NODE || !mn_param_is_derived(&g->nodes[s->node])) {
      snprintf(why, why_size, "source \"%.60s\": the graph has no derived parameter \"%.60s\"",
               s->name, s->derived);
      return false;
    }
  }
  if (l->num_sources) qsort(l->sources, l->num_sources, sizeof *l->sources, by_node_then_offset);
  size_t i = 0;
  for (mn_node d = 0; d < g->num_nodes; d++) {
    if (!mn_param_is_derived(&g->nodes[d])) continue;
    size_t from = i;
    while (i < l->num_sources && l->sources[i].node == d)
      i++;
    if (!check_tiling(l->sources, from, i, &g->nodes[d], why, why_size)) return false;
  }
  return check_names(l, g, why, why_size);
}

size_t mn_param_layout_sources_of(const mn_param_layout *l, mn_node node,
                                  const mn_param_source **first) {
  size_t n = 0;
  *first = NULL;
  for (size_t i = 0; i < l->num_sources; i++)
    if (l->sources[i].node == node) {
      if (!n) *first = &l->sources[i];
      n++;
    }
  return n;
}

const mn_param_source *mn_param_layout_find(const mn_param_layout *l, const char *name) {
  for (size_t i = 0; i < l->num_sources; i++)
    if (strcmp(l->sources[i].name, name) == 0) return &l->sources[i];
  return NULL;
}
