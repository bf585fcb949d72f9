#include "host/storage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode_layer.h"
#include "host/error.h"
#include "host/memplan.h"

mn_dtype mn_precision_storage(mn_precision prec) {
  switch (prec) {
  case MN_PRECISION_BF16: return MN_BF16;
  case MN_PRECISION_F16: return MN_F16;
  default: return MN_F32;
  }
}

/* bf16 is the top half of a float: add half of the dropped half, plus one when the kept half
 * is odd, so that a tie goes to the even neighbour; a carry into the exponent is the right
 * rounding up, to infinity past the largest finite value. */
static float round_bf16(float x) {
  if (isnan(x)) return x;
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* fp16: 11 significant bits down to 2^-14, then a fixed quantum of 2^-24 (subnormals); the
 * largest finite value is 65504, and from 65520 (the tie with 65536) on a value rounds to
 * infinity. nearbyintf rounds ties to even in the default rounding mode. */
static float round_f16(float x) {
  if (isnan(x)) return x;
  float a = fabsf(x);
  if (a >= 65520.0f) return copysignf(INFINITY, x);
  if (a < 0x1p-14f) return copysignf(nearbyintf(a * 0x1p24f) * 0x1p-24f, x);
  int e;
  float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
  return copysignf(ldexpf(nearbyintf(ldexpf(m, 11)), e - 11), x);
}

float mn_storage_round(mn_dtype dt, float x) {
  switch (dt) {
  case MN_BF16: return round_bf16(x);
  case MN_F16: return round_f16(x);
  default: return x;
  }
}

void mn_storage_round_n(mn_dtype dt, float *x, size_t n) {
  if (dt != MN_BF16 && dt != MN_F16) return;
  for (size_t i = 0; i < n; i++)
    x[i] = mn_storage_round(dt, x[i]);
}

bool mn_storage_reads_low(mn_op op, int k) {
  switch (op) {
  case MN_OP_MATMUL_BIAS_ACT: return k < 3; /* the bias too, as autocast's linear reads it */
  case MN_OP_MATMUL:
  case MN_OP_MATMUL_AT:
  case MN_OP_MATMUL_BT:
  case MN_OP_MATMUL_AT_BGRAD:
  case MN_OP_MATMUL_DGELU: /* the pre-activation is an activation already */
  case MN_OP_MATMUL_DRELU:
  case MN_OP_MATMUL_DRELU_BGRAD:
  case MN_OP_CONV2D:
  case MN_OP_CONV2D_GRAD_INPUT:
  case MN_OP_CONV2D_GRAD_KERNEL: return k < 2;
  case MN_OP_LLAMA_DECODE_LAYER: return mn_dl_is_weight(k);
  default: return false;
  }
}

/* Ops that produce or sum weight gradients: a value of theirs whose every reader is a
 * parameter gradient (or such a value) is a partial weight gradient, kept in fp32 so that the
 * sum is accumulated in fp32. */
static bool makes_weight_gradients(const mn_graph *g, const mn_node_rec *n) {
  /* the column sums of a bias-gradient pair (optimizer/bgrad.h) stand for a sum_rows */
  if (n->op == MN_OP_EXTRA_OUTPUT && n->attrs.variant == 1) {
    mn_op producer = g->nodes[n->inputs[0]].op;
    return producer == MN_OP_MATMUL_AT_BGRAD || producer == MN_OP_GELU_GRAD_BGRAD ||
           producer == MN_OP_MATMUL_DRELU_BGRAD;
  }
  switch (n->op) {
  case MN_OP_MATMUL_AT:
  case MN_OP_MATMUL_AT_BGRAD:
  case MN_OP_SUM_ROWS:
  case MN_OP_RMS_NORM_GRAD_W:
  case MN_OP_LAYER_NORM_GRAD_W:
  case MN_OP_GROUP_NORM_GRAD_W:
  case MN_OP_SCATTER_ADD:
  case MN_OP_CONV2D_GRAD_KERNEL:
  case MN_OP_SUM_PER_CHANNEL:
  case MN_OP_ADD:
  case MN_OP_FUSED:
  case MN_OP_RESHAPE: return true;
  default: return false;
  }
}

/* weight_grad[i]: node i is a parameter gradient, or an activation whose every reader is one
 * (a partial weight gradient summed into them). The graph is toposorted, so the readers of a
 * node come after it and one backward sweep decides each node after all of its readers. */
static mn_status mark_weight_gradients(const mn_plan *p, bool *weight_grad) {
  const mn_graph *g = p->graph;
  size_t n = g->num_nodes;
  size_t *first = calloc(n + 1, sizeof *first);
  mn_node *readers = NULL;
  if (!first) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_set_precision: out of memory");
  for (size_t u = 0; u < n; u++)
    for (int k = 0; k < g->nodes[u].num_inputs; k++)
      first[g->nodes[u].inputs[k] + 1]++;
  for (size_t i = 0; i < n; i++)
    first[i + 1] += first[i];
  readers = malloc((first[n] ? first[n] : 1) * sizeof *readers);
  size_t *fill = calloc(n ? n : 1, sizeof *fill);
  if (!readers || !fill) {
    free(first), free(readers), free(fill);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_set_precision: out of memory");
  }
  for (size_t u = 0; u < n; u++)
    for (int k = 0; k < g->nodes[u].num_inputs; k++) {
      mn_node in = g->nodes[u].inputs[k];
      readers[first[in] + fill[in]++] = (mn_node)u;
    }
  for (size_t i = 0; i < p->num_params; i++)
    if (p->params[i].grad != MN_NO_NODE) weight_grad[p->params[i].grad] = true;
  for (size_t i = n; i-- > 0;) {
    if (weight_grad[i] || !makes_weight_gradients(g, &g->nodes[i]) ||
        mn_plan_buffer_of(p, (mn_node)i)->role != MN_BUF_ACTIVATION || first[i] == first[i + 1])
      continue;
    bool all = true;
    for (size_t r = first[i]; r < first[i + 1] && all; r++)
      all = weight_grad[readers[r]];
    weight_grad[i] = all;
  }
  free(first), free(readers), free(fill);
  return MN_OK;
}

/* An attention's row statistics (its extra value, ops.h): maxima and 1 / sums of a softmax. */
static bool is_attention_stats(const mn_graph *g, const mn_node_rec *n) {
  return n->op == MN_OP_EXTRA_OUTPUT && mn_op_writes_attention_stats(g->nodes[n->inputs[0]].op);
}

static bool stays_f32(const mn_plan *p, mn_node id, const bool *weight_grad) {
  const mn_node_rec *n = &p->graph->nodes[id];
  mn_buffer_role role = mn_plan_buffer_of(p, id)->role;
  if (role != MN_BUF_ACTIVATION && role != MN_BUF_OUTPUT) return true;
  return n->type.dtype != MN_F32 || (mn_op_flags(n->op) & MN_OPF_LOSS) ||
         mn_tensor_type_numel(&n->type) == 1 || weight_grad[id] || is_attention_stats(p->graph, n);
}

uint16_t mn_storage_bits(mn_dtype dt, float x) {
  float r = mn_storage_round(dt, x);
  uint32_t u;
  memcpy(&u, &r, sizeof u);
  if (dt == MN_BF16) return (uint16_t)(u >> 16);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (isnan(r)) return (uint16_t)(sign | 0x7e00u);
  float a = fabsf(r);
  if (isinf(a)) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x1p-14f) return (uint16_t)(sign | (uint16_t)(a * 0x1p24f));
  int e;
  float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1): biased exponent e - 1 + 15 */
  return (uint16_t)(sign | (uint16_t)((e + 14) << 10) | ((uint16_t)ldexpf(m, 11) & 0x3ffu));
}

float mn_storage_value(mn_dtype dt, uint16_t bits) {
  if (dt == MN_BF16) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  float sign = bits & 0x8000u ? -1.0f : 1.0f;
  int e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  if (e == 0) return sign * ldexpf((float)m, -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * ldexpf((float)(m | 0x400), e - 25);
}

mn_status mn_plan_store_narrow(mn_plan *p) {
  for (size_t b = 0; b < p->num_buffers; b++) {
    mn_buffer_desc *d = &p->buffers[b];
    const mn_tensor_type *t = &p->graph->nodes[d->node].type;
    size_t n = (size_t)mn_tensor_type_numel(t);
    if (d->pitch) n = n / (size_t)t->shape[t->rank - 1] * (size_t)d->pitch;
    if (d->storage == MN_BF16 || d->storage == MN_F16)
      d->bytes = n * 2;
    else if (d->pitch)
      d->bytes = n * sizeof(float);
  }
  return mn_memplan_layout(p, MN_LAYOUT_PLANNED);
}

mn_status mn_plan_set_precision(mn_plan *p, mn_precision prec) {
  const mn_graph *g = p->graph;
  mn_dtype low = mn_precision_storage(prec);
  for (size_t b = 0; b < p->num_buffers; b++)
    p->buffers[b].storage = g->nodes[p->buffers[b].node].type.dtype;
  p->precision = prec;
  if (low == MN_F32) return MN_OK;
  bool *weight_grad = calloc(g->num_nodes ? g->num_nodes : 1, sizeof *weight_grad);
  if (!weight_grad) return mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_plan_set_precision: out of memory");
  mn_status st = mark_weight_gradients(p, weight_grad);
  for (size_t b = 0; st == MN_OK && b < p->num_buffers; b++)
    if (!stays_f32(p, p->buffers[b].node, weight_grad)) p->buffers[b].storage = low;
  free(weight_grad);
  return st;
}

bool mn_loss_scaler_record(mn_loss_scaler *l, bool finite) {
  if (!finite) {
    l->scale *= 0.5f;
    l->good_steps = 0;
    l->skipped++;
    return false;
  }
  if (++l->good_steps == MN_LOSS_SCALE_INTERVAL) {
    l->scale *= 2.0f;
    l->good_steps = 0;
  }
  return true;
}
