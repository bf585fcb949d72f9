/* Where the device memory of a language-model training step goes, from the plan alone (no
 * device): the step of bench_lm_step (models/, AdamW), lowered as mn_build_session lowers it
 * and sized as the CUDA backend sizes it (2-byte low-precision buffers, padded logits rows;
 * cuda/storage_layout.h). Prints the memory by role, what the backend allocates beside the
 * plan (scratch, staging, the weights' low-precision copy, Adam's moments, the cuBLASLt
 * workspace), and the arena's activations at the dispatch where the most of them are live,
 * grouped by the op that writes them.
 *
 * usage: bench_memory_lm gpt2|smollm2 [--precision f32|bf16|f16] [--batch B] [--seq T]
 *        [--list] [--timeline N]
 * --list prints every buffer live at the peak; --timeline N the live activations at N
 * dispatches spread over the step. Without a CUDA build the arena is sized by
 * mn_plan_store_narrow alone (no padded rows) and the backend's extras are not reported. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchmarks/driver_util.h"
#include "benchmarks/lm_configs.h"
#include "host/memplan.h"
#include "host/storage.h"
#include "session/session.h"
#ifdef MN_WITH_CUDA
#include "cuda/emit.h"
#include "cuda/storage_layout.h"
#endif

#define MIB(x) ((double)(x) / 1048576.0)

static const char *PROG = "bench_memory_lm";

static size_t aligned(size_t v) { return (v + 255) / 256 * 256; }

/* An activation some dispatch computes: it lives from that dispatch to its last reader. */
static bool computed(const mn_plan *p, size_t b, const size_t *first) {
  return p->buffers[b].role == MN_BUF_ACTIVATION && first[b] != SIZE_MAX;
}

/* One computed in a gradient's memory, free within the step until the gradient is written
 * (memplan.h): it costs no memory of its own. */
static bool in_gradients(const mn_plan *p, size_t b, const size_t *first) {
  return computed(p, b, first) && mn_plan_in_update_block(p, &p->buffers[b]);
}

/* One in the arena's shared part (memplan.c's rule: by lifetime). */
static bool shared(const mn_plan *p, size_t b, const size_t *first) {
  return computed(p, b, first) && !in_gradients(p, b, first);
}

/* Where the shared part of the arena starts: after every buffer of its own. */
static size_t pinned_end(const mn_plan *p, const size_t *first) {
  size_t end = 0;
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    if (!shared(p, b, first) && d->offset + aligned(d->bytes) > end)
      end = d->offset + aligned(d->bytes);
  }
  return end;
}

/* "fused(add+layer_norm)" for a fused node, the op's name otherwise; an extra value names
 * the node that writes it and which value it is. */
static void label_of(const mn_plan *p, mn_node id, char *buf, size_t size) {
  const mn_node_rec *n = &p->graph->nodes[id];
  if (n->op == MN_OP_EXTRA_OUTPUT) {
    char inner[200];
    label_of(p, n->inputs[0], inner, sizeof inner);
    snprintf(buf, size, "%s value %d", inner, n->attrs.variant);
    return;
  }
  if (n->op != MN_OP_FUSED || !n->fused) {
    snprintf(buf, size, "%s", mn_op_name(n->op));
    return;
  }
  size_t len = (size_t)snprintf(buf, size, "fused(");
  bool seen[MN_OP_COUNT] = {false};
  for (int i = 0; i < n->fused->num_instrs && len < size; i++) {
    mn_op op = n->fused->instrs[i].op;
    if (seen[op]) continue;
    seen[op] = true;
    len += (size_t)snprintf(buf + len, size - len, "%s%s", len > 6 ? "+" : "", mn_op_name(op));
  }
  if (len < size) snprintf(buf + len, size - len, ")");
}

static void shape_of(const mn_tensor_type *t, char *buf, size_t size) {
  size_t len = (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < t->rank && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "", (long long)t->shape[i]);
  if (len < size) snprintf(buf + len, size - len, "]");
}

typedef struct group {
  char label[240];
  size_t count, bytes;
} group;

static int by_bytes_desc(const void *a, const void *b) {
  const group *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : strcmp(x->label, y->label);
}

/* The dispatch that computes node id (an extra value: its writer's), for fwd / bwd labels. */
static size_t dispatch_of(const mn_plan *p, const size_t *at, mn_node id) {
  const mn_node_rec *n = &p->graph->nodes[id];
  return at[n->op == MN_OP_EXTRA_OUTPUT ? n->inputs[0] : id];
}

/* AdamW, as bench_lm_step trains: two fp32 moments per trained value. */
static void report_roles(const mn_plan *p, const size_t *first, size_t shadow_bytes) {
  size_t role_bytes[MN_BUF_GRADIENT + 1] = {0};
  for (size_t b = 0; b < p->num_buffers; b++)
    if (!computed(p, b, first)) role_bytes[p->buffers[b].role] += aligned(p->buffers[b].bytes);
  printf("memory by role (MiB):\n");
  printf("  %-34s %9.1f\n", "parameters (fp32 master weights)", MIB(role_bytes[MN_BUF_PARAMETER]));
  printf("  %-34s %9.1f\n", "parameter gradients (fp32)", MIB(role_bytes[MN_BUF_GRADIENT]));
  printf("  %-34s %9.1f\n", "inputs", MIB(role_bytes[MN_BUF_INPUT]));
  printf("  %-34s %9.1f\n", "constants", MIB(role_bytes[MN_BUF_CONSTANT]));
  printf("  %-34s %9.1f\n", "outputs", MIB(role_bytes[MN_BUF_OUTPUT]));
  for (size_t b = 0; b < p->num_buffers; b++) {
    const mn_buffer_desc *d = &p->buffers[b];
    if (d->role != MN_BUF_OUTPUT) continue;
    char shape[64];
    shape_of(&p->graph->nodes[d->node].type, shape, sizeof shape);
    printf("    %-32s %9.1f  %s %s%s\n", mn_op_name(p->graph->nodes[d->node].op), MIB(d->bytes),
           shape, d->storage == MN_F32 ? "f32" : "2-byte", d->pitch ? " (padded rows)" : "");
  }
  if (role_bytes[MN_BUF_ACTIVATION])
    printf("  %-34s %9.1f\n", "activations kept apart", MIB(role_bytes[MN_BUF_ACTIVATION]));
  printf("  %-34s %9.1f\n", "arena activations (shared)",
         MIB(p->arena_bytes - pinned_end(p, first)));
  printf("  %-34s %9.1f\n", "= the arena (planned_mib w/o Adam)", MIB(p->arena_bytes));
  printf("  %-34s %9.1f\n", "Adam moments m, v (fp32)", MIB(2 * p->update_bytes));
  if (shadow_bytes) printf("  %-34s %9.1f\n", "weights' low-precision copy", MIB(shadow_bytes));
}

/* Live activations per dispatch: returns the peak and its dispatch; fills live[] when given. */
static size_t live_profile(const mn_plan *p, const size_t *first, const size_t *last,
                           size_t *peak_at, size_t *live) {
  size_t nd = p->num_dispatches;
  long long *delta = calloc(nd + 1, sizeof *delta);
  if (!delta) drv_die(PROG, "out of memory");
  for (size_t b = 0; b < p->num_buffers; b++) {
    if (!computed(p, b, first)) continue;
    delta[first[b]] += (long long)aligned(p->buffers[b].bytes);
    delta[last[b] + 1] -= (long long)aligned(p->buffers[b].bytes);
  }
  long long cur = 0, best = -1;
  for (size_t d = 0; d < nd; d++) {
    cur += delta[d];
    if (live) live[d] = (size_t)cur;
    if (cur > best) {
      best = cur;
      *peak_at = d;
    }
  }
  free(delta);
  return (size_t)(best < 0 ? 0 : best);
}

static void report_peak(const mn_plan *p, const size_t *first, const size_t *last, bool list,
                        int timeline) {
  size_t nd = p->num_dispatches, peak_at = 0;
  size_t *live = malloc((nd ? nd : 1) * sizeof *live),
         *at = malloc(p->graph->num_nodes * sizeof *at);
  group *groups = calloc(p->num_buffers ? p->num_buffers : 1, sizeof *groups);
  if (!live || !at || !groups) drv_die(PROG, "out of memory");
  size_t peak = live_profile(p, first, last, &peak_at, live), loss_at = SIZE_MAX;
  for (size_t d = 0; d < nd; d++) {
    at[p->dispatches[d].node] = d;
    if (p->dispatches[d].node == p->loss) loss_at = d;
  }
  mn_node pn = p->dispatches[peak_at].node;
  char label[240];
  label_of(p, pn, label, sizeof label);
  size_t region = p->arena_bytes - pinned_end(p, first), borrowed = 0;
  for (size_t b = 0; b < p->num_buffers; b++)
    if (in_gradients(p, b, first) && first[b] <= peak_at && last[b] >= peak_at)
      borrowed += aligned(p->buffers[b].bytes);
  printf("arena activations: %.1f MiB planned; at most %.1f MiB live at once, at dispatch %zu of "
         "%zu (node %u, %s; the loss is dispatch %zu), %.1f MiB of it in gradients' memory (free "
         "until each gradient is written): the placement leaves %.1f MiB unused there\n",
         MIB(region), MIB(peak), peak_at, nd, pn, label, loss_at, MIB(borrowed),
         MIB(region + borrowed - peak));
  size_t ng = 0;
  for (size_t b = 0; b < p->num_buffers; b++) {
    if (!computed(p, b, first) || first[b] > peak_at || last[b] < peak_at) continue;
    const mn_buffer_desc *d = &p->buffers[b];
    char l[200], key[240];
    label_of(p, d->node, l, sizeof l);
    bool fwd = dispatch_of(p, at, d->node) < loss_at;
    snprintf(key, sizeof key, "%s %s%s", fwd ? "fwd" : "bwd", l,
             in_gradients(p, b, first) ? " (in gradients)" : "");
    size_t g = 0;
    while (g < ng && strcmp(groups[g].label, key))
      g++;
    if (g == ng) snprintf(groups[ng++].label, sizeof groups[0].label, "%s", key);
    groups[g].count++;
    groups[g].bytes += aligned(d->bytes);
    if (list) {
      char shape[64];
      shape_of(&p->graph->nodes[d->node].type, shape, sizeof shape);
      printf("    buffer %5zu node %5u %-44s %-18s %8.1f MiB  dispatches %zu..%zu\n", b, d->node,
             key, shape, MIB(d->bytes), first[b], last[b]);
    }
  }
  qsort(groups, ng, sizeof *groups, by_bytes_desc);
  printf("live at the peak, by the op that writes them (fwd: computed before the loss):\n");
  for (size_t g = 0; g < ng; g++)
    printf("  %-56s %4zu buffers %9.1f MiB\n", groups[g].label, groups[g].count,
           MIB(groups[g].bytes));
  for (int i = 0; i < timeline; i++) {
    size_t d = timeline > 1 ? (size_t)i * (nd - 1) / (size_t)(timeline - 1) : peak_at;
    label_of(p, p->dispatches[d].node, label, sizeof label);
    printf("  timeline: dispatch %5zu %-40s live %9.1f MiB\n", d, label, MIB(live[d]));
  }
  free(live);
  free(at);
  free(groups);
}

#ifdef MN_WITH_CUDA
/* What the CUDA backend allocates beside the plan, from its lowered program. */
static void report_backend(const mn_plan *p, size_t arena_with_adam, size_t shadow) {
  mn_cu_program prog;
  drv_expect_ok(PROG, mn_cu_program_build(p, false, &prog), "CUDA lowering");
  bool *fused = malloc((prog.num_cmds ? prog.num_cmds : 1) * sizeof *fused);
  if (!fused) drv_die(PROG, "out of memory");
  size_t products = 0, epilogues = 0;
  mn_node widest = MN_NO_NODE;
  size_t widest_bytes = 0;
  for (size_t i = 0; i < prog.num_cmds; i++) {
    const mn_cu_cmd *c = &prog.cmds[i];
    fused[i] = true;
    if (c->kind != MN_CU_CMD_MATMUL) continue;
    products++;
    epilogues += c->mm.epilogue != MN_CU_EPI_NONE;
    if (c->mm.fallback_scratch > widest_bytes) {
      widest_bytes = c->mm.fallback_scratch;
      widest = c->node;
    }
  }
  size_t all_fuse = mn_cu_program_scratch_bytes(&prog, fused),
         none_fuse = mn_cu_program_scratch_bytes(&prog, NULL);
  printf("beside the plan (CUDA backend, MiB):\n");
  printf("  %-34s %9.1f  every dispatch's own; %.1f if no epilogue fuses", "scratch", MIB(all_fuse),
         MIB(none_fuse));
  if (widest != MN_NO_NODE)
    printf(" (the fp32 product of node %u, %s)", widest, mn_op_name(p->graph->nodes[widest].op));
  printf("; %zu of %zu products offer an epilogue\n", epilogues, products);
  printf("  %-34s %9.1f  rounded product operands, padded head weight (fp32: in scratch)\n",
         "staging", MIB(prog.stage_bytes));
  printf("  %-34s %9.1f\n", "cuBLASLt workspace", MIB(MN_LT_WORKSPACE_BYTES));
  size_t total = arena_with_adam + shadow + all_fuse + prog.stage_bytes + MN_LT_WORKSPACE_BYTES;
  printf("  %-34s %9.1f  (every epilogue fused; without the CUDA context, kernels and "
         "graph)\n",
         "= device memory of the session", MIB(total));
  free(fused);
  mn_cu_program_free(&prog);
}
#endif

int main(int argc, char **argv) {
  if (argc < 2 || (strcmp(argv[1], "gpt2") && strcmp(argv[1], "smollm2"))) {
    fprintf(stderr,
            "usage: %s gpt2|smollm2 [--precision P] [--batch B] [--seq T] [--list] "
            "[--timeline N]\n",
            PROG);
    return 2;
  }
  bool gpt2 = strcmp(argv[1], "gpt2") == 0, list = false, tf32 = false;
  long batch = gpt2 ? 16 : 8, seq = 1024;
  int timeline = 0;
  mn_session_options o = mn_session_options_default();
  o.precision = MN_PRECISION_BF16;
  for (int i = 2; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--precision")) {
      if (!drv_precision(argv[++i], &o.precision, &tf32)) {
        fprintf(stderr, "%s: --precision must be f32, tf32, bf16 or f16\n", PROG);
        return 2;
      }
    } else if (i + 1 < argc && !strcmp(argv[i], "--batch")) {
      batch = atol(argv[++i]);
    } else if (i + 1 < argc && !strcmp(argv[i], "--seq")) {
      seq = atol(argv[++i]);
    } else if (i + 1 < argc && !strcmp(argv[i], "--timeline")) {
      timeline = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--list")) {
      list = true;
    } else {
      fprintf(stderr, "%s: unknown argument %s\n", PROG, argv[i]);
      return 2;
    }
  }
  mn_model_config cfg;
  drv_expect_ok(PROG, mn_model_config_parse(gpt2 ? MN_BENCH_GPT2 : MN_BENCH_SMOLLM2, &cfg),
                "config");
  mn_graph *g = NULL;
  drv_expect_ok(PROG, mn_model_build(&cfg, batch, seq, NULL, &g), "model");
  mn_plan *p = NULL;
  drv_expect_ok(PROG, mn_lower_training(PROG, g, &o, &p), "lowering");
  drv_expect_ok(PROG, mn_plan_set_precision(p, o.precision), "precision");
  size_t shadow = 0;
#ifdef MN_WITH_CUDA
  drv_expect_ok(PROG, mn_cu_size_plan(p), "CUDA sizes");
  if (mn_cu_low_storage(p) != MN_DEV_F32) shadow = mn_cu_low_shadow_layout(p, NULL);
#else
  if (o.precision != MN_PRECISION_F32) drv_expect_ok(PROG, mn_plan_store_narrow(p), "2-byte sizes");
#endif
  printf("%s %s batch %ld seq %ld: %zu dispatches, %zu buffers\n", argv[1],
         o.precision == MN_PRECISION_BF16  ? "bf16"
         : o.precision == MN_PRECISION_F16 ? "f16"
                                           : "f32",
         batch, seq, p->num_dispatches, p->num_buffers);
  size_t *first = malloc(p->num_buffers * sizeof *first),
         *last = malloc(p->num_buffers * sizeof *last);
  if (!first || !last) drv_die(PROG, "out of memory");
  mn_memplan_lifetimes(p, first, last);
  report_roles(p, first, shadow);
#ifdef MN_WITH_CUDA
  report_backend(p, p->arena_bytes + 2 * p->update_bytes, shadow);
#endif
  report_peak(p, first, last, list, timeline);
  free(first);
  free(last);
  mn_plan_free(p);
  mn_graph_free(g);
  return 0;
}
