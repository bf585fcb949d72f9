/* Lowering of the matrix products (cuBLASLt) and the element-wise ops (mn_pw_map of
 * cuda/kernels/pointwise.cuh, one instance per row of host/pointwise.h and size). */
#include <stdlib.h>
#include <string.h>

#include "cuda/emit.h"
#include "cuda/lower_skinny.h"
#include "host/error.h"
#include "host/pointwise.h"

#define PW_BLOCK 256
/* Enough blocks to fill an H200 several times over; larger tensors grid-stride. */
#define PW_MAX_BLOCKS 4096

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* cuBLASLt keeps a matrix whose rows are not a multiple of 16 bytes off its fast kernels.
 * Measured on GPT-2's 50257-wide logits (H200, TF32, docs/performance.md): copying the
 * transposed A of matmul_at into scratch with a padded row pitch took that product from
 * 10.5 to 6.1 ms for a 2.4 ms copy; padding A of matmul (9.6 ms) or C of matmul_bt
 * (9.3 ms) alone did not speed them up at all: their n or k stayed 50257. Padded logits
 * (pad_head_product below) pad n and k too and do pay, 9.3 -> 3.2-3.4 ms on an H100; this copy
 * is for a large matmul_at whose A has no pitch of its own. */
#define PAD_MIN_FLOPS   4e9
#define PAD_PITCH       32 /* floats: 128-byte rows */
#define COPY_BLOCK      256
#define COPY_MAX_BLOCKS 4096

typedef struct pad_plan {
  int64_t rows, cols, pitch;
} pad_plan;

static bool wants_pad(int64_t cols, double flops) {
  return cols % 4 != 0 && flops >= PAD_MIN_FLOPS;
}

/* Rows of `cols` floats from src into rows of `pitch` floats at dst, zeros after: 4 values an
 * access where both widths allow it (the head's table of 768-wide rows). */
static mn_status copy_rows(const mn_cu_op_ctx *c, const pad_plan *p, mn_cu_arg src, mn_cu_arg dst) {
  int64_t vec = p->pitch % 4 == 0 && p->cols % 4 == 0 ? 4 : 1;
  int k =
      mn_cu_kernel(c, COPY_BLOCK, "mn_slice_last_bwd<%d, %lldLL, %lldLL, %lldLL, 0LL>", (int)vec,
                   (long long)p->rows, (long long)(p->pitch / vec), (long long)(p->cols / vec));
  if (k < 0) return mn_cu_oom(c);
  unsigned blocks = mn_cu_blocks(p->rows * p->pitch / vec, COPY_BLOCK);
  if (blocks > COPY_MAX_BLOCKS) blocks = COPY_MAX_BLOCKS;
  mn_cu_arg args[2] = {src, dst};
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 2, args);
}

/* b, stored [rows, cols], as [prows, pcols] with zeros after: in the low-precision staging, or
 * in an fp32 session in scratch from byte *scratch_at on (which it moves past the copy). */
static mn_status padded_copy(const mn_cu_op_ctx *c, mn_cu_arg *b, int64_t rows, int64_t cols,
                             int64_t prows, int64_t pcols, size_t *scratch_at) {
  bool low = mn_cu_low_storage(c->plan) != MN_DEV_F32;
  size_t value = low ? 2 : sizeof(float), cells = (size_t)(prows * pcols);
  mn_cu_arg dst;
  if (low) {
    dst = mn_cu_stage(c, cells * value);
  } else {
    dst = mn_cu_scratch(c, *scratch_at + cells * value);
    dst.offset = *scratch_at;
    *scratch_at += (cells * value + 255) / 256 * 256;
  }
  pad_plan pp = {rows, cols, pcols};
  mn_status st = copy_rows(c, &pp, *b, dst);
  if (st == MN_OK && prows > rows) {
    mn_cu_arg tail = dst;
    tail.offset += (size_t)(rows * pcols) * value;
    st = mn_cu_memset_zero(c, tail, (size_t)((prows - rows) * pcols) * sizeof(float));
  }
  *b = dst;
  return st;
}

/* Padded logits (mn_cu_pitch_rows): the product that makes them computes the pad columns
 * as well, zeros from a zero-padded copy of b, and the product that reads their gradient
 * along k sums over the pad (zeros there too), so cuBLASLt multiplies aligned shapes; GPT-2's
 * head products at n or k = 50257 ran at a fraction of the aligned rate. */
static mn_status pad_head_product(const mn_cu_op_ctx *c, mn_cu_matmul_desc *d) {
  mn_status st = MN_OK;
  size_t scratch_at = 0;
  if (d->ldc > d->n) {
    int64_t p = d->ldc;
    st = d->trans_b ? padded_copy(c, &d->b, d->n, d->k, p, d->k, &scratch_at)
                    : padded_copy(c, &d->b, d->k, d->n, d->k, p, &scratch_at);
    d->n = p;
    d->ldb = 0;
  }
  if (st == MN_OK && !d->trans_a && d->lda > d->k) {
    int64_t p = d->lda;
    st = d->trans_b ? padded_copy(c, &d->b, d->n, d->k, d->n, p, &scratch_at)
                    : padded_copy(c, &d->b, d->k, d->n, p, d->n, &scratch_at);
    d->k = p;
    d->ldb = 0;
  }
  return st;
}

/* Rows of the product that cuBLASLt computes apart when A^T's m is not a multiple of this. */
#define SPLIT_ROWS 16

/* matmul_at of padded logits' gradient (GPT-2's head: A [16384, 50257] at a pitch of 50304)
 * into the weight's gradient [50257, 768]: the rows below the last multiple of 16 as one
 * product and the rest as a second, both on A's own storage. With m = 50257 cuBLASLt ran the
 * whole product at 490 TFLOP/s on an H100 against 790 for its aligned forward twin. The output
 * has no room for padded rows, so this splits instead of padding m. MN_CUDA_SPLIT_AT=0 turns it
 * off (A/B runs). */
static bool split_rows(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d) {
  const char *env = getenv("MN_CUDA_SPLIT_AT");
  if (env && strcmp(env, "0") == 0) return false;
  return d->trans_a && d->lda > d->m && d->m > SPLIT_ROWS && d->m % SPLIT_ROWS != 0 &&
         mn_cu_arg_storage(c->plan, d->a) == mn_cu_low_storage(c->plan);
}

static mn_status matmul_split_rows(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d) {
  int64_t head = d->m / SPLIT_ROWS * SPLIT_ROWS;
  mn_cu_matmul_desc top = *d, tail = *d;
  top.m = head;
  tail.m = d->m - head;
  /* Node offsets count fp32 bytes whatever the storage (mn_cu_stored_offset halves them). */
  tail.a.offset += (size_t)head * sizeof(float);
  tail.c.offset += (size_t)(head * (d->ldc ? d->ldc : d->n)) * sizeof(float);
  mn_status st = mn_cu_matmul(c, &top);
  return st != MN_OK ? st : mn_cu_matmul(c, &tail);
}

static mn_status matmul(const mn_cu_op_ctx *c, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k) {
  mn_cu_matmul_desc d = {.a = mn_cu_in(c, 0),
                         .b = mn_cu_in(c, 1),
                         .c = mn_cu_out(c),
                         .trans_a = trans_a,
                         .trans_b = trans_b,
                         .m = m,
                         .n = n,
                         .k = k,
                         .batch = 1,
                         /* a scale folded in by the optimizer (scale_fold.h) */
                         .alpha = c->node->attrs.scale != 0.0f ? c->node->attrs.scale : 1.0f,
                         .beta = 0.0f};
  /* Padded rows (mn_cu_pitch_rows) are read and written at their pitch. */
  if (mn_plan_buffer_of(c->plan, c->node->inputs[0])->pitch)
    d.lda = mn_cu_row_pitch(c->plan, c->node->inputs[0]);
  if (mn_plan_buffer_of(c->plan, c->node->inputs[1])->pitch)
    d.ldb = mn_cu_row_pitch(c->plan, c->node->inputs[1]);
  if (mn_plan_buffer_of(c->plan, c->id)->pitch) d.ldc = mn_cu_row_pitch(c->plan, c->id);
  if (mn_cu_skinny_applies(c, &d)) return mn_cu_skinny_matmul(c, &d);
  double flops = mn_cu_matmul_flops(&d);
  /* A decoding step (m of a few rows) would copy the whole weight to save nothing. */
  if (d.ldb == 0 && flops >= PAD_MIN_FLOPS) {
    mn_status st = pad_head_product(c, &d);
    if (st != MN_OK) return st;
  }
  /* A is stored [k, m] here. */
  if (split_rows(c, &d)) return matmul_split_rows(c, &d);
  pad_plan pa = {k, m, (m + PAD_PITCH - 1) / PAD_PITCH * PAD_PITCH};
  if (!trans_a || d.lda || !wants_pad(m, flops)) return mn_cu_matmul(c, &d);
  /* A low-precision session pads straight into the low-precision staging the product reads. */
  size_t cells = (size_t)pa.rows * (size_t)pa.pitch;
  mn_cu_arg padded = mn_cu_low_storage(c->plan) != MN_DEV_F32
                         ? mn_cu_stage(c, cells * 2)
                         : mn_cu_scratch(c, cells * sizeof(float));
  mn_status st = copy_rows(c, &pa, d.a, padded);
  d.a = padded;
  d.lda = pa.pitch;
  return st != MN_OK ? st : mn_cu_matmul(c, &d);
}

/* a [.., K] (leading dims flattened into M) x b [K, N]. */
mn_status mn_cu_lower_MATMUL(const mn_cu_op_ctx *c) {
  const mn_tensor_type *ta = mn_cu_in_type(c, 0), *tb = mn_cu_in_type(c, 1);
  int64_t k = last_dim(ta);
  return matmul(c, false, false, mn_tensor_type_numel(ta) / k, tb->shape[1], k);
}

/* a [.., K] x b [N, K]^T. */
mn_status mn_cu_lower_MATMUL_BT(const mn_cu_op_ctx *c) {
  const mn_tensor_type *ta = mn_cu_in_type(c, 0), *tb = mn_cu_in_type(c, 1);
  int64_t k = last_dim(ta);
  return matmul(c, false, true, mn_tensor_type_numel(ta) / k, tb->shape[0], k);
}

/* a [.., M]^T x b [.., N]: the leading dims of both flatten into K. */
mn_status mn_cu_lower_MATMUL_AT(const mn_cu_op_ctx *c) {
  const mn_tensor_type *ta = mn_cu_in_type(c, 0), *tb = mn_cu_in_type(c, 1);
  int64_t m = last_dim(ta);
  return matmul(c, true, false, m, last_dim(tb), mn_tensor_type_numel(ta) / m);
}

/* One mn_pw_map launch of row `code` (host/pointwise.h) over the node's elements: its
 * element-wise inputs, then for an MN_PW_SCALAR row the scalar's buffer (read at [0]). */
static mn_status pointwise(const mn_cu_op_ctx *c, mn_pw_code code) {
  unsigned flags = mn_pw_flags(code);
  int nargs_in = mn_pw_num_inputs(code) + ((flags & MN_PW_SCALAR) ? 1 : 0);
  float attr = (flags & MN_PW_ATTR) ? c->node->attrs.scale : 0.0f;
  int64_t n = mn_cu_numel(c);
  int k = mn_cu_kernel(c, PW_BLOCK, "mn_pw_map<%d, %lldLL, %uu>", (int)code, (long long)n,
                       mn_cu_float_bits(attr));
  mn_cu_arg args[4] = {mn_cu_out(c)};
  for (int i = 0; i < nargs_in; i++)
    args[1 + i] = mn_cu_in(c, i);
  unsigned blocks = mn_cu_blocks((n + 3) / 4, PW_BLOCK);
  if (blocks > PW_MAX_BLOCKS) blocks = PW_MAX_BLOCKS;
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 1 + nargs_in, args);
}

#define PW_LOWER(name, nin, flags, factor, value)                                                  \
  mn_status mn_cu_lower_##name(const mn_cu_op_ctx *c) { return pointwise(c, MN_PW_##name); }
MN_PW_OP_ROWS(PW_LOWER)
#undef PW_LOWER

mn_status mn_cu_lower_BCE_GRAD(const mn_cu_op_ctx *c) {
  return pointwise(c, c->node->attrs.variant == 0 ? MN_PW_BCE_GRAD_PRED : MN_PW_BCE_GRAD_TARGET);
}

/* x [.., N] + row [N] or [1, N]. */
static mn_status add_row(const mn_cu_op_ctx *c) {
  int64_t n = mn_cu_numel(c), ncol = last_dim(&c->node->type);
  int k = mn_cu_kernel(c, PW_BLOCK, "mn_pw_add_row<%lldLL, %lldLL>", (long long)n, (long long)ncol);
  mn_cu_arg args[3] = {mn_cu_out(c), mn_cu_in(c, 0), mn_cu_in(c, 1)};
  unsigned blocks = mn_cu_blocks(ncol % 4 == 0 ? n / 4 : n, PW_BLOCK);
  if (blocks > PW_MAX_BLOCKS) blocks = PW_MAX_BLOCKS;
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 3, args);
}
mn_status mn_cu_lower_BIAS_ADD(const mn_cu_op_ctx *c) { return add_row(c); }
mn_status mn_cu_lower_BROADCAST_ADD(const mn_cu_op_ctx *c) { return add_row(c); }

/* Dropout and its gradient (one mask, host/pointwise.h): the seed and p are template
 * arguments, the micro-step is read from the per-step scalars, never captured. */
static mn_status dropout(const mn_cu_op_ctx *c) {
  int64_t n = mn_cu_numel(c);
  int k =
      mn_cu_kernel(c, PW_BLOCK, "mn_dropout<%lldLL, %lluull, %uu>", (long long)n,
                   (unsigned long long)c->node->attrs.seed, mn_cu_float_bits(c->node->attrs.scale));
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[3] = {mn_cu_out(c), mn_cu_in(c, 0), mn_cu_scalars_arg()};
  unsigned blocks = mn_cu_blocks((n + 3) / 4, PW_BLOCK);
  if (blocks > PW_MAX_BLOCKS) blocks = PW_MAX_BLOCKS;
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 3, args);
}
mn_status mn_cu_lower_DROPOUT(const mn_cu_op_ctx *c) { return dropout(c); }
mn_status mn_cu_lower_DROPOUT_GRAD(const mn_cu_op_ctx *c) { return dropout(c); }

/* A copy, not an alias: the memory planner gives every node a buffer of its own. */
mn_status mn_cu_lower_RESHAPE(const mn_cu_op_ctx *c) {
  return mn_cu_copy(c, mn_cu_out(c), mn_cu_in(c, 0), mn_tensor_type_bytes(&c->node->type));
}

mn_status mn_cu_lower_ZEROS(const mn_cu_op_ctx *c) {
  return mn_cu_memset_zero(c, mn_cu_out(c), mn_tensor_type_bytes(&c->node->type));
}
