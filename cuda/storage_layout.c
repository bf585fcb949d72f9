#include "cuda/storage_layout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/emit.h"
#include "host/memplan.h"
#include "host/storage.h"

/* Rows of at least this many values whose rows are not 16-byte multiples: cuBLASLt keeps such
 * matrices off its fast kernels (GPT-2's 50257-wide logits), in bf16 / fp16 and in TF32. */
#define PITCH_MIN_COLS 1024
#define PITCH_ALIGN    64 /* values: 128-byte rows */

/* Whether op reads or writes the node at input k (k < 0: as its value, or for a multi-output op
 * its extra value 1) through a row pitch: the products and the sparse cross-entropy kernels do.
 */
static bool pitch_aware(mn_op op, int k) {
  switch (op) {
  case MN_OP_MATMUL: return k <= 0;
  case MN_OP_MATMUL_BT: return k < 0;
  case MN_OP_MATMUL_AT: return k == 0;
  case MN_OP_SPARSE_CROSS_ENTROPY_LOSS: return k == 0;
  case MN_OP_SPARSE_CROSS_ENTROPY_GRAD:
  case MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD: return k <= 0; /* the logits and their gradient */
  default: return false;
  }
}

/* The op whose kernel writes node n: its own, or an extra_output's producer. */
static mn_op writer_of(const mn_graph *g, const mn_node_rec *n) {
  return n->op == MN_OP_EXTRA_OUTPUT ? g->nodes[n->inputs[0]].op : n->op;
}

bool mn_cu_pitch_rows(mn_plan *p) {
  const mn_graph *g = p->graph;
  for (size_t b = 0; b < p->num_buffers; b++) {
    mn_buffer_desc *d = &p->buffers[b];
    const mn_node_rec *n = &g->nodes[d->node];
    int64_t cols = n->type.shape[n->type.rank - 1];
    int64_t per_16_bytes = d->storage == MN_BF16 || d->storage == MN_F16 ? 8 : 4;
    bool computed = d->role == MN_BUF_ACTIVATION || d->role == MN_BUF_OUTPUT;
    if (!computed || n->type.rank < 2 || cols < PITCH_MIN_COLS || cols % per_16_bytes == 0 ||
        !pitch_aware(writer_of(g, n), -1))
      continue;
    bool all = true;
    for (size_t u = d->node + 1; u < g->num_nodes && all; u++)
      for (int k = 0; k < g->nodes[u].num_inputs && all; k++)
        if (g->nodes[u].inputs[k] == d->node) all = pitch_aware(g->nodes[u].op, k);
    if (all) d->pitch = (cols + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
  }
  /* The gradient kernel walks the logits and its output with one alignment: both padded or
   * neither. */
  for (size_t i = 0; i < g->num_nodes; i++) {
    mn_op op = g->nodes[i].op;
    if (op != MN_OP_SPARSE_CROSS_ENTROPY_GRAD && op != MN_OP_SPARSE_CROSS_ENTROPY_LOSS_GRAD)
      continue;
    mn_buffer_desc *out = &p->buffers[p->node_buffer[mn_plan_overwriting_value(p, (mn_node)i)]],
                   *in = &p->buffers[p->node_buffer[g->nodes[i].inputs[0]]];
    if (out->pitch != in->pitch) out->pitch = in->pitch = 0;
  }
  bool any = false;
  for (size_t b = 0; b < p->num_buffers; b++)
    any = any || p->buffers[b].pitch;
  return any;
}

/* A plan whose buffers take at most this much without sharing keeps each in memory of its
 * own: what sharing saves is nothing on a GPU, and a buffer written where an earlier one was
 * read orders the writer after every reader, which on several streams (schedule.h) put the MLP
 * step's weight-gradient branch back on its critical path (the ReLU gradient's output took the
 * memory of the loss gradient that the third layer's weight gradient reads).
 * MN_CUDA_SHARE_MEMORY=1 shares anyway, for comparison. */
#define APART_MAX_BYTES ((size_t)64 << 20)

static bool buffers_apart(const mn_plan *p) {
  const char *env = getenv("MN_CUDA_SHARE_MEMORY");
  if (env && strcmp(env, "1") == 0) return false;
  return mn_memplan_unplanned_bytes(p) <= APART_MAX_BYTES;
}

mn_status mn_cu_size_plan(mn_plan *p) {
  bool padded = mn_cu_pitch_rows(p);
  mn_status rc = MN_OK;
  if (mn_cu_low_storage(p) != MN_DEV_F32 || padded) rc = mn_plan_store_narrow(p);
  if (rc == MN_OK && buffers_apart(p)) rc = mn_memplan_layout(p, MN_LAYOUT_ONE_PER_BUFFER);
  return rc;
}

bool mn_cu_in_update_block(const mn_plan *p, const mn_buffer_desc *d) {
  return d->offset >= p->update_params_offset &&
         d->offset < p->update_params_offset + p->update_bytes;
}

size_t mn_cu_low_shadow_layout(const mn_plan *p, size_t *shadow_at) {
  size_t end = p->update_bytes / 2;
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    size_t at = SIZE_MAX;
    if (d->role == MN_BUF_PARAMETER && p->update_bytes && mn_cu_in_update_block(p, d)) {
      at = (d->offset - p->update_params_offset) / 2;
    } else if (d->role == MN_BUF_PARAMETER) {
      at = end;
      end += (d->bytes / 2 + 255) / 256 * 256;
    }
    if (shadow_at) shadow_at[b] = at;
  }
  return end;
}
