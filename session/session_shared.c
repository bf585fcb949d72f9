/* Inference sessions that read a training session's parameters in place: an evaluation or a
 * sampler that always sees the current weights, with no copy and no re-capture per use. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/error.h"
#include "session/session.h"

mn_status mn_session_share_parameters(const char *fn, mn_session *s, mn_session *owner) {
  const mn_plan *p = s->plan;
  if (!owner->backend->buffer_address)
    return mn_fail(MN_ERR_UNSUPPORTED, "%s: the %s backend cannot share its memory", fn,
                   owner->backend->name);
  if (!(s->shared = calloc(p->num_buffers ? p->num_buffers : 1, sizeof *s->shared)))
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  for (size_t b = 0; b < p->num_buffers; b++) {
    if (p->buffers[b].role != MN_BUF_PARAMETER) continue;
    const mn_node_rec *n = &p->graph->nodes[p->buffers[b].node];
    size_t numel = (size_t)mn_tensor_type_numel(&n->type);
    mn_param_view v;
    /* The data pointer is only checked for NULL: nothing is read. */
    mn_status st = mn_session_find_param(fn, owner, n->name, n, numel, &v);
    if (st != MN_OK) return st;
    if (!mn_type_same_shape(v.type, &n->type)) {
      char want[96], have[96];
      return mn_fail(MN_ERR_SHAPE, "%s: \"%s\" is %s here but %s in the owner", fn, n->name,
                     mn_shape_str(&n->type, want, sizeof want),
                     mn_shape_str(v.type, have, sizeof have));
    }
    unsigned char *base = owner->backend->buffer_address(owner, owner->plan->node_buffer[v.node]);
    unsigned char *at = base + v.offset * sizeof(float);
    /* Kernels read whole buffers with vector loads from 256-byte aligned starts; a slice of a
     * derived parameter that starts elsewhere cannot stand in for a buffer. */
    if ((uintptr_t)at % 256 != 0)
      return mn_fail(MN_ERR_UNSUPPORTED,
                     "%s: \"%s\" lies at an unaligned place inside the owner's %s; build the "
                     "owner with siblings MN_SIBLINGS_NEVER to share it",
                     fn, n->name, owner->plan->graph->nodes[v.node].name);
    s->shared[b] = at;
    s->owner = owner;
  }
  return MN_OK;
}

/* The buffer of p's input called `name`, or UINT32_MAX. */
static uint32_t input_buffer(const mn_plan *p, const char *name, mn_node *node) {
  const mn_graph *g = p->graph;
  for (size_t i = 0; i < g->num_nodes; i++)
    if (g->nodes[i].op == MN_OP_INPUT && g->nodes[i].name && strcmp(g->nodes[i].name, name) == 0) {
      *node = (mn_node)i;
      return p->node_buffer[i];
    }
  return UINT32_MAX;
}

mn_status mn_session_share_inputs(const char *fn, mn_session *s, mn_session *owner,
                                  const char *const *names, size_t n) {
  for (size_t k = 0; k < n; k++) {
    mn_node mine = MN_NO_NODE, theirs = MN_NO_NODE;
    uint32_t b = input_buffer(s->plan, names[k], &mine);
    uint32_t ob = input_buffer(owner->plan, names[k], &theirs);
    if (b == UINT32_MAX || ob == UINT32_MAX)
      return mn_fail(MN_ERR_NOT_FOUND, "%s: input \"%s\" is not in %s", fn, names[k],
                     b == UINT32_MAX ? "this graph" : "the owner's graph");
    const mn_tensor_type *t = &s->plan->graph->nodes[mine].type;
    const mn_tensor_type *ot = &owner->plan->graph->nodes[theirs].type;
    if (!mn_type_same_shape(t, ot) || t->dtype != ot->dtype) {
      char want[96], have[96];
      return mn_fail(MN_ERR_SHAPE, "%s: input \"%s\" is %s here but %s in the owner", fn, names[k],
                     mn_shape_str(t, want, sizeof want), mn_shape_str(ot, have, sizeof have));
    }
    if (s->plan->buffers[b].storage != owner->plan->buffers[ob].storage)
      return mn_fail(MN_ERR_UNSUPPORTED,
                     "%s: input \"%s\" is stored as %s here but as %s in the owner (the plans' "
                     "precision placed it differently)",
                     fn, names[k], mn_dtype_name(s->plan->buffers[b].storage),
                     mn_dtype_name(owner->plan->buffers[ob].storage));
    if (!mn_plan_input_persists(s->plan, b) || !mn_plan_input_persists(owner->plan, ob))
      return mn_fail(MN_ERR_UNSUPPORTED,
                     "%s: input \"%s\" is copied from the host at each step in one of the graphs "
                     "(only KV caches and quantized weights can be shared)",
                     fn, names[k]);
    s->shared[b] = owner->backend->buffer_address(owner, ob);
  }
  return MN_OK;
}

mn_status mn_build_inference_session_sharing(const mn_graph *g, const mn_session_options *opts,
                                             mn_session *owner, const char *const *inputs,
                                             size_t n_inputs, mn_session **out) {
  const char *fn = "mn_build_inference_session_shared";
  mn_status st = mn_session_check_buildable(fn, g, opts, out);
  if (st != MN_OK) return st;
  if (!owner) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: owner is NULL", fn);
  mn_session_options o = opts ? *opts : mn_session_options_default();
  /* The owner's backend and device; no derived parameters, so each parameter is one range of
   * the owner's memory. */
  o.backend = owner->backend == &mn_cpu_backend ? MN_BACKEND_CPU : MN_BACKEND_CUDA;
  o.device = owner->options.device;
  o.siblings = MN_SIBLINGS_NEVER;
  mn_plan *plan = NULL;
  if ((st = mn_lower_inference(fn, g, &o, &plan)) != MN_OK) return st;
  return mn_session_create_sharing(fn, plan, &o, false, owner, inputs, n_inputs, out);
}

mn_status mn_build_inference_session_shared(const mn_graph *g, const mn_session_options *opts,
                                            mn_session *owner, mn_session **out) {
  return mn_build_inference_session_sharing(g, opts, owner, NULL, 0, out);
}
