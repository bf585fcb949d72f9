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
  mn_status (*write_optim_state)(mn_session *s, size_t slot, int which, const float *src, size_t n);
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

/* A parameter the user names that the optimizer concatenated into a derived one
 * (optimizer/siblings.h): its rows are a contiguous range of the derived parameter's buffer,
 * and of its gradient's and Adam moments'. */
typedef struct mn_param_source {
  char *name;          /* owned */
  mn_node node;        /* the derived parameter of the plan's graph */
  size_t offset;       /* first element within the derived tensor */
  mn_tensor_type type; /* the source's own type */
} mn_param_source;

struct mn_session {
  mn_plan *plan;
  mn_param_source *sources; /* of every derived parameter, in node and row order */
  size_t num_sources;
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

/* The build pipelines up to the plan (no backend): inference is sort, optimize, concatenate
 * sibling matmuls (optimizer/siblings.h), plan; training is sort, optimize, concatenate
 * sibling matmuls, differentiate, optimize, sort, plan. */
mn_status mn_lower_inference(const char *fn, const mn_graph *g, const mn_session_options *o,
                             mn_plan **out);
mn_status mn_lower_training(const char *fn, const mn_graph *g, const mn_session_options *o,
                            mn_plan **out);
/* mn_lower_training, filling `report` (when not NULL) with what the optimizer did and
 * the lowering time. */
mn_status mn_lower_training_report(const char *fn, const mn_graph *g, const mn_session_options *o,
                                   mn_plan **out, mn_optimize_report *report);

/* Creates a session around a lowered plan, taking ownership of the plan even on
 * failure; `fn` names the public builder in messages. The plan's derived parameters give
 * the session its table of sources (mn_session_sources_init). */
mn_status mn_session_create(const char *fn, mn_plan *plan, const mn_session_options *opts,
                            bool training, mn_session **out);

/* A parameter as users name it: a parameter node of the plan, or a source of a derived
 * one. The values are elements [offset, offset + numel) of node's tensor. */
typedef struct mn_param_view {
  const char *name;
  const mn_tensor_type *type;
  size_t numel;
  mn_node node;
  size_t offset;
} mn_param_view;

/* The table of sources, from the derived parameters of s->plan's graph (decoding their
 * names); MN_ERR_STATE when a derived parameter is malformed. */
mn_status mn_session_sources_init(const char *fn, mn_session *s);
void mn_session_sources_free(mn_session *s);

/* Finds the parameter users call `name` (never a derived one), holding exactly n elements;
 * `ptr` is the caller's data pointer, checked for NULL. */
mn_status mn_session_find_param(const char *fn, mn_session *s, const char *name, const void *ptr,
                                size_t n, mn_param_view *out);

/* Elements [offset, offset + n) of a buffer of buffer_numel F32 elements, through the
 * backend's whole-buffer read and write: a range that is not the whole buffer is read or
 * written back with the rest of the buffer around it. */
mn_status mn_session_read_range(mn_session *s, uint32_t buffer, size_t buffer_numel, size_t offset,
                                float *dst, size_t n);
mn_status mn_session_write_range(mn_session *s, uint32_t buffer, size_t buffer_numel, size_t offset,
                                 const float *src, size_t n);
/* The same for Adam moment `which` of plan parameter slot `slot`. */
mn_status mn_session_read_moment_range(mn_session *s, size_t slot, int which, size_t slot_numel,
                                       size_t offset, float *dst, size_t n);
mn_status mn_session_write_moment_range(mn_session *s, size_t slot, int which, size_t slot_numel,
                                        size_t offset, const float *src, size_t n);

/* Finds the named leaf of kind `op` (MN_OP_INPUT or MN_OP_PARAMETER; derived parameters are
 * not found) with dtype `dt` holding exactly n elements; `ptr` is the caller's data pointer,
 * checked for NULL. */
mn_status mn_session_find_leaf(const char *fn, mn_session *s, mn_op op, mn_dtype dt,
                               const char *name, const void *ptr, size_t n, mn_node *out);

/* The reference backend in host/reference/. */
extern const mn_backend_ops mn_cpu_backend;

#endif
