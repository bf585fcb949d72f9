/* Sibling matmuls: products matmul_bt(x, W_i) of one x with nn.Linear weights W_i [out_i, in]
 * (Llama's q, k and v projections; its MLP gate and up) become one product with a derived
 * parameter P [sum of out_i, in], whose rows are the W_i stacked, and one slice_last of the
 * result per W_i. Only matmul_bt is grouped: it is the layout of every nn.Linear weight the
 * models load (GPT-2's Conv1D weights already come concatenated, as c_attn).
 *
 * A pass of its own, not an e-graph rule: it replaces parameters, which the e-graph keeps
 * with their identity. It runs on the forward graph after the optimization (of the forward
 * stage in training, before autodiff, so the backward of the concatenated form comes from
 * autodiff: slice_last_grad, add). Products the rules gave an epilogue are left alone.
 *
 * A source W_i joins a group only when nothing else reads it (tied weights stay apart), it is
 * no graph output, its product is no graph output, and (training) the unoptimized graph gives
 * it a gradient, so that the optimizer updates exactly the parameters it updated before. A
 * group is formed when the cost model (cost.h) prices the concatenated form, with the backward
 * it implies in training, below the separate products; docs/optimizer-siblings.md says where
 * that holds.
 *
 * P is a PARAMETER node marked with attrs.variant = MN_PARAM_DERIVED, named
 * "#siblings(<len>:<source name>/<rows>,...)": the name alone says which rows of P hold
 * which source, so every plan (built, or read from a plan cache) carries its own table, and
 * sessions map the source names onto byte ranges of P's buffer. */
#ifndef MN_OPTIMIZER_SIBLINGS_H
#define MN_OPTIMIZER_SIBLINGS_H

#include <stdbool.h>

#include "host/graph.h"

#define MN_SIBLINGS_PREFIX "#siblings("
/* attrs.variant of a derived parameter; the builders leave a parameter's attrs zero. */
#define MN_PARAM_DERIVED 1
/* Sources per group: a bound on the work of decoding a name read from a cache file. */
#define MN_SIBLINGS_MAX_GROUP 64

typedef enum mn_siblings_mode {
  MN_SIBLINGS_AUTO,   /* groups that the cost model prices cheaper */
  MN_SIBLINGS_ALWAYS, /* every group the rules allow */
  MN_SIBLINGS_NEVER,
} mn_siblings_mode;

/* Process-wide switch, AUTO by default, for tests and benchmarks; it is not part of the plan
 * cache key. Not for concurrent use with session builds. */
void mn_siblings_set_mode(mn_siblings_mode mode);
mn_siblings_mode mn_siblings_get_mode(void);

/* The cost model's two prices of one group, in cost.h bytes. */
typedef struct mn_siblings_price {
  double separate, concat;
} mn_siblings_price;

/* Prices products of x (type x, leading dims flattened into M) with n weights of rows[i] x
 * in (in: x's last dim). With backward, the gradient ops autodiff builds for each form are
 * added: the weights' always, x's when x_grad. */
mn_siblings_price mn_siblings_price_group(const mn_tensor_type *x, const int64_t *rows, size_t n,
                                          bool backward, bool x_grad);

/* Replaces *g (topological; freeing the old graph) with every group concatenated; *groups
 * (may be NULL) counts them. training: the graph is a forward graph that autodiff
 * differentiates next (the backward is priced, and sources need a gradient). With
 * o->optimize false or the mode NEVER it changes nothing. On failure *g is unchanged. */
mn_status mn_siblings_concat(const char *fn, mn_graph **g, const mn_session_options *o,
                             bool training, size_t *groups);

/* A derived parameter of the pass (by its marker; its name is checked by decoding). */
static inline bool mn_siblings_is_derived(const mn_node_rec *n) {
  return n->op == MN_OP_PARAMETER && n->attrs.variant == MN_PARAM_DERIVED;
}

/* One source of a derived parameter, as its name spells it. */
typedef struct mn_sibling_source {
  const char *name; /* into the decoded string; not NUL-terminated */
  size_t len;
  int64_t rows;
} mn_sibling_source;

/* Decodes a derived parameter's name into at most MN_SIBLINGS_MAX_GROUP sources (out holds
 * that many), in row order. False, with a reason in why, for a name the pass would not
 * write: no prefix, a malformed or empty entry, fewer than two sources, trailing text. */
bool mn_siblings_decode(const char *name, mn_sibling_source *out, size_t *n, char *why,
                        size_t why_size);

#endif
