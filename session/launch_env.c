/* The launcher's environment (mn_launch_env_read) and sharing a group id through a file. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/collective.h"
#include "host/error.h"

static mn_status parse_int(const char *var, int lo, int *out) {
  const char *v = getenv(var);
  if (!v || !*v) return MN_ERR_NOT_FOUND;
  errno = 0;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > INT_MAX)
    return mn_fail(MN_ERR_INVALID_ARGUMENT,
                   "mn_launch_env_read: environment %s=\"%s\" is not a number >= %d", var, v, lo);
  *out = (int)x;
  return MN_OK;
}

typedef struct launcher {
  const char *name, *rank, *size, *local;
} launcher;

static const launcher launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

mn_status mn_launch_env_read(mn_launch_env *out) {
  const char *fn = "mn_launch_env_read";
  if (!out) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = (mn_launch_env){0};
  for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
    const launcher *l = &launchers[i];
    if (!getenv(l->rank) || !getenv(l->size)) continue;
    mn_status st = parse_int(l->rank, 0, &out->rank);
    if (st == MN_OK) st = parse_int(l->size, 1, &out->world_size);
    if (st != MN_OK) return st;
    st = parse_int(l->local, 0, &out->local_rank);
    if (st == MN_ERR_NOT_FOUND) out->local_rank = 0, st = MN_OK;
    if (st != MN_OK) return st;
    if (out->rank >= out->world_size)
      return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: %s=%d is outside [0, %s=%d)", fn, l->rank,
                     out->rank, l->size, out->world_size);
    out->launcher = l->name;
    const char *addr = getenv("MASTER_ADDR");
    if (addr) snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    st = parse_int("MASTER_PORT", 1, &out->master_port);
    if (st == MN_ERR_NOT_FOUND) st = MN_OK;
    if (st == MN_OK && out->master_port > 65535)
      st = mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: MASTER_PORT=%d is not a port", fn,
                   out->master_port);
    return st;
  }
  return mn_fail(MN_ERR_NOT_FOUND,
                 "%s: no launcher environment (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or "
                 "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)",
                 fn);
}

static mn_status write_id(const char *fn, const char *path, const mn_group_id *id) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (!tmp) return mn_fail(MN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  bool ok = f && fwrite(id->bytes, 1, sizeof id->bytes, f) == sizeof id->bytes;
  if (f) ok = fclose(f) == 0 && ok;
  ok = ok && rename(tmp, path) == 0;
  int err = errno;
  if (!ok) remove(tmp);
  free(tmp);
  if (ok) return MN_OK;
  return mn_fail(MN_ERR_IO, "%s: cannot write the group id to \"%s\": %s", fn, path, strerror(err));
}

/* True once the whole id was read (rank 0 renames the file into place only when complete). */
static bool read_id(const char *path, mn_group_id *id) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  bool ok = fread(id->bytes, 1, sizeof id->bytes, f) == sizeof id->bytes;
  fclose(f);
  return ok;
}

mn_status mn_group_id_share_file(const char *path, int rank, double timeout_s, mn_group_id *id) {
  const char *fn = "mn_group_id_share_file";
  if (!path || !id) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: path or id is NULL", fn);
  if (rank < 0) return mn_fail(MN_ERR_INVALID_ARGUMENT, "%s: rank = %d", fn, rank);
  if (rank == 0) return write_id(fn, path, id);
  double limit = timeout_s > 0 && isfinite(timeout_s) ? timeout_s : MN_GROUP_DEFAULT_TIMEOUT_S;
  struct timespec start, now, pause = {0, 20 * 1000 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    if (read_id(path, id)) return MN_OK;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double waited =
        (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9;
    if (waited >= limit)
      return mn_fail(MN_ERR_STATE, "%s: rank %d waited %g s for rank 0 to write \"%s\"", fn, rank,
                     limit, path);
    nanosleep(&pause, NULL);
  }
}
