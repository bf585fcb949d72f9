/* A session joining its data-parallel group (mn_session_options.group) when it is built:
 * CPU sessions through an in-process group, CUDA sessions through an NCCL group whose
 * collectives the CUDA backend captures into its step graph (cuda/data_parallel.c), in every
 * precision (F16's ranks agree on each overflow: host/reference/cpu_backend.c, cuda/capture.c). */
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "host/data_parallel.h"
#include "host/error.h"
#include "host/nccl.h"
#include "session/session.h"

/* The group must serve the session's backend; a CUDA session's group is bound to its stream. */
static mn_status check_backend(const char *fn, mn_session *s) {
  if (s->backend == &mn_cpu_backend) {
    if (mn_group_is_local(s->options.group)) return MN_OK;
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: a CPU session's group must be an in-process group (mn_group_new_local); "
                   "an NCCL group serves CUDA sessions",
                   fn);
  }
  const mn_nccl *nccl = NULL;
  mn_status st = mn_nccl_get(&nccl);
  if (st != MN_OK)
    return mn_fail(st, "%s: a data-parallel CUDA session needs NCCL: %s", fn, mn_nccl_error());
#ifdef MN_WITH_CUDA
  return mn_cuda_dp_prepare(s, fn);
#else
  return mn_fail(MN_ERR_UNSUPPORTED, "%s: this build of meganeura has no CUDA backend", fn);
#endif
}

mn_status mn_session_join_group(const char *fn, mn_session *s) {
  const mn_session_options *o = &s->options;
  if (!o->group) return MN_OK;
  if (!s->training)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: options.group is set but an inference session has nothing to reduce", fn);
  mn_status st = check_backend(fn, s);
  if (st != MN_OK) return st;
  if ((st = mn_group_join(o->group, o->rank, o->world_size, mn_dp_plan_hash(s->plan, o->zero1),
                          fn)) != MN_OK)
    return st;
  st = mn_dp_new(s->plan, o->group, o->rank, o->zero1, MN_DP_BUCKET_BYTES, &s->dp);
#ifdef MN_WITH_CUDA
  if (st == MN_OK && s->backend != &mn_cpu_backend) st = mn_cuda_dp_attach(s);
#endif
  return st;
}
