/* Derived parameters: a PARAMETER node that the optimizer made out of several of the user's
 * parameters (optimizer/siblings.h stacks sibling matmul weights into one), and the table that
 * says where each of the user's parameters lies in it.
 *
 * The table is plain data that travels beside the graph: the pass that makes a derived
 * parameter fills it, the build pipeline hands it to mn_plan_build, which binds it to the
 * plan's graph (plan.h), and the plan cache writes and reads it as fields of its own. Sessions
 * expose the user's parameters through it. A derived parameter's name is for reports, and for
 * the table to find its node; nothing reads meaning into it. */
#ifndef MN_HOST_PARAM_LAYOUT_H
#define MN_HOST_PARAM_LAYOUT_H

#include <stdbool.h>

#include "host/graph.h"

/* attrs.variant of a derived parameter; the builders leave a parameter's attrs zero. */
#define MN_PARAM_DERIVED 1

static inline bool mn_param_is_derived(const mn_node_rec *n) {
  return n->op == MN_OP_PARAMETER && n->attrs.variant == MN_PARAM_DERIVED;
}

/* One of the user's parameters inside a derived one: elements [offset, offset + numel(type))
 * of the derived tensor, and of its gradient and optimizer moments. */
typedef struct mn_param_source {
  char *name;          /* the user's parameter; owned */
  char *derived;       /* the name of the derived parameter node that holds it; owned */
  mn_node node;        /* that node once the table is bound to a graph, else MN_NO_NODE */
  size_t offset;       /* first element within the derived tensor */
  mn_tensor_type type; /* the source's own type */
} mn_param_source;

typedef struct mn_param_layout {
  mn_param_source *sources; /* bound: in node order, each node's in element order */
  size_t num_sources, cap_sources;
} mn_param_layout;

/* Appends a source (names copied, node MN_NO_NODE); MN_ERR_OUT_OF_MEMORY on failure. */
mn_status mn_param_layout_add(mn_param_layout *l, const char *derived, const char *name,
                              size_t offset, const mn_tensor_type *type);
/* Frees what l holds and leaves it empty. */
void mn_param_layout_clear(mn_param_layout *l);
/* dst (empty) becomes a deep copy of src; false (dst empty) when out of memory. */
bool mn_param_layout_copy(mn_param_layout *dst, const mn_param_layout *src);

/* Binds l to graph g: each source's node is set and the sources are put in node and element
 * order. True when the table describes g: every source's derived name is a derived parameter
 * of g; the sources of each derived parameter (two or more; every derived parameter has them)
 * have its dtype, a valid shape, and tile its elements in order from 0 to its end; and no
 * source's name is empty, a leaf of g, or another source's. Otherwise false, with a reason in
 * why. */
bool mn_param_layout_bind(mn_param_layout *l, const mn_graph *g, char *why, size_t why_size);

/* In a bound table: the sources of node (their count; *first the first of them, or NULL). */
size_t mn_param_layout_sources_of(const mn_param_layout *l, mn_node node,
                                  const mn_param_source **first);
/* The source the user calls `name`, or NULL. */
const mn_param_source *mn_param_layout_find(const mn_param_layout *l, const char *name);

#endif
