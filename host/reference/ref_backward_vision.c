/* Reference kernels of the vision backward ops (4-D NCHW). Each output element is
 * gathered from the elements that read it, so every element is written, including
 * input pixels that no strided conv window covers. */
#include <math.h>
#include <stdlib.h>

#include "host/reference/ref_shared.h"

/* The output position o with o * stride - pad + tap == i, or -1 when i falls between
 * strides or outside the output. */
static int64_t source_of(int64_t i, int64_t tap, int64_t stride, int64_t pad, int64_t out) {
  int64_t t = i + pad - tap;
  if (t < 0 || t % stride != 0) return -1;
  return t / stride < out ? t / stride : -1;
}

/* (dy [N,Co,Ho,Wo], kernel [Co,Ci,kh,kw]) -> dx [N,Ci,H,W]. */
mn_status mn_ref_CONV2D_GRAD_INPUT(const mn_ref_ctx *c) {
  const float *dy = mn_ref_in_f32(c, 0), *k = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw in = mn_ref_nchw_of(&c->node->type), kd = mn_ref_nchw_of(mn_ref_in_type(c, 1)),
              out = mn_ref_nchw_of(mn_ref_in_type(c, 0));
  int64_t stride = c->node->attrs.stride, pad = c->node->attrs.padding;
  for (size_t n = 0; n < in.n; n++)
    for (size_t ci = 0; ci < in.c; ci++)
      for (size_t iy = 0; iy < in.h; iy++)
        for (size_t ix = 0; ix < in.w; ix++) {
          double acc = 0;
          for (size_t ky = 0; ky < kd.h; ky++) {
            int64_t oy = source_of((int64_t)iy, (int64_t)ky, stride, pad, (int64_t)out.h);
            if (oy < 0) continue;
            for (size_t kx = 0; kx < kd.w; kx++) {
              int64_t ox = source_of((int64_t)ix, (int64_t)kx, stride, pad, (int64_t)out.w);
              if (ox < 0) continue;
              for (size_t co = 0; co < out.c; co++)
                acc += (double)dy[((n * out.c + co) * out.h + (size_t)oy) * out.w + (size_t)ox] *
                       k[((co * kd.c + ci) * kd.h + ky) * kd.w + kx];
            }
          }
          o[((n * in.c + ci) * in.h + iy) * in.w + ix] = (float)acc;
        }
  return MN_OK;
}

/* (x [N,Ci,H,W], dy [N,Co,Ho,Wo]) -> dkernel [Co,Ci,kh,kw]; taps over the zero padding
 * contribute nothing. */
mn_status mn_ref_CONV2D_GRAD_KERNEL(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw in = mn_ref_nchw_of(mn_ref_in_type(c, 0)), out = mn_ref_nchw_of(mn_ref_in_type(c, 1)),
              kd = mn_ref_nchw_of(&c->node->type);
  int64_t stride = c->node->attrs.stride, pad = c->node->attrs.padding;
  int64_t ih = (int64_t)in.h, iw = (int64_t)in.w;
  for (size_t co = 0; co < kd.n; co++)
    for (size_t ci = 0; ci < kd.c; ci++)
      for (size_t ky = 0; ky < kd.h; ky++)
        for (size_t kx = 0; kx < kd.w; kx++) {
          double acc = 0;
          for (size_t n = 0; n < in.n; n++) {
            const float *xp = x + (n * in.c + ci) * in.h * in.w;
            const float *dp = dy + (n * out.c + co) * out.h * out.w;
            for (size_t oy = 0; oy < out.h; oy++) {
              int64_t y = (int64_t)oy * stride - pad + (int64_t)ky;
              if (y < 0 || y >= ih) continue;
              for (size_t ox = 0; ox < out.w; ox++) {
                int64_t xx = (int64_t)ox * stride - pad + (int64_t)kx;
                if (xx < 0 || xx >= iw) continue;
                acc += (double)dp[oy * out.w + ox] * xp[(size_t)y * in.w + (size_t)xx];
              }
            }
          }
          o[((co * kd.c + ci) * kd.h + ky) * kd.w + kx] = (float)acc;
        }
  return MN_OK;
}

/* Mean and 1/sqrt(var + eps) of one (sample, group) block, computed in two passes
 * exactly as the forward kernel does, so both see the same normalized values. */
static void group_stats(const float *x, size_t count, double eps, double *mean, double *inv) {
  double sum = 0;
  for (size_t i = 0; i < count; i++)
    sum += x[i];
  double m = sum / (double)count, var = 0;
  for (size_t i = 0; i < count; i++) {
    double d = x[i] - m;
    var += d * d;
  }
  *mean = m;
  *inv = 1.0 / sqrt(var / (double)count + eps);
}

/* (x, w, dy) -> dx. With xh the normalized x and g = dy * w, the gradient through the
 * group's mean and variance is dx = inv * (g - mean(g) - xh * mean(g * xh)). */
mn_status mn_ref_GROUP_NORM_GRAD_X(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *w = mn_ref_in_f32(c, 1), *dy = mn_ref_in_f32(c, 2);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(&c->node->type);
  size_t groups = (size_t)c->node->attrs.groups, cpg = d.c / groups, hw = d.h * d.w;
  size_t count = cpg * hw;
  for (size_t n = 0; n < d.n; n++)
    for (size_t gi = 0; gi < groups; gi++) {
      size_t base = (n * d.c + gi * cpg) * hw;
      double mean, inv;
      group_stats(x + base, count, c->node->attrs.eps, &mean, &inv);
      double sum_g = 0, sum_gx = 0;
      for (size_t i = 0; i < count; i++) {
        double g = (double)dy[base + i] * w[gi * cpg + i / hw];
        sum_g += g;
        sum_gx += g * (x[base + i] - mean) * inv;
      }
      double mean_g = sum_g / (double)count, mean_gx = sum_gx / (double)count;
      for (size_t i = 0; i < count; i++) {
        double g = (double)dy[base + i] * w[gi * cpg + i / hw];
        double xh = (x[base + i] - mean) * inv;
        o[base + i] = (float)(inv * (g - mean_g - xh * mean_gx));
      }
    }
  return MN_OK;
}

/* (x, dy) -> dw [C]: sum over batch and space of dy * normalized x. The statistics of
 * every (sample, group) are computed once up front, since a channel's sum spans all
 * samples. */
mn_status mn_ref_GROUP_NORM_GRAD_W(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *dy = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(mn_ref_in_type(c, 0));
  size_t groups = (size_t)c->node->attrs.groups, cpg = d.c / groups, hw = d.h * d.w;
  double *stats = malloc(2 * d.n * groups * sizeof *stats);
  if (!stats)
    return mn_ref_fail(c, MN_ERR_OUT_OF_MEMORY, "out of memory for %zu group statistics",
                       d.n * groups);
  for (size_t n = 0; n < d.n; n++)
    for (size_t gi = 0; gi < groups; gi++) {
      size_t s = 2 * (n * groups + gi);
      group_stats(x + (n * d.c + gi * cpg) * hw, cpg * hw, c->node->attrs.eps, &stats[s],
                  &stats[s + 1]);
    }
  for (size_t ch = 0; ch < d.c; ch++) {
    double acc = 0;
    for (size_t n = 0; n < d.n; n++) {
      const double *st = &stats[2 * (n * groups + ch / cpg)];
      const float *xp = x + (n * d.c + ch) * hw, *dp = dy + (n * d.c + ch) * hw;
      for (size_t i = 0; i < hw; i++)
        acc += (double)dp[i] * ((xp[i] - st[0]) * st[1]);
    }
    o[ch] = (float)acc;
  }
  free(stats);
  return MN_OK;
}

/* dy [N,C,H,W] -> [C]: the gradient of a per-channel bias. */
mn_status mn_ref_SUM_PER_CHANNEL(const mn_ref_ctx *c) {
  const float *dy = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(mn_ref_in_type(c, 0));
  size_t hw = d.h * d.w;
  for (size_t ch = 0; ch < d.c; ch++) {
    double acc = 0;
    for (size_t n = 0; n < d.n; n++) {
      const float *dp = dy + (n * d.c + ch) * hw;
      for (size_t i = 0; i < hw; i++)
        acc += dp[i];
    }
    o[ch] = (float)acc;
  }
  return MN_OK;
}

/* dy [N,C,2H,2W] -> [N,C,H,W]: each output pixel was copied to a 2x2 block. */
mn_status mn_ref_DOWNSAMPLE_SUM_2X(const mn_ref_ctx *c) {
  const float *dy = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(&c->node->type);
  size_t w2 = 2 * d.w;
  for (size_t p = 0; p < d.n * d.c; p++)
    for (size_t y = 0; y < d.h; y++)
      for (size_t x = 0; x < d.w; x++) {
        const float *b = dy + (p * 2 * d.h + 2 * y) * w2 + 2 * x;
        double acc = (double)b[0] + b[1] + b[w2] + b[w2 + 1];
        o[(p * d.h + y) * d.w + x] = (float)acc;
      }
  return MN_OK;
}
