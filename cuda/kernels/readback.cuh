// The step graph's last node: what the host reads after a step (the error record, the loss and,
// in F16 training, the loss scaler) written by one kernel straight into the host's pinned
// readback, which the device addresses directly. Two copy-engine transfers in its place held a
// small step up by 10 us (docs/performance.md); one single-block kernel costs about 1.3.

// io = the error record, the loss (fp32, null without one), the scaler (null unless scaled),
// then where each goes in host memory, in the same order; last the scalars, when the readback
// runs beside the optimizer update instead of after it (capture.c), else null. The update
// records a step it skips after a failure in the error record (mn_opt_update); beside it, the
// readback derives the same step from the same words, whichever of the two reads first.
template <class IO> __device__ void mn_step_readback(const IO &io) {
  const unsigned *err = mn_arg<const unsigned>(io, 0);
  const float *loss = mn_arg<const float>(io, 1);
  const unsigned *scaler = mn_arg<const unsigned>(io, 2);
  unsigned *host_err = mn_arg<unsigned>(io, 3);
  float *host_loss = mn_arg<float>(io, 4);
  unsigned *host_scaler = mn_arg<unsigned>(io, 5);
  const mn_dev_scalars *beside_update = mn_arg<const mn_dev_scalars>(io, 6);
  constexpr unsigned ERR_WORDS = sizeof(mn_dev_error) / 4, SCALER_WORDS = sizeof(mn_dev_scaler) / 4;
  const mn_dev_error *e = reinterpret_cast<const mn_dev_error *>(err);
  const unsigned i = threadIdx.x;
  if (i < ERR_WORDS) {
    unsigned word = err[i];
    if (err + i == &e->skipped_step && beside_update && word == 0u)
      if (e->what && !e->nonfinite && beside_update->accum_apply) word = beside_update->step;
    host_err[i] = word;
  }
  if (scaler && i < SCALER_WORDS) host_scaler[i] = scaler[i];
  if (loss && i == 0) *host_loss = *loss;
}
