#include "optimizer/pass_switch.h"

#include <stdlib.h>
#include <string.h>

bool mn_optimize_pass_off(const char *pass) {
  const char *list = getenv("MN_OPTIMIZE_OFF");
  if (!list) return false;
  size_t len = strlen(pass);
  for (const char *p = list; (p = strstr(p, pass)) != NULL; p += len)
    if ((p == list || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return true;
  return false;
}
