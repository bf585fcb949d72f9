/* A session joining its data-parallel group (mn_session_options.group) when it is built. */
#include "host/data_parallel.h"
#include "host/error.h"
#include "host/nccl.h"
#include "session/session.h"

/* Only the CPU backend has collectives now; CUDA ranks need NCCL, and first of all the
 * library (docs/distributed.md). */
static mn_status check_backend(const char *fn, const mn_session *s) {
  if (s->backend == &mn_cpu_backend) return MN_OK;
  const mn_nccl *nccl = NULL;
  mn_status st = mn_nccl_get(&nccl);
  if (st != MN_OK)
    return mn_fail(st, "%s: a data-parallel CUDA session needs NCCL: %s", fn, mn_nccl_error());
  return mn_fail(MN_ERR_UNSUPPORTED,
                 "%s: data-parallel training runs on the CPU backend only in this version "
                 "(an in-process group); CUDA ranks through NCCL are not built yet",
                 fn);
}

mn_status mn_session_join_group(const char *fn, mn_session *s) {
  const mn_session_options *o = &s->options;
  if (!o->group) return MN_OK;
  if (!s->training)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "%s: options.group is set but an inference session has nothing to reduce", fn);
  if (o->precision == MN_PRECISION_F16)
    return mn_fail(MN_ERR_UNSUPPORTED,
                   "%s: data-parallel training in F16 (a loss scale every rank must agree on) is "
                   "not supported; use BF16 or F32",
                   fn);
  mn_status st = check_backend(fn, s);
  if (st != MN_OK) return st;
  if ((st = mn_group_join(o->group, o->rank, o->world_size, mn_dp_plan_hash(s->plan, o->zero1),
                          fn)) != MN_OK)
    return st;
  return mn_dp_new(s->plan, o->group, o->rank, o->zero1, MN_DP_BUCKET_BYTES, &s->dp);
}
