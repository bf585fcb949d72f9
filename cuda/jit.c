/* NVRTC with a disk cache of cubins. Cache files are written to a temporary name and
 * renamed into place, so processes sharing the folder never see a partial file; a file
 * whose header or checksum does not match is ignored and replaced. */
#include "cuda/jit.h"

#include <errno.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/error.h"

#define MN_CACHE_MAGIC "MNCUBIN1"

typedef struct hash128 {
  uint64_t a, b;
} hash128;

/* Two independent 64-bit FNV-1a style streams: collisions between different kernels
 * would silently run the wrong code, so 128 bits. */
static void hash_bytes(hash128 *h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h->a = (h->a ^ p[i]) * 0x100000001b3ULL;
    h->b = (h->b ^ p[i]) * 0x9e3779b97f4a7c15ULL + 0x7f4a7c159e3779b9ULL;
    h->b ^= h->b >> 29;
  }
}

static void hash_str(hash128 *h, const char *s) { hash_bytes(h, s, strlen(s) + 1); }

static uint64_t checksum(const void *data, size_t n) {
  hash128 h = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
  hash_bytes(&h, data, n);
  return h.a ^ h.b;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int mkdir_p(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

bool mn_cu_cache_folder(const char *cache_dir, char *out, size_t size) {
  if (cache_dir && !*cache_dir) return false;
  const char *env = getenv("MN_CACHE_DIR");
  const char *home = getenv("HOME");
  int n;
  if (cache_dir)
    n = snprintf(out, size, "%s", cache_dir);
  else if (env && *env)
    n = snprintf(out, size, "%s", env);
  else if (home && *home)
    n = snprintf(out, size, "%s/.cache/meganeura", home);
  else
    return false;
  return n > 0 && (size_t)n < size && mkdir_p(out) == 0;
}

static bool read_cached(const char *path, mn_cu_binary *out) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char magic[8];
  uint64_t size = 0, sum = 0;
  bool ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, MN_CACHE_MAGIC, 8) == 0 &&
            fread(&size, sizeof size, 1, f) == 1 && fread(&sum, sizeof sum, 1, f) == 1 &&
            size > 0 && size < ((uint64_t)1 << 32);
  void *data = ok ? malloc((size_t)size) : NULL;
  ok = data && fread(data, 1, (size_t)size, f) == size && fgetc(f) == EOF &&
       checksum(data, (size_t)size) == sum;
  fclose(f);
  if (!ok) {
    free(data);
    return false;
  }
  out->data = data;
  out->size = (size_t)size;
  return true;
}

/* Best effort: a cache that cannot be written only costs a compile next time. */
static void write_cached(const char *path, const mn_cu_binary *b) {
  static unsigned counter;
  char tmp[4400];
  int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                   __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  if (n < 0 || (size_t)n >= sizeof tmp) return;
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  uint64_t size = b->size, sum = checksum(b->data, b->size);
  bool ok = fwrite(MN_CACHE_MAGIC, 1, 8, f) == 8 && fwrite(&size, sizeof size, 1, f) == 1 &&
            fwrite(&sum, sizeof sum, 1, f) == 1 && fwrite(b->data, 1, b->size, f) == b->size;
  ok = (fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) remove(tmp);
}

static mn_status nvrtc_fail(nvrtcResult r, const char *what) {
  return mn_fail(MN_ERR_DEVICE, "cuda backend: %s failed: %s", what, nvrtcGetErrorString(r));
}

static mn_status run_nvrtc(const char *source, const char *const *opts, int nopts, const char *arch,
                           mn_cu_binary *out) {
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, source, "meganeura_kernels.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) return nvrtc_fail(r, "nvrtcCreateProgram");
  mn_status st = MN_OK;
  r = nvrtcCompileProgram(prog, nopts, opts);
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS)
      log[log_size] = '\0';
    else if (log)
      log[0] = '\0';
    st =
        mn_fail(MN_ERR_DEVICE, "cuda backend: NVRTC could not compile the kernels for %s (%s):\n%s",
                arch, nvrtcGetErrorString(r), log ? log : "(no log: out of memory)");
    free(log);
  } else if ((r = nvrtcGetCUBINSize(prog, &out->size)) != NVRTC_SUCCESS) {
    st = nvrtc_fail(r, "nvrtcGetCUBINSize");
  } else if (!(out->data = malloc(out->size ? out->size : 1))) {
    st = mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: no memory for a %zu-byte cubin", out->size);
  } else if ((r = nvrtcGetCUBIN(prog, out->data)) != NVRTC_SUCCESS) {
    st = nvrtc_fail(r, "nvrtcGetCUBIN");
  }
  nvrtcDestroyProgram(&prog);
  return st;
}

mn_status mn_cu_compile(const char *source, const char *arch, const char *cache_dir,
                        mn_cu_binary *out) {
  memset(out, 0, sizeof *out);
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  /* Exact IEEE division and square root: results are compared with the reference
   * backend at 1e-5, which fast-math approximations would not meet. */
  const char *opts[] = {arch_opt, "-std=c++17", "-lineinfo", "--fmad=true"};
  const int nopts = (int)(sizeof opts / sizeof opts[0]);

  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  hash128 h = {0xcbf29ce484222325ULL, 0x6c62272e07bb0142ULL};
  hash_str(&h, source);
  for (int i = 0; i < nopts; i++)
    hash_str(&h, opts[i]);
  hash_bytes(&h, &major, sizeof major);
  hash_bytes(&h, &minor, sizeof minor);
  hash_str(&h, arch);
  snprintf(out->key, sizeof out->key, "%016llx%016llx", (unsigned long long)h.a,
           (unsigned long long)h.b);

  char folder[4096], path[4200];
  bool cached = mn_cu_cache_folder(cache_dir, folder, sizeof folder);
  if (cached) {
    snprintf(path, sizeof path, "%s/kernels-%s-%s.cubin", folder, arch, out->key);
    if (read_cached(path, out)) {
      out->from_cache = true;
      return MN_OK;
    }
  }
  double t0 = now_ms();
  mn_status st = run_nvrtc(source, opts, nopts, arch, out);
  out->compile_ms = now_ms() - t0;
  if (st != MN_OK) {
    mn_cu_binary_free(out);
    return st;
  }
  if (cached) write_cached(path, out);
  return MN_OK;
}

void mn_cu_binary_free(mn_cu_binary *b) {
  free(b->data);
  b->data = NULL;
  b->size = 0;
}
