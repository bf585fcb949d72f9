/* Reference kernels: 4-D NCHW vision ops. Sizes are read from the node and input types. */
#include <math.h>

#include "host/reference/ref_shared.h"

/* Direct convolution, one output element at a time; taps that fall into the zero padding
 * are skipped rather than read. */
mn_status mn_ref_CONV2D(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *k = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw in = mn_ref_nchw_of(mn_ref_in_type(c, 0)), kd = mn_ref_nchw_of(mn_ref_in_type(c, 1)),
              out = mn_ref_nchw_of(&c->node->type);
  int64_t stride = c->node->attrs.stride, pad = c->node->attrs.padding;
  int64_t ih = (int64_t)in.h, iw = (int64_t)in.w;
  for (size_t n = 0; n < out.n; n++)
    for (size_t co = 0; co < out.c; co++)
      for (size_t oy = 0; oy < out.h; oy++)
        for (size_t ox = 0; ox < out.w; ox++) {
          double acc = 0;
          int64_t y0 = (int64_t)oy * stride - pad, x0 = (int64_t)ox * stride - pad;
          for (size_t ci = 0; ci < in.c; ci++) {
            const float *xp = x + (n * in.c + ci) * in.h * in.w;
            const float *kp = k + (co * kd.c + ci) * kd.h * kd.w;
            for (size_t ky = 0; ky < kd.h; ky++) {
              int64_t y = y0 + (int64_t)ky;
              if (y < 0 || y >= ih) continue;
              for (size_t kx = 0; kx < kd.w; kx++) {
                int64_t xx = x0 + (int64_t)kx;
                if (xx < 0 || xx >= iw) continue;
                acc += (double)xp[(size_t)y * in.w + (size_t)xx] * kp[ky * kd.w + kx];
              }
            }
          }
          o[((n * out.c + co) * out.h + oy) * out.w + ox] = (float)acc;
        }
  return MN_OK;
}

/* Two passes per (sample, group): the mean first, then the biased variance around it,
 * so a large common offset does not cancel away the variance. */
mn_status mn_ref_GROUP_NORM(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *w = mn_ref_in_f32(c, 1), *b = mn_ref_in_f32(c, 2);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(&c->node->type);
  size_t groups = (size_t)c->node->attrs.groups, cpg = d.c / groups, hw = d.h * d.w;
  size_t count = cpg * hw;
  double eps = c->node->attrs.eps;
  for (size_t n = 0; n < d.n; n++)
    for (size_t gi = 0; gi < groups; gi++) {
      size_t base = (n * d.c + gi * cpg) * hw;
      double sum = 0;
      for (size_t i = 0; i < count; i++)
        sum += x[base + i];
      double mean = sum / (double)count, var = 0;
      for (size_t i = 0; i < count; i++) {
        double dv = x[base + i] - mean;
        var += dv * dv;
      }
      double inv = 1.0 / sqrt(var / (double)count + eps);
      for (size_t i = 0; i < count; i++) {
        size_t ch = gi * cpg + i / hw;
        o[base + i] = (float)((x[base + i] - mean) * inv * w[ch] + b[ch]);
      }
    }
  if (c->node->attrs.act == MN_ACT_SILU) mn_ref_apply_act(o, mn_ref_numel(c), MN_ACT_SILU);
  return MN_OK;
}

/* Copies channels [c0, c0 + cn) of every sample of src (cs channels) into channels
 * [d0, d0 + cn) of dst (cd channels); each sample's channel block is contiguous. */
static void copy_channels(float *dst, size_t cd, size_t d0, const float *src, size_t cs, size_t c0,
                          size_t cn, size_t n, size_t hw) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < cn * hw; j++)
      dst[(i * cd + d0) * hw + j] = src[(i * cs + c0) * hw + j];
}

mn_status mn_ref_CONCAT(const mn_ref_ctx *c) {
  mn_ref_nchw a = mn_ref_nchw_of(mn_ref_in_type(c, 0)), b = mn_ref_nchw_of(mn_ref_in_type(c, 1));
  size_t co = a.c + b.c, hw = a.h * a.w;
  float *o = mn_ref_out_f32(c);
  copy_channels(o, co, 0, mn_ref_in_f32(c, 0), a.c, 0, a.c, a.n, hw);
  copy_channels(o, co, a.c, mn_ref_in_f32(c, 1), b.c, 0, b.c, a.n, hw);
  return MN_OK;
}

mn_status mn_ref_SPLIT_A(const mn_ref_ctx *c) {
  mn_ref_nchw x = mn_ref_nchw_of(mn_ref_in_type(c, 0));
  size_t ca = (size_t)c->node->attrs.channels_a;
  copy_channels(mn_ref_out_f32(c), ca, 0, mn_ref_in_f32(c, 0), x.c, 0, ca, x.n, x.h * x.w);
  return MN_OK;
}

mn_status mn_ref_SPLIT_B(const mn_ref_ctx *c) {
  mn_ref_nchw x = mn_ref_nchw_of(mn_ref_in_type(c, 0));
  size_t ca = (size_t)c->node->attrs.channels_a, cb = x.c - ca;
  copy_channels(mn_ref_out_f32(c), cb, 0, mn_ref_in_f32(c, 0), x.c, ca, cb, x.n, x.h * x.w);
  return MN_OK;
}

mn_status mn_ref_UPSAMPLE_2X(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw in = mn_ref_nchw_of(mn_ref_in_type(c, 0)), out = mn_ref_nchw_of(&c->node->type);
  for (size_t p = 0; p < in.n * in.c; p++)
    for (size_t y = 0; y < out.h; y++)
      for (size_t xx = 0; xx < out.w; xx++)
        o[(p * out.h + y) * out.w + xx] = x[(p * in.h + y / 2) * in.w + xx / 2];
  return MN_OK;
}

mn_status mn_ref_ADD_PER_CHANNEL(const mn_ref_ctx *c) {
  const float *x = mn_ref_in_f32(c, 0), *bias = mn_ref_in_f32(c, 1);
  float *o = mn_ref_out_f32(c);
  mn_ref_nchw d = mn_ref_nchw_of(&c->node->type);
  size_t hw = d.h * d.w;
  for (size_t i = 0, total = mn_ref_numel(c); i < total; i++)
    o[i] = x[i] + bias[(i / hw) % d.c];
  return MN_OK;
}
