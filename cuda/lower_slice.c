/* Lowering of slice_last and its gradient to the kernels of cuda/kernels/slice.cuh. */
#include "cuda/emit.h"

#define SLICE_BLOCK 256
/* Enough blocks to fill an H200 several times over; larger tensors grid-stride. */
#define SLICE_MAX_BLOCKS 4096

static int64_t last_dim(const mn_tensor_type *t) { return t->shape[t->rank - 1]; }

/* The widest of 4, 2, 1 floats dividing the row length, the slice length and its start,
 * so that vector loads and stores stay aligned. */
static int vec_width(int64_t n, int64_t len, int64_t start) {
  int vec = 4;
  while (n % vec || len % vec || start % vec)
    vec /= 2;
  return vec;
}

/* One launch of `kernel` (x or dy in, the node out) with one thread per VEC-float unit of
 * the output, whose rows are `out_cols` floats long. Both tensors have the same rows: the
 * leading dims of input 0. */
static mn_status launch(const mn_cu_op_ctx *c, const char *kernel, int64_t n, int64_t len,
                        int64_t out_cols) {
  const mn_tensor_type *in = mn_cu_in_type(c, 0);
  int64_t start = c->node->attrs.pos_offset, rows = mn_tensor_type_numel(in) / last_dim(in);
  int vec = vec_width(n, len, start);
  int k = mn_cu_kernel(c, SLICE_BLOCK, "%s<%d, %lldLL, %lldLL, %lldLL, %lldLL>", kernel, vec,
                       (long long)rows, (long long)(n / vec), (long long)(len / vec),
                       (long long)(start / vec));
  if (k < 0) return mn_cu_oom(c);
  unsigned blocks = mn_cu_blocks(rows * (out_cols / vec), SLICE_BLOCK);
  if (blocks > SLICE_MAX_BLOCKS) blocks = SLICE_MAX_BLOCKS;
  mn_cu_arg args[2] = {mn_cu_in(c, 0), mn_cu_out(c)};
  return mn_cu_launch(c, k, blocks, 1, 1, 0, 2, args);
}

/* x [.., N] -> y [.., len]. */
mn_status mn_cu_lower_SLICE_LAST(const mn_cu_op_ctx *c) {
  int64_t n = last_dim(mn_cu_in_type(c, 0)), len = last_dim(&c->node->type);
  return launch(c, "mn_slice_last_fwd", n, len, len);
}

/* dy [.., len] -> dx [.., N], zeros included. */
mn_status mn_cu_lower_SLICE_LAST_GRAD(const mn_cu_op_ctx *c) {
  int64_t n = last_dim(&c->node->type), len = last_dim(mn_cu_in_type(c, 0));
  return launch(c, "mn_slice_last_bwd", n, len, n);
}
