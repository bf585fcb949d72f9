#include "cuda/update_split.h"

#include <stdlib.h>
#include <string.h>

#include "cuda/schedule.h"
#include "host/error.h"

static bool arg_uses(const mn_plan *p, mn_cu_arg a, uint32_t b) {
  return a.kind == MN_CU_ARG_NODE && p->node_buffer[a.node] == b;
}

/* Whether command c names buffer b: its node's values, an argument, a product's operand. */
static bool cmd_uses(const mn_plan *p, const mn_cu_cmd *c, uint32_t b) {
  const mn_node_rec *n = &p->graph->nodes[c->node];
  if (p->node_buffer[c->node] == b) return true;
  for (int k = 1; k <= mn_node_num_extra_outputs(n); k++)
    if (p->node_buffer[mn_plan_extra_output(p, c->node, k)] == b) return true;
  for (int k = 0; k < n->num_inputs; k++)
    if (p->node_buffer[n->inputs[k]] == b) return true;
  if (c->kind == MN_CU_CMD_MATMUL) {
    const mn_cu_matmul_desc *d = &c->mm;
    return arg_uses(p, d->a, b) || arg_uses(p, d->b, b) || arg_uses(p, d->c, b) ||
           arg_uses(p, d->bias, b) || arg_uses(p, d->aux, b) || arg_uses(p, d->c_fallback, b);
  }
  for (int k = 0; k < c->num_args; k++)
    if (arg_uses(p, c->args[k], b)) return true;
  return false;
}

typedef struct slot {
  long long first, count; /* elements of the flat block, the alignment pad after it included */
  size_t last;            /* 1 + the last command that names the parameter or its gradient */
} slot;

/* The boundary between slots [0, cut) and [cut, n) that leaves the most elements to the part
 * whose commands end first; 0 when no boundary leaves the share the split needs. */
static size_t best_cut(const slot *sl, size_t n, long long total, bool *early_first) {
  size_t cut = 0;
  long long best = (long long)(MN_CU_UPDATE_SPLIT_MIN_SHARE * (double)total);
  for (size_t j = 1; j < n; j++) {
    size_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
      size_t *r = i < j ? &lo : &hi;
      if (sl[i].last > *r) *r = sl[i].last;
    }
    if (lo == hi) continue;
    long long early = lo < hi ? sl[j].first : total - sl[j].first;
    if (early > best) {
      best = early;
      cut = j;
      *early_first = lo < hi;
    }
  }
  return cut;
}

static mn_cu_update_part part(const mn_cu_op_ctx *c, long long first, long long count) {
  int k = mn_cu_kernel(c, 256, "mn_opt_update<256, %lldLL, %d>", count, MN_CU_NORM_BLOCKS);
  return (mn_cu_update_part){.first = first, .count = count, .kernel = k};
}

mn_status mn_cu_update_split_declare(mn_cu_program *prog, const mn_plan *p, bool training,
                                     mn_cu_update_split *split) {
  const mn_cu_update_part none = {.kernel = -1};
  *split = (mn_cu_update_split){none, none};
  const char *env = getenv("MN_CUDA_SPLIT_UPDATE");
  if ((env && strcmp(env, "0") == 0) || !training || !mn_cu_small_step(prog, p) ||
      mn_cu_low_storage(p) != MN_DEV_F32)
    return MN_OK;
  slot *sl = calloc(p->num_params ? p->num_params : 1, sizeof *sl);
  if (!sl) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  size_t n = 0;
  for (size_t i = 0; i < p->num_params; i++) {
    if (p->params[i].grad == MN_NO_NODE) continue;
    uint32_t pb = p->node_buffer[p->params[i].param], gb = p->node_buffer[p->params[i].grad];
    sl[n].first = (long long)((p->buffers[pb].offset - p->update_params_offset) / sizeof(float));
    for (size_t c = 0; c < prog->num_cmds; c++)
      if (cmd_uses(p, &prog->cmds[c], pb) || cmd_uses(p, &prog->cmds[c], gb)) sl[n].last = c + 1;
    n++;
  }
  long long total = (long long)(p->update_bytes / sizeof(float));
  bool early_first = false;
  /* The flat block holds the parameters in slot order (host/memplan.c). */
  bool ordered = n >= 2;
  for (size_t i = 1; i < n; i++)
    ordered = ordered && sl[i].first > sl[i - 1].first;
  size_t cut = ordered ? best_cut(sl, n, total, &early_first) : 0;
  mn_status rc = MN_OK;
  if (cut) {
    mn_cu_op_ctx c = {.prog = prog, .plan = p, .g = p->graph, .id = 0, .node = p->graph->nodes};
    long long at = sl[cut].first;
    mn_cu_update_part lo = part(&c, 0, at), hi = part(&c, at, total - at);
    split->early = early_first ? lo : hi;
    split->late = early_first ? hi : lo;
    if (lo.kernel < 0 || hi.kernel < 0)
      rc = mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  }
  free(sl);
  return rc;
}
