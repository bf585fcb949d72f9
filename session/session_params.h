/* What checkpoints and pretrained weights share: the parameters of a session as named
 * tensors, and messages built from other functions' failures and from lists of names. */
#ifndef MN_IO_SESSION_PARAMS_H
#define MN_IO_SESSION_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "session/session.h"

typedef struct mn_io_param {
  const char *name; /* owned by the session */
  const mn_tensor_type *type;
  size_t numel;
  uint32_t buffer;
  long slot;   /* plan parameter slot that has Adam moments (a gradient), else -1 */
  bool frozen; /* marked not trainable (mn_set_trainable) */
  /* Elements [offset, offset + numel) of the buffer's buffer_numel: a source of a derived
   * parameter (host/backend.h) is a range of it; any other parameter is all of its buffer. */
  size_t offset, buffer_numel;
} mn_io_param;

/* Every parameter of s as users name it, in node order (the order of the plan's slots), the
 * sources of a derived parameter in its place. Derived parameters themselves are never
 * listed: files hold the names the user gave. *out is malloc'd. */
mn_status mn_io_params(const char *fn, const mn_session *s, mn_io_param **out, size_t *n);

/* A parameter's values, and (Adam moment `which`, 0: m, 1: v) its optimizer state. */
mn_status mn_io_param_read(mn_session *s, const mn_io_param *p, float *dst);
mn_status mn_io_param_write(mn_session *s, const mn_io_param *p, const float *src);
mn_status mn_io_moment_read(mn_session *s, const mn_io_param *p, int which, float *dst);
mn_status mn_io_moment_write(mn_session *s, const mn_io_param *p, int which, const float *src);

/* Index into params of the parameter called name, or -1. Linear: sessions hold hundreds of
 * parameters and each load looks each name up once. */
long mn_io_param_index(const mn_io_param *params, size_t n, const char *name);

/* Largest numel among params (at least 1), for one staging buffer. */
size_t mn_io_params_max_numel(const mn_io_param *params, size_t n);

/* Records "fn: <the current last error>" with status st and returns st. */
mn_status mn_io_rewrap(mn_status st, const char *fn);

/* "[3,4] F32"-style comparison: does a file tensor's shape equal the parameter's? */
bool mn_io_same_shape(const mn_tensor_type *t, int rank, const int64_t *shape);
/* "[3,4]" into buf. */
const char *mn_io_shape_str(int rank, const int64_t *shape, char *buf, size_t size);

/* A bounded comma-separated list of names for messages: "a, b, c, ... (12 more)". */
typedef struct mn_io_name_list {
  char text[1400];
  size_t len, count, dropped;
} mn_io_name_list;
void mn_io_name_list_add(mn_io_name_list *l, const char *name);
/* NUL-terminated text of the list, with the "(N more)" tail when names were dropped. */
const char *mn_io_name_list_str(mn_io_name_list *l);

/* What a strict load refuses: with MN_LOAD_STRICT any parameter the file lacks (`missing`),
 * with MN_LOAD_STRICT_FROZEN the frozen ones among them; MN_ERR_NOT_FOUND listing them. */
mn_status mn_io_refuse_missing(const char *fn, const char *path, unsigned flags,
                               mn_io_name_list *missing, mn_io_name_list *missing_frozen);

/* A load's success message in mn_last_error(): the file's tensors the graph has no parameter
 * for (`skipped`) and the parameters the file lacks, which kept their values (`missing`); ""
 * when there are neither. Returns MN_OK. */
mn_status mn_io_load_report(const char *fn, const char *path, mn_io_name_list *skipped,
                            mn_io_name_list *missing);

#endif
