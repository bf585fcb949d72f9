/* Pointwise math, defined once. The C compiler (the reference backend, the fused-group
 * interpreter, the lowering) and NVRTC (cuda/kernels/pointwise.cuh, fused kernels) both
 * compile this header: CMakeLists.txt embeds it ahead of the kernel templates.
 *
 * One row per element function:
 *   X(NAME, element-wise inputs, MN_PW_* flags, scalar factor, value)
 * The value is an expression over a, b, c (the element-wise inputs, in order), s (the float
 * attribute, attrs.scale, for MN_PW_ATTR rows) and k (the scalar factor, for MN_PW_SCALAR
 * rows: the factor expression over v, the first element of the input after the element-wise
 * ones, s, and n, the element count). Values are mn_pw_real: double on the host, float on
 * the device, so the reference computes each op in double and rounds once to float on
 * store, while the kernels keep float speed. Ops whose float form loses too much (the loss
 * gradients) say double explicitly and are the same on both sides.
 *
 * MN_PW_OP_ROWS are ops of the op table (host/ops.h) by the same name; every op flagged
 * MN_OPF_POINTWISE has one, which the assertions at the end check at compile time.
 * MN_PW_VARIANT_ROWS are element functions of an op that picks one by attrs.variant. */
#ifndef MN_HOST_POINTWISE_H
#define MN_HOST_POINTWISE_H

#ifdef __CUDACC_RTC__
typedef float mn_pw_real;
#define MN_PW_FN      static __device__ __forceinline__
#define MN_PW_CONSTFN static __device__ constexpr
#define MN_PW_NAN     __int_as_float(0x7fffffff)
MN_PW_FN float mn_pw_exp(float x) { return expf(x); }
MN_PW_FN float mn_pw_log(float x) { return logf(x); }
MN_PW_FN float mn_pw_tanh(float x) { return tanhf(x); }
MN_PW_FN float mn_pw_fabs(float x) { return fabsf(x); }
/* 1 / d for d in [1, 2]: the fast path of float division (the reciprocal's approximation and
 * one Newton step, correctly rounded in that range) without the range test and branch that
 * 1 / d adds for operands near under- or overflow, a sixth of GELU's instructions. */
MN_PW_FN float mn_pw_recip_1_2(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, fmaf(-d, r, 1.0f), r);
}
/* exp(z) for z <= 0 as 2^(z log2(e)) by the multifunction unit's approximation: off by what
 * rounding log2(e) and z log2(e) does, about |z| 2^-24 relative, and two ulps more, where expf's
 * exact range reduction takes six instructions more (GELU's sigmoid, whose error bound grows with
 * |z| anyway, tests/test_math.c); results below 2^-126 flush to 0, so GELU is -0 from x of about
 * -10.0 rather than -10.7. */
MN_PW_FN float mn_pw_exp_nonpos(float z) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(z * 1.44269504088896341f));
  return r;
}
#else
#include <math.h>

#include "host/ops.h"
typedef double mn_pw_real;
#define MN_PW_FN      static inline
#define MN_PW_CONSTFN static inline
#define MN_PW_NAN     NAN
MN_PW_FN double mn_pw_exp(double x) { return exp(x); }
MN_PW_FN double mn_pw_log(double x) { return log(x); }
MN_PW_FN double mn_pw_tanh(double x) { return tanh(x); }
MN_PW_FN double mn_pw_fabs(double x) { return fabs(x); }
MN_PW_FN double mn_pw_recip_1_2(double d) { return 1 / d; }
MN_PW_FN float mn_pw_recip_1_2_f32(float d) { return 1 / d; }
MN_PW_FN double mn_pw_exp_nonpos(double z) { return exp(z); }
#endif

enum {
  MN_PW_SCALAR = 1 << 0, /* reads one scalar input (dy[0] of a loss) through the factor */
  MN_PW_ATTR = 1 << 1,   /* reads attrs.scale as s */
};

/* sqrt(2/pi) and the cubic coefficient of GELU's tanh approximation (API.md). */
#define MN_PW_GELU_K 0.7978845608028654
#define MN_PW_GELU_C 0.044715

MN_PW_FN mn_pw_real mn_pw_sigmoid(mn_pw_real x) { return 1 / (1 + mn_pw_exp(-x)); }

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x). */
MN_PW_FN mn_pw_real mn_pw_silu_slope(mn_pw_real x) {
  mn_pw_real s = mn_pw_sigmoid(x);
  return s * (1 + x * (1 - s));
}

/* GELU's tanh approximation 0.5 x (1 + tanh(u)), u = K (x + C x^3), as x sigmoid(2u): the
 * same function, since 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)). The tanh form cancels below x
 * of about -3, where 1 + tanh(u) nears 0 (in float one element at x = -4.6 came out 30% off),
 * and so ran in double on the device; the sigmoid form has no such difference and float keeps
 * a few ulps (tests/test_math.c measures it; docs/performance.md). Its slope is
 *   s (1 + x (1 - s) 2K (1 + 3C x^2)),  s = sigmoid(2u).
 * s and 1 - s come from e = exp(-|2u|) <= 1 as 1 / (1 + e) and e / (1 + e), whichever each is
 * by the sign of u: neither is a difference near 0, and nothing overflows. Where s is 0 (x
 * below about -10.7 in float, -10.0 on the device, or -inf) the value is -0 and the slope 0, their
 * limits, not -inf * 0; where 1 - s is 0 (above about 10.7, or +inf) the slope is s, not the 0 *
 * inf of an overflowing x^2. NaN stays NaN. Defined for a float type T and its exp: the rows'
 * mn_pw_real, and on the host also float (suffix _f32), the device's arithmetic but for its exp
 * (expf here, ex2.approx there: up to half an ulp more per unit of |2u| and two ulps), for the
 * tests. */
#define MN_PW_GELU_FNS(T, SUFFIX, EXP)                                                             \
  MN_PW_FN void mn_pw_gelu_sigmoid##SUFFIX(T x, T *s, T *one_minus_s) {                            \
    T z = (T)(2 * MN_PW_GELU_K) * x * (1 + (T)MN_PW_GELU_C * x * x);                               \
    T e = EXP(z < 0 ? z : -z), r = mn_pw_recip_1_2##SUFFIX(1 + e);                                 \
    *s = z < 0 ? e * r : r;                                                                        \
    *one_minus_s = z < 0 ? r : e * r;                                                              \
  }                                                                                                \
  MN_PW_FN T mn_pw_gelu_tanh##SUFFIX(T x) {                                                        \
    T s, t;                                                                                        \
    mn_pw_gelu_sigmoid##SUFFIX(x, &s, &t);                                                         \
    return s == 0 ? -(T)0 : x * s;                                                                 \
  }                                                                                                \
  MN_PW_FN T mn_pw_gelu_tanh_grad##SUFFIX(T x) {                                                   \
    T s, t;                                                                                        \
    mn_pw_gelu_sigmoid##SUFFIX(x, &s, &t);                                                         \
    if (s == 0) return 0;                                                                          \
    if (t == 0) return s;                                                                          \
    return s * (1 + x * t * (T)(2 * MN_PW_GELU_K) * (1 + (T)(3 * MN_PW_GELU_C) * x * x));          \
  }
MN_PW_GELU_FNS(mn_pw_real, , mn_pw_exp_nonpos)
#ifndef __CUDACC_RTC__
MN_PW_GELU_FNS(float, _f32, expf)
#endif
#undef MN_PW_GELU_FNS

/* log floored at -100, as PyTorch's binary cross-entropy does. */
MN_PW_FN double mn_pw_clamped_log(double v) {
  double l = log(v);
  return l < -100.0 ? -100.0 : l;
}

/* BCE's d pred: the denominator p (1 - p) is floored at 1e-12 like PyTorch, so p = 0 or 1
 * gives a large finite gradient instead of inf or NaN. */
MN_PW_FN double mn_pw_bce_grad_pred(double p, double t, double k) {
  double den = p * (1.0 - p);
  return k * (p - t) / (den > 1e-12 ? den : 1e-12);
}

#define MN_PW_MEAN_OF_V ((double)v / (double)n)

#define MN_PW_OP_ROWS(X)                                                                           \
  X(ADD, 2, 0, 0, a + b)                                                                           \
  X(MUL, 2, 0, 0, a *b)                                                                            \
  X(DIV, 2, 0, 0, a / b)                                                                           \
  X(GREATER, 2, 0, 0, a > b ? 1 : 0)                                                               \
  X(SCALE, 1, MN_PW_ATTR, 0, a *s)                                                                 \
  X(RELU, 1, 0, 0, a > 0 ? a : 0)                                                                  \
  X(SIGMOID, 1, 0, 0, mn_pw_sigmoid(a))                                                            \
  X(TANH, 1, 0, 0, mn_pw_tanh(a))                                                                  \
  X(NEG, 1, 0, 0, -a)                                                                              \
  X(ABS, 1, 0, 0, mn_pw_fabs(a))                                                                   \
  X(LOG, 1, 0, 0, mn_pw_log(a))                                                                    \
  X(EXP, 1, 0, 0, mn_pw_exp(a))                                                                    \
  X(RECIP, 1, 0, 0, 1 / a)                                                                         \
  X(SILU, 1, 0, 0, a *mn_pw_sigmoid(a))                                                            \
  X(GELU, 1, 0, 0, mn_pw_gelu_tanh(a))                                                             \
  X(SWIGLU, 2, 0, 0, a *mn_pw_sigmoid(a) * b) /* (gate, up) */                                     \
  /* gradients: a is the forward input or output the op names, b is dy; 0 * b keeps NaN */         \
  X(RELU_GRAD, 2, 0, 0, a > 0 ? b : 0 * b)                                                         \
  X(SIGMOID_GRAD, 2, 0, 0, b *(a * (1 - a)))                                                       \
  X(TANH_GRAD, 2, 0, 0, b *(1 - a * a))                                                            \
  X(ABS_GRAD, 2, 0, 0, a > 0 ? b : (a < 0 ? -b : 0 * b))                                           \
  X(SILU_GRAD, 2, 0, 0, b *mn_pw_silu_slope(a))                                                    \
  X(GELU_GRAD, 2, 0, 0, b *mn_pw_gelu_tanh_grad(a))                                                \
  X(SWIGLU_GRAD_GATE, 3, 0, 0, c *b *mn_pw_silu_slope(a)) /* (gate, up, dy) */                     \
  X(EXPAND_SCALAR, 0, MN_PW_SCALAR | MN_PW_ATTR, (double)(v * s), (mn_pw_real)k)                   \
  /* loss gradients (pred, target, dy[1]): k is dy[0] / n, times 2 for the squared error */        \
  X(MSE_GRAD, 2, MN_PW_SCALAR, 2.0 * MN_PW_MEAN_OF_V, (mn_pw_real)(k * ((double)a - (double)b)))   \
  X(L1_GRAD, 2, MN_PW_SCALAR, MN_PW_MEAN_OF_V, a > b ? (mn_pw_real)k : (a < b ? (mn_pw_real)-k : 0))

#define MN_PW_VARIANT_ROWS(X)                                                                      \
  /* bce_grad: variant 0 d pred, variant 1 d target = k (log(1 - p) - log p) */                    \
  X(BCE_GRAD_PRED, 2, MN_PW_SCALAR, MN_PW_MEAN_OF_V, (mn_pw_real)mn_pw_bce_grad_pred(a, b, k))     \
  X(BCE_GRAD_TARGET, 2, MN_PW_SCALAR, MN_PW_MEAN_OF_V,                                             \
    (mn_pw_real)(k * (mn_pw_clamped_log(1.0 - (double)a) - mn_pw_clamped_log(a))))

#define MN_PW_LIST(X) MN_PW_OP_ROWS(X) MN_PW_VARIANT_ROWS(X)

typedef enum mn_pw_code {
#define MN_PW_CODE(name, nin, flags, factor, value) MN_PW_##name,
  MN_PW_LIST(MN_PW_CODE)
#undef MN_PW_CODE
      MN_PW_COUNT
} mn_pw_code;

/* The element function of each row: mn_pw_<NAME>(a, b, c, k, s). */
#define MN_PW_DEFINE(name, nin, flags, factor, value)                                              \
  MN_PW_FN mn_pw_real mn_pw_##name(mn_pw_real a, mn_pw_real b, mn_pw_real c, double k,             \
                                   mn_pw_real s) {                                                 \
    (void)a, (void)b, (void)c, (void)k, (void)s;                                                   \
    return (value);                                                                                \
  }
MN_PW_LIST(MN_PW_DEFINE)
#undef MN_PW_DEFINE

/* A row's value by code; with a constant code (a template argument on the device) the
 * switch folds to the one function. */
MN_PW_FN mn_pw_real mn_pw_eval(int code, mn_pw_real a, mn_pw_real b, mn_pw_real c, double k,
                               mn_pw_real s) {
  switch (code) {
#define MN_PW_EVAL_CASE(name, nin, flags, factor, value)                                           \
  case MN_PW_##name: return mn_pw_##name(a, b, c, k, s);
    MN_PW_LIST(MN_PW_EVAL_CASE)
#undef MN_PW_EVAL_CASE
  default: return MN_PW_NAN;
  }
}

/* k of an MN_PW_SCALAR row from the scalar input's value v, s and the element count n. */
MN_PW_FN double mn_pw_factor(int code, float v, mn_pw_real s, long long n) {
  switch (code) {
#define MN_PW_FACTOR_CASE(name, nin, flags, factor, value)                                         \
  case MN_PW_##name: return (factor);
    MN_PW_LIST(MN_PW_FACTOR_CASE)
#undef MN_PW_FACTOR_CASE
  default: return (void)v, (void)s, (void)n, 0.0;
  }
}

MN_PW_CONSTFN int mn_pw_num_inputs(int code) {
  switch (code) {
#define MN_PW_NIN_CASE(name, nin, flags, factor, value)                                            \
  case MN_PW_##name: return nin;
    MN_PW_LIST(MN_PW_NIN_CASE)
#undef MN_PW_NIN_CASE
  default: return 0;
  }
}

MN_PW_CONSTFN unsigned mn_pw_flags(int code) {
  switch (code) {
#define MN_PW_FLAGS_CASE(name, nin, flags, factor, value)                                          \
  case MN_PW_##name: return flags;
    MN_PW_LIST(MN_PW_FLAGS_CASE)
#undef MN_PW_FLAGS_CASE
  default: return 0u;
  }
}

/* Dropout's mask, a pure function of (seed, micro-step, element index) so that nothing is
 * stored: the backward draws the forward's mask again, the CPU and CUDA backends draw the same
 * bits, and a resumed run draws the masks the uninterrupted one would (docs/architecture.md,
 * "Dropout's random numbers"). The node's seed and the session's micro-step make a 64-bit key
 * (each mixed by splitmix64's finalizer, a bijection); element i takes output i + 1 of
 * splitmix64 started at that key, whose top 32 bits u keep the element when u >= p 2^32. A
 * kept element is x / (1 - p), divided in double and rounded once to float on both sides, a
 * dropped one 0 * x (a NaN or infinity stays NaN, as PyTorch's x * mask gives). */
#define MN_PW_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

MN_PW_FN unsigned long long mn_pw_mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

MN_PW_FN unsigned long long mn_pw_dropout_key(unsigned long long seed, unsigned long long step) {
  return mn_pw_mix64(mn_pw_mix64(seed) + step);
}

/* The 32 random bits of element i under key. */
MN_PW_FN unsigned int mn_pw_dropout_bits(unsigned long long key, unsigned long long i) {
  return (unsigned int)(mn_pw_mix64(key + (i + 1) * MN_PW_GOLDEN_GAMMA) >> 32);
}

/* mn_sample's u in [0, 1) for row `row` at `position` under `seed`: the top 53 bits of
 * splitmix64's output row + 1 from the key mix(mix(seed) + position). */
MN_PW_FN double mn_pw_sample_uniform(unsigned long long seed, unsigned long long position,
                                     unsigned long long row) {
  unsigned long long key = mn_pw_mix64(mn_pw_mix64(seed) + position);
  return (double)(mn_pw_mix64(key + (row + 1) * MN_PW_GOLDEN_GAMMA) >> 11) *
         (1.0 / 9007199254740992.0);
}

/* The order of floats as unsigned integers: a < b (neither NaN) iff key(a) < key(b). */
MN_PW_FN unsigned int mn_pw_order_key(unsigned int bits) {
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/* p 2^32 is exact in float for p in [0, 1) (a power-of-two scaling), so both compilers agree. */
MN_PW_FN unsigned int mn_pw_dropout_threshold(float p) { return (unsigned int)(p * 4294967296.0f); }

MN_PW_FN float mn_pw_dropout(float x, unsigned long long key, unsigned long long i,
                             unsigned int threshold, float p) {
  if (mn_pw_dropout_bits(key, i) < threshold) return 0.0f * x;
  return (float)((double)x / (1.0 - (double)p));
}

#ifndef __CUDACC_RTC__
/* The row of an op of the op table, or -1 for an op without one. */
static inline int mn_pw_code_of_op(mn_op op) {
  switch (op) {
#define MN_PW_OP_CASE(name, nin, flags, factor, value)                                             \
  case MN_OP_##name: return MN_PW_##name;
    MN_PW_OP_ROWS(MN_PW_OP_CASE)
#undef MN_PW_OP_CASE
  default: return -1;
  }
}

/* Every op flagged pointwise (but fused, which runs a program of them) has a row, and each
 * row reads as many inputs as its op has. */
enum {
#define MN_PW_OP_FACTS(e, name, arity, flags) MN_PW_OPF_##e = (flags), MN_PW_OPA_##e = (arity),
  MN_OP_LIST(MN_PW_OP_FACTS)
#undef MN_PW_OP_FACTS
};
#define MN_PW_COUNT_POINTWISE_OP(e, name, arity, flags)                                            \
  +(((flags)&MN_OPF_POINTWISE) && (arity) != MN_ARITY_VARIADIC)
#define MN_PW_COUNT_POINTWISE_ROW(name, nin, flags, factor, value)                                 \
  +((MN_PW_OPF_##name & MN_OPF_POINTWISE) != 0)
_Static_assert(0 MN_OP_LIST(MN_PW_COUNT_POINTWISE_OP) == 0 MN_PW_OP_ROWS(MN_PW_COUNT_POINTWISE_ROW),
               "every op flagged MN_OPF_POINTWISE in host/ops.h needs a row in MN_PW_OP_ROWS");
#undef MN_PW_COUNT_POINTWISE_OP
#undef MN_PW_COUNT_POINTWISE_ROW
#define MN_PW_CHECK_ARITY(name, nin, flags, factor, value)                                         \
  _Static_assert(MN_PW_OPA_##name == (nin) + (((flags)&MN_PW_SCALAR) ? 1 : 0),                     \
                 "the row of " #name " reads the inputs its op has");
MN_PW_OP_ROWS(MN_PW_CHECK_ARITY)
#undef MN_PW_CHECK_ARITY
#endif

#endif
