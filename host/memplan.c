#include "host/memplan.h"

#include <stdlib.h>

#include "host/error.h"

#define MN_BUFFER_ALIGN 256

static size_t align_up(size_t v) {
  return (v + MN_BUFFER_ALIGN - 1) / MN_BUFFER_ALIGN * MN_BUFFER_ALIGN;
}

size_t mn_memplan_unplanned_bytes(const mn_plan *p) {
  size_t total = 0;
  for (size_t i = 0; i < p->num_buffers; i++)
    total += align_up(p->buffers[i].bytes);
  return total;
}

typedef struct interval {
  uint32_t buffer;
  size_t first, last; /* dispatch indices, inclusive */
  size_t offset, size;
} interval;

static int by_size_desc(const void *a, const void *b) {
  const interval *x = a, *y = b;
  if (x->size != y->size) return x->size < y->size ? 1 : -1;
  return x->first < y->first ? -1 : x->first > y->first;
}

static int by_offset(const void *a, const void *b) {
  const interval *x = *(interval *const *)a, *y = *(interval *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Inclusive ends keep a kernel's outputs apart from the inputs it reads. */
void mn_memplan_lifetimes(const mn_plan *p, size_t *first, size_t *last) {
  const mn_graph *g = p->graph;
  for (size_t b = 0; b < p->num_buffers; b++)
    first[b] = last[b] = SIZE_MAX;
  for (size_t d = 0; d < p->num_dispatches; d++) {
    const mn_node_rec *n = &g->nodes[p->dispatches[d].node];
    uint32_t out = p->node_buffer[p->dispatches[d].node];
    if (first[out] == SIZE_MAX) first[out] = d;
    last[out] = d;
    for (int k = 1; k <= mn_node_num_extra_outputs(n); k++) {
      uint32_t extra = p->node_buffer[mn_plan_extra_output(p, p->dispatches[d].node, k)];
      if (first[extra] == SIZE_MAX) first[extra] = d;
      last[extra] = d;
    }
    for (int k = 0; k < n->num_inputs; k++)
      last[p->node_buffer[n->inputs[k]]] = d;
  }
}

/* The buffer whose memory b takes (b itself when none). */
static uint32_t root_of(const uint32_t *share, uint32_t b) {
  while (share[b] != b)
    b = share[b];
  return b;
}

/* share[b]: an op that may overwrite its input 0 (MN_OPF_MAY_OVERWRITE, ops.h; a language
 * model's logits gradient, as large as the logits) writes its value into that input's memory
 * when the input is an activation that no later dispatch reads and the two have the same size,
 * storage and row pitch; the pair then holds one interval, from the input's first dispatch to
 * the output's last. */
static void share_overwritten(const mn_plan *p, const bool *placed, uint32_t *share, size_t *first,
                              size_t *last) {
  for (size_t b = 0; b < p->num_buffers; b++)
    share[b] = (uint32_t)b;
  for (size_t d = 0; d < p->num_dispatches; d++) {
    mn_node id = p->dispatches[d].node;
    const mn_node_rec *n = &p->graph->nodes[id];
    if (!(mn_op_flags(n->op) & MN_OPF_MAY_OVERWRITE) || n->num_inputs < 1) continue;
    uint32_t out = p->node_buffer[mn_plan_overwriting_value(p, id)],
             in = root_of(share, p->node_buffer[n->inputs[0]]);
    const mn_buffer_desc *bo = &p->buffers[out], *bi = &p->buffers[in];
    if (in == out || placed[in] || placed[out] || bi->role != MN_BUF_ACTIVATION ||
        bo->role != MN_BUF_ACTIVATION || first[in] == SIZE_MAX || last[in] != d ||
        first[out] != d || bi->bytes != bo->bytes || bi->storage != bo->storage ||
        bi->pitch != bo->pitch)
      continue;
    share[out] = in;
    last[in] = last[out];
  }
}

/* Greedy best-fit in decreasing size: each buffer goes to the lowest offset that no
 * already placed, time-overlapping buffer occupies. */
static size_t place(interval *iv, size_t n, size_t base) {
  qsort(iv, n, sizeof *iv, by_size_desc);
  interval **live = malloc((n ? n : 1) * sizeof *live);
  size_t end = base;
  if (!live) return SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    size_t count = 0;
    for (size_t j = 0; j < i; j++)
      if (iv[j].first <= iv[i].last && iv[i].first <= iv[j].last) live[count++] = &iv[j];
    qsort(live, count, sizeof *live, by_offset);
    size_t offset = base;
    for (size_t j = 0; j < count; j++) {
      if (live[j]->offset >= offset + iv[i].size) break;
      if (live[j]->offset + live[j]->size > offset) offset = live[j]->offset + live[j]->size;
    }
    iv[i].offset = offset;
    if (offset + iv[i].size > end) end = offset + iv[i].size;
  }
  free(live);
  return end;
}

/* Parameters with a gradient first, then their gradients at the same spacing (see
 * update_bytes in plan.h); marks what it placed and sets *end. The flat update needs
 * each gradient to own a buffer of its parameter's size, which autodiff guarantees;
 * a plan that breaks it is refused rather than trained wrongly. */
static mn_status place_update_blocks(mn_plan *p, bool *placed, size_t *end) {
  size_t span = 0;
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    uint32_t b = p->node_buffer[p->params[i].param];
    p->buffers[b].offset = span;
    placed[b] = true;
    span += align_up(p->buffers[b].bytes);
  }
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    uint32_t pb = p->node_buffer[p->params[i].param], gb = p->node_buffer[p->params[i].grad];
    if (placed[gb] || p->buffers[gb].role != MN_BUF_GRADIENT ||
        p->buffers[gb].bytes != p->buffers[pb].bytes)
      return mn_fail(MN_ERR_STATE,
                     "memory planning: the gradient of parameter node %u does not own a buffer "
                     "of its size",
                     p->params[i].param);
    p->buffers[gb].offset = span + p->buffers[pb].offset;
    placed[gb] = true;
  }
  p->update_params_offset = 0;
  p->update_grads_offset = span;
  p->update_bytes = span;
  *end = 2 * span;
  return MN_OK;
}

/* A value whose last reader is the element-wise op that writes a parameter gradient of its
 * size, such as the head's partial gradient of a tied embedding that the embedding's own
 * gradient is added to at the end of the backward pass, is computed in that gradient's memory
 * instead of the arena's shared part. A gradient is written once a step, by that op, and read
 * only after the step (by the optimizer, read_grad), so its memory is free until then; an
 * element-wise op reads each element before it writes it, so its output may overwrite an
 * input it reads last. Fused nodes are left out: a row op reads a whole row first. One value
 * per gradient; marks what it placed. */
static void borrow_gradients(mn_plan *p, const size_t *first, const size_t *last, bool *placed) {
  const mn_graph *g = p->graph;
  for (size_t d = 0; d < p->num_dispatches; d++) {
    mn_node id = p->dispatches[d].node;
    const mn_node_rec *n = &g->nodes[id];
    const mn_buffer_desc *grad = &p->buffers[p->node_buffer[id]];
    if (!(mn_op_flags(n->op) & MN_OPF_POINTWISE) || n->op == MN_OP_FUSED ||
        grad->role != MN_BUF_GRADIENT || !placed[p->node_buffer[id]] ||
        first[p->node_buffer[id]] != d)
      continue;
    for (int k = 0; k < n->num_inputs; k++) {
      uint32_t b = p->node_buffer[n->inputs[k]];
      mn_buffer_desc *v = &p->buffers[b];
      if (placed[b] || v->role != MN_BUF_ACTIVATION || first[b] == SIZE_MAX || last[b] != d ||
          v->bytes != grad->bytes || v->storage != grad->storage ||
          mn_tensor_type_numel(&g->nodes[v->node].type) != mn_tensor_type_numel(&n->type))
        continue;
      v->offset = grad->offset;
      placed[b] = true;
      break;
    }
  }
}

mn_status mn_memplan_layout(mn_plan *p, mn_layout_mode mode) {
  size_t nb = p->num_buffers;
  bool *placed = calloc(nb ? nb : 1, sizeof *placed);
  if (!placed) return mn_fail(MN_ERR_OUT_OF_MEMORY, "memory planning: out of memory");
  size_t pinned_end = 0;
  mn_status st = place_update_blocks(p, placed, &pinned_end);
  if (st != MN_OK) {
    free(placed);
    return st;
  }
  for (size_t b = 0; p->external && b < nb; b++)
    if (p->external[b]) {
      p->buffers[b].offset = 0;
      placed[b] = true;
    }
  if (mode == MN_LAYOUT_ONE_PER_BUFFER) {
    for (size_t b = 0; b < nb; b++) {
      if (placed[b]) continue;
      p->buffers[b].offset = pinned_end;
      pinned_end += align_up(p->buffers[b].bytes);
    }
    free(placed);
    p->arena_bytes = pinned_end;
    return MN_OK;
  }
  size_t *first = malloc((nb ? nb : 1) * sizeof *first),
         *last = malloc((nb ? nb : 1) * sizeof *last);
  interval *iv = malloc((nb ? nb : 1) * sizeof *iv);
  uint32_t *share = malloc((nb ? nb : 1) * sizeof *share);
  if (!first || !last || !iv || !share) {
    free(placed);
    free(first);
    free(last);
    free(iv);
    free(share);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "memory planning: out of memory (%zu buffers)", nb);
  }
  mn_memplan_lifetimes(p, first, last);
  borrow_gradients(p, first, last, placed);
  share_overwritten(p, placed, share, first, last);
  size_t count = 0;
  for (size_t b = 0; b < nb; b++) {
    mn_buffer_desc *buf = &p->buffers[b];
    if (placed[b] || share[b] != b) continue;
    bool shared = buf->role == MN_BUF_ACTIVATION && first[b] != SIZE_MAX;
    if (!shared) {
      buf->offset = pinned_end;
      pinned_end += align_up(buf->bytes);
      continue;
    }
    iv[count++] = (interval){
        .buffer = (uint32_t)b, .first = first[b], .last = last[b], .size = align_up(buf->bytes)};
  }
  size_t end = place(iv, count, pinned_end);
  for (size_t i = 0; i < count && end != SIZE_MAX; i++)
    p->buffers[iv[i].buffer].offset = iv[i].offset;
  for (size_t b = 0; b < nb; b++)
    if (share[b] != b) p->buffers[b].offset = p->buffers[root_of(share, (uint32_t)b)].offset;
  free(share);
  free(placed);
  free(first);
  free(last);
  free(iv);
  if (end == SIZE_MAX) return mn_fail(MN_ERR_OUT_OF_MEMORY, "memory planning: out of memory");
  p->arena_bytes = end;
  return MN_OK;
}
