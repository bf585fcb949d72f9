/* Lowering of the transformer ops: the row norms and their gradients (norm.cuh), RoPE
 * and its transpose (rope.cuh), embedding, scatter_add and the KV cache write
 * (embedding.cuh). Shapes, eps, theta and static offsets become template constants;
 * launch shapes are chosen here from the shapes. */
#include <stdio.h>

#include "cuda/emit.h"
#include "cuda/lower_norm.h"
#include "host/error.h"

/* Grid-stride kernels loop over what a grid of at most this many blocks does not cover. */
#define MAX_GRID 65535u
/* Rows wider than this are refused: the weight gradient keeps one double accumulator
 * per column a thread owns, which would not fit a thread's local memory. */
#define MAX_NORM_WIDTH ((int64_t)1 << 18)
/* Bytes of double partials the norm weight gradient may take from the scratch. */
#define NORM_PARTIAL_BYTES ((int64_t)64 << 20)
/* Row chunks (blocks) of the norm weight gradient. A GPT-2 row of 768 takes a block of one
 * warp, so 512 chunks left about 4 warps per SM of an H100 waiting on memory (0.11 ms per
 * [16384, 768] norm in bf16); 2048 keep about 16 in flight. */
#define NORM_MAX_CHUNKS 2048
/* Launch shapes of the warp-per-row weight gradient (norm_grad_w.cuh), by row width; wider
 * rows take a block per row. A lane keeps its share of a row, at most 24 floats of x and of dy
 * and 24 double column sums for rows up to 768 floats: at most 128 registers a thread (ptxas of
 * CUDA 13.0: 106 to 122 at N = 576 and 768), so two blocks of 8 warps share an SM. Up to 1024
 * floats (32 of each) it takes up to 168, so three blocks of 4 warps do. Either way the grid
 * is one wave on the 132 SMs of an H100 or H200, with no straggling partial wave, and its double
 * partials are small (264 x 768 x 8 bytes = 1.6 MB, against 12.6 MB for 2048 chunks). Constants
 * rather than the device's SM count, so that the plan, and with it the order of the sums and
 * the bits of the result, is the same on every card. */
typedef struct norm_gw_shape {
  int64_t max_n;
  int warps, blocks;
} norm_gw_shape;
static const norm_gw_shape NORM_GW_SHAPES[] = {{768, 8, 264}, {1024, 4, 396}};

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

static const char *tf(bool b) { return b ? "true" : "false"; }

static unsigned grid_for(int64_t n, unsigned block) {
  unsigned g = mn_cu_blocks(n, block);
  return g > MAX_GRID ? MAX_GRID : g;
}

/* Floats moved per access for rows of n floats: every row stays aligned to it. */
static int vec_for(int64_t n) { return n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }

/* ---- norms ---- */

/* Launch shape of a row norm over x (see norm.cuh): `block` threads per row, each owning
 * ITEMS vectors of VEC floats, aiming at 16 (VEC 4) or 8 floats per thread so that a row
 * of up to 16384 floats stays in registers between passes. */
typedef struct norm_cfg {
  int64_t n, rows;
  int vec, items;
  unsigned block;
  bool cache;
} norm_cfg;

static mn_status norm_config(const mn_cu_op_ctx *c, const mn_tensor_type *x, norm_cfg *k) {
  k->n = last_dim(x);
  k->rows = mn_tensor_type_numel(x) / k->n;
  if (k->n > MAX_NORM_WIDTH || k->rows > INT32_MAX)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "cuda backend: node %u (%s): rows of %lld floats (%lld rows) exceed the "
                   "norm kernels' limits (%lld floats, %d rows)",
                   c->id, mn_op_name(c->node->op), (long long)k->n, (long long)k->rows,
                   (long long)MAX_NORM_WIDTH, INT32_MAX);
  k->vec = vec_for(k->n);
  int64_t nv = k->n / k->vec, per_thread = k->vec == 1 ? 8 : 4;
  int64_t b = (nv + per_thread - 1) / per_thread;
  b = (b + 31) / 32 * 32;
  b = b < 32 ? 32 : b > 1024 ? 1024 : b;
  k->block = (unsigned)b;
  k->items = (int)((nv + b - 1) / b);
  k->cache = k->items * k->vec <= 16;
  return MN_OK;
}

/* Rows of one warp go 8 to a block of 256 threads. */
static unsigned rows_per_block(const norm_cfg *k) { return k->block == 32 ? 8u : 1u; }

/* The forward (inputs x, w[, b]) and the x gradient (inputs x, w, dy): the same launch
 * shape and argument layout, the output last. */
static mn_status lower_norm_rows(const mn_cu_op_ctx *c, const char *kernel, bool center,
                                 mn_cu_arg third) {
  norm_cfg k;
  mn_status st = norm_config(c, mn_cu_in_type(c, 0), &k);
  if (st != MN_OK) return st;
  unsigned rpb = rows_per_block(&k);
  int kid = mn_cu_kernel(c, k.block * rpb, "%s<%u, %u, %lld, %d, %lld, %d, %s, %s, %uu>", kernel,
                         k.block, rpb, (long long)k.rows, k.vec, (long long)k.n, k.items,
                         tf(k.cache), tf(center), mn_cu_float_bits(c->node->attrs.eps));
  mn_cu_arg args[4] = {mn_cu_in(c, 0), mn_cu_in(c, 1), third, mn_cu_out(c)};
  return mn_cu_launch(c, kid, mn_cu_blocks(k.rows, rpb), 1, 1, 0, 4, args);
}

mn_status mn_cu_launch_norm_rows(const mn_cu_op_ctx *c, const mn_tensor_type *x, const char *code,
                                 int nargs, const mn_cu_arg *args) {
  norm_cfg k;
  mn_status st = norm_config(c, x, &k);
  if (st != MN_OK) return st;
  unsigned rpb = rows_per_block(&k);
  char targs[160];
  snprintf(targs, sizeof targs, "<%u, %u, %lld, %d, %lld, %d, %s>", k.block, rpb, (long long)k.rows,
           k.vec, (long long)k.n, k.items, tf(k.cache));
  int kid = mn_cu_kernel_generated(c, k.block * rpb, code, targs);
  return mn_cu_launch(c, kid, mn_cu_blocks(k.rows, rpb), 1, 1, 0, nargs, args);
}

static mn_status lower_norm_fwd(const mn_cu_op_ctx *c, bool center) {
  return lower_norm_rows(c, "mn_norm_fwd", center,
                         center ? mn_cu_in(c, 2) : (mn_cu_arg){.kind = MN_CU_ARG_NONE});
}

static mn_status lower_norm_grad_x(const mn_cu_op_ctx *c, bool center) {
  return lower_norm_rows(c, "mn_norm_grad_x", center, mn_cu_in(c, 2));
}

/* Inputs (x, dy) -> [N]. Deterministic: each block sums a fixed chunk of rows into
 * double partials in the scratch, then one thread per column adds the partials in
 * chunk order. Rows of up to 1024 floats take a warp each (NORM_GW_SHAPES; a chunk is a
 * multiple of the warps, so they share it evenly); wider ones a block each. */
static mn_status lower_norm_grad_w(const mn_cu_op_ctx *c, bool center) {
  norm_cfg k;
  mn_status st = norm_config(c, mn_cu_in_type(c, 0), &k);
  if (st != MN_OK) return st;
  const norm_gw_shape *gw = NULL;
  for (size_t i = 0; !gw && i < sizeof NORM_GW_SHAPES / sizeof NORM_GW_SHAPES[0]; i++)
    if (k.n <= NORM_GW_SHAPES[i].max_n) gw = &NORM_GW_SHAPES[i];
  int64_t chunk;
  if (gw) {
    chunk = (k.rows + gw->blocks - 1) / gw->blocks;
    chunk = (chunk + gw->warps - 1) / gw->warps * gw->warps;
    if (chunk < gw->warps) chunk = gw->warps;
  } else {
    int64_t chunks = k.rows < NORM_MAX_CHUNKS ? k.rows : NORM_MAX_CHUNKS;
    int64_t fit = NORM_PARTIAL_BYTES / (k.n * (int64_t)sizeof(double));
    if (fit < 1) fit = 1;
    if (chunks > fit) chunks = fit;
    chunk = (k.rows + chunks - 1) / chunks;
  }
  int64_t chunks = (k.rows + chunk - 1) / chunk;
  mn_cu_arg part = mn_cu_scratch(c, (size_t)(chunks * k.n) * sizeof(double));
  unsigned eps = mn_cu_float_bits(c->node->attrs.eps);
  int k1 = gw ? mn_cu_kernel(c, 32u * (unsigned)gw->warps,
                             "mn_norm_grad_w_rows<%d, %lld, %s, %uu, %lld, %lld>", gw->warps,
                             (long long)k.n, tf(center), eps, (long long)k.rows, (long long)chunk)
              : mn_cu_kernel(c, k.block,
                             "mn_norm_grad_w_partial<%u, %d, %lld, %d, %s, %s, %uu, %lld, %lld>",
                             k.block, k.vec, (long long)k.n, k.items, tf(k.cache), tf(center), eps,
                             (long long)k.rows, (long long)chunk);
  mn_cu_arg a1[3] = {mn_cu_in(c, 0), mn_cu_in(c, 1), part};
  st = mn_cu_launch(c, k1, (unsigned)chunks, 1, 1, 0, 3, a1);
  if (st != MN_OK) return st;
  int k2 = mn_cu_kernel(c, 256, "mn_norm_grad_w_sum<%lld, %d>", (long long)k.n, (int)chunks);
  mn_cu_arg a2[2] = {part, mn_cu_out(c)};
  return mn_cu_launch(c, k2, (unsigned)((k.n + 31) / 32), 1, 1, 0, 2, a2);
}

mn_status mn_cu_lower_RMS_NORM(const mn_cu_op_ctx *c) { return lower_norm_fwd(c, false); }
mn_status mn_cu_lower_LAYER_NORM(const mn_cu_op_ctx *c) { return lower_norm_fwd(c, true); }
mn_status mn_cu_lower_RMS_NORM_GRAD_X(const mn_cu_op_ctx *c) { return lower_norm_grad_x(c, false); }
mn_status mn_cu_lower_RMS_NORM_GRAD_W(const mn_cu_op_ctx *c) { return lower_norm_grad_w(c, false); }
mn_status mn_cu_lower_LAYER_NORM_GRAD_X(const mn_cu_op_ctx *c) {
  return lower_norm_grad_x(c, true);
}
mn_status mn_cu_lower_LAYER_NORM_GRAD_W(const mn_cu_op_ctx *c) {
  return lower_norm_grad_w(c, true);
}

/* ---- RoPE ---- */

/* Where a RoPE op takes its positions from: its static offset, a U32 offset (input 1), or a
 * U32 position per row (input 1). */
typedef enum rope_pos { ROPE_STATIC, ROPE_DYNAMIC, ROPE_PER_ROW } rope_pos;

/* Input 0 is x (forward) or dy (gradient). One thread per (row, rotated pair index); each
 * covers every head of its row. */
static mn_status lower_rope(const mn_cu_op_ctx *c, int dir, rope_pos from) {
  const mn_tensor_type *t = &c->node->type;
  const mn_op_attrs *a = &c->node->attrs;
  int64_t d = last_dim(t), seq = t->shape[t->rank - 2], rows = mn_tensor_type_numel(t) / d;
  bool dyn = from == ROPE_DYNAMIC, per_row = from == ROPE_PER_ROW;
  int kid = mn_cu_kernel(c, 256, "mn_rope_apply<%lld, %lld, %lld, %d, %d, %d, %s, %s, %uu>",
                         (long long)rows, (long long)seq, (long long)d, a->head_dim, dir,
                         from == ROPE_STATIC ? a->pos_offset : 0, tf(dyn), tf(per_row),
                         mn_cu_float_bits(a->theta));
  mn_cu_arg args[3] = {mn_cu_in(c, 0), mn_cu_out(c),
                       from != ROPE_STATIC ? mn_cu_in(c, 1) : (mn_cu_arg){.kind = MN_CU_ARG_NONE}};
  return mn_cu_launch(c, kid, grid_for(rows * (a->head_dim / 2), 256), 1, 1, 0, 3, args);
}

mn_status mn_cu_lower_ROPE(const mn_cu_op_ctx *c) { return lower_rope(c, 1, ROPE_STATIC); }
mn_status mn_cu_lower_ROPE_DYNAMIC(const mn_cu_op_ctx *c) { return lower_rope(c, 1, ROPE_DYNAMIC); }
mn_status mn_cu_lower_ROPE_POSITIONS(const mn_cu_op_ctx *c) {
  return lower_rope(c, 1, ROPE_PER_ROW);
}
mn_status mn_cu_lower_ROPE_GRAD(const mn_cu_op_ctx *c) { return lower_rope(c, -1, ROPE_STATIC); }
mn_status mn_cu_lower_ROPE_DYNAMIC_GRAD(const mn_cu_op_ctx *c) {
  return lower_rope(c, -1, ROPE_DYNAMIC);
}
mn_status mn_cu_lower_ROPE_POSITIONS_GRAD(const mn_cu_op_ctx *c) {
  return lower_rope(c, -1, ROPE_PER_ROW);
}

/* ---- embedding, scatter_add, cache_write ---- */

/* Inputs (indices U32 [..], table [rows, D]) -> [.., D]. */
mn_status mn_cu_lower_EMBEDDING(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tt = mn_cu_in_type(c, 1);
  int64_t ni = mn_tensor_type_numel(mn_cu_in_type(c, 0)), rows = tt->shape[0], d = tt->shape[1];
  int vec = vec_for(d);
  int kid = mn_cu_kernel(c, 256, "mn_emb_gather<%lld, %lld, %lld, %d, %uu>", (long long)ni,
                         (long long)d, (long long)rows, vec, (unsigned)c->id);
  mn_cu_arg args[4] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_out(c), mn_cu_error_arg()};
  return mn_cu_launch(c, kid, grid_for(ni * d / vec, 256), 1, 1, 0, 4, args);
}

/* Inputs (indices U32 [..], src [.., D]) -> [num_rows, D]: each of about 1024 blocks owns a
 * range of rows and sums its entries in index order, so the result repeats bit for bit. Every
 * block scans all the indices; with 256 blocks each also made ~64 dependent row additions
 * (GPT-2's two on an H100: 0.34 ms, 0.26 with 1024; docs/performance.md). */
#define SCATTER_BLOCKS 1024
mn_status mn_cu_lower_SCATTER_ADD(const mn_cu_op_ctx *c) {
  int64_t ni = mn_tensor_type_numel(mn_cu_in_type(c, 0)), rows = c->node->attrs.num_rows;
  int64_t d = last_dim(&c->node->type);
  int64_t rpb = (rows + SCATTER_BLOCKS - 1) / SCATTER_BLOCKS;
  int kid = mn_cu_kernel(c, 256, "mn_emb_scatter_add<%lld, %lld, %lld, %lld, %uu>", (long long)ni,
                         (long long)d, (long long)rows, (long long)rpb, (unsigned)c->id);
  mn_cu_arg args[4] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_out(c), mn_cu_error_arg()};
  return mn_cu_launch(c, kid, (unsigned)((rows + rpb - 1) / rpb), 1, 1, 0, 4, args);
}

/* Inputs (new_kv [B, D] or [B, P, D], cache [rows, D] or [B, rows, D], kv_pos U32 [1]); the
 * node's buffer is the cache's (an in-place op), so only rows kv_pos .. kv_pos+P-1 of each
 * sequence are written. */
mn_status mn_cu_lower_CACHE_WRITE(const mn_cu_op_ctx *c) {
  const mn_tensor_type *tc = mn_cu_in_type(c, 1), *tn = mn_cu_in_type(c, 0);
  int64_t rows = tc->shape[tc->rank - 2], d = tc->shape[tc->rank - 1];
  int64_t batch = tc->rank == 3 ? tc->shape[0] : 1, p = tn->rank == 3 ? tn->shape[1] : 1;
  int kid = mn_cu_kernel(c, 256, "mn_emb_cache_write<%lld, %lld, %lld>", (long long)rows,
                         (long long)d, (long long)p);
  mn_cu_arg args[5] = {mn_cu_in(c, 0), mn_cu_out(c), mn_cu_in(c, 2), mn_cu_error_arg(),
                       mn_cu_node_id_arg(c)};
  return mn_cu_launch(c, kid, grid_for(p * d, 256), (unsigned)batch, 1, 0, 5, args);
}
