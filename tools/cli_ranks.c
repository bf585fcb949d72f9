/* meganeura train's data-parallel ranks, each running cli_train_rank: --ranks N (threads of
 * this process on the CPU backend), --gpus N (N processes, one per CUDA device) and one rank
 * of a job that a launcher (torchrun, srun, mpirun) started.
 *
 * --gpus runs its ranks as fresh processes of this program (fork, then exec) under the same
 * environment a launcher gives (RANK, WORLD_SIZE, LOCAL_RANK and --group-id-file), so that
 * one code path serves both: a child of a plain fork could not use CUDA, which this process
 * has initialized to count the devices, and NCCL's state would be half copied. */
#include "tools/cli_train.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *const CMD = "meganeura train";

/* ---- --ranks: ranks 1.. on threads of their own, each with its own data and session, while
 * rank 0 goes on in the caller. A rank that fails aborts the group, so that the others stop
 * at once instead of waiting for it. */

typedef struct rank_thread {
  pthread_t thread;
  train_args a;
  const resume_point *rp;
  const mn_model_config *cfg;
  int rc;
} rank_thread;

static void *rank_main(void *arg) {
  rank_thread *t = arg;
  t->rc = cli_train_rank(&t->a, t->rp, t->cfg);
  if (t->rc) mn_group_abort(t->a.options.group, "a rank of meganeura train --ranks failed");
  return NULL;
}

int cli_train_threads(train_args *a, const resume_point *rp, const mn_model_config *cfg) {
  mn_group *group = NULL;
  if (mn_group_new_local((int)a->ranks, 0, &group) != MN_OK)
    return cli_lib_fail(CMD, "cannot create the group of --ranks");
  a->options.group = group;
  a->options.world_size = (int)a->ranks;
  rank_thread *t = calloc((size_t)a->ranks, sizeof *t);
  if (!t) {
    mn_group_free(group);
    return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  }
  long started = 1;
  int rc = CLI_OK;
  for (; started < a->ranks; started++) {
    rank_thread *r = &t[started];
    r->a = *a;
    r->a.rank = (int)started;
    r->a.options.rank = (int)started;
    r->rp = rp;
    r->cfg = cfg;
    if (pthread_create(&r->thread, NULL, rank_main, r) != 0) {
      fprintf(stderr, "%s: cannot start rank %ld's thread\n", CMD, started);
      rc = CLI_FAIL;
      break;
    }
  }
  if (!rc) rc = cli_train_rank(a, rp, cfg);
  if (rc) mn_group_abort(group, "rank 0 of meganeura train --ranks failed");
  for (long i = 1; i < started; i++) {
    pthread_join(t[i].thread, NULL);
    if (!rc) rc = t[i].rc;
  }
  free(t);
  mn_group_free(group);
  a->options.group = NULL;
  return rc;
}

/* ---- a job started by a launcher */

static bool is(const char *s, const char *name) { return s && strcmp(s, name) == 0; }

/* The port of the group id: MN_GROUP_PORT, else MASTER_PORT + 1 (torchrun's own store
 * listens on MASTER_PORT). */
static int group_port(const mn_launch_env *env) {
  const char *v = getenv("MN_GROUP_PORT");
  if (v && *v) {
    char *end = NULL;
    errno = 0;
    long p = strtol(v, &end, 10);
    if (errno || *end || p < 1 || p > 65535) {
      fprintf(stderr, "%s: MN_GROUP_PORT=\"%s\" is not a port (1..65535)\n", CMD, v);
      return 0;
    }
    return (int)p;
  }
  if (env->master_port < 1 || env->master_port >= 65535) {
    fprintf(stderr,
            "%s: in a job of %s the group id goes through MASTER_ADDR and port MASTER_PORT + 1, "
            "but MASTER_PORT is %s; set MN_GROUP_PORT or give --group-id-file PATH\n",
            CMD, env->launcher, env->master_port ? "65535" : "not set");
    return 0;
  }
  return env->master_port + 1;
}

int cli_launch_args(train_args *a, const char *launcher, bool ranks_given) {
  if (launcher && !is(launcher, "auto") && !is(launcher, "env") && !is(launcher, "none")) {
    fprintf(stderr, "%s: --launcher must be auto, env or none, got '%s'\n", CMD, launcher);
    return CLI_USAGE;
  }
  mn_launch_env env;
  mn_status st = is(launcher, "none") ? MN_ERR_NOT_FOUND : mn_launch_env_read(&env);
  if (st == MN_ERR_INVALID_ARGUMENT || (st != MN_OK && is(launcher, "env"))) {
    fprintf(stderr, "%s: %s%s\n", CMD, is(launcher, "env") ? "--launcher env: " : "",
            mn_last_error());
    return CLI_USAGE;
  }
  /* A world of one is a plain run unless --launcher env asks for a group of one. */
  a->launched = st == MN_OK && (env.world_size > 1 || is(launcher, "env"));
  if (!a->launched) {
    if (!a->group_id_file) return CLI_OK;
    fprintf(stderr,
            "%s: --group-id-file applies to a job started by a launcher (RANK and WORLD_SIZE, "
            "or srun's or mpirun's variables, set) only\n",
            CMD);
    return CLI_USAGE;
  }
  if (ranks_given || a->gpus) {
    fprintf(stderr,
            "%s: %s cannot be used in a job started by %s (rank %d of %d): each process of the "
            "job is one rank (--launcher none trains alone)\n",
            CMD, ranks_given ? "--ranks" : "--gpus", env.launcher, env.rank, env.world_size);
    return CLI_USAGE;
  }
  a->env = env;
  a->rank = env.rank;
  a->ranks = env.world_size;
  a->options.backend = MN_BACKEND_CUDA;
  a->options.device = env.local_rank;
  if (a->group_id_file) return CLI_OK;
  if (!*env.master_addr) {
    fprintf(stderr,
            "%s: in a job of %s the group id goes through MASTER_ADDR, which is not set; set it "
            "(and MASTER_PORT) or give --group-id-file PATH on a file system every rank sees\n",
            CMD, env.launcher);
    return CLI_USAGE;
  }
  a->group_port = group_port(&env);
  return a->group_port ? CLI_OK : CLI_USAGE;
}

static int rank_fail(const train_args *a, const char *what) {
  char buf[128];
  snprintf(buf, sizeof buf, "rank %d: %s", a->rank, what);
  return cli_lib_fail(CMD, buf);
}

/* The usable CUDA devices; -1 when this build has no CUDA backend. */
static int cuda_devices(void) {
#ifdef MN_WITH_CUDA
  return mn_cuda_usable_devices();
#else
  return -1;
#endif
}

int cli_train_launched(train_args *a, const resume_point *rp, const mn_model_config *cfg) {
  int devices = cuda_devices();
  if (devices < 0) {
    fprintf(stderr,
            "%s: rank %d of a job of %s needs the CUDA backend, which this build of meganeura "
            "lacks (--launcher none trains alone)\n",
            CMD, a->rank, a->env.launcher);
    return CLI_FAIL;
  }
  /* srun --gpus-per-task (or CUDA_VISIBLE_DEVICES set per rank) shows each rank its one
   * device. */
  if (devices == 1) a->options.device = 0;
  if (a->options.device >= devices) {
    fprintf(stderr, "%s: rank %d has local rank %d, but this machine has %d usable CUDA device%s\n",
            CMD, a->rank, a->options.device, devices, devices == 1 ? "" : "s");
    return CLI_FAIL;
  }
  if (a->rank == 0) {
    char how[300];
    if (a->group_id_file)
      snprintf(how, sizeof how, "the file %s", a->group_id_file);
    else
      snprintf(how, sizeof how, "TCP port %d (MASTER_ADDR %s)", a->group_port, a->env.master_addr);
    fprintf(stderr, "%s: rank 0 of %ld on device %d, the group id through %s\n", CMD, a->ranks,
            a->options.device, how);
  }
  mn_group_id id = {{0}};
  if (a->rank == 0 && mn_group_id_new(&id) != MN_OK)
    return rank_fail(a, "cannot make the group id");
  mn_status st = a->group_id_file ? mn_group_id_share_file(a->group_id_file, a->rank, 0, &id)
                                  : mn_group_id_share_tcp(a->env.master_addr, a->group_port,
                                                          a->rank, (int)a->ranks, 0, &id);
  if (st != MN_OK) return rank_fail(a, "cannot share the group id");
  mn_group *group = NULL;
  if (mn_group_new_nccl(&id, (int)a->ranks, a->rank, a->options.device, 0, &group) != MN_OK)
    return rank_fail(a, "cannot join the NCCL group");
  a->options.group = group;
  a->options.rank = a->rank;
  a->options.world_size = (int)a->ranks;
  int rc = cli_train_rank(a, rp, cfg);
  /* The others then fail at once rather than at the timeout; an aborted communicator is also
   * the one that frees without waiting for them. */
  if (rc) mn_group_abort(group, "a rank of meganeura train failed");
  a->options.group = NULL;
  mn_group_free(group);
  return rc;
}

/* ---- --gpus N: one process per device */

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

/* The children's environment: ours without a launcher's rank variables, plus rank's. */
static char **child_environment(long rank, long world, char *storage, size_t cap) {
  static const char *const dropped[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE="};
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 5, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool drop = false;
    for (size_t d = 0; d < sizeof dropped / sizeof dropped[0]; d++)
      drop = drop || strncmp(environ[i], dropped[d], strlen(dropped[d])) == 0;
    if (!drop) env[k++] = environ[i];
  }
  int used =
      snprintf(storage, cap, "RANK=%ld%cWORLD_SIZE=%ld%cLOCAL_RANK=%ld%cLOCAL_WORLD_SIZE=%ld", rank,
               '\0', world, '\0', rank, '\0', world);
  for (char *p = storage; p < storage + used; p += strlen(p) + 1)
    env[k++] = p;
  env[k] = NULL;
  return env;
}

/* Our arguments without --gpus and --launcher, with --group-id-file FILE. */
static char **child_arguments(const char *exe, int argc, char **argv, const char *id_file) {
  char **out = calloc((size_t)argc + 4, sizeof *out);
  if (!out) return NULL;
  int k = 0;
  out[k++] = (char *)exe;
  out[k++] = "train";
  for (int i = 1; i < argc; i++) {
    bool gpus = strcmp(argv[i], "--gpus") == 0, launcher = strcmp(argv[i], "--launcher") == 0;
    if (gpus || launcher) {
      i++;
      continue;
    }
    if (strncmp(argv[i], "--gpus=", 7) == 0 || strncmp(argv[i], "--launcher=", 11) == 0) continue;
    out[k++] = argv[i];
  }
  out[k++] = "--group-id-file";
  out[k++] = (char *)id_file;
  out[k] = NULL;
  return out;
}

static void describe(int status, char *buf, size_t n) {
  if (WIFSIGNALED(status))
    snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
}

static void signal_all(const pid_t *pid, long n, int sig) {
  for (long r = 0; r < n; r++)
    if (pid[r] > 0) kill(pid[r], sig);
}

/* Waits for every child; the first that fails (or a signal to us) stops the others: SIGTERM,
 * then SIGKILL for one still there 10 s later. The exit code is the first failure's. */
static int wait_ranks(pid_t *pid, long n) {
  int rc = CLI_OK;
  long alive = n;
  double kill_at = 0;
  struct timespec tick = {0, 20 * 1000 * 1000};
  while (alive > 0) {
    for (long r = 0; r < n; r++) {
      int status = 0;
      if (pid[r] <= 0 || waitpid(pid[r], &status, WNOHANG) != pid[r]) continue;
      pid_t done = pid[r];
      pid[r] = 0;
      alive--;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || rc || kill_at) continue;
      char what[160];
      describe(status, what, sizeof what);
      fprintf(stderr, "%s: rank %ld (pid %ld) %s; stopping the other ranks\n", CMD, r, (long)done,
              what);
      rc = WIFEXITED(status) ? WEXITSTATUS(status) : CLI_FAIL;
    }
    if ((rc || stop_signal) && !kill_at) {
      if (stop_signal && !rc) {
        fprintf(stderr, "%s: stopping the ranks on signal %d\n", CMD, (int)stop_signal);
        rc = CLI_FAIL;
      }
      signal_all(pid, n, SIGTERM);
      kill_at = cli_now() + 10;
    }
    if (kill_at && cli_now() > kill_at) signal_all(pid, n, SIGKILL);
    if (alive > 0) nanosleep(&tick, NULL);
  }
  return rc;
}

static int spawn_ranks(const train_args *a, int argc, char **argv, const char *exe,
                       const char *id_file) {
  pid_t *pid = calloc((size_t)a->gpus, sizeof *pid);
  char **args = child_arguments(exe, argc, argv, id_file);
  if (!pid || !args) {
    free(pid);
    free(args);
    return fprintf(stderr, "%s: out of memory\n", CMD), CLI_FAIL;
  }
  struct sigaction act = {.sa_handler = on_stop}, old_int, old_term;
  sigemptyset(&act.sa_mask);
  sigaction(SIGINT, &act, &old_int);
  sigaction(SIGTERM, &act, &old_term);
  int rc = CLI_OK;
  for (long r = 0; r < a->gpus && !rc; r++) {
    char storage[160];
    char **env = child_environment(r, a->gpus, storage, sizeof storage);
    pid[r] = env ? fork() : -1;
    if (pid[r] == 0) {
      execve(exe, args, env);
      static const char msg[] = "meganeura train: a rank cannot start this program\n";
      ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
      (void)ignored;
      _exit(CLI_FAIL);
    }
    free(env);
    if (pid[r] < 0) {
      fprintf(stderr, "%s: cannot start rank %ld: %s\n", CMD, r, strerror(errno));
      rc = CLI_FAIL;
      signal_all(pid, r, SIGTERM);
      pid[r] = 0;
    }
  }
  int waited = wait_ranks(pid, a->gpus);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  free(pid);
  free(args);
  return rc ? rc : waited;
}

int cli_train_gpus(train_args *a, const resume_point *rp, const mn_model_config *cfg, int argc,
                   char **argv) {
  int devices = cuda_devices();
  if (devices < 0) {
    fprintf(stderr, "%s: --gpus %ld needs the CUDA backend, which this build of meganeura lacks\n",
            CMD, a->gpus);
    return CLI_FAIL;
  }
  if (devices < a->gpus) {
    fprintf(stderr, "%s: --gpus %ld needs %ld usable CUDA device%s, this machine has %d\n", CMD,
            a->gpus, a->gpus, a->gpus == 1 ? "" : "s", devices);
    return CLI_FAIL;
  }
  if (a->gpus == 1) {
    a->options.backend = MN_BACKEND_CUDA;
    a->options.device = 0;
    return cli_train_rank(a, rp, cfg);
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    fprintf(stderr, "%s: --gpus cannot find this program (/proc/self/exe): %s\n", CMD,
            strerror(errno));
    return CLI_FAIL;
  }
  exe[len] = '\0';
  /* Rank 0 writes the id here; an old one would be read as this job's. */
  char id_file[4200];
  snprintf(id_file, sizeof id_file, "%s/.group-id", a->out);
  if (unlink(id_file) != 0 && errno != ENOENT) {
    fprintf(stderr, "%s: cannot remove the old group id '%s': %s\n", CMD, id_file, strerror(errno));
    return CLI_FAIL;
  }
  fprintf(stderr, "%s: %ld ranks, one process per CUDA device\n", CMD, a->gpus);
  int rc = spawn_ranks(a, argc, argv, exe, id_file);
  unlink(id_file);
  return rc;
}
