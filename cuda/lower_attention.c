/* Lowering of the attention ops to the kernels of cuda/kernels/attention.cuh and, for head
 * dims that are multiples of 32 up to 128 (16 with 16-bit operands), the tensor-core kernels of
 * attention_mma.cuh (same launches and statistics layout).
 *
 * Forward: one flash-style launch (grid: query tiles x heads x batches); a forward whose
 * variant is 1 also writes each query row's max and 1 / sum into its statistics (ops.h).
 * Each backward op is its own dispatch of two launches. attention_grad_*: the statistics
 * pre-pass (the forward kernel in a mode that writes each query row's max, 1 / sum and delta =
 * sum_s P_s dP_s into scratch instead of the output), then dQ per query tile or dK / dV per key
 * tile. attention_grad_*_saved (optimizer/attention_stats.h) read the forward's statistics and
 * replace the pre-pass, a second pass over every score, by delta = dy . y, one pass over dy and
 * the forward's output. causal_attention_packed and its gradients are these with the segment
 * mask, their positions an extra argument (MN_ATTN_POSITIONS_ARG). Unmasked and causal attention
 * with 16-bit operands run the pipelined forward, dQ and dK / dV of attention_pipe.cuh instead
 * (same grids and statistics; the pre-pass stays the mma kernel's). Cached attention splits the
 * cache over blocks of 128 keys and merges the partial softmaxes. */
#include <string.h>

#include "cuda/emit.h"
#include "cuda/lower_attention.h"
#include "host/error.h"

#define ATTN_MAX_HEAD_DIM 256
/* Query heads of one kv head handled together by a decode block. */
#define DECODE_MAX_GROUP   8
#define DECODE_PART_FLOATS (8192 / (MN_ATTN_DECODE_THREADS / 32))
#define GRID_YZ_MAX        65535

typedef struct attn_dims {
  int64_t batches, t_len, s_len;
  int heads, kv_heads, head_dim, head_dim_padded;
  int mask; /* an mn_attn_mask */
} attn_dims;

/* A kernel's tile: rm query (or key) rows per lane, so 16 * rm rows per block, and bc
 * columns per tile streamed through shared memory. */
typedef struct attn_tile {
  int rm, bc;
} attn_tile;

static mn_status unsupported(const mn_cu_op_ctx *c, const char *why, long long value) {
  return mn_fail(MN_ERR_UNSUPPORTED, "cuda backend: node %u (%s): %s (%lld)", c->id,
                 mn_op_name(c->node->op), why, value);
}

/* tq: q's type (the queries' count), tk: k's (the keys'). */
static mn_status dims_from(const mn_cu_op_ctx *c, int mask, const mn_tensor_type *tq,
                           const mn_tensor_type *tk, attn_dims *d) {
  const mn_op_attrs *a = &c->node->attrs;
  *d = (attn_dims){.batches = tq->rank == 3 ? tq->shape[0] : 1,
                   .t_len = tq->shape[tq->rank - 2],
                   .s_len = tk->shape[tk->rank - 2],
                   .heads = a->num_heads,
                   .kv_heads = a->num_kv_heads,
                   .head_dim = a->head_dim,
                   .head_dim_padded = (a->head_dim + 31) / 32 * 32,
                   .mask = mask};
  if (d->head_dim > ATTN_MAX_HEAD_DIM)
    return unsupported(c, "head_dim above 256 has no CUDA kernel", d->head_dim);
  if (d->heads > GRID_YZ_MAX) return unsupported(c, "too many heads for one grid", d->heads);
  if (d->batches > GRID_YZ_MAX) return unsupported(c, "too many batches for one grid", d->batches);
  /* The key-tile kernels keep each query's first key as an int. */
  if (mask == MN_ATTN_MASK_SEGMENTS && d->t_len > INT32_MAX)
    return unsupported(c, "packed sequences longer than 2^31 - 1 tokens", d->t_len);
  return MN_OK;
}

static mn_status dims_of(const mn_cu_op_ctx *c, int mask, attn_dims *d) {
  return dims_from(c, mask, mn_cu_in_type(c, 0), mn_cu_in_type(c, 1), d);
}

/* Short sequences get smaller row tiles so that fewer rows are padding. */
static attn_tile fit_rows(attn_tile t, int64_t rows) {
  while (t.rm > 1 && 8 * (int64_t)t.rm >= rows)
    t.rm /= 2;
  return t;
}

/* Larger head dims hold more accumulators per lane and larger tiles in shared memory, so
 * they take fewer rows and columns. */
static attn_tile forward_tile(const attn_dims *d) {
  attn_tile t = d->head_dim <= 64    ? (attn_tile){4, 64}
                : d->head_dim <= 128 ? (attn_tile){4, 32}
                                     : (attn_tile){2, 32};
  return fit_rows(t, d->t_len);
}

static attn_tile backward_tile(const attn_dims *d, int64_t rows) {
  attn_tile t = d->head_dim <= 64    ? (attn_tile){4, 32}
                : d->head_dim <= 128 ? (attn_tile){2, 32}
                                     : (attn_tile){2, 16};
  return fit_rows(t, rows);
}

static size_t row_stride(const attn_dims *d) { return (size_t)d->head_dim_padded + 4; }

static mn_status launch_forward(const mn_cu_op_ctx *c, const attn_dims *d, int mode,
                                const mn_cu_arg *args, int nargs) {
  attn_tile t = forward_tile(d);
  size_t br = 16 * (size_t)t.rm, bc = (size_t)t.bc;
  /* q, k and v tiles; then the probability tile (output), or dy rows (delta), or for
   * MN_ATTN_STATS only q and k. */
  size_t ld = row_stride(d);
  bool out = mode == MN_ATTN_OUTPUT || mode == MN_ATTN_OUTPUT_STATS;
  size_t smem = out                           ? 4 * ((br + 2 * bc) * ld + br * (bc + 4))
                : mode == MN_ATTN_STATS_DELTA ? 4 * (2 * (br + bc) * ld)
                                              : 4 * ((br + bc) * ld);
  int k =
      mn_cu_kernel(c, MN_ATTN_BLOCK, "mn_attn_fwd<%d, %d, %d, %d, %lldLL, %lldLL, %d, %d, %d, %d>",
                   d->head_dim, d->head_dim_padded, t.rm, t.bc, (long long)d->t_len,
                   (long long)d->s_len, d->heads, d->kv_heads, d->mask, mode);
  return mn_cu_launch(c, k, mn_cu_blocks(d->t_len, (unsigned)br), (unsigned)d->heads,
                      (unsigned)d->batches, smem, nargs, args);
}

/* The tensor-core kernels of kernels/attention_mma.cuh, by operand kind:
 * - 16-bit operands (mn_attn_lp_*, first template argument the session's low storage) when q, k
 *   or v is stored in bf16 / fp16 and the head dim is a multiple of 16 up to 128: m16n8k16 on
 *   16-bit tiles, P and dS rounded for their products, statistics and sums fp32;
 * - TF32 (mn_attn_mma_*, first argument an mn_attn_prec) for other head dims that are multiples
 *   of 32 up to 128: TF32 when the session allows it, else 3xTF32, which keeps FP32 accuracy.
 * Other head dims use the FP32 kernels of attention.cuh. */
typedef struct attn_tc {
  bool on;
  const char *name; /* "mn_attn_lp" or "mn_attn_mma" */
  int first;        /* LP storage, or the TF32 precision */
  size_t row_bytes; /* a shared tile row: head_dim + 8 16-bit values, or head_dim + 4 floats */
  /* 16-bit operands, unmasked or causal, positions that fit an int: the forward (not the
   * pre-pass), dQ and dK / dV are the pipelined kernels of kernels/attention_pipe.cuh. */
  bool pipe;
} attn_tc;

static attn_tc tensor_core(const mn_cu_op_ctx *c, const attn_dims *d) {
  int hd = d->head_dim;
  bool low = false;
  for (int i = 0; i < 3; i++)
    low = low || mn_cu_arg_storage(c->plan, mn_cu_in(c, i)) != MN_DEV_F32;
  bool pipe = (d->mask == MN_ATTN_MASK_NONE || d->mask == MN_ATTN_MASK_CAUSAL) &&
              d->t_len < INT32_MAX / 2 && d->s_len < INT32_MAX / 2;
  if (low && hd % 16 == 0 && hd <= 128)
    return (attn_tc){true, "mn_attn_lp", mn_cu_low_storage(c->plan), 2 * (size_t)(hd + 8), pipe};
  if (hd % 32 == 0 && hd <= 128)
    return (attn_tc){true, "mn_attn_mma", c->allow_tf32 ? MN_ATTN_TF32 : MN_ATTN_3XTF32,
                     4 * (size_t)(hd + 4), false};
  return (attn_tc){.on = false};
}

/* The pipelined kernels: PIPE_WARPS warps of 16 rows a block, tiles of PIPE_COLS rows streamed
 * through two stages. In the forward, head dims up to 64 give each warp PIPE_FWD_BLOCKS blocks of
 * 16 rows, which share the K and V fragments it reads (larger ones would spill). */
#define PIPE_WARPS      4
#define PIPE_FWD_BLOCKS 2
#define PIPE_COLS       64

static size_t pipe_rows(void) { return 16 * PIPE_WARPS; }

/* The pipelined forward: q [rows], then two stages of k and v [PIPE_COLS] each. */
static mn_status launch_pipe_forward(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                                     int mode, bool qkv, const mn_cu_arg *args, int nargs) {
  int blocks = d->head_dim <= 64 ? PIPE_FWD_BLOCKS : 1;
  int k = mn_cu_kernel(c, 32 * PIPE_WARPS,
                       "mn_attn_pipe_fwd<%d, %d, %lldLL, %lldLL, %d, %d, %d, %d, %d, %d, %d>",
                       tc->first, d->head_dim, (long long)d->t_len, (long long)d->s_len, d->heads,
                       d->kv_heads, d->mask, mode, PIPE_WARPS, blocks, qkv ? 1 : 0);
  size_t rows = pipe_rows() * (size_t)blocks;
  size_t smem = (rows + 4 * PIPE_COLS) * tc->row_bytes;
  return mn_cu_launch(c, k, mn_cu_blocks(d->t_len, (unsigned)rows), (unsigned)d->heads,
                      (unsigned)d->batches, smem, nargs, args);
}

/* The pipelined dQ: q and dy [rows], then two stages of k and v [PIPE_COLS] each. */
static mn_status launch_pipe_dq(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                                bool qkv, const mn_cu_arg *args, int nargs) {
  int k = mn_cu_kernel(c, 32 * PIPE_WARPS,
                       "mn_attn_pipe_dq<%d, %d, %lldLL, %lldLL, %d, %d, %d, %d, %d>", tc->first,
                       d->head_dim, (long long)d->t_len, (long long)d->s_len, d->heads, d->kv_heads,
                       d->mask, PIPE_WARPS, qkv ? 1 : 0);
  /* Left free, the compiler takes ~200 registers a thread for dQ at head dim 64 and an SM holds
   * 2 blocks; 168 fit 3 (3 blocks of 55 KB of tiles fit in shared memory too). */
  if (k >= 0 && d->head_dim <= 64) mn_cu_kernel_min_blocks(c, k, 3);
  size_t smem = (2 * pipe_rows() + 4 * PIPE_COLS) * tc->row_bytes;
  return mn_cu_launch(c, k, mn_cu_blocks(d->t_len, (unsigned)pipe_rows()), (unsigned)d->heads,
                      (unsigned)d->batches, smem, nargs, args);
}

/* The pipelined dK / dV: k and v [rows], then two stages of q and dy [PIPE_COLS] and their
 * statistics (3 floats a row). out: an mn_attn_kv_out. */
static mn_status launch_pipe_dkv(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                                 int out, bool packed, bool qkv, const mn_cu_arg *args, int nargs) {
  int k = mn_cu_kernel(
      c, 32 * PIPE_WARPS, "mn_attn_pipe_dkv<%d, %d, %lldLL, %lldLL, %d, %d, %d, %d, %s, %d, %d>",
      tc->first, d->head_dim, (long long)d->t_len, (long long)d->s_len, d->heads, d->kv_heads,
      d->mask, out, packed ? "true" : "false", PIPE_WARPS, qkv ? 1 : 0);
  size_t smem =
      2 * pipe_rows() * tc->row_bytes + 2 * (2 * PIPE_COLS * tc->row_bytes + 12 * PIPE_COLS);
  return mn_cu_launch(c, k, mn_cu_blocks(d->s_len, (unsigned)pipe_rows()), (unsigned)d->kv_heads,
                      (unsigned)d->batches, smem, nargs, args);
}

/* Shared memory of the tensor-core kernels: `tiles` tiles of 64 rows, plus `extra` floats. */
static size_t mma_smem(const attn_tc *tc, int tiles, size_t extra) {
  return (size_t)tiles * MN_ATTN_MMA_ROWS * tc->row_bytes + 4 * extra;
}

static mn_status launch_mma_forward(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                                    int mode, const mn_cu_arg *args, int nargs) {
  if (tc->pipe && (mode == MN_ATTN_OUTPUT || mode == MN_ATTN_OUTPUT_STATS))
    return launch_pipe_forward(c, d, tc, mode, false, args, nargs);
  int tiles = mode == MN_ATTN_OUTPUT || mode == MN_ATTN_OUTPUT_STATS ? 3
              : mode == MN_ATTN_STATS_DELTA                          ? 4
                                                                     : 2;
  int k = mn_cu_kernel(c, MN_ATTN_BLOCK, "%s_fwd<%d, %d, %lldLL, %lldLL, %d, %d, %d, %d>", tc->name,
                       tc->first, d->head_dim, (long long)d->t_len, (long long)d->s_len, d->heads,
                       d->kv_heads, d->mask, mode);
  return mn_cu_launch(c, k, mn_cu_blocks(d->t_len, MN_ATTN_MMA_ROWS), (unsigned)d->heads,
                      (unsigned)d->batches, mma_smem(tc, tiles, 0), nargs, args);
}

/* The row maxima and 1 / sums in an attention's statistics (F32 [2 * n], n = B * H * T). */
static void stats_args(const attn_dims *d, mn_cu_arg stats, mn_cu_arg *m, mn_cu_arg *inv_l) {
  *m = *inv_l = stats;
  inv_l->offset += (size_t)(d->batches * d->heads * d->t_len) * sizeof(float);
}

/* Packed attention reads its positions (its last input) as argument MN_ATTN_POSITIONS_ARG of
 * every launch; *nargs grows to cover it. */
static void positions_arg(const mn_cu_op_ctx *c, const attn_dims *d, mn_cu_arg *args, int *nargs) {
  if (d->mask != MN_ATTN_MASK_SEGMENTS) return;
  args[MN_ATTN_POSITIONS_ARG] = mn_cu_in(c, c->node->num_inputs - 1);
  *nargs = MN_ATTN_POSITIONS_ARG + 1;
}

/* A forward's output (args[3], set) and, for variant 1, its statistics (args[4], args[5]): the
 * mode and argument count of its launch. */
static mn_status output_args(const mn_cu_op_ctx *c, const attn_dims *d, mn_cu_arg *args, int *mode,
                             int *nargs) {
  *mode = MN_ATTN_OUTPUT;
  *nargs = 4;
  if (c->node->attrs.variant != 1) return MN_OK;
  mn_node stats = mn_plan_extra_output(c->plan, c->id, 1);
  if (stats == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE,
                   "cuda backend: node %u (%s) has no extra_output for its statistics", c->id,
                   mn_op_name(c->node->op));
  stats_args(d, mn_cu_node_arg(stats), &args[4], &args[5]);
  *mode = MN_ATTN_OUTPUT_STATS;
  *nargs = 6;
  return MN_OK;
}

static mn_status lower_forward(const mn_cu_op_ctx *c, int mask) {
  attn_dims d;
  mn_status st = dims_of(c, mask, &d);
  if (st != MN_OK) return st;
  mn_cu_arg args[MN_CU_MAX_ARGS] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2), mn_cu_out(c)};
  int mode, nargs;
  if ((st = output_args(c, &d, args, &mode, &nargs)) != MN_OK) return st;
  positions_arg(c, &d, args, &nargs);
  attn_tc tc = tensor_core(c, &d);
  if (tc.on) return launch_mma_forward(c, &d, &tc, mode, args, nargs);
  return launch_forward(c, &d, mode, args, nargs);
}

mn_status mn_cu_lower_CAUSAL_ATTENTION(const mn_cu_op_ctx *c) {
  return lower_forward(c, MN_ATTN_MASK_CAUSAL);
}
mn_status mn_cu_lower_FULL_ATTENTION(const mn_cu_op_ctx *c) {
  return lower_forward(c, MN_ATTN_MASK_NONE);
}
mn_status mn_cu_lower_CROSS_ATTENTION(const mn_cu_op_ctx *c) {
  return lower_forward(c, MN_ATTN_MASK_NONE);
}
mn_status mn_cu_lower_CAUSAL_ATTENTION_PACKED(const mn_cu_op_ctx *c) {
  return lower_forward(c, MN_ATTN_MASK_SEGMENTS);
}

typedef enum grad_of { GRAD_Q, GRAD_K, GRAD_V, GRAD_KV } grad_of;

static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* dK (want_k) or dV into args[7] from a kv tile kernel of attention.cuh; `os` is the output
 * row stride in floats. */
/* Floats per query row of a key-tile kernel's statistics: m, inv_l, delta and, packed, the
 * row's first key. */
static size_t stat_floats(const attn_dims *d) { return d->mask == MN_ATTN_MASK_SEGMENTS ? 4 : 3; }

static mn_status launch_simt_dkv(const mn_cu_op_ctx *c, const attn_dims *d, bool want_k,
                                 long long os, const mn_cu_arg *args, int nargs) {
  attn_tile t = backward_tile(d, d->s_len);
  size_t br = 16 * (size_t)t.rm, bc = (size_t)t.bc, ld = row_stride(d);
  size_t smem = 4 * (((want_k ? 2 : 1) * br + 2 * bc) * ld + br * (bc + 4) + stat_floats(d) * bc);
  int k = mn_cu_kernel(
      c, MN_ATTN_BLOCK, "mn_attn_bwd_dkv<%d, %d, %d, %d, %lldLL, %lldLL, %d, %d, %d, %s, %lldLL>",
      d->head_dim, d->head_dim_padded, t.rm, t.bc, (long long)d->t_len, (long long)d->s_len,
      d->heads, d->kv_heads, d->mask, want_k ? "true" : "false", os);
  return mn_cu_launch(c, k, mn_cu_blocks(d->s_len, (unsigned)br), (unsigned)d->kv_heads,
                      (unsigned)d->batches, smem, nargs, args);
}

/* out: an mn_attn_kv_out; packed: rows of [dK | dV]. */
static mn_status launch_mma_dkv(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                                int out, bool packed, bool qkv, const mn_cu_arg *args, int nargs) {
  if (tc->pipe) return launch_pipe_dkv(c, d, tc, out, packed, qkv, args, nargs);
  int k = mn_cu_kernel(c, MN_ATTN_BLOCK, "%s_dkv<%d, %d, %lldLL, %lldLL, %d, %d, %d, %d, %s>",
                       tc->name, tc->first, d->head_dim, (long long)d->t_len, (long long)d->s_len,
                       d->heads, d->kv_heads, d->mask, out, packed ? "true" : "false");
  return mn_cu_launch(
      c, k, mn_cu_blocks(d->s_len, MN_ATTN_MMA_ROWS), (unsigned)d->kv_heads, (unsigned)d->batches,
      mma_smem(tc, out == MN_ATTN_DV ? 3 : 4, stat_floats(d) * MN_ATTN_MMA_ROWS), nargs, args);
}

/* Head dims up to 64 keep dK and dV accumulators in registers together; larger ones make
 * two passes. */
#define MMA_KV_ONE_PASS_MAX_HD 64

/* dK | dV side by side in each output row (qkv: in the k and v blocks of qkv's rows), one pass
 * for head dims up to MMA_KV_ONE_PASS_MAX_HD, else dK then dV. */
static mn_status launch_dk_dv(const mn_cu_op_ctx *c, const attn_dims *d, const attn_tc *tc,
                              bool qkv, const mn_cu_arg *args, int nargs) {
  if (d->head_dim <= MMA_KV_ONE_PASS_MAX_HD)
    return launch_mma_dkv(c, d, tc, MN_ATTN_DK_DV, true, qkv, args, nargs);
  mn_status st = launch_mma_dkv(c, d, tc, MN_ATTN_DK, true, qkv, args, nargs);
  return st != MN_OK ? st : launch_mma_dkv(c, d, tc, MN_ATTN_DV, true, qkv, args, nargs);
}

/* delta = dy . y per (b, h, t) into `delta`. */
static mn_status launch_delta(const mn_cu_op_ctx *c, const attn_dims *d, mn_cu_arg y, mn_cu_arg dy,
                              mn_cu_arg delta) {
  long long rows = (long long)(d->batches * d->t_len) * d->heads;
  /* Head dims 8, 16, 32, 64 and 128 (32 / (head_dim / 8) rows a warp, more than one) give each
   * lane 8 values of a row (kernels/attention.cuh, mn_attn_delta); others a warp a row. */
  int hd = d->head_dim;
  int rpw = hd % 8 == 0 && hd <= 128 && 32 % (hd / 8) == 0 ? 32 / (hd / 8) : 1;
  long long per_block = (long long)(MN_ATTN_BLOCK / 32) * rpw;
  long long blocks = (rows + per_block - 1) / per_block;
  if (blocks > 0x7fffffffLL) return unsupported(c, "too many attention rows for one grid", rows);
  int k = mn_cu_kernel(c, MN_ATTN_BLOCK, "mn_attn_delta<%d, %lldLL, %d, %lldLL, %d>", hd,
                       (long long)d->t_len, d->heads, rows, rpw);
  mn_cu_arg delta_args[3] = {y, dy, delta};
  return mn_cu_launch(c, k, (unsigned)blocks, 1, 1, 0, 3, delta_args);
}

/* The statistics the gradient kernels read (row max, 1 / row sum and, except for dV alone,
 * delta per (b, h, t)): from a pre-pass into scratch, or for the _saved ops the forward's
 * statistics and delta = dy . y; then the gradient kernels. */
static mn_status lower_backward(const mn_cu_op_ctx *c, grad_of which, bool saved) {
  attn_dims d;
  int mask = mn_op_is_packed_attention_grad(c->node->op) ? MN_ATTN_MASK_SEGMENTS
             : c->node->attrs.variant == 1               ? MN_ATTN_MASK_CAUSAL
                                                         : MN_ATTN_MASK_NONE;
  mn_status st = dims_of(c, mask, &d);
  if (st != MN_OK) return st;
  if (d.kv_heads > GRID_YZ_MAX) return unsupported(c, "too many kv heads for one grid", d.kv_heads);
  size_t stat_bytes = align256((size_t)(d.batches * d.heads * d.t_len) * sizeof(float));
  mn_cu_arg m = mn_cu_scratch(c, (saved ? 1 : 3) * stat_bytes), inv_l = m, delta = m;
  if (saved) {
    stats_args(&d, mn_cu_in(c, 5), &m, &inv_l);
  } else {
    inv_l.offset = stat_bytes;
    delta.offset = 2 * stat_bytes;
  }
  mn_cu_arg args[MN_CU_MAX_ARGS] = {
      mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2), mn_cu_in(c, 3), m,
      inv_l,          delta,          mn_cu_out(c)};
  int nargs = 8;
  positions_arg(c, &d, args, &nargs);
  /* The dV half of a packed row starts kv_width floats in. */
  long long kv_width = (long long)d.kv_heads * d.head_dim;
  mn_cu_arg v_args[MN_CU_MAX_ARGS];
  memcpy(v_args, args, sizeof args);
  v_args[7].offset = (size_t)kv_width * sizeof(float);
  bool packed = which == GRAD_KV;
  int mode = which == GRAD_V ? MN_ATTN_STATS : MN_ATTN_STATS_DELTA;
  /* The pre-pass reads q, k, v, dy and writes the statistics: the first 7 arguments, and the
   * positions. */
  int pre_nargs = nargs == 8 ? 7 : nargs;
  attn_tc tc = tensor_core(c, &d);
  if (saved) {
    st = launch_delta(c, &d, mn_cu_in(c, 4), mn_cu_in(c, 3), args[6]);
    if (st != MN_OK) return st;
  }
  if (tc.on) {
    if (!saved && (st = launch_mma_forward(c, &d, &tc, mode, args, pre_nargs)) != MN_OK) return st;
    if (which == GRAD_Q && tc.pipe) return launch_pipe_dq(c, &d, &tc, false, args, nargs);
    if (which == GRAD_Q) {
      int k = mn_cu_kernel(c, MN_ATTN_BLOCK, "%s_dq<%d, %d, %lldLL, %lldLL, %d, %d, %d>", tc.name,
                           tc.first, d.head_dim, (long long)d.t_len, (long long)d.s_len, d.heads,
                           d.kv_heads, d.mask);
      return mn_cu_launch(c, k, mn_cu_blocks(d.t_len, MN_ATTN_MMA_ROWS), (unsigned)d.heads,
                          (unsigned)d.batches, mma_smem(&tc, 4, 0), nargs, args);
    }
    if (!packed)
      return launch_mma_dkv(c, &d, &tc, which == GRAD_K ? MN_ATTN_DK : MN_ATTN_DV, false, false,
                            args, nargs);
    return launch_dk_dv(c, &d, &tc, false, args, nargs);
  }
  if (!saved && (st = launch_forward(c, &d, mode, args, pre_nargs)) != MN_OK) return st;
  if (which == GRAD_Q) {
    attn_tile t = backward_tile(&d, d.t_len);
    size_t br = 16 * (size_t)t.rm, bc = (size_t)t.bc, ld = row_stride(&d);
    size_t smem = 4 * ((2 * br + 2 * bc) * ld + br * (bc + 4));
    int k =
        mn_cu_kernel(c, MN_ATTN_BLOCK, "mn_attn_bwd_dq<%d, %d, %d, %d, %lldLL, %lldLL, %d, %d, %d>",
                     d.head_dim, d.head_dim_padded, t.rm, t.bc, (long long)d.t_len,
                     (long long)d.s_len, d.heads, d.kv_heads, d.mask);
    return mn_cu_launch(c, k, mn_cu_blocks(d.t_len, (unsigned)br), (unsigned)d.heads,
                        (unsigned)d.batches, smem, nargs, args);
  }
  if (!packed) return launch_simt_dkv(c, &d, which == GRAD_K, kv_width, args, nargs);
  st = launch_simt_dkv(c, &d, true, 2 * kv_width, args, nargs);
  return st != MN_OK ? st : launch_simt_dkv(c, &d, false, 2 * kv_width, v_args, nargs);
}

mn_status mn_cu_lower_ATTENTION_GRAD_Q(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_Q, false);
}
mn_status mn_cu_lower_ATTENTION_GRAD_K(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_K, false);
}
mn_status mn_cu_lower_ATTENTION_GRAD_V(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_V, false);
}
mn_status mn_cu_lower_ATTENTION_GRAD_KV(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_KV, false);
}
mn_status mn_cu_lower_ATTENTION_GRAD_Q_SAVED(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_Q, true);
}
mn_status mn_cu_lower_ATTENTION_GRAD_KV_SAVED(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_KV, true);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_Q(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_Q, false);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_K(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_K, false);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_V(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_V, false);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_KV(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_KV, false);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_Q_SAVED(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_Q, true);
}
mn_status mn_cu_lower_PACKED_ATTENTION_GRAD_KV_SAVED(const mn_cu_op_ctx *c) {
  return lower_backward(c, GRAD_KV, true);
}

/* A prefill: P > 1 query rows per sequence against the caches, causal at the device's kv_len.
 * The forward's query tiles, with the keys of the whole cache (S rows) as their columns; the
 * FP32 kernel, which reads any storage, as the tensor-core kernels know no such mask. */
static mn_status lower_cached_rows(const mn_cu_op_ctx *c) {
  attn_dims d;
  mn_status st = dims_of(c, MN_ATTN_MASK_CACHE, &d);
  if (st != MN_OK) return st;
  mn_cu_arg none = {.kind = MN_CU_ARG_NONE};
  mn_cu_arg args[MN_ATTN_POSITIONS_ARG + 2] = {
      mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2), mn_cu_out(c),   mn_cu_error_arg(),
      none,           none,           none,           mn_cu_in(c, 3), mn_cu_node_id_arg(c)};
  attn_tile t = forward_tile(&d);
  size_t br = 16 * (size_t)t.rm, bc = (size_t)t.bc, ld = row_stride(&d);
  size_t smem = 4 * ((br + 2 * bc) * ld + br * (bc + 4));
  int k =
      mn_cu_kernel(c, MN_ATTN_BLOCK, "mn_attn_fwd<%d, %d, %d, %d, %lldLL, %lldLL, %d, %d, %d, %d>",
                   d.head_dim, d.head_dim_padded, t.rm, t.bc, (long long)d.t_len,
                   (long long)d.s_len, d.heads, d.kv_heads, d.mask, MN_ATTN_OUTPUT);
  return mn_cu_launch(c, k, mn_cu_blocks(d.t_len, (unsigned)br), (unsigned)d.heads,
                      (unsigned)d.batches, smem, MN_ATTN_POSITIONS_ARG + 2, args);
}

/* q [B, H*hd] against rows 0..kv_len-1 of each sequence's caches ([S, kvd] is B = 1, [B, S,
 * kvd] B sequences); kv_len (input 3) is read on the device, so the splits cover the whole
 * cache and those past kv_len do nothing. q [B, P, H*hd] with P > 1 is a prefill
 * (lower_cached_rows). */
mn_status mn_cu_decode_attention_scratch(const mn_cu_op_ctx *c, int64_t batch, int64_t max_seq,
                                         int split, size_t at, mn_cu_arg parts[3]) {
  const mn_op_attrs *a = &c->node->attrs;
  int hd = a->head_dim, heads = a->num_heads;
  if (hd > ATTN_MAX_HEAD_DIM) return unsupported(c, "head_dim above 256 has no CUDA kernel", hd);
  int64_t splits = (max_seq + split - 1) / split;
  if (splits > GRID_YZ_MAX) return unsupported(c, "KV cache too long for one grid", max_seq);
  if (batch > GRID_YZ_MAX) return unsupported(c, "too many sequences for one grid", batch);
  size_t n = (size_t)batch * (size_t)splits * (size_t)heads;
  size_t stat_bytes = align256(n * sizeof(float));
  parts[0] = mn_cu_scratch(c, at + 2 * stat_bytes + n * (size_t)hd * sizeof(float));
  parts[0].offset = at;
  parts[1] = parts[2] = parts[0];
  parts[1].offset += stat_bytes;
  parts[2].offset += 2 * stat_bytes;
  return MN_OK;
}

mn_status mn_cu_decode_attention_parts(const mn_cu_op_ctx *c, mn_cu_arg q, mn_cu_arg k_cache,
                                       mn_cu_arg v_cache, mn_cu_arg kv_len, int64_t batch,
                                       int64_t max_seq, int split, const mn_cu_arg parts[3],
                                       const mn_cu_arg *merge) {
  const mn_op_attrs *a = &c->node->attrs;
  int hd = a->head_dim, heads = a->num_heads, kv_heads = a->num_kv_heads;
  int64_t splits = (max_seq + split - 1) / split;
  int group = heads / kv_heads;
  /* The kernel's per-warp partial outputs, WARPS x gb x hd floats, stay in 32 KB of shared
   * memory. */
  int gb_max =
      DECODE_PART_FLOATS / hd < DECODE_MAX_GROUP ? DECODE_PART_FLOATS / hd : DECODE_MAX_GROUP;
  int gb = group < gb_max ? group : gb_max;
  unsigned slices = (unsigned)((group + gb - 1) / gb);
  mn_cu_arg args[11] = {q, k_cache, v_cache, kv_len, parts[0], parts[1], parts[2]};
  int nargs = 7;
  if (merge) {
    args[7] = merge[0];
    args[8] = merge[1];
    args[9] = mn_cu_error_arg();
    args[10] = mn_cu_node_id_arg(c);
    nargs = 11;
  }
  int k =
      mn_cu_kernel(c, MN_ATTN_DECODE_THREADS, "mn_attn_decode_part<%d, %d, %d, %lldLL, %d, %d, %s>",
                   hd, heads, kv_heads, (long long)max_seq, gb, split, merge ? "true" : "false");
  if (k < 0) return mn_cu_oom(c);
  return mn_cu_launch(c, k, (unsigned)kv_heads * slices, (unsigned)splits, (unsigned)batch, 0,
                      nargs, args);
}

mn_status mn_cu_lower_CACHED_ATTENTION(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tq = mn_cu_in_type(c, 0);
  if (tq->rank == 3 && tq->shape[1] > 1) return lower_cached_rows(c);
  const mn_op_attrs *a = &c->node->attrs;
  int hd = a->head_dim, heads = a->num_heads;
  const mn_tensor_type *tk = mn_cu_in_type(c, 1);
  int64_t max_seq = tk->shape[tk->rank - 2], batch = tk->rank == 3 ? tk->shape[0] : 1;
  mn_cu_arg parts[3];
  mn_status st = mn_cu_decode_attention_scratch(c, batch, max_seq, MN_ATTN_BLOCK, 0, parts);
  if (st == MN_OK)
    st = mn_cu_decode_attention_parts(c, mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2),
                                      mn_cu_in(c, 3), batch, max_seq, MN_ATTN_BLOCK, parts, NULL);
  if (st != MN_OK) return st;
  unsigned block = hd <= 32 ? 32u : hd <= 64 ? 64u : hd <= 128 ? 128u : 256u;
  mn_cu_arg combine_args[6] = {mn_cu_in(c, 3), parts[0],     parts[1],
                               parts[2],       mn_cu_out(c), mn_cu_error_arg()};
  int k = mn_cu_kernel(c, block, "mn_attn_decode_combine<%d, %d, %lldLL, %uu, %u>", hd, heads,
                       (long long)max_seq, (unsigned)c->id, block);
  if (k < 0) return mn_cu_oom(c);
  return mn_cu_launch(c, k, (unsigned)heads, (unsigned)batch, 1, 0, 6, combine_args);
}

/* qkv_causal_attention and its gradient (optimizer/attention_qkv.c): the pipelined kernels with
 * q, k and v the column blocks of input 0's rows, the same arguments as the separate tensors'
 * launches with offsets into one buffer. Only those kernels read wider rows, so the ops need
 * what they need: 16-bit storage, a head dim a multiple of 16 up to 128, int positions. */
static mn_status qkv_setup(const mn_cu_op_ctx *c, attn_dims *d, attn_tc *tc, mn_cu_arg qkv[3]) {
  /* Input 0 holds the keys as well as the queries. */
  mn_status st = dims_from(c, MN_ATTN_MASK_CAUSAL, mn_cu_in_type(c, 0), mn_cu_in_type(c, 0), d);
  if (st != MN_OK) return st;
  int hd = d->head_dim;
  if (mn_cu_arg_storage(c->plan, mn_cu_in(c, 0)) == MN_DEV_F32 || hd % 16 || hd > 128 ||
      d->t_len >= INT32_MAX / 2)
    return unsupported(c, "needs 16-bit q, k and v, a head dim a multiple of 16 up to 128", hd);
  *tc = (attn_tc){true, "mn_attn_lp", mn_cu_low_storage(c->plan), 2 * (size_t)(hd + 8), true};
  size_t q_width = (size_t)d->heads * (size_t)hd, kv_width = (size_t)d->kv_heads * (size_t)hd;
  for (int i = 0; i < 3; i++)
    qkv[i] = mn_cu_in(c, 0);
  qkv[1].offset += q_width * sizeof(float);
  qkv[2].offset += (q_width + kv_width) * sizeof(float);
  return MN_OK;
}

mn_status mn_cu_lower_QKV_CAUSAL_ATTENTION(const mn_cu_op_ctx *c) {
  attn_dims d;
  attn_tc tc;
  mn_cu_arg args[MN_CU_MAX_ARGS];
  mn_status st = qkv_setup(c, &d, &tc, args);
  if (st != MN_OK) return st;
  args[3] = mn_cu_out(c);
  int mode, nargs;
  if ((st = output_args(c, &d, args, &mode, &nargs)) != MN_OK) return st;
  return launch_pipe_forward(c, &d, &tc, mode, true, args, nargs);
}

/* (qkv, dy, y, stats): delta = dy . y, then dQ into the q block of the output's rows and dK | dV
 * into the k and v blocks. */
mn_status mn_cu_lower_QKV_ATTENTION_GRAD_SAVED(const mn_cu_op_ctx *c) {
  attn_dims d;
  attn_tc tc;
  mn_cu_arg args[MN_CU_MAX_ARGS];
  mn_status st = qkv_setup(c, &d, &tc, args);
  if (st != MN_OK) return st;
  size_t stat_bytes = align256((size_t)(d.batches * d.heads * d.t_len) * sizeof(float));
  args[3] = mn_cu_in(c, 1);
  stats_args(&d, mn_cu_in(c, 3), &args[4], &args[5]);
  args[6] = mn_cu_scratch(c, stat_bytes);
  args[7] = mn_cu_out(c);
  if ((st = launch_delta(c, &d, mn_cu_in(c, 2), mn_cu_in(c, 1), args[6])) != MN_OK) return st;
  if ((st = launch_pipe_dq(c, &d, &tc, true, args, 8)) != MN_OK) return st;
  args[7].offset += (size_t)d.heads * (size_t)d.head_dim * sizeof(float);
  return launch_dk_dv(c, &d, &tc, true, args, 8);
}
