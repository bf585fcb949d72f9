#include "autodiff/autodiff.h"

#include <stdlib.h>
#include <string.h>

#include "host/build_util.h"
#include "host/error.h"

mn_node mn_ad_node(mn_ad_ctx *c, mn_op op, const mn_node *inputs, int n, const mn_tensor_type *type,
                   const mn_op_attrs *attrs) {
  if (c->g->status != MN_OK) return MN_NO_NODE;
  for (int i = 0; i < n; i++)
    if (inputs[i] == MN_NO_NODE) return MN_NO_NODE;
  const mn_tensor_type *t = type ? type : &c->g->nodes[inputs[0]].type;
  return mn_graph_append(c->g, op, inputs, n, t, attrs, NULL);
}

void mn_ad_accumulate(mn_ad_ctx *c, mn_node x, mn_node dx) {
  if (dx == MN_NO_NODE || x >= c->num_forward || !c->needs_grad[x]) return;
  if (c->grad[x] == MN_NO_NODE) {
    c->grad[x] = dx;
    return;
  }
  mn_node sum[2] = {c->grad[x], dx};
  c->grad[x] = mn_ad_node(c, MN_OP_ADD, sum, 2, NULL, NULL);
}

/* Which forward nodes a parameter reaches, through ops that pass gradients. Ops
 * without a VJP either cut the flow by definition (greater: its derivative is zero
 * almost everywhere) or cannot be trained through (KV-cache ops), which is an error
 * when the loss depends on them. */
static mn_status mark_needs_grad(const char *fn, mn_ad_ctx *c, const mn_vjp_rule *rules) {
  const mn_graph *g = c->g;
  for (size_t i = 0; i < c->num_forward; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op == MN_OP_PARAMETER) {
      c->needs_grad[i] = !mn_param_is_frozen(n);
      continue;
    }
    bool reached = false;
    for (int k = 0; k < n->num_inputs; k++)
      reached |= c->needs_grad[n->inputs[k]] != 0;
    if (!reached || n->op == MN_OP_GREATER) continue;
    if (!rules[n->op])
      return mn_fail(MN_ERR_UNSUPPORTED,
                     "%s: node %zu (%s) is not differentiable, but a parameter reaches it; "
                     "KV-cache ops belong in inference sessions",
                     fn, i, mn_op_name(n->op));
    c->needs_grad[i] = 1;
  }
  return MN_OK;
}

/* A parameter's gradient must be a buffer of its own: clipping scales it in place and
 * the optimizer reads it after everything else ran. */
static mn_node own_gradient(mn_ad_ctx *c, mn_node grad, const unsigned char *taken) {
  const mn_node_rec *n = &c->g->nodes[grad];
  if (!taken[grad] && grad >= c->num_forward && n->op != MN_OP_CONSTANT) return grad;
  mn_op_attrs one = {.scale = 1.0f};
  return mn_ad_node(c, MN_OP_SCALE, &grad, 1, NULL, &one);
}

mn_status mn_autodiff(const char *fn, const mn_graph *fwd, mn_graph **out, int32_t *grads) {
  return mn_autodiff_scaled(fn, fwd, NULL, out, grads);
}

mn_status mn_autodiff_scaled(const char *fn, const mn_graph *fwd, const char *scale_input,
                             mn_graph **out, int32_t *grads) {
  *out = NULL;
  if (fwd->num_outputs == 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: graph has no outputs", fn);
  mn_node loss = fwd->outputs[0];
  const mn_tensor_type *lt = &fwd->nodes[loss].type;
  if (lt->dtype != MN_F32 || lt->rank != 1 || lt->shape[0] != 1) {
    char shape[96];
    return mn_fail(MN_ERR_SHAPE,
                   "%s: output 0 is node %u %s (%s); the loss of a training session must be a "
                   "[1] f32 tensor",
                   fn, loss, mn_shape_str(lt, shape, sizeof shape),
                   mn_op_name(fwd->nodes[loss].op));
  }

  const mn_vjp_rule *rules = mn_vjp_rules;
  mn_ad_ctx c = {.num_forward = fwd->num_nodes};
  c.g = mn_graph_clone(fwd);
  c.grad = malloc(fwd->num_nodes * sizeof *c.grad);
  c.needs_grad = calloc(fwd->num_nodes, 1);
  unsigned char *taken = NULL;
  mn_node *param_grad = NULL;
  mn_status st = MN_OK;
  if (!c.g || !c.grad || !c.needs_grad) {
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory differentiating %zu nodes", fn,
                 fwd->num_nodes);
    goto done;
  }
  for (size_t i = 0; i < fwd->num_nodes; i++)
    c.grad[i] = MN_NO_NODE;
  if ((st = mark_needs_grad(fn, &c, rules)) != MN_OK) goto done;

  float one = 1.0f;
  /* The loss-scale input is the library's own leaf, which the public builders refuse. */
  mn_tensor_type scalar = mn_type_make(MN_F32, MN_SHAPE(1));
  mn_node seed = scale_input
                     ? mn_graph_append(c.g, MN_OP_INPUT, NULL, 0, &scalar, NULL, scale_input)
                     : mn_constant(c.g, &one, MN_SHAPE(1));
  mn_ad_accumulate(&c, loss, seed);
  for (size_t i = fwd->num_nodes; i-- > 0 && c.g->status == MN_OK;) {
    if (c.grad[i] == MN_NO_NODE || fwd->nodes[i].op == MN_OP_PARAMETER) continue;
    st = rules[fwd->nodes[i].op](&c, (mn_node)i, c.grad[i]);
    if (st != MN_OK) break;
  }
  if (c.g->status != MN_OK) {
    st = mn_fail(c.g->status, "%s: building the backward graph: %s", fn, c.g->error);
    goto done;
  }

  /* Outputs: the forward outputs, then each parameter's gradient. */
  size_t total = fwd->num_outputs;
  taken = calloc(c.g->num_nodes + fwd->num_nodes + 1, 1);
  param_grad = malloc((fwd->num_nodes + 1) * sizeof *param_grad);
  if (!taken || !param_grad) {
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    goto done;
  }
  for (size_t i = 0; i < fwd->num_nodes; i++) {
    grads[i] = -1;
    if (fwd->nodes[i].op != MN_OP_PARAMETER || c.grad[i] == MN_NO_NODE) continue;
    mn_node gnode = own_gradient(&c, c.grad[i], taken);
    if (gnode == MN_NO_NODE) break;
    taken[gnode] = 1;
    param_grad[total - fwd->num_outputs] = gnode;
    grads[i] = (int32_t)total++;
  }
  mn_node *outs = malloc(total * sizeof *outs);
  if (c.g->status != MN_OK || !outs) {
    free(outs);
    st = mn_fail(c.g->status != MN_OK ? c.g->status : MN_ERR_OUT_OF_MEMORY, "%s: %s", fn,
                 c.g->status != MN_OK ? c.g->error : "out of memory");
    goto done;
  }
  memcpy(outs, fwd->outputs, fwd->num_outputs * sizeof *outs);
  memcpy(outs + fwd->num_outputs, param_grad, (total - fwd->num_outputs) * sizeof *outs);
  free(c.g->outputs);
  c.g->outputs = outs;
  c.g->num_outputs = total;
  *out = c.g;
  c.g = NULL;
done:
  mn_graph_free(c.g);
  free(c.grad);
  free(c.needs_grad);
  free(taken);
  free(param_grad);
  return st;
}
