/* The pipeline driver: session builds (optimize, differentiate, lower, instantiate on a
 * backend) and the helpers its read/write functions share. */
#ifndef MN_SESSION_SESSION_H
#define MN_SESSION_SESSION_H

#include "host/backend.h"

/* The checks every mn_build_* makes first: out, graph, graph error, outputs, and the enums of
 * opts (NULL: the defaults). */
mn_status mn_session_check_buildable(const char *fn, const mn_graph *g,
                                     const mn_session_options *opts, mn_session **out);

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

/* mn_session_create for a session that reads its parameters in place in owner's memory
 * (mn_build_inference_session_shared; NULL: none), and the inputs named in inputs[0 ..
 * n_inputs-1] (mn_session_share_inputs). */
mn_status mn_session_create_sharing(const char *fn, mn_plan *plan, const mn_session_options *opts,
                                    bool training, mn_session *owner, const char *const *inputs,
                                    size_t n_inputs, mn_session **out);
/* Points s's inputs named in `names` at owner's inputs of those names, which must have the same
 * type and storage and persist across steps in both plans (mn_plan_input_persists: KV caches,
 * quantized weights; inputs that each step copies from the host cannot be shared);
 * MN_ERR_NOT_FOUND or MN_ERR_SHAPE naming the input.
 * Needs s->shared (mn_session_share_parameters). */
mn_status mn_session_share_inputs(const char *fn, mn_session *s, mn_session *owner,
                                  const char *const *names, size_t n);
/* mn_build_inference_session_shared that also shares the named inputs with owner: a prefill
 * session writing the KV caches that owner's decode graph reads (models/generator.c). */
mn_status mn_build_inference_session_sharing(const mn_graph *g, const mn_session_options *opts,
                                             mn_session *owner, const char *const *inputs,
                                             size_t n_inputs, mn_session **out);
/* Fills s->shared: every parameter of s's plan, by the name users call it, in owner's memory;
 * MN_ERR_NOT_FOUND or MN_ERR_SHAPE naming a parameter owner lacks or holds in another type. */
mn_status mn_session_share_parameters(const char *fn, mn_session *s, mn_session *owner);

/* Creates a session around a lowered plan, taking ownership of the plan even on
 * failure; `fn` names the public builder in messages. The plan's table of derived parameters
 * (plan->layout) tells the session where the user's parameters lie in them. */
mn_status mn_session_create(const char *fn, mn_plan *plan, const mn_session_options *opts,
                            bool training, mn_session **out);

/* Joins the group of s->options.group (nothing without one): checks the backend and options,
 * makes the group's first collective (world size and plan agreed by every rank) and sets s->dp.
 * session/data_parallel.c. */
mn_status mn_session_join_group(const char *fn, mn_session *s);

/* A parameter as users name it: a parameter node of the plan, or a source of a derived
 * one. The values are elements [offset, offset + numel) of node's tensor. */
typedef struct mn_param_view {
  const char *name;
  const mn_tensor_type *type;
  size_t numel;
  mn_node node;
  size_t offset;
} mn_param_view;

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

#endif
