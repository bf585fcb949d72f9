/* The memory planner: activations share arena memory only when their lifetimes do not
 * overlap, pinned buffers never share (a gradient's memory only until the gradient is
 * written), and a planned session computes exactly what a session with one buffer per node
 * computes. */
#include <stdlib.h>
#include <string.h>

#include "host/memplan.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/models.h"
#include "tests/support/session_util.h"

enum { B = 2, T = 8, V = 11 };

/* Unlike mn_test_lm: no final norm, and the logits are a second output, compared bit for bit
 * (with_logits), or the loss is the only output, as in a training loop. */
static mn_graph *lm_graph_with(bool with_logits) {
  const mn_test_block_config *cfg = &mn_test_tiny_block;
  mn_graph *g = mn_graph_new();
  mn_node tokens = mn_input_u32(g, "tokens", MN_SHAPE(B, T));
  mn_node labels = mn_input_u32(g, "labels", MN_SHAPE(B, T));
  mn_node emb = mn_parameter(g, "embed", MN_SHAPE(V, cfg->d_model));
  mn_node h = mn_embedding(g, tokens, emb);
  for (int l = 0; l < 2; l++) {
    mn_test_block_weights w = mn_test_block_params(g, cfg, l);
    h = mn_test_block(g, cfg, &w, h);
  }
  mn_node outs[2];
  outs[1] = mn_matmul_bt(g, h, emb);
  outs[0] = mn_sparse_cross_entropy_loss(g, outs[1], labels);
  mn_set_outputs(g, outs, with_logits ? 2 : 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_graph *lm_graph(void) { return lm_graph_with(true); }

static mn_session *session_with_layout_as(const mn_graph *g, mn_layout_mode mode,
                                          mn_precision prec) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.precision = prec;
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &plan), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_memplan_layout(plan, mode), MN_OK);
  mn_session *s = NULL;
  cr_assert_eq(mn_session_create("test", plan, &o, true, &s), MN_OK, "%s", mn_last_error());
  /* Every parameter normal(0, 0.1), norms included; the same stream then draws the tokens. */
  mn_rng r = mn_rng_new(3);
  mn_test_init_normal(g, &s, 1, &r, 0.1f, false);
  uint32_t tok[B * T], lab[B * T];
  mn_rng_fill_u32(&r, tok, B * T, V);
  mn_rng_fill_u32(&r, lab, B * T, V);
  mn_session_set_input_u32(s, "tokens", tok, B * T);
  mn_session_set_input_u32(s, "labels", lab, B * T);
  cr_assert_eq(mn_session_set_adamw(s, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.01f), MN_OK);
  return s;
}

static mn_session *session_with_layout(const mn_graph *g, mn_layout_mode mode) {
  return session_with_layout_as(g, mode, MN_PRECISION_F32);
}

/* One step of both sessions, which must report the same loss bit for bit. */
static void step_alike(mn_session *planned, mn_session *flat, int step) {
  mn_session *ss[2] = {planned, flat};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mn_session_step(ss[k]), MN_OK);
    cr_assert_eq(mn_session_wait(ss[k]), MN_OK, "%s", mn_last_error());
  }
  cr_assert(mn_session_read_loss(planned) == mn_session_read_loss(flat), "step %d: %.9g vs %.9g",
            step, mn_session_read_loss(planned), mn_session_read_loss(flat));
}

Test(memplan, planned_equals_one_buffer_per_node) {
  mn_graph *g = lm_graph();
  mn_session *planned = session_with_layout(g, MN_LAYOUT_PLANNED);
  mn_session *flat = session_with_layout(g, MN_LAYOUT_ONE_PER_BUFFER);
  const mn_plan *pp = mn_session_plan(planned), *fp = mn_session_plan(flat);
  cr_assert_lt(pp->arena_bytes, fp->arena_bytes * 3 / 4, "planning saved too little: %zu of %zu",
               pp->arena_bytes, fp->arena_bytes);
  cr_assert_eq(fp->arena_bytes, mn_memplan_unplanned_bytes(fp));
  static float la[B * T * V], lb[B * T * V];
  for (int step = 0; step < 3; step++) {
    step_alike(planned, flat, step);
    mn_session_read_output_by_index(planned, 1, la, B * T * V);
    mn_session_read_output_by_index(flat, 1, lb, B * T * V);
    cr_assert(memcmp(la, lb, sizeof la) == 0, "logits differ at step %d", step);
  }
  float wa[16 * 16], wb[16 * 16];
  mn_session_read_param(planned, "layers.1.self_attn.q_proj.weight", wa, 16 * 16);
  mn_session_read_param(flat, "layers.1.self_attn.q_proj.weight", wb, 16 * 16);
  cr_assert(memcmp(wa, wb, sizeof wa) == 0, "parameters differ after 3 AdamW steps");
  mn_session_free(planned);
  mn_session_free(flat);
  mn_graph_free(g);
}

/* Whether buffers x and y meet only at dispatch d, an element-wise op (not fused) that reads x
 * there for the last time and writes y: it may write over what it reads. */
static bool in_place(const mn_plan *p, uint32_t x, uint32_t y, const size_t *first,
                     const size_t *last) {
  size_t d = first[y];
  if (d == SIZE_MAX || last[x] != d || d >= p->num_dispatches) return false;
  mn_node id = p->dispatches[d].node;
  const mn_node_rec *n = &p->graph->nodes[id];
  if (p->node_buffer[id] != y || n->op == MN_OP_FUSED || !(mn_op_flags(n->op) & MN_OPF_POINTWISE))
    return false;
  for (int k = 0; k < n->num_inputs; k++)
    if (p->node_buffer[n->inputs[k]] == x) return true;
  return false;
}

/* Checks the layout directly: no two buffers that are alive at the same time overlap
 * in memory, and pinned buffers overlap nothing, except that a gradient's memory is free
 * within a step until the dispatch that writes it (nothing reads a gradient before the step
 * has ended) and that an element-wise op may write over an input it reads last. */
Test(memplan, no_live_buffers_overlap) {
  mn_graph *g = lm_graph();
  mn_session_options o = mn_session_options_default();
  mn_plan *p = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &p), MN_OK, "%s", mn_last_error());
  size_t nb = p->num_buffers;
  size_t *first = malloc(nb * sizeof *first), *last = malloc(nb * sizeof *last);
  for (size_t b = 0; b < nb; b++) {
    bool pinned = p->buffers[b].role != MN_BUF_ACTIVATION;
    bool from_write =
        p->buffers[b].role == MN_BUF_ACTIVATION || p->buffers[b].role == MN_BUF_GRADIENT;
    first[b] = from_write ? SIZE_MAX : 0;
    last[b] = pinned ? SIZE_MAX : 0;
  }
  for (size_t d = 0; d < p->num_dispatches; d++) {
    const mn_node_rec *n = &p->graph->nodes[p->dispatches[d].node];
    uint32_t ob = p->node_buffer[p->dispatches[d].node];
    if (d < first[ob]) first[ob] = d;
    for (int k = 1; k <= mn_node_num_extra_outputs(n); k++) {
      uint32_t eb = p->node_buffer[mn_plan_extra_output(p, p->dispatches[d].node, k)];
      if (d < first[eb]) first[eb] = d;
    }
    if (d > last[ob] && last[ob] != SIZE_MAX) last[ob] = d;
    for (int k = 0; k < n->num_inputs; k++) {
      uint32_t ib = p->node_buffer[n->inputs[k]];
      if (d > last[ib] && last[ib] != SIZE_MAX) last[ib] = d;
    }
  }
  size_t shared = 0;
  for (size_t a = 0; a < nb; a++)
    for (size_t b = a + 1; b < nb; b++) {
      const mn_buffer_desc *x = &p->buffers[a], *y = &p->buffers[b];
      bool mem = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
      bool time = first[a] <= last[b] && first[b] <= last[a] &&
                  !in_place(p, (uint32_t)a, (uint32_t)b, first, last) &&
                  !in_place(p, (uint32_t)b, (uint32_t)a, first, last);
      cr_assert(!(mem && time), "buffers %zu and %zu overlap in memory and time", a, b);
      shared += mem;
    }
  cr_assert_gt(shared, 0, "nothing was shared");
  cr_assert(p->arena_bytes <= mn_memplan_unplanned_bytes(p));
  free(first);
  free(last);
  mn_plan_free(p);
  mn_graph_free(g);
}

/* The node of the only op of `op` in p's graph. */
static mn_node only_node(const mn_plan *p, mn_op op) {
  mn_node found = MN_NO_NODE;
  for (size_t i = 0; i < p->graph->num_nodes; i++)
    if (p->graph->nodes[i].op == op) {
      cr_assert_eq(found, MN_NO_NODE, "two %s nodes", mn_op_name(op));
      found = (mn_node)i;
    }
  cr_assert_neq(found, MN_NO_NODE, "no %s node", mn_op_name(op));
  return found;
}

/* Three AdamW steps of both sessions: the same loss every step and the same tied embedding after,
 * bit for bit. */
static void train_alike(mn_session *planned, mn_session *flat) {
  for (int step = 0; step < 3; step++)
    step_alike(planned, flat, step);
  float wa[V * 16], wb[V * 16];
  mn_session_read_param(planned, "embed", wa, V * 16);
  mn_session_read_param(flat, "embed", wb, V * 16);
  cr_assert(memcmp(wa, wb, sizeof wa) == 0, "the tied embedding differs after 3 AdamW steps");
}

/* When the loss is the only output, the logits are an activation that the fused cross-entropy
 * loss and gradient reads last, and it writes the gradient over them: one
 * buffer's memory for both, and the same training as with a buffer per node, bit for bit. As an
 * output the logits keep their own memory. */
Test(memplan, logits_gradient_overwrites_the_logits) {
  for (int with_logits = 0; with_logits < 2; with_logits++) {
    mn_graph *g = lm_graph_with(with_logits);
    mn_session *planned = session_with_layout(g, MN_LAYOUT_PLANNED);
    mn_session *flat = session_with_layout(g, MN_LAYOUT_ONE_PER_BUFFER);
    const mn_plan *p = mn_session_plan(planned);
    /* The loss and its gradient are one node (optimizer/loss_grad.c); the gradient is its
     * second value. */
    mn_node pair = only_node(p, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD);
    mn_node grad = mn_plan_extra_output(p, pair, 1);
    cr_assert_neq(grad, MN_NO_NODE, "the fused loss has no gradient value");
    const mn_buffer_desc *gb = mn_plan_buffer_of(p, grad);
    const mn_buffer_desc *lb = mn_plan_buffer_of(p, p->graph->nodes[pair].inputs[0]);
    cr_assert_eq(gb->offset == lb->offset, !with_logits, "logits output %d: offsets %zu and %zu",
                 with_logits, gb->offset, lb->offset);
    train_alike(planned, flat);
    mn_session_free(planned);
    mn_session_free(flat);
    mn_graph_free(g);
  }
}

/* The tied embedding's gradient sums the head's partial gradient and the embedding's: the
 * head's is computed early in the backward pass and read last by that sum, so it lives in the
 * gradient's own memory (free until the sum writes it) instead of the shared arena. The
 * planned sessions above compute the same bits; here the gradient also reads as zeros before
 * the first step (poisoning the partial would have poisoned it) and as the flat session's
 * after each step. */
Test(memplan, a_partial_gradient_lives_in_its_gradients_memory) {
  mn_graph *g = lm_graph();
  mn_session *planned = session_with_layout(g, MN_LAYOUT_PLANNED);
  mn_session *flat = session_with_layout(g, MN_LAYOUT_ONE_PER_BUFFER);
  const mn_plan *p = mn_session_plan(planned);
  const mn_graph *pg = p->graph;
  mn_node emb = mn_graph_find_leaf(pg, MN_OP_PARAMETER, "embed");
  const mn_buffer_desc *grad = NULL;
  for (size_t i = 0; i < p->num_params; i++)
    if (p->params[i].param == emb) grad = mn_plan_buffer_of(p, p->params[i].grad);
  cr_assert_not_null(grad);
  const mn_node_rec *sum = &pg->nodes[grad->node];
  cr_assert_eq(sum->op, MN_OP_ADD, "the embedding's gradient is a sum of two partials, not %s",
               mn_op_name(sum->op));
  size_t borrowed = 0;
  for (int k = 0; k < sum->num_inputs; k++) {
    const mn_buffer_desc *part = mn_plan_buffer_of(p, sum->inputs[k]);
    cr_expect_eq(part->role, MN_BUF_ACTIVATION);
    if (part->offset != grad->offset) continue;
    borrowed++;
    cr_expect(mn_plan_in_update_block(p, part));
  }
  cr_assert_eq(borrowed, 1, "one partial in the gradient's memory, not %zu", borrowed);
  size_t n = (size_t)mn_tensor_type_numel(&pg->nodes[emb].type);
  float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
  float *zeros = calloc(n, sizeof *zeros);
  cr_assert_eq(mn_session_read_grad(planned, "embed", a, n), MN_OK, "%s", mn_last_error());
  cr_assert(memcmp(a, zeros, n * sizeof *a) == 0, "the gradient reads as zeros before a step");
  for (int step = 0; step < 3; step++) {
    mn_session *ss[2] = {planned, flat};
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(mn_session_step(ss[k]), MN_OK);
      cr_assert_eq(mn_session_wait(ss[k]), MN_OK, "%s", mn_last_error());
    }
    cr_assert_eq(mn_session_read_grad(planned, "embed", a, n), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(flat, "embed", b, n), MN_OK, "%s", mn_last_error());
    cr_assert(memcmp(a, b, n * sizeof *a) == 0, "the embedding's gradient differs at step %d",
              step);
  }
  free(a);
  free(b);
  free(zeros);
  mn_session_free(planned);
  mn_session_free(flat);
  mn_graph_free(g);
}

/* In low precision the loss and its gradient come from one node (optimizer/loss_grad.h), whose
 * gradient, its extra value, takes the logits' memory when the loss is the only output; training
 * matches the layout with a buffer per node bit for bit. */
Test(memplan, one_pass_loss_gradient_overwrites_the_logits) {
  mn_graph *g = lm_graph_with(false);
  mn_session *planned = session_with_layout_as(g, MN_LAYOUT_PLANNED, MN_PRECISION_BF16);
  mn_session *flat = session_with_layout_as(g, MN_LAYOUT_ONE_PER_BUFFER, MN_PRECISION_BF16);
  const mn_plan *p = mn_session_plan(planned);
  mn_node loss = only_node(p, MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD);
  cr_assert_eq(p->graph->nodes[loss].num_inputs, 3);
  mn_node grad = mn_plan_extra_output(p, loss, 1);
  cr_assert_neq(grad, MN_NO_NODE);
  cr_assert_eq(mn_plan_buffer_of(p, grad)->offset,
               mn_plan_buffer_of(p, p->graph->nodes[loss].inputs[0])->offset);
  train_alike(planned, flat);
  mn_session_free(planned);
  mn_session_free(flat);
  mn_graph_free(g);
}
