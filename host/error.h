/* The thread's last error message, shared by every public function that can fail. */
#ifndef MN_HOST_ERROR_H
#define MN_HOST_ERROR_H

#include <stdarg.h>

#include "meganeura.h"

/* Records the message for mn_last_error() and returns s, so that a failure path is
 * one statement: return mn_fail(MN_ERR_SHAPE, "mn_x: ..."). */
mn_status mn_fail(mn_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
mn_status mn_vfail(mn_status s, const char *fmt, va_list ap);
/* Sets the last error to exactly msg (no formatting). */
void mn_set_last_error(const char *msg);

#endif
