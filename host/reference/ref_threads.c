/* The CPU products' threads (ref_math.c, ref_quant.c): how many, and running a product's parts
 * on them. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "host/reference/ref_shared.h"

size_t mn_ref_threads(double work, size_t items) {
  if (work < 1 << 18 || items < 2) return 1;
  const char *env = getenv("MN_CPU_THREADS");
  long t = env && *env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  if (t < 1) t = 1;
  if (t > MN_REF_MAX_THREADS) t = MN_REF_MAX_THREADS;
  return (size_t)t < items ? (size_t)t : items;
}

typedef struct job {
  void (*run)(const void *part);
  const void *part;
} job;

static void *run_job(void *arg) {
  const job *j = arg;
  j->run(j->part);
  return NULL;
}

void mn_ref_run_parts(void (*run)(const void *part), const void *parts, size_t part_size,
                      size_t threads) {
  job jobs[MN_REF_MAX_THREADS];
  pthread_t ids[MN_REF_MAX_THREADS];
  bool started[MN_REF_MAX_THREADS] = {false};
  if (threads > MN_REF_MAX_THREADS) threads = MN_REF_MAX_THREADS;
  for (size_t t = 1; t < threads; t++)
    jobs[t] = (job){run, (const char *)parts + t * part_size};
  /* A thread that cannot start leaves its part to this one. */
  for (size_t t = 1; t < threads; t++)
    started[t] = pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
  if (threads > 0) run(parts);
  for (size_t t = 1; t < threads; t++) {
    if (started[t])
      pthread_join(ids[t], NULL);
    else
      run(jobs[t].part);
  }
}
