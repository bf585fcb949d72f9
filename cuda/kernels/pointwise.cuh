// Element-wise ops: one grid-stride template driven by an op code. Arguments:
// p[0] the output, p[1..NIN] the element-wise inputs, and for ops that read one
// upstream scalar (loss gradients, expand_scalar) p[1 + NIN] that scalar's buffer.
// Every node buffer starts 256-byte aligned, so whole buffers are read as float4.
// Float math mirrors the reference formulas; the loss gradients and BCE's logs, whose
// reference clamps and floors are easy to get subtly wrong in float, run in double.

enum mn_pw_code {
  MN_PW_ADD = 1,
  MN_PW_MUL,
  MN_PW_DIV,
  MN_PW_GREATER,
  MN_PW_SCALE,
  MN_PW_RELU,
  MN_PW_SIGMOID,
  MN_PW_TANH,
  MN_PW_NEG,
  MN_PW_ABS,
  MN_PW_LOG,
  MN_PW_EXP,
  MN_PW_RECIP,
  MN_PW_SILU,
  MN_PW_GELU,
  MN_PW_SWIGLU,
  MN_PW_EXPAND_SCALAR,
  MN_PW_RELU_GRAD,
  MN_PW_SIGMOID_GRAD,
  MN_PW_TANH_GRAD,
  MN_PW_ABS_GRAD,
  MN_PW_SILU_GRAD,
  MN_PW_GELU_GRAD,
  MN_PW_SWIGLU_GRAD_GATE,
  MN_PW_MSE_GRAD,
  MN_PW_L1_GRAD,
  MN_PW_BCE_GRAD_PRED,
  MN_PW_BCE_GRAD_TARGET,
};

// Element-wise inputs of an op.
__device__ constexpr int mn_pw_nin(int op) {
  return op == MN_PW_EXPAND_SCALAR      ? 0
         : op == MN_PW_SWIGLU_GRAD_GATE ? 3
         : (op >= MN_PW_ADD && op <= MN_PW_GREATER) || op == MN_PW_SWIGLU ||
                 (op >= MN_PW_RELU_GRAD && op <= MN_PW_BCE_GRAD_TARGET)
             ? 2
             : 1;
}

// Ops that read the scalar dy[0] (loss gradients) or x[0] (expand_scalar).
__device__ constexpr bool mn_pw_has_scalar(int op) {
  return op == MN_PW_EXPAND_SCALAR || op >= MN_PW_MSE_GRAD;
}

// The scalar factor: the loss gradients apply the mean's 1/N (and MSE's 2) here, in
// double, as the reference does.
template <int OP, long long N> __device__ __forceinline__ double mn_pw_factor(float v, float s) {
  if constexpr (OP == MN_PW_EXPAND_SCALAR)
    return (double)(v * s);
  else if constexpr (OP == MN_PW_MSE_GRAD)
    return 2.0 * (double)v / (double)N;
  else
    return (double)v / (double)N;
}

__device__ __forceinline__ float mn_pw_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ double mn_pw_clamped_log(double v) {
  double l = log(v);
  return l < -100.0 ? -100.0 : l;
}

// sqrt(2/pi) and the cubic coefficient of the tanh approximation (API.md).
#define MN_PW_GELU_KD 0.7978845608028654
#define MN_PW_GELU_CD 0.044715

template <int OP>
__device__ __forceinline__ float mn_pw_apply(float a, float b, float c, double k, float s) {
  if constexpr (OP == MN_PW_ADD)
    return a + b;
  else if constexpr (OP == MN_PW_MUL)
    return a * b;
  else if constexpr (OP == MN_PW_DIV)
    return a / b;
  else if constexpr (OP == MN_PW_GREATER)
    return a > b ? 1.0f : 0.0f;
  else if constexpr (OP == MN_PW_SCALE)
    return a * s;
  else if constexpr (OP == MN_PW_RELU)
    return a > 0.0f ? a : 0.0f;
  else if constexpr (OP == MN_PW_SIGMOID)
    return mn_pw_sigmoid(a);
  else if constexpr (OP == MN_PW_TANH)
    return tanhf(a);
  else if constexpr (OP == MN_PW_NEG)
    return -a;
  else if constexpr (OP == MN_PW_ABS)
    return fabsf(a);
  else if constexpr (OP == MN_PW_LOG)
    return logf(a);
  else if constexpr (OP == MN_PW_EXP)
    return expf(a);
  else if constexpr (OP == MN_PW_RECIP)
    return 1.0f / a;
  else if constexpr (OP == MN_PW_SILU)
    return a * mn_pw_sigmoid(a);
  else if constexpr (OP == MN_PW_GELU) {
    // In double, as the reference: for x below about -3, 1 + tanh(u) cancels and a float
    // result keeps only a few correct bits (seen: 30% relative error at x = -4.6).
    double x = a;
    return (float)(0.5 * x * (1.0 + tanh(MN_PW_GELU_KD * (x + MN_PW_GELU_CD * x * x * x))));
  }
  else if constexpr (OP == MN_PW_SWIGLU)
    return a * mn_pw_sigmoid(a) * b;
  else if constexpr (OP == MN_PW_EXPAND_SCALAR)
    return (float)k;
  // Gradients: a is the forward input or output the op names, b is dy.
  else if constexpr (OP == MN_PW_RELU_GRAD)
    return a > 0.0f ? b : 0.0f * b;
  else if constexpr (OP == MN_PW_SIGMOID_GRAD)
    return b * (a * (1.0f - a));
  else if constexpr (OP == MN_PW_TANH_GRAD)
    return b * (1.0f - a * a);
  else if constexpr (OP == MN_PW_ABS_GRAD)
    return a > 0.0f ? b : (a < 0.0f ? -b : 0.0f * b);
  else if constexpr (OP == MN_PW_SILU_GRAD) {
    float sg = mn_pw_sigmoid(a);
    return b * (sg * (1.0f + a * (1.0f - sg)));
  } else if constexpr (OP == MN_PW_GELU_GRAD) {
    double x = a, t = tanh(MN_PW_GELU_KD * (x + MN_PW_GELU_CD * x * x * x));
    return (float)((double)b * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * MN_PW_GELU_KD *
                                                      (1.0 + 3.0 * MN_PW_GELU_CD * x * x)));
  } else if constexpr (OP == MN_PW_SWIGLU_GRAD_GATE) {
    // a gate, b up, c dy
    float sg = mn_pw_sigmoid(a);
    return c * b * (sg * (1.0f + a * (1.0f - sg)));
  }
  // Loss gradients: a pred, b target, k = dy[0] / N (times 2 for MSE).
  else if constexpr (OP == MN_PW_MSE_GRAD)
    return (float)(k * ((double)a - (double)b));
  else if constexpr (OP == MN_PW_L1_GRAD)
    return a > b ? (float)k : (a < b ? (float)-k : 0.0f);
  else if constexpr (OP == MN_PW_BCE_GRAD_PRED) {
    // The denominator is floored at 1e-12 like PyTorch, so p = 0 or 1 stays finite.
    double p = a, den = p * (1.0 - p);
    return (float)(k * (p - (double)b) / (den > 1e-12 ? den : 1e-12));
  } else if constexpr (OP == MN_PW_BCE_GRAD_TARGET) {
    double p = a;
    return (float)(k * (mn_pw_clamped_log(1.0 - p) - mn_pw_clamped_log(p)));
  } else
    return mn_nan();
}

template <int OP>
__device__ __forceinline__ float4 mn_pw_apply4(float4 a, float4 b, float4 c, double k, float s) {
  return make_float4(mn_pw_apply<OP>(a.x, b.x, c.x, k, s), mn_pw_apply<OP>(a.y, b.y, c.y, k, s),
                     mn_pw_apply<OP>(a.z, b.z, c.z, k, s), mn_pw_apply<OP>(a.w, b.w, c.w, k, s));
}

// out[i] = f(in0[i], in1[i], in2[i]) for i < N; SBITS is the float attribute (scale)
// as its bit pattern, since C++17 has no float template parameters.
template <int OP, long long N, unsigned SBITS> __device__ void mn_pw_map(const mn_ptrs &io) {
  constexpr int NIN = mn_pw_nin(OP);
  const float s = __uint_as_float(SBITS);
  float *out = mn_arg<float>(io, 0);
  const float *a = mn_arg<const float>(io, 1), *b = mn_arg<const float>(io, 2),
              *c = mn_arg<const float>(io, 3);
  double k = 0.0;
  if constexpr (mn_pw_has_scalar(OP))
    k = mn_pw_factor<OP, N>(mn_arg<const float>(io, 1 + NIN)[0], s);
  constexpr long long NQ = N / 4;
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  MN_FOR_EACH(q, NQ) {
    float4 va = zero4, vb = zero4, vc = zero4;
    if constexpr (NIN > 0) va = reinterpret_cast<const float4 *>(a)[q];
    if constexpr (NIN > 1) vb = reinterpret_cast<const float4 *>(b)[q];
    if constexpr (NIN > 2) vc = reinterpret_cast<const float4 *>(c)[q];
    reinterpret_cast<float4 *>(out)[q] = mn_pw_apply4<OP>(va, vb, vc, k, s);
  }
  if constexpr (N % 4 != 0) {
    const long long i = NQ * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
      float va = 0.0f, vb = 0.0f, vc = 0.0f;
      if constexpr (NIN > 0) va = a[i];
      if constexpr (NIN > 1) vb = b[i];
      if constexpr (NIN > 2) vc = c[i];
      out[i] = mn_pw_apply<OP>(va, vb, vc, k, s);
    }
  }
}

// out[i] = x[i] + row[i % NCOL] (bias_add, broadcast_add).
template <long long N, long long NCOL> __device__ void mn_pw_add_row(const mn_ptrs &io) {
  float *out = mn_arg<float>(io, 0);
  const float *x = mn_arg<const float>(io, 1), *row = mn_arg<const float>(io, 2);
  if constexpr (NCOL % 4 == 0) {
    constexpr long long NQ = N / 4, QCOL = NCOL / 4;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    const float4 *r4 = reinterpret_cast<const float4 *>(row);
    MN_FOR_EACH(q, NQ) {
      float4 v = x4[q], r = r4[q % QCOL];
      reinterpret_cast<float4 *>(out)[q] = make_float4(v.x + r.x, v.y + r.y, v.z + r.z, v.w + r.w);
    }
  } else {
    MN_FOR_EACH(i, N) { out[i] = x[i] + row[i % NCOL]; }
  }
}
