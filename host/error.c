#include "host/error.h"

#include <stdio.h>
#include <string.h>

#define MN_LAST_ERROR_CAP 2048

static _Thread_local char last_error[MN_LAST_ERROR_CAP];

const char *mn_last_error(void) { return last_error; }

void mn_set_last_error(const char *msg) {
  snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
}

mn_status mn_vfail(mn_status s, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  return s;
}

mn_status mn_fail(mn_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mn_vfail(s, fmt, ap);
  va_end(ap);
  return s;
}

const char *mn_status_string(mn_status s) {
  switch (s) {
  case MN_OK: return "ok";
  case MN_ERR_INVALID_ARGUMENT: return "invalid argument";
  case MN_ERR_SHAPE: return "shape mismatch";
  case MN_ERR_NOT_FOUND: return "not found";
  case MN_ERR_IO: return "i/o error";
  case MN_ERR_FORMAT: return "bad file format";
  case MN_ERR_UNSUPPORTED: return "unsupported";
  case MN_ERR_OUT_OF_MEMORY: return "out of memory";
  case MN_ERR_DEVICE: return "device error";
  case MN_ERR_STATE: return "invalid state";
  }
  return "unknown status";
}

const char *mn_version(void) { return MN_VERSION_STRING; }
