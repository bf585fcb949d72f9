/* Lowering of the vision ops (NCHW float32) to CUDA: kernels of cuda/kernels/vision.cuh
 * and cuBLASLt matmuls.
 *
 * conv2d runs as im2col + matmul. With KD = Ci*kh*kw and P = Ho*Wo, image n gives
 *   forward      y[n][Co,P]   = K[Co,KD] . col[n][KD,P]
 *   grad input   dcol[n][KD,P] = K^T . dy[n][Co,P], then a col2im gather into dx[n]
 *   grad kernel  dK[Co,KD]    = dyT[Co,N*P] . col[KD,N*P]^T, one long product
 * The first two are one strided-batch matmul with K shared (batch stride 0); the kernel
 * gradient lays every image's columns side by side so the batch sum happens inside the
 * product, deterministically. Images go in chunks so the scratch stays bounded; the
 * kernel gradient accumulates later chunks with beta 1. A 1x1 conv with stride 1 and no
 * padding reads x and writes dx directly. */
#include <limits.h>

#include "cuda/emit.h"
#include "host/error.h"

/* Scratch bytes a conv may use for its column matrices before it splits the batch. */
#define MN_VIS_SCRATCH_BUDGET ((int64_t)256 << 20)
/* Pointwise kernels: threads per block and the most blocks of a grid-stride launch. */
#define MN_VIS_BLOCK      256
#define MN_VIS_MAX_BLOCKS 8192

static mn_status unsupported(const mn_cu_op_ctx *c, const char *why) {
  return mn_fail(MN_ERR_UNSUPPORTED, "cuda backend: node %u (%s): %s", c->id,
                 mn_op_name(c->node->op), why);
}

static unsigned grid_for(int64_t n) {
  unsigned b = mn_cu_blocks(n, MN_VIS_BLOCK);
  return b > MN_VIS_MAX_BLOCKS ? MN_VIS_MAX_BLOCKS : b;
}

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static mn_cu_arg with_offset(mn_cu_arg a, int64_t floats) {
  a.offset += (size_t)floats * sizeof(float);
  return a;
}

/* Threads per block for a kernel striding along rows of `cols` items. */
static unsigned row_block(int64_t cols) {
  return cols >= MN_VIS_BLOCK ? MN_VIS_BLOCK : (unsigned)round_up(cols, 32);
}

/* Launches a kernel with one block row (grid x) per row and grid y along the columns. */
static mn_status launch_rows(const mn_cu_op_ctx *c, int k, int64_t rows, int64_t cols,
                             unsigned block, int nargs, const mn_cu_arg *args) {
  int64_t gy = (cols + block - 1) / block;
  return mn_cu_launch(c, k, (unsigned)rows, (unsigned)(gy > 65535 ? 65535 : gy), 1, 0, nargs, args);
}

/* Launches a 1-D grid-stride kernel over n items. */
static mn_status launch_flat(const mn_cu_op_ctx *c, int k, int64_t n, int nargs,
                             const mn_cu_arg *args) {
  return mn_cu_launch(c, k, grid_for(n), 1, 1, 0, nargs, args);
}

typedef struct nchw {
  int64_t n, c, h, w;
} nchw;

static nchw nchw_of(const mn_tensor_type *t) {
  return (nchw){t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
}

/* Kernels take per-dimension sizes as int template arguments. */
static bool fits_int(const nchw *d) {
  return d->n <= INT_MAX && d->c <= INT_MAX && d->h <= INT_MAX && d->w <= INT_MAX &&
         d->h * d->w <= INT_MAX;
}

/* The widest of 4, 2, 1 floats that divides every value. */
static int vec_width(const int64_t *v, int n) {
  int vec = 4;
  for (int i = 0; i < n; i++)
    while (v[i] % vec)
      vec /= 2;
  return vec;
}

/* Block size for a reduction over `units` values per block. */
static unsigned reduce_block(int64_t units) {
  if (units <= 256) return 64;
  if (units <= 1024) return 128;
  if (units <= 4096) return 256;
  if (units <= 16384) return 512;
  return 1024;
}

/* ---------------------------------------------------------------- conv2d */

typedef struct conv_geom {
  nchw x, y, k; /* input [N,Ci,H,W], output [N,Co,Ho,Wo], kernel [Co,Ci,kh,kw] */
  int64_t stride, pad, kd, p;
  bool direct; /* 1x1, stride 1, no padding: col[n] is x[n] itself */
} conv_geom;

static mn_status conv_geom_of(const mn_cu_op_ctx *c, const mn_tensor_type *x,
                              const mn_tensor_type *k, const mn_tensor_type *y, conv_geom *g) {
  g->x = nchw_of(x);
  g->k = nchw_of(k);
  g->y = nchw_of(y);
  g->stride = c->node->attrs.stride;
  g->pad = c->node->attrs.padding;
  g->kd = g->k.c * g->k.h * g->k.w;
  g->p = g->y.h * g->y.w;
  g->direct = g->k.h == 1 && g->k.w == 1 && g->stride == 1 && g->pad == 0;
  if (!fits_int(&g->x) || !fits_int(&g->y) || !fits_int(&g->k) || g->kd > INT_MAX ||
      g->pad > INT_MAX / 4 || g->stride > INT_MAX / 4 || g->p > INT_MAX / 2 ||
      g->x.h * g->x.w > INT_MAX / 2 || (g->y.h - 1) * g->stride + g->k.h > INT_MAX ||
      (g->y.w - 1) * g->stride + g->k.w > INT_MAX)
    return unsupported(c, "conv2d dimension too large for the kernels' int indices");
  return MN_OK;
}

/* Images per chunk when each needs `per_image` scratch bytes. Chunk starts keep the
 * image offsets of [N, Co, P] tensors on 256-byte boundaries when they can, so that
 * cuBLASLt may keep its aligned algorithms. */
static int64_t conv_chunk(const conv_geom *g, int64_t per_image) {
  int64_t chunk = MN_VIS_SCRATCH_BUDGET / (per_image > 0 ? per_image : 1);
  if (chunk < 1) chunk = 1;
  /* Rows of the im2col, col2im and transpose grids (x dimension) stay below 2^31. */
  int64_t widest = g->kd > g->x.c ? g->kd : g->x.c;
  widest = widest > g->y.c ? widest : g->y.c;
  if (chunk > INT_MAX / widest) chunk = INT_MAX / widest;
  if (chunk >= g->x.n) return g->x.n;
  int64_t unit = 1, plane = g->y.c * g->p;
  while (unit < 64 && (unit * plane) % 64)
    unit *= 2;
  if (chunk >= unit) chunk = chunk / unit * unit;
  return chunk;
}

/* im2col of images [n0, n0 + b) into scratch at offset 0; SB, SK as in the kernel. */
static mn_status im2col(const mn_cu_op_ctx *c, const conv_geom *g, mn_cu_arg x, int64_t n0,
                        int64_t b, int64_t sb, int64_t sk) {
  unsigned block = row_block(g->p);
  int k =
      mn_cu_kernel(c, block,
                   "mn_vis_im2col<%u, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, "
                   "%lldLL, %lldLL>",
                   block, (long long)g->x.c, (long long)g->x.h, (long long)g->x.w,
                   (long long)g->k.h, (long long)g->k.w, (long long)g->stride, (long long)g->pad,
                   (long long)g->y.h, (long long)g->y.w, (long long)sb, (long long)sk);
  mn_cu_arg args[2] = {with_offset(x, n0 * g->x.c * g->x.h * g->x.w), mn_cu_scratch(c, 0)};
  /* Each thread handles MN_VIS_IM2COL_UNROLL columns (see the kernel). */
  return launch_rows(c, k, b * g->kd, (g->p + 3) / 4, block, 2, args);
}

mn_status mn_cu_lower_CONV2D(const mn_cu_op_ctx *c) {
  conv_geom g;
  mn_status st = conv_geom_of(c, mn_cu_in_type(c, 0), mn_cu_in_type(c, 1), &c->node->type, &g);
  if (st != MN_OK) return st;
  mn_cu_matmul_desc mm = {.a = mn_cu_in(c, 1),
                          .m = g.y.c,
                          .n = g.p,
                          .k = g.kd,
                          .stride_a = 0,
                          .stride_c = g.y.c * g.p,
                          .alpha = 1.0f,
                          .beta = 0.0f};
  if (g.direct) {
    mm.b = mn_cu_in(c, 0);
    mm.c = mn_cu_out(c);
    mm.batch = g.x.n;
    mm.stride_b = g.x.c * g.p;
    return mn_cu_matmul(c, &mm);
  }
  int64_t sb = round_up(g.kd * g.p, 64);
  int64_t chunk = conv_chunk(&g, sb * (int64_t)sizeof(float));
  mn_cu_scratch(c, (size_t)(chunk * sb) * sizeof(float));
  /* Chunks run in order: each reuses the staging of the one before (low precision). */
  size_t stage_mark = c->prog->stage_cursor;
  for (int64_t n0 = 0; n0 < g.x.n && st == MN_OK; n0 += chunk) {
    c->prog->stage_cursor = stage_mark;
    int64_t b = g.x.n - n0 < chunk ? g.x.n - n0 : chunk;
    st = im2col(c, &g, mn_cu_in(c, 0), n0, b, sb, g.p);
    mm.b = mn_cu_scratch(c, 0);
    mm.c = with_offset(mn_cu_out(c), n0 * g.y.c * g.p);
    mm.batch = b;
    mm.stride_b = sb;
    if (st == MN_OK) st = mn_cu_matmul(c, &mm);
  }
  return st;
}

/* (dy, kernel) -> dx [N, Ci, H, W]. */
mn_status mn_cu_lower_CONV2D_GRAD_INPUT(const mn_cu_op_ctx *c) {
  conv_geom g;
  mn_status st = conv_geom_of(c, &c->node->type, mn_cu_in_type(c, 1), mn_cu_in_type(c, 0), &g);
  if (st != MN_OK) return st;
  mn_cu_matmul_desc mm = {.a = mn_cu_in(c, 1),
                          .trans_a = true,
                          .m = g.kd,
                          .n = g.p,
                          .k = g.y.c,
                          .stride_a = 0,
                          .stride_b = g.y.c * g.p,
                          .alpha = 1.0f,
                          .beta = 0.0f};
  if (g.direct) {
    mm.b = mn_cu_in(c, 0);
    mm.c = mn_cu_out(c);
    mm.batch = g.x.n;
    mm.stride_c = g.x.c * g.p;
    return mn_cu_matmul(c, &mm);
  }
  int64_t sb = round_up(g.kd * g.p, 64);
  int64_t chunk = conv_chunk(&g, sb * (int64_t)sizeof(float));
  mn_cu_scratch(c, (size_t)(chunk * sb) * sizeof(float));
  /* Chunks run in order: each reuses the staging of the one before (low precision). */
  size_t stage_mark = c->prog->stage_cursor;
  for (int64_t n0 = 0; n0 < g.x.n && st == MN_OK; n0 += chunk) {
    c->prog->stage_cursor = stage_mark;
    int64_t b = g.x.n - n0 < chunk ? g.x.n - n0 : chunk;
    mm.b = with_offset(mn_cu_in(c, 0), n0 * g.y.c * g.p);
    mm.c = mn_cu_scratch(c, 0);
    mm.batch = b;
    mm.stride_c = sb;
    st = mn_cu_matmul(c, &mm);
    unsigned block = row_block(g.x.h * g.x.w);
    int k = mn_cu_kernel(c, block,
                         "mn_vis_col2im<%u, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, "
                         "%lldLL>",
                         block, (long long)g.x.c, (long long)g.x.h, (long long)g.x.w,
                         (long long)g.k.h, (long long)g.k.w, (long long)g.stride, (long long)g.pad,
                         (long long)g.y.h, (long long)g.y.w, (long long)sb);
    mn_cu_arg args[2] = {mn_cu_scratch(c, 0),
                         with_offset(mn_cu_out(c), n0 * g.x.c * g.x.h * g.x.w)};
    if (st == MN_OK) st = launch_rows(c, k, b * g.x.c, g.x.h * g.x.w, block, 2, args);
  }
  return st;
}

/* (x, dy) -> dkernel [Co, Ci, kh, kw]. Scratch: col [KD, b*P] at 0, then dyT [Co, b*P]
 * (not needed for a single image, whose dy already is [Co, P]). */
mn_status mn_cu_lower_CONV2D_GRAD_KERNEL(const mn_cu_op_ctx *c) {
  conv_geom g;
  mn_status st = conv_geom_of(c, mn_cu_in_type(c, 0), &c->node->type, mn_cu_in_type(c, 1), &g);
  if (st != MN_OK) return st;
  mn_cu_matmul_desc mm = {.trans_b = true, .m = g.y.c, .n = g.kd, .batch = 1, .alpha = 1.0f};
  mm.c = mn_cu_out(c);
  if (g.x.n == 1 && g.direct) {
    mm.a = mn_cu_in(c, 1);
    mm.b = mn_cu_in(c, 0);
    mm.k = g.p;
    return mn_cu_matmul(c, &mm);
  }
  bool transpose = g.x.n > 1;
  int64_t per_image = (g.kd + (transpose ? g.y.c : 0)) * g.p * (int64_t)sizeof(float);
  int64_t chunk = conv_chunk(&g, per_image);
  int64_t dyt_at = round_up(g.kd * chunk * g.p, 64);
  mn_cu_scratch(c, (size_t)(dyt_at + (transpose ? g.y.c * chunk * g.p : 0)) * sizeof(float));
  /* Chunks run in order: each reuses the staging of the one before (low precision). */
  size_t stage_mark = c->prog->stage_cursor;
  for (int64_t n0 = 0; n0 < g.x.n && st == MN_OK; n0 += chunk) {
    c->prog->stage_cursor = stage_mark;
    int64_t b = g.x.n - n0 < chunk ? g.x.n - n0 : chunk;
    st = im2col(c, &g, mn_cu_in(c, 0), n0, b, g.p, b * g.p);
    mn_cu_arg dy = with_offset(mn_cu_in(c, 1), n0 * g.y.c * g.p);
    if (transpose && st == MN_OK) {
      unsigned block = row_block(g.p);
      int k = mn_cu_kernel(c, block, "mn_vis_batch_to_rows<%u, %lld, %lld, %lld>", block,
                           (long long)b, (long long)g.y.c, (long long)g.p);
      mn_cu_arg args[2] = {dy, with_offset(mn_cu_scratch(c, 0), dyt_at)};
      st = launch_rows(c, k, g.y.c * b, g.p, block, 2, args);
      dy = args[1];
    }
    mm.a = dy;
    mm.b = mn_cu_scratch(c, 0);
    mm.k = b * g.p;
    mm.beta = n0 == 0 ? 0.0f : 1.0f;
    if (st == MN_OK) st = mn_cu_matmul(c, &mm);
  }
  return st;
}

/* ---------------------------------------------------------------- group norm */

typedef struct gn_geom {
  nchw d;
  int64_t groups, count;
  int vec;
  unsigned block;
} gn_geom;

static mn_status gn_geom_of(const mn_cu_op_ctx *c, const mn_tensor_type *x, gn_geom *g) {
  g->d = nchw_of(x);
  g->groups = c->node->attrs.groups;
  if (!fits_int(&g->d) || g->groups < 1 || g->d.c % g->groups ||
      g->d.n * g->groups > (int64_t)INT_MAX)
    return unsupported(c, "group_norm shape out of the kernels' range");
  int64_t hw = g->d.h * g->d.w;
  g->count = g->d.c / g->groups * hw;
  g->vec = vec_width(&hw, 1);
  g->block = reduce_block(g->count / g->vec);
  return MN_OK;
}

/* A group-norm kernel with one block per (sample, group): io x, w, <third>, out. `more`
 * ends the template arguments (e.g. ", true"), or is empty. */
static mn_status gn_launch(const mn_cu_op_ctx *c, const char *name, mn_cu_arg third,
                           const char *more) {
  gn_geom g = {0};
  mn_status st = gn_geom_of(c, mn_cu_in_type(c, 0), &g);
  if (st != MN_OK) return st;
  int k = mn_cu_kernel(c, g.block, "%s<%u, %d, %lld, %lldLL, %lld, %uu%s>", name, g.block, g.vec,
                       (long long)g.d.c, (long long)(g.d.h * g.d.w), (long long)g.groups,
                       mn_cu_float_bits(c->node->attrs.eps), more);
  mn_cu_arg args[4] = {mn_cu_in(c, 0), mn_cu_in(c, 1), third, mn_cu_out(c)};
  return mn_cu_launch(c, k, (unsigned)(g.d.n * g.groups), 1, 1, 0, 4, args);
}

/* attrs.act: none, or silu applied to the result (the only activation it takes). */
mn_status mn_cu_lower_GROUP_NORM(const mn_cu_op_ctx *c) {
  int act = c->node->attrs.act;
  if (act != MN_ACT_NONE && act != MN_ACT_SILU)
    return unsupported(c, "group_norm activation other than silu");
  return gn_launch(c, "mn_vis_group_norm_fwd", mn_cu_in(c, 2),
                   act == MN_ACT_SILU ? ", true" : ", false");
}

/* (x, w, dy) -> dx. */
mn_status mn_cu_lower_GROUP_NORM_GRAD_X(const mn_cu_op_ctx *c) {
  return gn_launch(c, "mn_vis_group_norm_grad_x", mn_cu_in(c, 2), "");
}

/* Per-channel sums in two deterministic passes: a value per (sample, channel) row into
 * scratch at `partial_at` floats (straight into the output when N is 1), then a sum
 * over the batch per channel. `normed`: sum dy times the normalized x, with group
 * statistics at scratch offset 0. */
static mn_status channel_sums(const mn_cu_op_ctx *c, const nchw *d, int64_t groups, mn_cu_arg dy,
                              mn_cu_arg x, bool normed, int64_t partial_at) {
  int64_t hw = d->h * d->w, rows = d->n * d->c;
  if (rows > (int64_t)INT_MAX) return unsupported(c, "too many channel rows");
  int vec = vec_width(&hw, 1);
  int64_t units = hw / vec;
  unsigned block, tpr;
  if (units <= 64) {
    block = MN_VIS_BLOCK;
    tpr = 32;
  } else {
    block = reduce_block(units);
    tpr = block;
  }
  mn_cu_arg partial = d->n == 1 ? mn_cu_out(c) : with_offset(mn_cu_scratch(c, 0), partial_at);
  int k = mn_cu_kernel(c, block, "mn_vis_channel_rows<%u, %u, %d, %lld, %lldLL, %lld, %lldLL, %s>",
                       block, tpr, vec, (long long)d->c, (long long)hw, (long long)groups,
                       (long long)rows, normed ? "true" : "false");
  mn_cu_arg args[4] = {dy, x, mn_cu_scratch(c, 0), partial};
  int64_t rows_per_block = block / tpr;
  mn_status st = mn_cu_launch(c, k, (unsigned)((rows + rows_per_block - 1) / rows_per_block), 1, 1,
                              0, 4, args);
  if (st != MN_OK || d->n == 1) return st;
  k = mn_cu_kernel(c, MN_VIS_BLOCK, "mn_vis_sum_over_batch<%lld, %lld>", (long long)d->c,
                   (long long)d->n);
  mn_cu_arg args2[2] = {partial, mn_cu_out(c)};
  return launch_flat(c, k, d->c, 2, args2);
}

/* (x, dy) -> dw [C]: group statistics into scratch, then the per-channel sums. */
mn_status mn_cu_lower_GROUP_NORM_GRAD_W(const mn_cu_op_ctx *c) {
  gn_geom g = {0};
  mn_status st = gn_geom_of(c, mn_cu_in_type(c, 0), &g);
  if (st != MN_OK) return st;
  int64_t stats = 2 * g.d.n * g.groups, partial_at = round_up(stats, 64);
  mn_cu_scratch(c, (size_t)(partial_at + g.d.n * g.d.c) * sizeof(float));
  int k = mn_cu_kernel(c, g.block, "mn_vis_group_stats<%u, %d, %lldLL, %uu>", g.block, g.vec,
                       (long long)g.count, mn_cu_float_bits(c->node->attrs.eps));
  mn_cu_arg args[2] = {mn_cu_in(c, 0), mn_cu_scratch(c, 0)};
  st = mn_cu_launch(c, k, (unsigned)(g.d.n * g.groups), 1, 1, 0, 2, args);
  if (st != MN_OK) return st;
  return channel_sums(c, &g.d, g.groups, mn_cu_in(c, 1), mn_cu_in(c, 0), true, partial_at);
}

/* dy [N, C, H, W] -> [C]. */
mn_status mn_cu_lower_SUM_PER_CHANNEL(const mn_cu_op_ctx *c) {
  nchw d = nchw_of(mn_cu_in_type(c, 0));
  if (!fits_int(&d)) return unsupported(c, "sum_per_channel shape out of the kernels' range");
  mn_cu_scratch(c, (size_t)(d.n * d.c) * sizeof(float));
  return channel_sums(c, &d, 1, mn_cu_in(c, 0), mn_cu_in(c, 0), false, 0);
}

/* ---------------------------------------------------------------- layout and pointwise */

/* Copies channels [c0, c0 + cn) of every sample of src (cs channels) into channels
 * [d0, d0 + cn) of dst (cd channels). */
static mn_status copy_channels(const mn_cu_op_ctx *c, mn_cu_arg dst, int64_t cd, int64_t d0,
                               mn_cu_arg src, int64_t cs, int64_t c0, int64_t cn, int64_t n,
                               int64_t hw) {
  int64_t sizes[5] = {cn * hw, cs * hw, c0 * hw, cd * hw, d0 * hw};
  int vec = vec_width(sizes, 5);
  int k = mn_cu_kernel(
      c, MN_VIS_BLOCK, "mn_vis_copy_rows<%d, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL>", vec,
      (long long)n, (long long)(sizes[0] / vec), (long long)(sizes[1] / vec),
      (long long)(sizes[2] / vec), (long long)(sizes[3] / vec), (long long)(sizes[4] / vec));
  mn_cu_arg args[2] = {src, dst};
  return launch_flat(c, k, n * sizes[0] / vec, 2, args);
}

mn_status mn_cu_lower_CONCAT(const mn_cu_op_ctx *c) {
  nchw a = nchw_of(mn_cu_in_type(c, 0)), b = nchw_of(mn_cu_in_type(c, 1));
  int64_t co = a.c + b.c, hw = a.h * a.w;
  mn_status st = copy_channels(c, mn_cu_out(c), co, 0, mn_cu_in(c, 0), a.c, 0, a.c, a.n, hw);
  if (st != MN_OK) return st;
  return copy_channels(c, mn_cu_out(c), co, a.c, mn_cu_in(c, 1), b.c, 0, b.c, a.n, hw);
}

mn_status mn_cu_lower_SPLIT_A(const mn_cu_op_ctx *c) {
  nchw x = nchw_of(mn_cu_in_type(c, 0));
  int64_t ca = c->node->attrs.channels_a;
  return copy_channels(c, mn_cu_out(c), ca, 0, mn_cu_in(c, 0), x.c, 0, ca, x.n, x.h * x.w);
}

mn_status mn_cu_lower_SPLIT_B(const mn_cu_op_ctx *c) {
  nchw x = nchw_of(mn_cu_in_type(c, 0));
  int64_t ca = c->node->attrs.channels_a, cb = x.c - ca;
  return copy_channels(c, mn_cu_out(c), cb, 0, mn_cu_in(c, 0), x.c, ca, cb, x.n, x.h * x.w);
}

/* Both directions index by the small [N, C, H, W] side. */
static mn_status resample(const mn_cu_op_ctx *c, const char *name, const nchw *small) {
  if (!fits_int(small) || small->w > INT_MAX / 2)
    return unsupported(c, "resampled shape out of the kernels' range");
  int k = mn_cu_kernel(c, MN_VIS_BLOCK, "%s<%lldLL, %lld, %lld>", name,
                       (long long)(small->n * small->c), (long long)small->h, (long long)small->w);
  mn_cu_arg args[2] = {mn_cu_in(c, 0), mn_cu_out(c)};
  return launch_flat(c, k, small->n * small->c * small->h * small->w, 2, args);
}

mn_status mn_cu_lower_UPSAMPLE_2X(const mn_cu_op_ctx *c) {
  nchw x = nchw_of(mn_cu_in_type(c, 0));
  return resample(c, "mn_vis_upsample_2x", &x);
}

mn_status mn_cu_lower_DOWNSAMPLE_SUM_2X(const mn_cu_op_ctx *c) {
  nchw y = nchw_of(&c->node->type);
  return resample(c, "mn_vis_downsample_sum_2x", &y);
}

mn_status mn_cu_lower_ADD_PER_CHANNEL(const mn_cu_op_ctx *c) {
  nchw d = nchw_of(&c->node->type);
  if (!fits_int(&d)) return unsupported(c, "add_per_channel shape out of the kernels' range");
  int64_t hw = d.h * d.w, total = mn_cu_numel(c);
  int vec = vec_width(&hw, 1);
  int k = mn_cu_kernel(c, MN_VIS_BLOCK, "mn_vis_add_per_channel<%d, %lld, %lldLL, %lldLL>", vec,
                       (long long)d.c, (long long)hw, (long long)total);
  mn_cu_arg args[3] = {mn_cu_in(c, 0), mn_cu_in(c, 1), mn_cu_out(c)};
  return launch_flat(c, k, total / vec, 3, args);
}
