/* The distance of each op of a profiled step to its floor: the work of every command (the
 * FLOPs of its products, the bytes its kernel must at least read and write) priced at the
 * card's measured bf16 GEMM rate and copy bandwidth, both measured here in the same run, so
 * the table shows where a step is far from what the hardware allows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/profile_floor.h"
#include "host/error.h"
#include "host/graph.h"
#include "host/ops.h"

/* ------------------------------------------------------------------ the card's peaks */

static mn_status lt(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return MN_OK;
  return mn_fail(MN_ERR_DEVICE, "profile: cuBLASLt %s: %s", what, cublasLtGetStatusString(s));
}

/* The median of 7 timings (after one untimed run) of what `enqueue` puts on the stream. */
typedef mn_status (*timed_work)(cuda_state *st, void *ctx);

static mn_status median_ms(cuda_state *st, cudaEvent_t ev[2], timed_work enqueue, void *ctx,
                           double *median) {
  enum { REPS = 7 };
  double ms[REPS];
  mn_status rc = MN_OK;
  for (int r = -1; rc == MN_OK && r < REPS; r++) {
    rc = mn_cu_check(cudaEventRecord(ev[0], st->stream), "event");
    if (rc == MN_OK) rc = enqueue(st, ctx);
    if (rc == MN_OK) rc = mn_cu_check(cudaEventRecord(ev[1], st->stream), "event");
    if (rc == MN_OK) rc = mn_cu_check(cudaEventSynchronize(ev[1]), "profile: measuring the card");
    float t = 0;
    if (rc == MN_OK) rc = mn_cu_check(cudaEventElapsedTime(&t, ev[0], ev[1]), "event");
    if (rc == MN_OK && r >= 0) ms[r] = t;
  }
  if (rc != MN_OK) return rc;
  for (int i = 1; i < REPS; i++)
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      double x = ms[j];
      ms[j] = ms[j - 1];
      ms[j - 1] = x;
    }
  *median = ms[REPS / 2];
  return MN_OK;
}

typedef struct gemm_work {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t layout;
  cublasLtMatmulAlgo_t algo;
  void *a, *b, *c;
} gemm_work;

static mn_status enqueue_gemm(cuda_state *st, void *ctx) {
  const gemm_work *g = ctx;
  float alpha = 1.0f, beta = 0.0f;
  return lt(cublasLtMatmul(g->handle, g->desc, &alpha, g->a, g->layout, g->b, g->layout, &beta,
                           g->c, g->layout, g->c, g->layout, &g->algo, st->workspace,
                           st->workspace ? st->workspace_bytes : 0, st->stream),
            "matmul");
}

/* One 8192-cubed bf16 product (FP32 accumulation, what the sessions' bf16 products use), in
 * TFLOP/s. */
static mn_status gemm_rate(cuda_state *st, cudaEvent_t ev[2], double *tflops) {
  const int n = 8192;
  size_t bytes = (size_t)n * n * 2;
  gemm_work g = {0};
  cublasLtMatmulPreference_t pref = NULL;
  mn_status rc = mn_cu_check(cudaMalloc(&g.a, bytes), "profile: GEMM operand");
  if (rc == MN_OK) rc = mn_cu_check(cudaMalloc(&g.b, bytes), "profile: GEMM operand");
  if (rc == MN_OK) rc = mn_cu_check(cudaMalloc(&g.c, bytes), "profile: GEMM result");
  /* Small random-looking values: all-zero operands run faster than real data. */
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(g.a, 0x3c, bytes, st->stream), "GEMM fill");
  if (rc == MN_OK) rc = mn_cu_check(cudaMemsetAsync(g.b, 0x3b, bytes, st->stream), "GEMM fill");
  /* A handle of its own: a session without matrix products has none. */
  if (rc == MN_OK) rc = lt(cublasLtCreate(&g.handle), "handle");
  if (rc == MN_OK)
    rc = lt(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  if (rc == MN_OK) rc = lt(cublasLtMatrixLayoutCreate(&g.layout, CUDA_R_16BF, n, n, n), "layout");
  if (rc == MN_OK) rc = lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  if (rc == MN_OK) {
    size_t ws = st->workspace ? st->workspace_bytes : 0;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    rc = lt(cublasLtMatmulAlgoGetHeuristic(g.handle, g.desc, g.layout, g.layout, g.layout, g.layout,
                                           pref, 1, &h, &found),
            "heuristic");
    if (rc == MN_OK && !found) rc = mn_fail(MN_ERR_DEVICE, "profile: no bf16 GEMM algorithm");
    if (rc == MN_OK) g.algo = h.algo;
  }
  double ms = 0;
  if (rc == MN_OK) rc = median_ms(st, ev, enqueue_gemm, &g, &ms);
  if (rc == MN_OK) *tflops = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (g.layout) cublasLtMatrixLayoutDestroy(g.layout);
  if (g.desc) cublasLtMatmulDescDestroy(g.desc);
  if (g.handle) cublasLtDestroy(g.handle);
  cudaFree(g.a);
  cudaFree(g.b);
  cudaFree(g.c);
  return rc;
}

typedef struct copy_work {
  void *src, *dst;
  size_t bytes;
} copy_work;

static mn_status enqueue_copy(cuda_state *st, void *ctx) {
  const copy_work *c = ctx;
  return mn_cu_check(
      cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, st->stream), "copy");
}

/* A 1 GiB device-to-device copy: bytes read plus bytes written per second. */
static mn_status copy_rate(cuda_state *st, cudaEvent_t ev[2], double *tbps) {
  copy_work c = {.bytes = (size_t)1 << 30};
  mn_status rc = mn_cu_check(cudaMalloc(&c.src, c.bytes), "profile: copy source");
  if (rc == MN_OK) rc = mn_cu_check(cudaMalloc(&c.dst, c.bytes), "profile: copy target");
  double ms = 0;
  if (rc == MN_OK) rc = median_ms(st, ev, enqueue_copy, &c, &ms);
  if (rc == MN_OK) *tbps = 2.0 * (double)c.bytes / (ms * 1e-3) / 1e12;
  cudaFree(c.src);
  cudaFree(c.dst);
  return rc;
}

mn_status mn_cu_measure_peaks(cuda_state *st, mn_cu_peaks *out) {
  cudaEvent_t ev[2] = {NULL, NULL};
  mn_status rc = mn_cu_check(cudaEventCreate(&ev[0]), "creating an event");
  if (rc == MN_OK) rc = mn_cu_check(cudaEventCreate(&ev[1]), "creating an event");
  if (rc == MN_OK) rc = gemm_rate(st, ev, &out->gemm_tflops);
  if (rc == MN_OK) rc = copy_rate(st, ev, &out->copy_tbps);
  for (int i = 0; i < 2; i++)
    if (ev[i]) cudaEventDestroy(ev[i]);
  return rc;
}

/* ------------------------------------------------------------------ the work of a command */

/* Bytes of node id's value as the session stores it (bf16 values take 2 bytes each). */
static double stored_bytes(const mn_plan *p, mn_node id) {
  const mn_node_rec *n = &p->graph->nodes[id];
  double numel = (double)mn_tensor_type_numel(&n->type);
  mn_dtype storage = p->buffers[p->node_buffer[id]].storage;
  return numel * (double)mn_dtype_size(storage);
}

/* Matrix-product units of an attention kernel: each is one [Tq, d] x [d, Tk] product per
 * head (the statistics pass, P V, dP, dS K, ...). */
static int attention_products(mn_op op) {
  switch (op) {
  case MN_OP_CAUSAL_ATTENTION:
  case MN_OP_FULL_ATTENTION:
  case MN_OP_CROSS_ATTENTION:
  case MN_OP_CAUSAL_ATTENTION_PACKED:
  case MN_OP_QKV_CAUSAL_ATTENTION: return 2;
  case MN_OP_QKV_ATTENTION_GRAD_SAVED: return 7; /* dQ's 3 and dK | dV's 4 */
  case MN_OP_ATTENTION_GRAD_KV:
  case MN_OP_ATTENTION_GRAD_KV_SAVED:
  case MN_OP_PACKED_ATTENTION_GRAD_KV:
  case MN_OP_PACKED_ATTENTION_GRAD_KV_SAVED: return 4;
  case MN_OP_ATTENTION_GRAD_Q:
  case MN_OP_ATTENTION_GRAD_Q_SAVED:
  case MN_OP_ATTENTION_GRAD_K:
  case MN_OP_PACKED_ATTENTION_GRAD_Q:
  case MN_OP_PACKED_ATTENTION_GRAD_Q_SAVED:
  case MN_OP_PACKED_ATTENTION_GRAD_K: return 3;
  case MN_OP_ATTENTION_GRAD_V:
  case MN_OP_PACKED_ATTENTION_GRAD_V: return 2;
  default: return 0;
  }
}

/* The FLOPs of an attention node: q [.., Tq, H*d], k [.., Tk, KVH*d] (the qkv ops: their
 * input 0 holds both); causal masks skip half of each product (the variant of a backward op
 * says whether its forward was causal). */
static double attention_flops(const mn_graph *g, const mn_node_rec *n) {
  int units = attention_products(n->op);
  bool qkv = n->op == MN_OP_QKV_CAUSAL_ATTENTION || n->op == MN_OP_QKV_ATTENTION_GRAD_SAVED;
  if (!units || (n->num_inputs < 2 && !qkv)) return 0;
  const mn_tensor_type *q = &g->nodes[n->inputs[0]].type;
  const mn_tensor_type *k = qkv ? q : &g->nodes[n->inputs[1]].type;
  int heads = n->attrs.num_heads, d = n->attrs.head_dim;
  if (heads <= 0 || d <= 0 || q->rank < 2 || k->rank < 2) return 0;
  double rows = (double)mn_tensor_type_numel(q) / (double)q->shape[q->rank - 1]; /* batch * Tq */
  double tk = (double)k->shape[k->rank - 2];
  bool causal = n->op == MN_OP_CAUSAL_ATTENTION || n->op == MN_OP_CAUSAL_ATTENTION_PACKED || qkv ||
                mn_op_is_packed_attention_grad(n->op) ||
                ((mn_op_flags(n->op) & MN_OPF_BACKWARD) && n->attrs.variant == 1);
  return units * 2.0 * rows * heads * tk * d * (causal ? 0.5 : 1.0);
}

/* The FLOPs of a product node that runs as a kernel of ours (a skinny product, lower_skinny.h)
 * rather than as a cuBLASLt command, which counts its own; 0 for other nodes. */
static double own_product_flops(const cuda_state *st, const mn_graph *g, mn_node id) {
  const mn_node_rec *n = &g->nodes[id];
  bool at = n->op == MN_OP_MATMUL_AT;
  if (!at && n->op != MN_OP_MATMUL && n->op != MN_OP_MATMUL_BT && n->op != MN_OP_MATMUL_BIAS_ACT &&
      n->op != MN_OP_MATMUL_DRELU && n->op != MN_OP_MATMUL_DRELU_BGRAD)
    return 0;
  for (size_t i = 0; i < st->prog.num_cmds; i++)
    if (st->prog.cmds[i].node == id && st->prog.cmds[i].kind == MN_CU_CMD_MATMUL) return 0;
  const mn_tensor_type *a = &g->nodes[n->inputs[0]].type;
  double last = a->rank ? (double)a->shape[a->rank - 1] : 1.0;
  double k = at ? (last > 0 ? (double)mn_tensor_type_numel(a) / last : 0) : last;
  return 2.0 * (double)mn_tensor_type_numel(&n->type) * k;
}

void mn_cu_command_work(const cuda_state *st, const mn_session *s, size_t cmd, bool first_of_node,
                        double *flops, double *bytes) {
  *flops = 0;
  *bytes = 0;
  const mn_plan *p = s->plan;
  if (cmd >= st->prog.num_cmds) { /* the optimizer: params, grads and two moments, in and out */
    *bytes = (double)p->update_bytes * 7.0;
    return;
  }
  const mn_cu_cmd *c = &st->prog.cmds[cmd];
  if (c->kind == MN_CU_CMD_MATMUL) *flops = mn_cu_matmul_flops(&c->mm);
  if (c->kind == MN_CU_CMD_MEMSET) {
    *bytes = (double)c->bytes;
    return;
  }
  if (c->kind == MN_CU_CMD_COPY) {
    *bytes = 2.0 * (double)c->bytes;
    return;
  }
  if (!first_of_node) return;
  const mn_node_rec *n = &p->graph->nodes[c->node];
  if (c->kind == MN_CU_CMD_LAUNCH)
    *flops = attention_flops(p->graph, n) + own_product_flops(st, p->graph, c->node);
  for (int i = 0; i < n->num_inputs; i++)
    *bytes += stored_bytes(p, n->inputs[i]);
  *bytes += stored_bytes(p, c->node);
  for (int k = 1; k <= mn_node_num_extra_outputs(n); k++)
    *bytes += stored_bytes(p, mn_plan_extra_output(p, c->node, k));
}

/* ------------------------------------------------------------------ the table */

typedef struct floor_row {
  const char *op;
  size_t commands;
  double ms, floor_ms, flops, bytes;
} floor_row;

static int by_gap_desc(const void *a, const void *b) {
  const floor_row *x = a, *y = b;
  double gx = x->ms - x->floor_ms, gy = y->ms - y->floor_ms;
  return (gx < gy) - (gx > gy);
}

static const char *op_name(const cuda_state *st, const mn_session *s, size_t cmd) {
  if (cmd == st->prog.num_cmds) return "optimizer_update";
  return mn_op_name(mn_graph_at(s->plan->graph, st->prog.cmds[cmd].node)->op);
}

size_t mn_cu_forward_end(const cuda_state *st, const mn_session *s) {
  const mn_plan *p = s->plan;
  if (p->loss == MN_NO_NODE) return st->prog.num_cmds;
  mn_node writer = p->loss;
  if (mn_op_flags(p->graph->nodes[writer].op) & MN_OPF_EXTRA_OUTPUT)
    writer = p->graph->nodes[writer].inputs[0];
  size_t end = st->prog.num_cmds;
  for (size_t i = 0; i < st->prog.num_cmds; i++)
    if (st->prog.cmds[i].node == writer) end = i;
  return end;
}

void mn_cu_print_floors(const mn_session *s, const double *med, size_t n, const mn_cu_peaks *pk,
                        FILE *out) {
  const cuda_state *st = s->backend_state;
  floor_row *rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows) return;
  size_t num = 0, fwd_end = mn_cu_forward_end(st, s);
  double phase_ms[3] = {0}, phase_floor[3] = {0}, total = 0, total_floor = 0;
  mn_node last_node = MN_NO_NODE;
  for (size_t i = 0; i < n; i++) {
    if (i < st->prog.num_cmds && mn_cu_cmd_skipped(st, i)) continue;
    bool first = i >= st->prog.num_cmds || st->prog.cmds[i].node != last_node;
    if (i < st->prog.num_cmds) last_node = st->prog.cmds[i].node;
    double flops, bytes;
    mn_cu_command_work(st, s, i, first, &flops, &bytes);
    double fl = fmax(flops / (pk->gemm_tflops * 1e12), bytes / (pk->copy_tbps * 1e12)) * 1e3;
    const char *op = op_name(st, s, i);
    size_t k = 0;
    while (k < num && strcmp(rows[k].op, op) != 0)
      k++;
    if (k == num) rows[num++] = (floor_row){.op = op};
    rows[k].commands++;
    rows[k].ms += med[i];
    rows[k].floor_ms += fl;
    rows[k].flops += flops;
    rows[k].bytes += bytes;
    int phase = i >= st->prog.num_cmds ? 2 : i <= fwd_end ? 0 : 1;
    phase_ms[phase] += med[i];
    phase_floor[phase] += fl;
    total += med[i];
    total_floor += fl;
  }
  qsort(rows, num, sizeof *rows, by_gap_desc);
  fprintf(out,
          "FLOOR measured now: bf16 GEMM %.0f TFLOP/s (8192^3), copy %.2f TB/s (1 GiB, read + "
          "write)\n",
          pk->gemm_tflops, pk->copy_tbps);
  fprintf(out, "FLOOR %-28s %8s %9s %9s %7s %9s %8s\n", "op", "commands", "ms", "floor ms",
          "x floor", "TFLOP/s", "TB/s");
  for (size_t k = 0; k < num; k++) {
    const floor_row *r = &rows[k];
    double sec = r->ms * 1e-3;
    fprintf(out, "FLOOR %-28s %8zu %9.3f %9.3f %7.1f %9.1f %8.2f\n", r->op, r->commands, r->ms,
            r->floor_ms, r->floor_ms > 0 ? r->ms / r->floor_ms : 0.0,
            sec > 0 ? r->flops / sec / 1e12 : 0.0, sec > 0 ? r->bytes / sec / 1e12 : 0.0);
  }
  const char *names[3] = {"forward (to the loss)", "backward", "optimizer"};
  for (int ph = 0; ph < 3; ph++)
    fprintf(out, "FLOOR phase %-22s %9.3f ms, floor %9.3f ms\n", names[ph], phase_ms[ph],
            phase_floor[ph]);
  fprintf(out, "FLOOR total %9.3f ms in kernels, floor %9.3f ms (%.1fx)\n", total, total_floor,
          total_floor > 0 ? total / total_floor : 0.0);
  free(rows);
}
