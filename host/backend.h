/* The interface between the session (session/) and a backend (cuda/, host/reference/):
 * the state of a session that a backend reads and writes, and the table of functions each
 * backend implements. It sits on the ground floor so that backends need nothing from the
 * pipeline driver above them. */
#ifndef MN_HOST_BACKEND_H
#define MN_HOST_BACKEND_H

#include "host/plan.h"
#include "host/storage.h"

typedef struct mn_backend_ops {
  const char *name;
  /* Allocates buffers for s->plan and fills constants; parameters and inputs start at 0. */
  mn_status (*create)(mn_session *s);
  void (*destroy)(mn_session *s);
  mn_status (*write_buffer)(mn_session *s, uint32_t buffer, const void *src, size_t bytes);
  mn_status (*read_buffer)(mn_session *s, uint32_t buffer, void *dst, size_t bytes);
  /* Submits one step; failures found while running it are returned by wait. */
  mn_status (*step)(mn_session *s);
  mn_status (*wait)(mn_session *s);
  /* Adam moments of plan parameter slot `slot` (which 0: first moment m, 1: second v),
   * n elements; reading state that was never allocated gives zeros, writing allocates it. */
  mn_status (*read_optim_state)(mn_session *s, size_t slot, int which, float *dst, size_t n);
  mn_status (*write_optim_state)(mn_session *s, size_t slot, int which, const float *src, size_t n);
  /* Fills the backend's part of the statistics (optional). */
  void (*stats)(const mn_session *s, mn_session_stats *out);
  /* Where buffer lives in the backend's memory (a device pointer on CUDA), for a session that
   * reads it in place (mn_build_inference_session_shared). */
  void *(*buffer_address)(const mn_session *s, uint32_t buffer);
} mn_backend_ops;

typedef enum mn_optimizer_kind {
  MN_OPTIM_NONE,
  MN_OPTIM_SGD,
  MN_OPTIM_ADAM,
  MN_OPTIM_ADAMW
} mn_optimizer_kind;

typedef struct mn_optimizer_config {
  mn_optimizer_kind kind;
  float lr, beta1, beta2, eps, weight_decay;
  float max_grad_norm; /* 0: no clipping */
} mn_optimizer_config;

struct mn_session {
  mn_plan *plan; /* plan->layout: the user's parameters inside derived ones */
  mn_session_options options;
  bool training;
  const mn_backend_ops *backend;
  void *backend_state;
  mn_optimizer_config optim;
  uint64_t step_count; /* completed optimizer steps (Adam bias correction) */
  uint64_t steps;      /* mn_session_step calls that submitted work */
  /* Steps a training session has submitted, accumulation steps included, counted on across a
   * checkpoint: the counter dropout's masks are drawn with (host/pointwise.h). A step reads it
   * as it is submitted; mn_session_step advances it after. */
  uint64_t micro_steps;
  mn_loss_scaler scaler; /* F16 training plans (plan->loss_scale); host/storage.h */
  /* Gradient accumulation (mn_session_set_grad_accumulation): the steps per update, and how
   * many steps of the current round have run. */
  unsigned grad_accum, accum_index;
  /* Per buffer: where a parameter shared with another session lives in that session's memory
   * (its buffer_address), else NULL; NULL as a whole when nothing is shared. */
  void **shared;
  mn_session *owner; /* the session whose parameters those are, else NULL */
  struct mn_dp *dp;  /* the session's rank of a data-parallel group (data_parallel.h), or NULL */
};

/* The backend memory of a buffer that lives in another session, or NULL. */
static inline void *mn_session_shared_buffer(const mn_session *s, uint32_t buffer) {
  return s->shared ? s->shared[buffer] : NULL;
}

/* Whether the step about to run applies an update: always without accumulation, else on the
 * last step of each round of grad_accum. */
static inline bool mn_session_accumulation_step(const mn_session *s) {
  return s->grad_accum <= 1 || s->accum_index + 1 >= s->grad_accum;
}
/* Moves the round on after a step that had an optimizer to run. */
static inline void mn_session_accumulation_advance(mn_session *s, bool applied) {
  s->accum_index = applied ? 0 : s->accum_index + 1;
}

/* The reference backend in host/reference/. */
extern const mn_backend_ops mn_cpu_backend;

#endif
