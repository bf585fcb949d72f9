/* The session front end and the interface every backend implements. */
#ifndef MN_HOST_SESSION_H
#define MN_HOST_SESSION_H

#include "plan.h"

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
  mn_status (*write_optim_state)(mn_session *s, size_t slot, int which, const float *src,
                                 size_t n);
  /* Fills the backend's part of the statistics (optional). */
  void (*stats)(const mn_session *s, mn_session_stats *out);
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
  mn_plan *plan;
  mn_session_options options;
  bool training;
  const mn_backend_ops *backend;
  void *backend_state;
  mn_optimizer_config optim;
  uint64_t step_count; /* completed optimizer steps (Adam bias correction) */
  uint64_t steps;      /* mn_session_step calls that submitted work */
};

/* The checks every mn_build_* makes first: out, graph, graph error, outputs. */
mn_status mn_session_check_buildable(const char *fn, const mn_graph *g, mn_session **out);

/* The build pipelines up to the plan (no backend): inference is sort, optimize, plan;
 * training is sort, optimize, differentiate, optimize, sort, plan. */
mn_status mn_lower_inference(const char *fn, const mn_graph *g, const mn_session_options *o,
                             mn_plan **out);
mn_status mn_lower_training(const char *fn, const mn_graph *g, const mn_session_options *o,
                            mn_plan **out);
/* mn_lower_training, filling `report` (when not NULL) with what the optimizer did and
 * the lowering time. */
mn_status mn_lower_training_report(const char *fn, const mn_graph *g, const mn_session_options *o,
                                   mn_plan **out, mn_optimize_report *report);

/* Creates a session around a lowered plan, taking ownership of the plan even on
 * failure; `fn` names the public builder in messages. */
mn_status mn_session_create(const char *fn, mn_plan *plan, const mn_session_options *opts,
                            bool training, mn_session **out);

/* Finds the named leaf of kind `op` (MN_OP_INPUT or MN_OP_PARAMETER) with dtype `dt`
 * holding exactly n elements; `ptr` is the caller's data pointer, checked for NULL. */
mn_status mn_session_find_leaf(const char *fn, mn_session *s, mn_op op, mn_dtype dt,
                               const char *name, const void *ptr, size_t n, mn_node *out);

/* The reference backend in host/reference/. */
extern const mn_backend_ops mn_cpu_backend;

#endif
