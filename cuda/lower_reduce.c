/* Lowering of the reductions, softmax, losses and their gradients to the kernels of
 * cuda/kernels/reduce.cuh, reduce_loss.cuh and (element-wise loss gradients)
 * pointwise.cuh. Whole-tensor sums go through per-block double partials in scratch and
 * one finishing block, never atomics, so every result is reproducible bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "cuda/emit.h"
#include "cuda/lower_colsum.h"
#include "host/error.h"
#include "host/pointwise.h"

#define RED_BLOCK 256
/* Threads of the one block that counts a sparse loss's labels. */
#define COUNT_BLOCK 1024
/* Partials of a whole-tensor sum: one finishing block reads at most this many. */
#define RED_MAX_PARTS 1024
/* Elements a thread of pass 1 sums at least, so small tensors take one block. */
#define RED_PER_THREAD 16

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* Sum over the n elements of input 0 (and input 1 for the two-operand losses) into
 * the node's scalar; `code` is an mn_red_code. */
static mn_status reduce_all(const mn_cu_op_ctx *c, const char *code, int nin) {
  int64_t n = mn_tensor_type_numel(mn_cu_in_type(c, 0));
  int64_t parts =
      (n + (int64_t)RED_BLOCK * RED_PER_THREAD - 1) / ((int64_t)RED_BLOCK * RED_PER_THREAD);
  if (parts > RED_MAX_PARTS) parts = RED_MAX_PARTS;
  if (parts < 1) parts = 1;
  mn_cu_arg args[3] = {mn_cu_out(c), mn_cu_in(c, 0), nin > 1 ? mn_cu_in(c, 1) : (mn_cu_arg){0}};
  if (parts == 1) {
    int k = mn_cu_kernel(c, RED_BLOCK, "mn_red_all_partial<%s, %lldLL, %d, true>", code,
                         (long long)n, RED_BLOCK);
    return mn_cu_launch(c, k, 1, 1, 1, 0, 1 + nin, args);
  }
  mn_cu_arg scratch = mn_cu_scratch(c, (size_t)parts * sizeof(double));
  args[0] = scratch;
  int k1 = mn_cu_kernel(c, RED_BLOCK, "mn_red_all_partial<%s, %lldLL, %d, false>", code,
                        (long long)n, RED_BLOCK);
  mn_status st = mn_cu_launch(c, k1, (unsigned)parts, 1, 1, 0, 1 + nin, args);
  if (st != MN_OK) return st;
  int k2 = mn_cu_kernel(c, RED_BLOCK, "mn_red_all_final<%s, %lldLL, %lldLL, %d>", code,
                        (long long)n, (long long)parts, RED_BLOCK);
  mn_cu_arg fin[2] = {mn_cu_out(c), scratch};
  return mn_cu_launch(c, k2, 1, 1, 1, 0, 2, fin);
}

mn_status mn_cu_lower_SUM_ALL(const mn_cu_op_ctx *c) { return reduce_all(c, "MN_RED_SUM", 1); }
mn_status mn_cu_lower_MEAN_ALL(const mn_cu_op_ctx *c) { return reduce_all(c, "MN_RED_MEAN", 1); }
mn_status mn_cu_lower_BCE_LOSS(const mn_cu_op_ctx *c) { return reduce_all(c, "MN_RED_BCE", 2); }
mn_status mn_cu_lower_MSE_LOSS(const mn_cu_op_ctx *c) { return reduce_all(c, "MN_RED_MSE", 2); }
mn_status mn_cu_lower_L1_LOSS(const mn_cu_op_ctx *c) { return reduce_all(c, "MN_RED_L1", 2); }

/* Launch shape of a row-wise kernel over rows of n: g threads per row, from one warp
 * (several rows per block) up to a 1024-thread block, about 8 float4 loads per thread. */
typedef struct row_cfg {
  int64_t rows, n;
  int block, g;
  unsigned grid;
} row_cfg;

static row_cfg row_config(int64_t rows, int64_t n) {
  row_cfg r = {.rows = rows, .n = n};
  r.g = 32;
  while (r.g < 1024 && (int64_t)r.g * 32 < n)
    r.g *= 2;
  r.block = r.g == 32 ? 128 : r.g;
  r.grid = mn_cu_blocks(rows, (unsigned)(r.block / r.g));
  return r;
}

/* Rows of the node's input 0 over its last axis. */
static row_cfg input_rows(const mn_cu_op_ctx *c) {
  const mn_tensor_type *t = mn_cu_in_type(c, 0);
  int64_t n = last_dim(t);
  return row_config(mn_tensor_type_numel(t) / n, n);
}

static mn_status softmax(const mn_cu_op_ctx *c, bool log) {
  row_cfg r = input_rows(c);
  int k = mn_cu_kernel(c, (unsigned)r.block, "mn_red_softmax<%s, %d, %d, %lldLL, %lldLL>",
                       log ? "true" : "false", r.block, r.g, (long long)r.rows, (long long)r.n);
  mn_cu_arg args[2] = {mn_cu_out(c), mn_cu_in(c, 0)};
  return mn_cu_launch(c, k, r.grid, 1, 1, 0, 2, args);
}
mn_status mn_cu_lower_SOFTMAX(const mn_cu_op_ctx *c) { return softmax(c, false); }
mn_status mn_cu_lower_LOG_SOFTMAX(const mn_cu_op_ctx *c) { return softmax(c, true); }

static mn_status softmax_grad(const mn_cu_op_ctx *c, bool log) {
  row_cfg r = input_rows(c);
  int k = mn_cu_kernel(c, (unsigned)r.block, "mn_red_softmax_grad<%s, %d, %d, %lldLL, %lldLL>",
                       log ? "true" : "false", r.block, r.g, (long long)r.rows, (long long)r.n);
  mn_cu_arg args[3] = {mn_cu_out(c), mn_cu_in(c, 0), mn_cu_in(c, 1)};
  return mn_cu_launch(c, k, r.grid, 1, 1, 0, 3, args);
}
mn_status mn_cu_lower_SOFTMAX_GRAD(const mn_cu_op_ctx *c) { return softmax_grad(c, false); }
mn_status mn_cu_lower_LOG_SOFTMAX_GRAD(const mn_cu_op_ctx *c) { return softmax_grad(c, true); }

/* The mean of `rows` double partials in scratch into the node's scalar. */
static mn_status mean_of_rows(const mn_cu_op_ctx *c, mn_cu_arg scratch, int64_t rows) {
  int k = mn_cu_kernel(c, RED_BLOCK, "mn_red_all_final<MN_RED_MEAN, %lldLL, %lldLL, %d>",
                       (long long)rows, (long long)rows, RED_BLOCK);
  mn_cu_arg args[2] = {mn_cu_out(c), scratch};
  return mn_cu_launch(c, k, 1, 1, 1, 0, 2, args);
}

mn_status mn_cu_lower_CROSS_ENTROPY_LOSS(const mn_cu_op_ctx *c) {
  row_cfg r = input_rows(c);
  mn_cu_arg scratch = mn_cu_scratch(c, (size_t)r.rows * sizeof(double));
  int k = mn_cu_kernel(c, (unsigned)r.block, "mn_loss_ce_rows<%d, %d, %lldLL, %lldLL>", r.block,
                       r.g, (long long)r.rows, (long long)r.n);
  mn_cu_arg args[3] = {scratch, mn_cu_in(c, 0), mn_cu_in(c, 1)};
  mn_status st = mn_cu_launch(c, k, r.grid, 1, 1, 0, 3, args);
  return st != MN_OK ? st : mean_of_rows(c, scratch, r.rows);
}

/* The sparse cross-entropy's scratch: the count of the rows it counts (a double at offset 0),
 * then, for the loss, one double partial per row. */
_Static_assert(MN_DEV_IGNORE_LABEL == MN_IGNORE_LABEL, "the kernels' ignore label is the API's");
#define SPARSE_PARTS_AT 256

static mn_cu_arg sparse_scratch(const mn_cu_op_ctx *c, int64_t loss_rows) {
  return mn_cu_scratch(c, SPARSE_PARTS_AT + (size_t)loss_rows * sizeof(double));
}

static mn_cu_arg sparse_partials(mn_cu_arg scratch) {
  scratch.offset += SPARSE_PARTS_AT;
  return scratch;
}

/* Counts the rows whose label (input 1) is not the ignore label into scratch offset 0, before
 * any kernel that divides by it; reports a batch with none. */
static mn_status count_labels(const mn_cu_op_ctx *c, mn_cu_arg scratch, int64_t rows) {
  int k = mn_cu_kernel(c, COUNT_BLOCK, "mn_loss_label_count<%d, %lldLL, %uu, %uu>", COUNT_BLOCK,
                       (long long)rows, (unsigned)c->id, (unsigned)c->node->inputs[1]);
  mn_cu_arg args[3] = {scratch, mn_cu_in(c, 1), mn_cu_error_arg()};
  return mn_cu_launch(c, k, 1, 1, 1, 0, 3, args);
}

/* The loss: the sum of the row partials over the count. */
static mn_status mean_of_counted_rows(const mn_cu_op_ctx *c, mn_cu_arg scratch, int64_t rows) {
  int k =
      mn_cu_kernel(c, RED_BLOCK, "mn_loss_sparse_ce_mean<%lldLL, %d>", (long long)rows, RED_BLOCK);
  mn_cu_arg args[3] = {mn_cu_out(c), sparse_partials(scratch), scratch};
  return mn_cu_launch(c, k, 1, 1, 1, 0, 3, args);
}

mn_status mn_cu_lower_SPARSE_CROSS_ENTROPY_LOSS(const mn_cu_op_ctx *c) {
  row_cfg r = input_rows(c);
  mn_cu_arg scratch = sparse_scratch(c, r.rows);
  mn_status st = count_labels(c, scratch, r.rows);
  if (st != MN_OK) return st;
  int k = mn_cu_kernel(c, (unsigned)r.block,
                       "mn_loss_sparse_ce_rows<%d, %d, %lldLL, %lldLL, %uu, %lldLL>", r.block, r.g,
                       (long long)r.rows, (long long)r.n, (unsigned)c->id,
                       (long long)mn_cu_row_pitch(c->plan, c->node->inputs[0]));
  mn_cu_arg args[4] = {sparse_partials(scratch), mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_error_arg()};
  st = mn_cu_launch(c, k, r.grid, 1, 1, 0, 4, args);
  return st != MN_OK ? st : mean_of_counted_rows(c, scratch, r.rows);
}

mn_status mn_cu_lower_CROSS_ENTROPY_GRAD(const mn_cu_op_ctx *c) {
  row_cfg r = input_rows(c);
  int k = mn_cu_kernel(c, (unsigned)r.block, "mn_loss_ce_grad<%d, %d, %lldLL, %lldLL>", r.block,
                       r.g, (long long)r.rows, (long long)r.n);
  mn_cu_arg args[4] = {mn_cu_out(c), mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_in(c, 2)};
  return mn_cu_launch(c, k, r.grid, 1, 1, 0, 4, args);
}

/* The sparse loss gradient's rows a block and the shared memory of its stage. A block of one
 * row group (G == BLOCK: rows of more than 1024 values) takes up to LOSS_ROWS_PER_BLOCK rows one
 * after another, at least LOSS_ROW_BLOCKS blocks in all, and when its 16-bit rows can be held in
 * registers (16-byte chunks, at most 8 a lane) the next row's loads go into a stage of shared
 * memory while this one is worked on (mn_loss_sparse_ce_pipe). The stage holds at most
 * LOSS_STAGE_BYTES, what a block may have on every card from sm_80 on (99 KB on sm_86, 89 and
 * 120): 6 of the 7 chunks a lane of GPT-2's 50304-wide rows. fp32 rows take no stage. */
#define LOSS_ROWS_PER_BLOCK 8
#define LOSS_ROW_BLOCKS     128
#define LOSS_STAGE_BYTES    (96 * 1024)

typedef struct loss_rows {
  int per_block;
  unsigned grid;
  int staged;   /* chunks a lane in the stage, 0: none */
  size_t stage; /* its bytes */
} loss_rows;

static loss_rows loss_rows_of(const mn_cu_op_ctx *c, const row_cfg *r, long long xp, long long op) {
  loss_rows lr = {.per_block = 1, .grid = r->grid};
  if (r->g != r->block) return lr;
  while (lr.per_block < LOSS_ROWS_PER_BLOCK && r->rows / (2 * lr.per_block) >= LOSS_ROW_BLOCKS)
    lr.per_block *= 2;
  lr.grid = mn_cu_blocks(r->rows, (unsigned)lr.per_block);
  long long chunks = (xp + 8LL * r->g - 1) / (8LL * r->g), fit = LOSS_STAGE_BYTES / (16LL * r->g);
  bool low = mn_cu_arg_storage(c->plan, mn_cu_in(c, 0)) != MN_DEV_F32;
  if (low && lr.per_block > 1 && xp == op && xp % 8 == 0 && chunks <= 8 && fit > 0) {
    lr.staged = (int)(chunks < fit ? chunks : fit);
    lr.stage = (size_t)lr.staged * (size_t)r->g * 16;
  }
  return lr;
}

mn_status mn_cu_lower_SPARSE_CROSS_ENTROPY_GRAD(const mn_cu_op_ctx *c) {
  row_cfg r = input_rows(c);
  mn_cu_arg scratch = sparse_scratch(c, 0);
  mn_status st = count_labels(c, scratch, r.rows);
  if (st != MN_OK) return st;
  /* The logits and their gradient may have padded rows (the same pitch: both are padded when
   * every op touching them reads the pitch, and they have one width). */
  long long xp = (long long)mn_cu_row_pitch(c->plan, c->node->inputs[0]),
            op = (long long)mn_cu_row_pitch(c->plan, c->id);
  loss_rows lr = loss_rows_of(c, &r, xp, op);
  int k = mn_cu_kernel(
      c, (unsigned)r.block,
      "mn_loss_sparse_ce_grad<%d, %d, %lldLL, %lldLL, %uu, %lldLL, %lldLL, %d, %d>", r.block, r.g,
      (long long)r.rows, (long long)r.n, (unsigned)c->id, xp, op, lr.per_block, lr.staged);
  mn_cu_arg args[6] = {mn_cu_out(c),   mn_cu_in(c, 0),    mn_cu_in(c, 1),
                       mn_cu_in(c, 2), mn_cu_error_arg(), scratch};
  return mn_cu_launch(c, k, lr.grid, 1, 1, lr.stage, 6, args);
}

/* The loss (the mean of the row partials over the counted rows) and, as extra value 1, its
 * gradient, from one pass over the logits (optimizer/loss_grad.h); the gradient may be written over
 * them. */
/* A batch of at most SMALL_LOSS_ROWS rows of at most SMALL_LOSS_N classes and at most
 * SMALL_LOSS_VALUES logits in all takes one block (mn_loss_sparse_ce_small): its three kernels
 * are three waits on the critical path of a step that is all waits. More logits than that are
 * more work than one SM should take alone (the MLP's 128 x 10 is what was measured).
 * MN_CUDA_SMALL_LOSS=0 keeps the three kernels, for comparison. */
#define SMALL_LOSS_ROWS   1024
#define SMALL_LOSS_N      1024
#define SMALL_LOSS_VALUES 65536

static bool small_loss(const row_cfg *r) {
  const char *env = getenv("MN_CUDA_SMALL_LOSS");
  if (env && strcmp(env, "0") == 0) return false;
  return r->rows <= SMALL_LOSS_ROWS && r->n <= SMALL_LOSS_N && r->rows * r->n <= SMALL_LOSS_VALUES;
}

/* Lanes a row of the small loss: about two float4 loads each, 4 to 32. */
static int small_loss_group(int64_t n) {
  int g = 4;
  while (g < 32 && (int64_t)g * 8 < n)
    g *= 2;
  return g;
}

mn_status mn_cu_lower_SPARSE_CROSS_ENTROPY_LOSS_GRAD(const mn_cu_op_ctx *c) {
  row_cfg r = input_rows(c);
  mn_node grad = mn_plan_extra_output(c->plan, c->id, 1);
  if (grad == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (%s) has no extra_output for its gradient",
                   c->id, mn_op_name(c->node->op));
  mn_cu_arg scratch = sparse_scratch(c, r.rows);
  long long xp = (long long)mn_cu_row_pitch(c->plan, c->node->inputs[0]),
            op = (long long)mn_cu_row_pitch(c->plan, grad);
  if (small_loss(&r)) {
    int k =
        mn_cu_kernel(c, SMALL_LOSS_ROWS,
                     "mn_loss_sparse_ce_small<%d, %d, %lldLL, %lldLL, %uu, %uu, %lldLL, %lldLL>",
                     SMALL_LOSS_ROWS, small_loss_group(r.n), (long long)r.rows, (long long)r.n,
                     (unsigned)c->id, (unsigned)c->node->inputs[1], xp, op);
    mn_cu_arg args[8] = {mn_cu_node_arg(grad),     mn_cu_in(c, 0),    mn_cu_in(c, 1),
                         mn_cu_in(c, 2),           mn_cu_error_arg(), scratch,
                         sparse_partials(scratch), mn_cu_out(c)};
    return mn_cu_launch(c, k, 1, 1, 1, 0, 8, args);
  }
  mn_status st = count_labels(c, scratch, r.rows);
  if (st != MN_OK) return st;
  loss_rows lr = loss_rows_of(c, &r, xp, op);
  int k = mn_cu_kernel(
      c, (unsigned)r.block,
      "mn_loss_sparse_ce_loss_grad<%d, %d, %lldLL, %lldLL, %uu, %lldLL, %lldLL, %d, %d>", r.block,
      r.g, (long long)r.rows, (long long)r.n, (unsigned)c->id, xp, op, lr.per_block, lr.staged);
  mn_cu_arg args[7] = {mn_cu_node_arg(grad),    mn_cu_in(c, 0),    mn_cu_in(c, 1),
                       mn_cu_in(c, 2),          mn_cu_error_arg(), scratch,
                       sparse_partials(scratch)};
  st = mn_cu_launch(c, k, lr.grid, 1, 1, lr.stage, 7, args);
  return st != MN_OK ? st : mean_of_counted_rows(c, scratch, r.rows);
}

/* The row chunks of a column sum over `rows` rows in col_blocks column blocks: about `blocks`
 * blocks in all, each chunk at least min_rows long and, with max_rows, at most that; 1 to
 * 65535 chunks. */
static int64_t row_chunks(int64_t rows, unsigned col_blocks, int64_t blocks, int64_t min_rows,
                          int64_t max_rows) {
  int64_t ch = blocks / col_blocks;
  if (ch > rows / min_rows) ch = rows / min_rows;
  if (max_rows && ch < (rows + max_rows - 1) / max_rows) ch = (rows + max_rows - 1) / max_rows;
  if (ch > 65535) ch = 65535;
  return ch < 1 ? 1 : ch;
}

/* The ch double partials of each of ncol columns (scratch, chunk-major) added in a fixed order
 * into sums. */
static mn_status add_partials(const mn_cu_op_ctx *c, mn_cu_arg sums, mn_cu_arg partials,
                              int64_t ncol, int64_t ch) {
  int k = mn_cu_kernel(c, 256, "mn_red_sum_rows_final<%lldLL, %d>", (long long)ncol, (int)ch);
  if (k < 0) return mn_cu_oom(c);
  mn_cu_arg args[2] = {sums, partials};
  return mn_cu_launch(c, k, mn_cu_blocks(ncol, 32), 1, 1, 0, 2, args);
}

/* Up to SMALL_SUM_ROWS rows, a column sum (sum_rows, and the pointwise gradients' below) is one
 * kernel of SMALL_SUM_LANES row lanes by 32 columns a block, a column a thread: row chunks would
 * take a second kernel to add them, and a thread a column alone waits on its loads one after
 * another (a small step's bias gradient, 128 rows, on its critical path). */
#define SMALL_SUM_ROWS  256
#define SMALL_SUM_LANES 32
#define SMALL_SUM_COLS  32

/* Many rows of 8k columns: 32 column threads of 8 columns by 8 row lanes a block, each lane 8
 * rows in flight (4 of fp32: the same bytes), about 512 blocks in all, each chunk at least 128
 * rows (mn_red_sum_rows_vec); other widths a thread a column. */
#define SUM_VEC_CT     32
#define SUM_VEC_LANES  8
#define SUM_VEC_BLOCKS 512
#define SUM_VEC_MIN    128

/* Kernel k of sum_rows over col_blocks x ch blocks: into the sums when ch is 1, else into
 * chunk partials that add_partials adds. */
static mn_status launch_sum_rows(const mn_cu_op_ctx *c, int k, unsigned col_blocks, int64_t ch,
                                 int64_t ncol) {
  if (k < 0) return mn_cu_oom(c);
  if (ch == 1) {
    mn_cu_arg args[2] = {mn_cu_out(c), mn_cu_in(c, 0)};
    return mn_cu_launch(c, k, col_blocks, 1, 1, 0, 2, args);
  }
  mn_cu_arg scratch = mn_cu_scratch(c, (size_t)ch * (size_t)ncol * sizeof(double));
  mn_cu_arg args[2] = {scratch, mn_cu_in(c, 0)};
  mn_status st = mn_cu_launch(c, k, col_blocks, (unsigned)ch, 1, 0, 2, args);
  return st != MN_OK ? st : add_partials(c, mn_cu_out(c), scratch, ncol, ch);
}

static mn_status sum_rows_vec8(const mn_cu_op_ctx *c, int64_t rows, int64_t ncol) {
  unsigned col_blocks = mn_cu_blocks(ncol, SUM_VEC_CT * 8);
  int64_t ch = row_chunks(rows, col_blocks, SUM_VEC_BLOCKS, SUM_VEC_MIN, 0);
  int k =
      mn_cu_kernel(c, SUM_VEC_CT * SUM_VEC_LANES, "mn_red_sum_rows_vec<%lldLL, %lldLL, %d, %d, %d>",
                   (long long)rows, (long long)ncol, (int)ch, SUM_VEC_CT, SUM_VEC_LANES);
  return launch_sum_rows(c, k, col_blocks, ch, ncol);
}

/* x [.., N] summed over every leading index into N values: column blocks by row chunks,
 * about 512 blocks in all, each chunk at least 16 rows. */
mn_status mn_cu_lower_SUM_ROWS(const mn_cu_op_ctx *c) {
  const mn_tensor_type *t = mn_cu_in_type(c, 0);
  int64_t ncol = last_dim(t), rows = mn_tensor_type_numel(t) / ncol;
  if (rows <= SMALL_SUM_ROWS) {
    int k = mn_cu_kernel(c, SMALL_SUM_LANES * SMALL_SUM_COLS,
                         "mn_red_sum_rows_lanes<%lldLL, %lldLL, %d, %d>", (long long)rows,
                         (long long)ncol, SMALL_SUM_COLS, SMALL_SUM_LANES);
    if (k < 0) return mn_cu_oom(c);
    mn_cu_arg args[2] = {mn_cu_out(c), mn_cu_in(c, 0)};
    return mn_cu_launch(c, k, mn_cu_blocks(ncol, SMALL_SUM_COLS), 1, 1, 0, 2, args);
  }
  if (ncol % 8 == 0) return sum_rows_vec8(c, rows, ncol);
  int block = ncol >= 256 ? 256 : (int)((ncol + 31) / 32 * 32);
  unsigned col_blocks = mn_cu_blocks(ncol, (unsigned)block);
  int64_t ch = row_chunks(rows, col_blocks, 512, 16, 0);
  int k = mn_cu_kernel(c, (unsigned)block, "mn_red_sum_rows<%lldLL, %lldLL, %d, %d>",
                       (long long)rows, (long long)ncol, (int)ch, block);
  return launch_sum_rows(c, k, col_blocks, ch, ncol);
}

/* A pointwise gradient's column sums (gelu_grad_bgrad, matmul_drelu_bgrad), first pass: blocks
 * of COLSUM_CT column threads by COLSUM_LANES row lanes, about COLSUM_BLOCKS of them in all (4 a
 * multiprocessor of an H100, 32 warps), each chunk of rows at least COLSUM_MIN_ROWS long. One lane
 * a block (128 threads, 8 columns a thread, 16 warps an SM) ran GPT-2's [16384, 3072] at 146 us
 * against 110 us for gelu_grad alone. */
#define COLSUM_CT            32
#define COLSUM_LANES         8
#define COLSUM_BLOCKS        512
#define COLSUM_BLOCKS_PER_SM 4
#define COLSUM_MIN_ROWS      32
/* Rows of a chunk at most: a lane adds at most COLSUM_MAX_ROWS / COLSUM_LANES values in float. */
#define COLSUM_MAX_ROWS 4096

mn_status mn_cu_pointwise_colsum(const mn_cu_op_ctx *c, int op, mn_cu_arg x, mn_cu_arg dy,
                                 mn_node sums, mn_node act) {
  int64_t ncol = last_dim(&c->node->type), rows = mn_cu_numel(c) / ncol;
  bool small = rows <= SMALL_SUM_ROWS;
  int vec = ncol % 8 == 0 && !small ? 8 : 1, lanes = small ? SMALL_SUM_LANES : COLSUM_LANES;
  int ct = small ? SMALL_SUM_COLS : COLSUM_CT;
  unsigned col_blocks = mn_cu_blocks(ncol, (unsigned)(ct * vec));
  int64_t ch =
      small ? 1 : row_chunks(rows, col_blocks, COLSUM_BLOCKS, COLSUM_MIN_ROWS, COLSUM_MAX_ROWS);
  int k = mn_cu_kernel(c, (unsigned)(ct * lanes),
                       "mn_pw_map_colsum<%d, %lldLL, %lldLL, %d, %d, %d, %d, %d>", op,
                       (long long)rows, (long long)ncol, (int)ch, vec, ct, lanes,
                       act != MN_NO_NODE ? (int)MN_PW_GELU : -1);
  if (k < 0) return mn_cu_oom(c);
  /* COLSUM_BLOCKS fill an H100 in one wave only at 4 blocks a multiprocessor (64 registers a
   * thread); left free, GPT-2's bf16 instance that also writes gelu(x) took 69 for sm_90a and an
   * SM held 3 (504 blocks over 396 places); bounded, it takes 60 and spills nothing. */
  if (!small) mn_cu_kernel_min_blocks(c, k, COLSUM_BLOCKS_PER_SM);
  mn_cu_arg args[5] = {mn_cu_out(c), x, dy, mn_cu_node_arg(sums),
                       act != MN_NO_NODE ? mn_cu_node_arg(act) : mn_cu_out(c)};
  int nargs = act != MN_NO_NODE ? 5 : 4;
  if (ch == 1) return mn_cu_launch(c, k, col_blocks, 1, 1, 0, nargs, args);
  args[3] = mn_cu_scratch(c, (size_t)ch * (size_t)ncol * sizeof(double));
  mn_status st = mn_cu_launch(c, k, col_blocks, (unsigned)ch, 1, 0, nargs, args);
  return st != MN_OK ? st : add_partials(c, mn_cu_node_arg(sums), args[3], ncol, ch);
}

/* gelu_grad(x, dy) over [rows, N], its column sums into the extra_output of value 1 and for
 * variant 1 gelu(x) into that of value 2. */
mn_status mn_cu_lower_GELU_GRAD_BGRAD(const mn_cu_op_ctx *c) {
  mn_node sums = mn_plan_extra_output(c->plan, c->id, 1);
  if (sums == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (%s) has no extra_output for its sums",
                   c->id, mn_op_name(c->node->op));
  bool act = c->node->attrs.variant == 1;
  mn_node gelu = act ? mn_plan_extra_output(c->plan, c->id, 2) : MN_NO_NODE;
  if (act && gelu == MN_NO_NODE)
    return mn_fail(MN_ERR_STATE, "cuda backend: node %u (%s) has no extra_output for gelu(x)",
                   c->id, mn_op_name(c->node->op));
  return mn_cu_pointwise_colsum(c, MN_PW_GELU_GRAD, mn_cu_in(c, 0), mn_cu_in(c, 1), sums, gelu);
}
