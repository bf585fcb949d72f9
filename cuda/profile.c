/* Per-command timing of a training step: every command of the lowered program runs on its
 * own between two CUDA events, outside the step graph, so the time of each op and each
 * kernel can be read without Nsight. Launch gaps are excluded (the graph hides them). */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_state.h"
#include "cuda/nvtx.h"
#include "cuda/profile_floor.h"
#include "host/error.h"
#include "host/graph.h"
#include "host/ops.h"

typedef struct op_total {
  const char *op;
  size_t commands;
  double ms;
} op_total;

typedef struct cmd_time {
  size_t cmd; /* num_cmds: the optimizer update */
  double ms;
} cmd_time;

static int by_ms_desc(const void *a, const void *b) {
  double x = ((const cmd_time *)a)->ms, y = ((const cmd_time *)b)->ms;
  return (x < y) - (x > y);
}

static int by_total_desc(const void *a, const void *b) {
  double x = ((const op_total *)a)->ms, y = ((const op_total *)b)->ms;
  return (x < y) - (x > y);
}

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static const char *op_of(const mn_session *s, size_t cmd) {
  const cuda_state *st = s->backend_state;
  if (cmd == st->prog.num_cmds) return "optimizer_update";
  return mn_op_name(mn_graph_at(s->plan->graph, st->prog.cmds[cmd].node)->op);
}

static void describe(const cuda_state *st, const mn_session *s, size_t cmd, char *buf,
                     size_t size) {
  if (cmd == st->prog.num_cmds) {
    snprintf(buf, size, "optimizer update (%zu floats)", s->plan->update_bytes / sizeof(float));
    return;
  }
  const mn_cu_cmd *c = &st->prog.cmds[cmd];
  switch (c->kind) {
  case MN_CU_CMD_LAUNCH:
    snprintf(buf, size, "%.90s grid %ux%ux%u", st->prog.kernels[c->kernel].call, c->grid[0],
             c->grid[1], c->grid[2]);
    break;
  case MN_CU_CMD_MATMUL: {
    char epi[48] = "";
    if (c->mm.epilogue != MN_CU_EPI_NONE)
      snprintf(epi, sizeof epi, " %s (%s)", mn_cu_epilogue_name(c->mm.epilogue),
               st->matmuls[cmd].fused ? "fused" : "kernels");
    snprintf(buf, size, "matmul m%lld n%lld k%lld batch %lld%s%s%s%s", (long long)c->mm.m,
             (long long)c->mm.n, (long long)c->mm.k, (long long)c->mm.batch,
             c->mm.trans_a ? " At" : "", c->mm.trans_b ? " Bt" : "",
             c->mm.beta != 0.0f ? " +=C" : "", epi);
    break;
  }
  case MN_CU_CMD_MEMSET: snprintf(buf, size, "memset %zu bytes", c->bytes); break;
  case MN_CU_CMD_COPY: snprintf(buf, size, "copy %zu bytes", c->bytes); break;
  }
}

/* Runs every command once between events; times[i] gets command i's milliseconds. */
static mn_status time_commands(cuda_state *st, mn_session *s, bool update, cudaEvent_t *ev,
                               double *times) {
  size_t n = st->prog.num_cmds + (update ? 1 : 0), fwd_end = mn_cu_forward_end(st, s);
  mn_status rc = mn_cu_check(cudaEventRecord(ev[0], st->stream), "recording an event");
  /* NVTX ranges per phase, for Nsight Compute's --nvtx-include (scripts/profile.sh). */
  mn_nvtx_push("meganeura: forward");
  for (size_t i = 0; rc == MN_OK && i < n; i++) {
    if (i == fwd_end + 1 && i < st->prog.num_cmds) {
      mn_nvtx_pop();
      mn_nvtx_push("meganeura: backward");
    }
    if (i == st->prog.num_cmds) {
      mn_nvtx_pop();
      mn_nvtx_push("meganeura: optimizer");
    }
    rc = i < st->prog.num_cmds ? mn_cu_enqueue_cmd(st, s, i)
                               : mn_cu_enqueue_update(st, s, st->captured_key);
    if (rc == MN_OK) rc = mn_cu_check(cudaEventRecord(ev[i + 1], st->stream), "recording an event");
  }
  mn_nvtx_pop();
  if (rc == MN_OK) rc = mn_cu_check(cudaStreamSynchronize(st->stream), "profiling a step");
  for (size_t i = 0; rc == MN_OK && i < n; i++) {
    float ms = 0;
    rc = mn_cu_check(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "reading an event");
    times[i] = ms;
  }
  return rc;
}

/* The kernel command cmd runs, for the per-kernel table: a launch's template (its call up to
 * the first '<'), "cublasLt" for a product, "memset" or "copy". */
static void kernel_of(const cuda_state *st, size_t cmd, char *buf, size_t size) {
  if (cmd == st->prog.num_cmds) {
    snprintf(buf, size, "optimizer update");
    return;
  }
  const mn_cu_cmd *c = &st->prog.cmds[cmd];
  switch (c->kind) {
  case MN_CU_CMD_LAUNCH: {
    const char *call = st->prog.kernels[c->kernel].call;
    snprintf(buf, size, "%.*s", (int)strcspn(call, "<"), call);
    break;
  }
  case MN_CU_CMD_MATMUL: snprintf(buf, size, "cublasLt"); break;
  case MN_CU_CMD_MEMSET: snprintf(buf, size, "memset"); break;
  case MN_CU_CMD_COPY: snprintf(buf, size, "copy"); break;
  }
}

/* Commands grouped under one name (a kernel template, a product's shape): how many, their time
 * and, for products, their FLOPs. */
typedef struct group_total {
  char name[160];
  size_t commands;
  double ms, flops;
} group_total;

static int by_group_ms_desc(const void *a, const void *b) {
  double x = ((const group_total *)a)->ms, y = ((const group_total *)b)->ms;
  return (x < y) - (x > y);
}

/* Adds one command to the group named `name` among gs[0 .. *num), opening it when new. */
static void group_add(group_total *gs, size_t *num, const char *name, double ms, double flops) {
  size_t k = 0;
  while (k < *num && strcmp(gs[k].name, name) != 0)
    k++;
  if (k == *num) snprintf(gs[(*num)++].name, sizeof gs->name, "%s", name);
  gs[k].commands++;
  gs[k].ms += ms;
  gs[k].flops += flops;
}

/* Every kernel's commands and time, the slowest first: an op lowered to several kernels (a
 * decode layer, attention) shows what each of them costs. */
static void print_kernels(const mn_session *s, const double *med, size_t n, FILE *out) {
  const cuda_state *st = s->backend_state;
  group_total *ks = calloc(n ? n : 1, sizeof *ks);
  if (!ks) return;
  size_t num = 0;
  for (size_t i = 0; i < n; i++) {
    if (i < st->prog.num_cmds && mn_cu_cmd_skipped(st, i)) continue;
    char name[64];
    kernel_of(st, i, name, sizeof name);
    group_add(ks, &num, name, med[i], 0.0);
  }
  qsort(ks, num, sizeof *ks, by_group_ms_desc);
  fprintf(out, "PROFILE %-28s %8s %10s %10s\n", "kernel", "commands", "ms", "us each");
  for (size_t k = 0; k < num && k < 20; k++)
    fprintf(out, "PROFILE %-28s %8zu %10.3f %10.2f\n", ks[k].name, ks[k].commands, ks[k].ms,
            1e3 * ks[k].ms / (double)ks[k].commands);
  free(ks);
}

/* The products grouped by shape (m, n, k, batch, transposes, epilogue): how many, their time and
 * rate, the slowest total first, so that each shape can be set beside what another library
 * reaches on it. */
static void print_products(const mn_session *s, const double *med, FILE *out) {
  const cuda_state *st = s->backend_state;
  size_t n = st->prog.num_cmds;
  group_total *sh = calloc(n ? n : 1, sizeof *sh);
  if (!sh) return;
  size_t num = 0;
  for (size_t i = 0; i < n; i++) {
    const mn_cu_cmd *c = &st->prog.cmds[i];
    if (c->kind != MN_CU_CMD_MATMUL || mn_cu_cmd_skipped(st, i)) continue;
    char what[160];
    describe(st, s, i, what, sizeof what);
    group_add(sh, &num, what, med[i], mn_cu_matmul_flops(&c->mm));
  }
  qsort(sh, num, sizeof *sh, by_group_ms_desc);
  fprintf(out, "PROFILE products by shape:\n");
  for (size_t k = 0; k < num; k++)
    fprintf(out, "PROFILE %8.3f ms %4zux %7.1f TFLOP/s  %s\n", sh[k].ms, sh[k].commands,
            sh[k].ms > 0 ? sh[k].flops / (sh[k].ms * 1e9) : 0.0, sh[k].name);
  free(sh);
}

static void print_report(const mn_session *s, const double *med, size_t n, FILE *out) {
  const cuda_state *st = s->backend_state;
  op_total *ops = calloc(n, sizeof *ops);
  cmd_time *cmds = malloc(n * sizeof *cmds);
  if (!ops || !cmds) {
    free(ops);
    free(cmds);
    return;
  }
  size_t num_ops = 0, num_cmds = 0, fused = 0, unfused = 0;
  double total = 0;
  for (size_t i = 0; i < n; i++) {
    if (i < st->prog.num_cmds && mn_cu_cmd_skipped(st, i)) continue;
    const mn_cu_cmd *c = i < st->prog.num_cmds ? &st->prog.cmds[i] : NULL;
    if (c && c->kind == MN_CU_CMD_MATMUL && c->mm.epilogue != MN_CU_EPI_NONE) {
      fused += st->matmuls[i].fused;
      unfused += !st->matmuls[i].fused;
    }
    const char *op = op_of(s, i);
    size_t k = 0;
    while (k < num_ops && strcmp(ops[k].op, op) != 0)
      k++;
    if (k == num_ops) ops[num_ops++] = (op_total){op, 0, 0};
    ops[k].commands++;
    ops[k].ms += med[i];
    cmds[num_cmds++] = (cmd_time){i, med[i]};
    total += med[i];
  }
  qsort(ops, num_ops, sizeof *ops, by_total_desc);
  qsort(cmds, num_cmds, sizeof *cmds, by_ms_desc);
  fprintf(out, "PROFILE %zu commands, %.3f ms in kernels (sum of medians)\n", num_cmds, total);
  if (fused + unfused > 0)
    fprintf(out, "PROFILE matmul epilogues: %zu fused by cuBLASLt, %zu computed by kernels\n",
            fused, unfused);
  fprintf(out, "PROFILE %-28s %8s %10s %6s\n", "op", "commands", "ms", "%");
  for (size_t k = 0; k < num_ops; k++)
    fprintf(out, "PROFILE %-28s %8zu %10.3f %6.1f\n", ops[k].op, ops[k].commands, ops[k].ms,
            100.0 * ops[k].ms / total);
  print_kernels(s, med, n, out);
  print_products(s, med, out);
  fprintf(out, "PROFILE slowest commands:\n");
  for (size_t i = 0; i < num_cmds && i < 25; i++) {
    char what[160];
    describe(st, s, cmds[i].cmd, what, sizeof what);
    fprintf(out, "PROFILE %8.3f ms  %-22s %s\n", cmds[i].ms, op_of(s, cmds[i].cmd), what);
  }
  free(ops);
  free(cmds);
}

mn_status mn_cuda_profile_step(mn_session *s, int reps, FILE *out) {
  if (!s || s->backend != &mn_cuda_backend || reps < 1 || !out)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_cuda_profile_step: needs a CUDA session, reps >= 1 and an output file");
  cuda_state *st = s->backend_state;
  if (!st->captured)
    return mn_fail(MN_ERR_INVALID_ARGUMENT, "mn_cuda_profile_step: step the session first");
  /* Run eagerly, one rank's collectives would wait for ranks that are not profiling. */
  if (s->dp)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "mn_cuda_profile_step: a data-parallel session's step is not profiled yet");
  mn_status rc = s->backend->wait(s);
  if (rc != MN_OK) return rc;
  bool update = (st->captured_key & 1u) && st->opt_update >= 0;
  size_t n = st->prog.num_cmds + (update ? 1 : 0);
  cudaEvent_t *ev = calloc(n + 1, sizeof *ev);
  double *times = malloc(n * (size_t)reps * sizeof *times);
  double *med = malloc(n * sizeof *med);
  double *col = malloc((size_t)reps * sizeof *col);
  if (!ev || !times || !med || !col) rc = mn_fail(MN_ERR_OUT_OF_MEMORY, "mn_cuda_profile_step");
  size_t created = 0;
  for (; rc == MN_OK && created <= n; created++)
    rc = mn_cu_check(cudaEventCreate(&ev[created]), "creating an event");
  for (int r = 0; rc == MN_OK && r < reps; r++)
    rc = time_commands(st, s, update, ev, times + (size_t)r * n);
  if (rc == MN_OK) {
    for (size_t i = 0; i < n; i++) {
      for (int r = 0; r < reps; r++)
        col[r] = times[(size_t)r * n + i];
      qsort(col, (size_t)reps, sizeof *col, by_double);
      med[i] = col[reps / 2];
    }
    print_report(s, med, n, out);
    mn_cu_peaks peaks;
    rc = mn_cu_measure_peaks(st, &peaks);
    if (rc == MN_OK) mn_cu_print_floors(s, med, n, &peaks, out);
  }
  for (size_t i = 0; i < created; i++)
    cudaEventDestroy(ev[i]);
  free(ev);
  free(times);
  free(med);
  free(col);
  return rc;
}
