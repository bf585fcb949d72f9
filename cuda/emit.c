/* The emitter: lowering functions append commands and declare kernel instances here. */
#include "cuda/emit.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernel_sources.h"
#include "cuda/loss_scale.h"
#include "host/error.h"
#include "host/storage.h"

static bool grow(void **items, size_t *cap, size_t need, size_t item_size) {
  if (need <= *cap) return true;
  size_t cap2 = *cap ? *cap * 2 : 64;
  while (cap2 < need)
    cap2 *= 2;
  void *p = realloc(*items, cap2 * item_size);
  if (!p) return false;
  *items = p;
  *cap = cap2;
  return true;
}

const char *mn_cu_epilogue_name(mn_cu_epilogue e) {
  switch (e) {
  case MN_CU_EPI_BIAS: return "bias";
  case MN_CU_EPI_BIAS_RELU: return "bias+relu";
  case MN_CU_EPI_BIAS_GELU: return "bias+gelu";
  case MN_CU_EPI_DGELU: return "dgelu";
  case MN_CU_EPI_BGRAD_A: return "bgrad of A";
  case MN_CU_EPI_BGRAD_B: return "bgrad of B";
  case MN_CU_EPI_NONE: break;
  }
  return "none";
}

mn_status mn_cu_oom(const mn_cu_op_ctx *c) {
  return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory lowering node %u (%s)",
                 c->id, mn_op_name(c->node->op));
}

int mn_cu_low_storage(const mn_plan *p) {
  switch (p->precision) {
  case MN_PRECISION_BF16: return MN_DEV_BF16;
  case MN_PRECISION_F16: return MN_DEV_F16;
  default: return MN_DEV_F32;
  }
}

int mn_cu_arg_storage(const mn_plan *p, mn_cu_arg a) {
  switch (a.kind) {
  case MN_CU_ARG_NODE:
    switch (mn_plan_buffer_of(p, a.node)->storage) {
    case MN_BF16: return MN_DEV_BF16;
    case MN_F16: return MN_DEV_F16;
    default: return MN_DEV_F32;
    }
  case MN_CU_ARG_SHADOW:
  case MN_CU_ARG_STAGE: return mn_cu_low_storage(p);
  default: return MN_DEV_F32;
  }
}

int64_t mn_cu_row_pitch(const mn_plan *p, mn_node n) {
  const mn_tensor_type *t = &p->graph->nodes[n].type;
  int64_t pitch = mn_plan_buffer_of(p, n)->pitch;
  return pitch ? pitch : t->shape[t->rank - 1];
}

size_t mn_cu_stored_offset(const mn_plan *p, mn_cu_arg a) {
  bool halved = (a.kind == MN_CU_ARG_NODE || a.kind == MN_CU_ARG_SHADOW) &&
                mn_cu_arg_storage(p, a) != MN_DEV_F32;
  return halved ? a.offset / 2 : a.offset;
}

int mn_cu_kernel(const mn_cu_op_ctx *c, unsigned block, const char *fmt, ...) {
  char call[512];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(call, sizeof call, fmt, ap);
  va_end(ap);
  if (len < 0 || (size_t)len >= sizeof call) return -1;
  mn_cu_program *prog = c->prog;
  for (size_t i = 0; i < prog->num_kernels; i++)
    if (prog->kernels[i].block == block && strcmp(prog->kernels[i].call, call) == 0) return (int)i;
  if (!grow((void **)&prog->kernels, &prog->cap_kernels, prog->num_kernels + 1,
            sizeof *prog->kernels))
    return -1;
  char *copy = strdup(call);
  if (!copy) return -1;
  prog->kernels[prog->num_kernels] = (mn_cu_kernel_desc){.call = copy, .block = block};
  return (int)prog->num_kernels++;
}

int mn_cu_instance(mn_cu_program *prog, int k, unsigned storage) {
  const mn_cu_kernel_desc *kd = &prog->kernels[k];
  if (kd->storage == storage) return k;
  for (size_t i = 0; i < prog->num_kernels; i++)
    if (prog->kernels[i].block == kd->block && prog->kernels[i].storage == storage &&
        strcmp(prog->kernels[i].call, kd->call) == 0)
      return (int)i;
  if (!grow((void **)&prog->kernels, &prog->cap_kernels, prog->num_kernels + 1,
            sizeof *prog->kernels))
    return -1;
  kd = &prog->kernels[k];
  char *copy = strdup(kd->call);
  if (!copy) return -1;
  prog->kernels[prog->num_kernels] = (mn_cu_kernel_desc){.call = copy,
                                                         .block = kd->block,
                                                         .storage = storage,
                                                         .overlaps = kd->overlaps,
                                                         .waits_at_entry = kd->waits_at_entry,
                                                         .min_blocks = kd->min_blocks};
  return (int)prog->num_kernels++;
}

/* Kernel k and every storage instance of its call (the same call and block). */
static bool same_call(const mn_cu_program *prog, size_t i, int k) {
  return prog->kernels[i].block == prog->kernels[k].block &&
         strcmp(prog->kernels[i].call, prog->kernels[k].call) == 0;
}

void mn_cu_kernel_overlaps(const mn_cu_op_ctx *c, int k) {
  for (size_t i = 0; i < c->prog->num_kernels; i++)
    if (same_call(c->prog, i, k)) c->prog->kernels[i].overlaps = true;
}

void mn_cu_program_overlap_small_step(mn_cu_program *prog, const mn_plan *p, bool training) {
  if (!training || !mn_cu_small_step(prog, p)) return;
  for (size_t i = 0; i < prog->num_kernels; i++)
    if (!prog->kernels[i].overlaps)
      prog->kernels[i].overlaps = prog->kernels[i].waits_at_entry = true;
}

void mn_cu_kernel_min_blocks(const mn_cu_op_ctx *c, int k, unsigned blocks) {
  for (size_t i = 0; i < c->prog->num_kernels; i++)
    if (same_call(c->prog, i, k)) c->prog->kernels[i].min_blocks = blocks;
}

int mn_cu_kernel_generated(const mn_cu_op_ctx *c, unsigned block, const char *code,
                           const char *targs) {
  mn_cu_program *prog = c->prog;
  size_t j = 0;
  while (j < prog->num_generated && strcmp(prog->generated[j], code) != 0)
    j++;
  if (j == prog->num_generated) {
    if (!grow((void **)&prog->generated, &prog->cap_generated, j + 1, sizeof *prog->generated))
      return -1;
    if (!(prog->generated[j] = strdup(code))) return -1;
    prog->num_generated++;
  }
  return mn_cu_kernel(c, block, "mn_gen%zu%s", j, targs);
}

static mn_cu_cmd *append(const mn_cu_op_ctx *c, mn_cu_cmd_kind kind) {
  mn_cu_program *prog = c->prog;
  if (!grow((void **)&prog->cmds, &prog->cap_cmds, prog->num_cmds + 1, sizeof *prog->cmds))
    return NULL;
  mn_cu_cmd *cmd = &prog->cmds[prog->num_cmds++];
  memset(cmd, 0, sizeof *cmd);
  cmd->kind = kind;
  cmd->node = c->id;
  return cmd;
}

mn_status mn_cu_launch(const mn_cu_op_ctx *c, int k, unsigned gx, unsigned gy, unsigned gz,
                       size_t smem, int nargs, const mn_cu_arg *args) {
  if (k < 0) return mn_cu_oom(c);
  if (nargs < 0 || nargs > MN_CU_MAX_ARGS || gx == 0 || gy == 0 || gz == 0)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "cuda backend: bad launch for node %u (%s): %d arguments, grid %ux%ux%u", c->id,
                   mn_op_name(c->node->op), nargs, gx, gy, gz);
  unsigned storage = 0;
  for (int i = 0; i < nargs; i++)
    storage |= (unsigned)mn_cu_arg_storage(c->plan, args[i]) << (MN_DEV_STORAGE_BITS * i);
  if ((k = mn_cu_instance(c->prog, k, storage)) < 0) return mn_cu_oom(c);
  mn_cu_cmd *cmd = append(c, MN_CU_CMD_LAUNCH);
  if (!cmd) return mn_cu_oom(c);
  cmd->kernel = (uint32_t)k;
  cmd->grid[0] = gx;
  cmd->grid[1] = gy;
  cmd->grid[2] = gz;
  cmd->smem = smem;
  cmd->num_args = nargs;
  for (int i = 0; i < nargs; i++)
    cmd->args[i] = args[i];
  return MN_OK;
}

/* n values from src into dst, converted between their storage types (8 a thread). */
static mn_status convert(const mn_cu_op_ctx *c, mn_cu_arg dst, mn_cu_arg src, int64_t n) {
  int k = mn_cu_kernel(c, 256, "mn_convert<%lldLL>", (long long)n);
  unsigned blocks = mn_cu_blocks((n + 7) / 8, 256);
  mn_cu_arg args[2] = {dst, src};
  return mn_cu_launch(c, k, blocks < 4096 ? blocks : 4096, 1, 1, 0, 2, args);
}

mn_status mn_cu_low_operand(const mn_cu_op_ctx *c, mn_cu_arg *a, int64_t rows, int64_t cols,
                            int64_t ld, int64_t batch, int64_t stride) {
  if (mn_cu_arg_storage(c->plan, *a) != MN_DEV_F32) return MN_OK;
  if (a->kind == MN_CU_ARG_NODE && mn_plan_buffer_of(c->plan, a->node)->role == MN_BUF_PARAMETER) {
    a->kind = MN_CU_ARG_SHADOW;
    return MN_OK;
  }
  int64_t extent = (batch > 1 ? (batch - 1) * stride : 0) + (rows - 1) * (ld ? ld : cols) + cols;
  mn_cu_arg staged = mn_cu_stage(c, (size_t)extent * 2);
  mn_status st = convert(c, staged, *a, extent);
  *a = staged;
  return st;
}

mn_cu_arg mn_cu_stage(const mn_cu_op_ctx *c, size_t bytes) {
  mn_cu_program *prog = c->prog;
  mn_cu_arg a = {.kind = MN_CU_ARG_STAGE, .offset = prog->stage_cursor};
  prog->stage_cursor += (bytes + 255) / 256 * 256;
  if (prog->stage_cursor > prog->stage_bytes) prog->stage_bytes = prog->stage_cursor;
  return a;
}

mn_status mn_cu_matmul(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d) {
  mn_cu_matmul_desc mm = *d;
  if (mm.batch < 1) mm.batch = 1;
  if (mn_cu_low_storage(c->plan) != MN_DEV_F32) {
    mn_status st = mn_cu_low_operand(c, &mm.a, mm.trans_a ? mm.k : mm.m, mm.trans_a ? mm.m : mm.k,
                                     mm.lda, mm.batch, mm.stride_a);
    if (st == MN_OK)
      st = mn_cu_low_operand(c, &mm.b, mm.trans_b ? mm.n : mm.k, mm.trans_b ? mm.k : mm.n, mm.ldb,
                             mm.batch, mm.stride_b);
    if (st != MN_OK) return st;
  }
  mn_cu_cmd *cmd = append(c, MN_CU_CMD_MATMUL);
  if (!cmd) return mn_cu_oom(c);
  cmd->mm = mm;
  return MN_OK;
}

/* bytes of fp32 values as dst stores them. */
static size_t stored_bytes(const mn_cu_op_ctx *c, mn_cu_arg dst, size_t bytes) {
  return mn_cu_arg_storage(c->plan, dst) == MN_DEV_F32 ? bytes : bytes / 2;
}

mn_status mn_cu_memset_zero(const mn_cu_op_ctx *c, mn_cu_arg dst, size_t bytes) {
  mn_cu_cmd *cmd = append(c, MN_CU_CMD_MEMSET);
  if (!cmd) return mn_cu_oom(c);
  cmd->args[0] = dst;
  cmd->num_args = 1;
  cmd->bytes = stored_bytes(c, dst, bytes);
  return MN_OK;
}

mn_status mn_cu_copy(const mn_cu_op_ctx *c, mn_cu_arg dst, mn_cu_arg src, size_t bytes) {
  if (mn_cu_arg_storage(c->plan, dst) != mn_cu_arg_storage(c->plan, src))
    return convert(c, dst, src, (int64_t)(bytes / sizeof(float)));
  bytes = stored_bytes(c, dst, bytes);
  mn_cu_cmd *cmd = append(c, MN_CU_CMD_COPY);
  if (!cmd) return mn_cu_oom(c);
  cmd->args[0] = dst;
  cmd->args[1] = src;
  cmd->num_args = 2;
  cmd->bytes = bytes;
  return MN_OK;
}

mn_cu_arg mn_cu_scratch(const mn_cu_op_ctx *c, size_t bytes) {
  bytes = (bytes + 255) / 256 * 256;
  if (bytes > c->prog->scratch_bytes) c->prog->scratch_bytes = bytes;
  return (mn_cu_arg){.kind = MN_CU_ARG_SCRATCH};
}

void mn_cu_fallback_scratch(mn_cu_matmul_desc *d, size_t bytes) {
  d->c_fallback = (mn_cu_arg){.kind = MN_CU_ARG_SCRATCH};
  d->fallback_scratch = (bytes + 255) / 256 * 256;
}

size_t mn_cu_program_scratch_bytes(const mn_cu_program *prog, const bool *fused) {
  size_t bytes = prog->scratch_bytes;
  for (size_t i = 0; i < prog->num_cmds; i++) {
    const mn_cu_cmd *cmd = &prog->cmds[i];
    if (cmd->kind != MN_CU_CMD_MATMUL || cmd->mm.fallback_scratch <= bytes) continue;
    if (!fused || !fused[i] || cmd->mm.epilogue == MN_CU_EPI_NONE) bytes = cmd->mm.fallback_scratch;
  }
  return bytes;
}

mn_status mn_cu_program_build(const mn_plan *p, bool allow_tf32, mn_cu_program *out) {
  memset(out, 0, sizeof *out);
  for (size_t d = 0; d < p->num_dispatches; d++) {
    mn_node id = p->dispatches[d].node;
    const mn_node_rec *node = &p->graph->nodes[id];
    mn_cu_op_ctx c = {
        .prog = out, .plan = p, .g = p->graph, .id = id, .node = node, .allow_tf32 = allow_tf32};
    out->stage_cursor = 0;
    mn_status st = mn_cu_lowerers[node->op](&c);
    if (st != MN_OK) {
      mn_cu_program_free(out);
      return st;
    }
  }
  return MN_OK;
}

mn_status mn_cu_program_add_loss_scaler(mn_cu_program *prog, const mn_plan *p, bool training,
                                        int *begin, int *unscale, int *end) {
  *begin = *unscale = *end = -1;
  if (!training || p->loss_scale == MN_NO_NODE) return MN_OK;
  mn_cu_op_ctx c = {.prog = prog, .plan = p, .g = p->graph, .id = 0, .node = p->graph->nodes};
  long long n = (long long)(p->update_bytes / sizeof(float));
  *begin = mn_cu_kernel(&c, MN_CU_SCALER_BLOCK, "mn_scaler_begin");
  *unscale = n > 0 ? mn_cu_kernel(&c, 256, "mn_scaler_unscale<%lldLL>", n) : -2;
  *end = mn_cu_kernel(&c, MN_CU_SCALER_BLOCK, "mn_scaler_end<%uu>", MN_LOSS_SCALE_INTERVAL);
  if (*begin < 0 || *unscale == -1 || *end < 0)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  if (*unscale < 0) *unscale = -1; /* no gradient to unscale */
  return MN_OK;
}

mn_status mn_cu_program_add_readback(mn_cu_program *prog, const mn_plan *p, int *kernel) {
  mn_cu_op_ctx c = {.prog = prog, .plan = p, .g = p->graph, .id = 0, .node = p->graph->nodes};
  *kernel = mn_cu_kernel(&c, MN_CU_READBACK_BLOCK, "mn_step_readback");
  return *kernel < 0 ? mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory") : MN_OK;
}

mn_status mn_cu_program_add_optimizer(mn_cu_program *prog, const mn_plan *p, bool training,
                                      int *sumsq, int *update, int *accumulate) {
  *sumsq = *update = *accumulate = -1;
  int begin, unscale, end;
  mn_status st = mn_cu_program_add_loss_scaler(prog, p, training, &begin, &unscale, &end);
  if (st != MN_OK) return st;
  if (!training || p->update_bytes == 0) return MN_OK;
  mn_cu_op_ctx c = {.prog = prog, .plan = p, .g = p->graph, .id = 0, .node = p->graph->nodes};
  long long n = (long long)(p->update_bytes / sizeof(float));
  *sumsq = mn_cu_kernel(&c, 256, "mn_opt_sumsq<256, %lldLL>", n);
  *update = mn_cu_kernel(&c, 256, "mn_opt_update<256, %lldLL, %d>", n, MN_CU_NORM_BLOCKS);
  if (*update >= 0 && mn_cu_low_storage(p) != MN_DEV_F32)
    *update =
        mn_cu_instance(prog, *update, (unsigned)mn_cu_low_storage(p) << (MN_DEV_STORAGE_BITS * 7));
  *accumulate = mn_cu_kernel(&c, 256, "mn_opt_accumulate<%lldLL>", n);
  if (*sumsq < 0 || *update < 0 || *accumulate < 0)
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of host memory");
  return MN_OK;
}

void mn_cu_program_free(mn_cu_program *prog) {
  for (size_t i = 0; i < prog->num_kernels; i++)
    free(prog->kernels[i].call);
  free(prog->kernels);
  for (size_t i = 0; i < prog->num_generated; i++)
    free(prog->generated[i]);
  free(prog->generated);
  free(prog->cmds);
  memset(prog, 0, sizeof *prog);
}

typedef struct strbuf {
  char *s;
  size_t len, cap;
  bool failed;
} strbuf;

static void sb_append(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_append(strbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !grow((void **)&b->s, &b->cap, b->len + (size_t)n + 1, 1)) {
    b->failed = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

char *mn_cu_program_source(const mn_cu_program *prog) {
  strbuf b = {0};
  for (size_t i = 0; i < mn_cu_num_kernel_sources; i++)
    sb_append(&b, "// ---- %s\n%s\n", mn_cu_kernel_sources[i].name, mn_cu_kernel_sources[i].text);
  for (size_t i = 0; i < prog->num_generated; i++)
    sb_append(&b, "// ---- generated %zu\n#define MN_GEN mn_gen%zu\n%s\n#undef MN_GEN\n", i, i,
              prog->generated[i]);
  sb_append(&b, "// ---- instances\n");
  for (size_t i = 0; i < prog->num_kernels; i++) {
    const mn_cu_kernel_desc *kd = &prog->kernels[i];
    char bounds[32];
    if (kd->min_blocks)
      snprintf(bounds, sizeof bounds, "%u, %u", kd->block, kd->min_blocks);
    else
      snprintf(bounds, sizeof bounds, "%u", kd->block);
    sb_append(&b,
              "extern \"C\" __global__ void __launch_bounds__(%s) mn_k%zu(mn_ptrs io) { "
              "%s%s(mn_io<0x%xu>{io}); }\n",
              bounds, i, kd->waits_at_entry ? "mn_overlap_wait(); " : "", kd->call, kd->storage);
  }
  if (b.failed) {
    free(b.s);
    return NULL;
  }
  return b.s;
}
