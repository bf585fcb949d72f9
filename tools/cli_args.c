/* Option parsing and validation for the meganeura command. */
#include "tools/cli.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int cli_parse(const char *cmd, int argc, char **argv, cli_opt *opts, size_t n, const char *usage) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return CLI_HELP;
    }
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", cmd, a, cmd);
      return CLI_USAGE;
    }
    /* --name=value is accepted too */
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    cli_opt *o = NULL;
    for (size_t j = 0; j < n; j++)
      if (strlen(opts[j].name) == len && strncmp(opts[j].name, a, len) == 0) o = &opts[j];
    if (!o) {
      fprintf(stderr, "%s: unknown option '%.*s' (see %s --help)\n", cmd, (int)len, a, cmd);
      return CLI_USAGE;
    }
    if (!o->takes_value) {
      if (eq) {
        fprintf(stderr, "%s: %s takes no value\n", cmd, o->name);
        return CLI_USAGE;
      }
      o->seen = 1;
      continue;
    }
    if (eq) {
      o->value = eq + 1;
    } else {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", cmd, o->name);
        return CLI_USAGE;
      }
      o->value = argv[++i];
    }
    o->seen = 1;
  }
  return CLI_OK;
}

int cli_require(const char *cmd, const cli_opt *o) {
  if (o->seen) return CLI_OK;
  fprintf(stderr, "%s: %s is required (see %s --help)\n", cmd, o->name, cmd);
  return CLI_USAGE;
}

static int parse_long(const char *s, long *out) {
  if (!s || !*s) return 0;
  errno = 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (errno || *end) return 0;
  *out = v;
  return 1;
}

static int parse_float(const char *s, float *out) {
  if (!s || !*s) return 0;
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return 0;
  *out = (float)v;
  return 1;
}

int cli_pos_long(const char *cmd, const cli_opt *o, long *out) {
  if (!o->seen) return CLI_OK;
  long v = 0;
  if (!parse_long(o->value, &v) || v < 1 || v > 1000000000L) {
    fprintf(stderr, "%s: %s must be a positive integer, got '%s'\n", cmd, o->name, o->value);
    return CLI_USAGE;
  }
  *out = v;
  return CLI_OK;
}

int cli_nonneg_long(const char *cmd, const cli_opt *o, long *out) {
  if (!o->seen) return CLI_OK;
  long v = 0;
  if (!parse_long(o->value, &v) || v < 0) {
    fprintf(stderr, "%s: %s must be a non-negative integer, got '%s'\n", cmd, o->name, o->value);
    return CLI_USAGE;
  }
  *out = v;
  return CLI_OK;
}

int cli_pos_float(const char *cmd, const cli_opt *o, float *out) {
  if (!o->seen) return CLI_OK;
  float v = 0;
  if (!parse_float(o->value, &v) || !(v > 0)) {
    fprintf(stderr, "%s: %s must be a positive number, got '%s'\n", cmd, o->name, o->value);
    return CLI_USAGE;
  }
  *out = v;
  return CLI_OK;
}

int cli_nonneg_float(const char *cmd, const cli_opt *o, float *out) {
  if (!o->seen) return CLI_OK;
  float v = 0;
  if (!parse_float(o->value, &v) || v < 0) {
    fprintf(stderr, "%s: %s must be a non-negative number, got '%s'\n", cmd, o->name, o->value);
    return CLI_USAGE;
  }
  *out = v;
  return CLI_OK;
}

int cli_lib_fail(const char *cmd, const char *what) {
  const char *e = mn_last_error();
  fprintf(stderr, "%s: %s: %s\n", cmd, what, e && *e ? e : "failed");
  return CLI_FAIL;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_mkdir_p(const char *path) {
  char buf[4096];
  size_t len = strlen(path);
  if (len == 0 || len >= sizeof buf) return -1;
  memcpy(buf, path, len + 1);
  for (size_t i = 1; i <= len; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    buf[i] = c;
  }
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

uint64_t cli_rand(uint64_t *state) {
  uint64_t x = *state ? *state : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

double cli_rand_unit(uint64_t *state) { return (double)(cli_rand(state) >> 11) * 0x1.0p-53; }

/* session.c's choice of backend, made here before the session exists: an explicit backend in
 * the options wins, then MN_BACKEND=cpu|cuda|auto, then CUDA when a device is usable. */
static bool uses_cuda(const mn_session_options *o) {
#ifdef MN_WITH_CUDA
  mn_backend want = o->backend;
  const char *env = getenv("MN_BACKEND");
  if (want == MN_BACKEND_AUTO && env && strcmp(env, "cpu") == 0) want = MN_BACKEND_CPU;
  return want != MN_BACKEND_CPU && mn_cuda_usable_devices() > 0;
#else
  (void)o;
  return false;
#endif
}

int cli_compute_capability(int device) {
#ifdef MN_WITH_CUDA
  return mn_cuda_compute_capability(device);
#else
  (void)device;
  return 0;
#endif
}

const char *cli_default_precision(const mn_session_options *o) {
  return uses_cuda(o) && cli_compute_capability(o->device) >= 80 ? "bf16" : "f32";
}

int cli_precision(const char *cmd, const cli_opt *o, mn_session_options *out, const char **name) {
  static const struct {
    const char *name;
    mn_precision precision;
    bool tf32;
  } names[] = {{"f32", MN_PRECISION_F32, false},
               {"tf32", MN_PRECISION_F32, true},
               {"bf16", MN_PRECISION_BF16, false},
               {"f16", MN_PRECISION_F16, false}};
  const char *want = o->seen ? o->value : cli_default_precision(out);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(want, names[i].name) == 0) {
      out->precision = names[i].precision;
      out->allow_tf32 = names[i].tf32;
      if (name) *name = names[i].name;
      return CLI_OK;
    }
  fprintf(stderr, "%s: %s must be f32, tf32, bf16 or f16, got '%s'\n", cmd, o->name, want);
  return CLI_USAGE;
}
