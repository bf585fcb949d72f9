// The optimizer update over every trainable parameter at once: the memory planner lays
// parameters and gradients out as two flat vectors with equal spacing, so one kernel
// updates them all. Arithmetic is done in double, as the reference backend does, so the
// two backends agree to the last bit or nearly.

// Gradient accumulation: io = grads, the running sum, scalars, the error record. Each step
// adds its gradients to the sum (the first of a round starts it); the updating step replaces
// the gradients by the mean, which clipping and the update then read. Float arithmetic in the
// order the reference backend uses, so both agree bit for bit. Nothing after a failure, nor on
// an F16 step whose gradients overflowed.
template <long long N, class IO> __device__ void mn_opt_accumulate(const IO &io) {
  auto g = mn_out<0>(io);
  auto sum = mn_out<1>(io);
  const mn_dev_scalars *sc = mn_arg<const mn_dev_scalars>(io, 2);
  const mn_dev_error *err = mn_arg<const mn_dev_error>(io, 3);
  if (err->what || err->nonfinite) return;
  const bool first = sc->accum_first != 0u, apply = sc->accum_apply != 0u;
  const float k = sc->accum_k;
  MN_FOR_EACH(i, N) {
    const float a = first ? g[i] : sum[i] + g[i];
    if (apply)
      g[i] = a / k;
    else
      sum[i] = a;
  }
}

// Per-block partial sums of squared gradients, for global-norm clipping; io = grads,
// partials, the error record, scalars (nothing on a step that only accumulates).
template <int BLOCK, long long N, class IO> __device__ void mn_opt_sumsq(const IO &io) {
  auto g = mn_in<0>(io);
  double *partials = mn_arg<double>(io, 1);
  const mn_dev_error *err = mn_arg<const mn_dev_error>(io, 2);
  if (err->what || err->nonfinite) return;
  if (!mn_arg<const mn_dev_scalars>(io, 3)->accum_apply) return;
  __shared__ double shared[32];
  double acc = 0.0;
  MN_FOR_EACH(i, N) {
    double v = g[i];
    acc += v * v;
  }
  acc = mn_block_sum_d<BLOCK>(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Applies update(g, m, v, w) to every element in place (m and v only WITH_MOMENTS; SGD's are
// dummies), writing the gradient back when clipping rewrote it and the weights' low-precision
// copy (io.p[7]) beside them. Four elements a thread at a time with 16-byte loads and stores
// where the vectors allow it (the update block's are laid out 256-byte aligned; a misaligned
// shadow falls back): more loads in flight a thread and a quarter of the loop's instructions,
// which a small model's update, a wave or two of blocks, waits on. The same arithmetic per
// element either way, so the same bits.
template <long long N, bool WITH_MOMENTS, class IO, class Update>
__device__ __forceinline__ void mn_opt_each(const IO &io, float *w, float *g, float *m, float *v,
                                            bool clip, Update update) {
  constexpr bool LOW = mn_io_storage<IO, 7>::value != MN_DEV_F32;
  auto lw = mn_out<7>(io);
  if constexpr (N % 4 == 0) {
    unsigned long long addresses =
        reinterpret_cast<unsigned long long>(w) | reinterpret_cast<unsigned long long>(g);
    if constexpr (WITH_MOMENTS)
      addresses |=
          reinterpret_cast<unsigned long long>(m) | reinterpret_cast<unsigned long long>(v);
    bool aligned = (addresses & 15ull) == 0;
    if constexpr (LOW)
      aligned = aligned && (reinterpret_cast<unsigned long long>(lw.p) & 7ull) == 0;
    if (aligned) {
      for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < N / 4;
           q += (long long)gridDim.x * blockDim.x) {
        float4 g4 = reinterpret_cast<const float4 *>(g)[q];
        float4 w4 = reinterpret_cast<const float4 *>(w)[q];
        float4 m4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v4 = m4;
        if constexpr (WITH_MOMENTS) {
          m4 = reinterpret_cast<const float4 *>(m)[q];
          v4 = reinterpret_cast<const float4 *>(v)[q];
        }
        update(g4.x, m4.x, v4.x, w4.x);
        update(g4.y, m4.y, v4.y, w4.y);
        update(g4.z, m4.z, v4.z, w4.z);
        update(g4.w, m4.w, v4.w, w4.w);
        if (clip) reinterpret_cast<float4 *>(g)[q] = g4;
        if constexpr (WITH_MOMENTS) {
          reinterpret_cast<float4 *>(m)[q] = m4;
          reinterpret_cast<float4 *>(v)[q] = v4;
        }
        reinterpret_cast<float4 *>(w)[q] = w4;
        if constexpr (LOW) {
          constexpr int S = mn_io_storage<IO, 7>::value;
          reinterpret_cast<uint2 *>(lw.p)[q] =
              make_uint2(mn_lp_round2<S>(w4.x, w4.y), mn_lp_round2<S>(w4.z, w4.w));
        }
      }
      return;
    }
  }
  MN_FOR_EACH(i, N) {
    float gi = g[i], wi = w[i], mi = 0.0f, vi = 0.0f;
    if constexpr (WITH_MOMENTS) {
      mi = m[i];
      vi = v[i];
    }
    update(gi, mi, vi, wi);
    if (clip) g[i] = gi;
    if constexpr (WITH_MOMENTS) {
      m[i] = mi;
      v[i] = vi;
    }
    w[i] = wi;
    if constexpr (LOW) lw[i] = wi;
  }
}

// io: params, grads, m, v (NULL for SGD), scalars, norm partials (NULL: no clipping),
// the error record: after a failed kernel (NaN rows) nothing is updated, nor on an F16 step
// whose gradients overflowed. In a low-precision session io.p[7] is the weights'
// low-precision copy, written in the same pass.
template <int BLOCK, long long N, int PARTIALS, class IO>
__device__ void mn_opt_update(const IO &io) {
  float *w = mn_arg<float>(io, 0);
  float *g = mn_arg<float>(io, 1);
  float *m = mn_arg<float>(io, 2);
  float *v = mn_arg<float>(io, 3);
  const mn_dev_scalars *sc = mn_arg<const mn_dev_scalars>(io, 4);
  const double *partials = mn_arg<const double>(io, 5);
  mn_dev_error *err = mn_arg<mn_dev_error>(io, 6);
  if (!sc->accum_apply || err->nonfinite) return;
  if (err->what) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && err->skipped_step == 0u)
      err->skipped_step = sc->step;
    return;
  }
  __shared__ double shared[32];
  double coef = 1.0;
  if (partials) {
    // Every block sums the partials in the same order, so all agree on the norm.
    double acc = 0.0;
    for (int i = threadIdx.x; i < PARTIALS; i += BLOCK)
      acc += partials[i];
    acc = mn_block_sum_d<BLOCK>(acc, shared);
    coef = (double)sc->max_grad_norm / (sqrt(acc) + 1e-6);
  }
  // A NaN norm scales every gradient by NaN, as clip_grad_norm_ and the reference do.
  const bool clip = partials && !(coef >= 1.0);
  const unsigned kind = sc->kind;
  const double lr = sc->lr;
  if (kind == MN_DEV_OPTIM_SGD) {
    mn_opt_each<N, false>(io, w, g, m, v, clip, [&](float &gi, float &, float &, float &wi) {
      if (clip) gi = (float)(gi * coef);
      wi = (float)(wi - lr * gi);
    });
    return;
  }
  if (kind != MN_DEV_OPTIM_ADAM && kind != MN_DEV_OPTIM_ADAMW) return;
  const double beta1 = sc->beta1, beta2 = sc->beta2, eps = sc->eps;
  const double decay = kind == MN_DEV_OPTIM_ADAMW ? 1.0 - lr * (double)sc->weight_decay : 1.0;
  const double step_size = lr / sc->bias_correction1, bc2_sqrt = sqrt(sc->bias_correction2);
  // One element's update: its gradient (clipped), moments and weight in place.
  mn_opt_each<N, true>(io, w, g, m, v, clip, [&](float &gi, float &mi, float &vi, float &wi) {
    if (clip) gi = (float)(gi * coef);
    double mk = beta1 * mi + (1.0 - beta1) * gi;
    double vk = beta2 * vi + (1.0 - beta2) * (double)gi * gi;
    mi = (float)mk;
    vi = (float)vk;
    double denom = sqrt((double)vi) / bc2_sqrt + eps;
    wi = (float)(wi * decay - step_size * mi / denom);
  });
}

// ---- F16 loss scaling (host/storage.h, mn_loss_scaler; docs/precision.md)
//
// The scaler lives on the device (mn_dev_scaler), so a step needs no word from the host: the
// step graph runs mn_scaler_begin after its input copies, the program (whose loss gradient is
// seeded with the #loss_scale input), mn_scaler_unscale, the optimizer kernels above (which do
// nothing when the unscale flagged an overflow) and mn_scaler_end. One thread each for begin
// and end.

// io = the scaler, the host's copy of it, scalars, the #loss_scale input (fp32). Takes the
// parts of the host's state it names; seeds the loss gradient with the scale; decides, from the
// device's own round and step count, whether this step starts and ends an accumulation round
// and which optimizer step it is (a skipped step advances neither, so the host's guess, which
// the scalars carry, may be ahead).
template <class IO> __device__ void mn_scaler_begin(const IO &io) {
  mn_dev_scaler *ls = mn_arg<mn_dev_scaler>(io, 0);
  const mn_dev_scaler *host = mn_arg<const mn_dev_scaler>(io, 1);
  mn_dev_scalars *sc = mn_arg<mn_dev_scalars>(io, 2);
  auto seed = mn_out<3>(io);
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned take = host->take;
  if (take & MN_DEV_TAKE_SCALER) {
    ls->scale = host->scale;
    ls->good_steps = host->good_steps;
    ls->skipped = host->skipped;
  }
  if (take & MN_DEV_TAKE_STEP) ls->step = host->step;
  if (take & MN_DEV_TAKE_ROUND) ls->accum_index = host->accum_index;
  seed[0] = ls->scale;
  if (sc->kind == MN_DEV_OPTIM_NONE) return;
  const unsigned k = sc->accum_steps;
  sc->accum_first = ls->accum_index == 0u;
  sc->accum_apply = k <= 1u || ls->accum_index + 1u >= k;
  if (!sc->accum_apply) return;
  const unsigned long long step = ls->step + 1ull;
  // The host computed the bias corrections for the step it expected; recompute them (in
  // double, as it does) only when a skipped step in flight made it wrong.
  if ((unsigned)step == sc->step) return;
  sc->step = (unsigned)step;
  sc->bias_correction1 = 1.0 - pow((double)sc->beta1, (double)step);
  sc->bias_correction2 = 1.0 - pow((double)sc->beta2, (double)step);
}

__device__ __forceinline__ bool mn_nonfinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// io = the gradients (the update block, fp32, N values), the scaler, the error record.
// Multiplies every gradient by 1 / scale, as the reference backend does (g *= inv in float),
// and flags the step when any scaled gradient was infinite or NaN. Nothing after a failure
// (the reference stops before it too).
template <long long N, class IO> __device__ void mn_scaler_unscale(const IO &io) {
  auto g = mn_out<0>(io);
  const mn_dev_scaler *ls = mn_arg<const mn_dev_scaler>(io, 1);
  mn_dev_error *err = mn_arg<mn_dev_error>(io, 2);
  if (err->what) return;
  const float inv = 1.0f / ls->scale;
  bool bad = false;
  MN_FOR_EACH(i, N) {
    const float v = g[i];
    bad |= mn_nonfinite(v);
    g[i] = v * inv;
  }
  if (bad) err->nonfinite = 1u;
}

// io = the scaler, the error record, scalars. mn_loss_scaler_record on the device: an
// overflowing step halves the scale and counts as skipped; INTERVAL finite steps in a row
// double it. With an optimizer, a finite step moves the accumulation round on and, when it
// updated, the step count. A failed step (an index out of range) starts the round again, as
// the reference does, and leaves the scale alone.
template <unsigned INTERVAL, class IO> __device__ void mn_scaler_end(const IO &io) {
  mn_dev_scaler *ls = mn_arg<mn_dev_scaler>(io, 0);
  mn_dev_error *err = mn_arg<mn_dev_error>(io, 1);
  const mn_dev_scalars *sc = mn_arg<const mn_dev_scalars>(io, 2);
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const bool finite = err->nonfinite == 0u;
  err->nonfinite = 0u;
  if (err->what) {
    ls->accum_index = 0u;
    return;
  }
  if (!finite) {
    ls->scale *= 0.5f;
    ls->good_steps = 0u;
    ls->skipped++;
    return;
  }
  if (++ls->good_steps == INTERVAL) {
    ls->scale *= 2.0f;
    ls->good_steps = 0u;
  }
  if (sc->kind == MN_DEV_OPTIM_NONE) return;
  if (sc->accum_apply) {
    ls->step++;
    ls->accum_index = 0u;
  } else {
    ls->accum_index++;
  }
}
