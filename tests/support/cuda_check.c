#include "tests/support/cuda_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/graph.h"
#include "host/storage.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#ifdef MN_WITH_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/storage_layout.h"
#endif

void mn_test_require_cuda_build(void) {
#ifndef MN_WITH_CUDA
  cr_skip_test("built without the CUDA backend");
#endif
}

void mn_test_require_cuda_device(void) {
#ifdef MN_WITH_CUDA
  if (mn_cuda_usable_devices() > 0) return;
#endif
  cr_skip_test("no CUDA device");
}

#ifdef MN_WITH_CUDA
/* g lowered in `precision` and stored as the backend stores it (padded rows, 2-byte values), so
 * that the kernels of its program are the instances a session runs; asserts each stage. */
static mn_plan *stored_plan(const mn_graph *g, bool training, mn_precision precision) {
  mn_session_options o = mn_session_options_default();
  o.precision = precision;
  mn_plan *plan = NULL;
  mn_status st =
      training ? mn_lower_training("test", g, &o, &plan) : mn_lower_inference("test", g, &o, &plan);
  cr_assert_eq(st, MN_OK, "lowering failed: %s", mn_last_error());
  cr_assert_eq(mn_plan_set_precision(plan, precision), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_cu_size_plan(plan), MN_OK, "%s", mn_last_error());
  return plan;
}
#endif

void mn_test_assert_compiles_precision(const mn_graph *g, bool training, mn_precision precision) {
#ifdef MN_WITH_CUDA
  mn_plan *plan = stored_plan(g, training, precision);
  /* sm_90a is what an H100 or H200 runs (the wgmma attention kernels); sm_80 takes the mma.sync
   * kernels, as every card before Hopper and MN_CUDA_WGMMA=0 do. */
  static const char *const archs[] = {"sm_90a", "sm_80"};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    mn_cu_binary bin;
    mn_status st = mn_cuda_compile_plan(plan, archs[i], false, training, "", &bin);
    if (st != MN_OK) mn_plan_free(plan);
    cr_assert_eq(st, MN_OK, "%s kernels do not compile for %s: %s",
                 mn_test_precision_name(precision), archs[i], mn_last_error());
    cr_assert_gt(bin.size, 0u, "empty cubin");
    mn_cu_binary_free(&bin);
  }
  mn_plan_free(plan);
#else
  (void)g;
  (void)training;
  (void)precision;
  cr_skip_test("built without the CUDA backend");
#endif
}

char *mn_test_plan_source(const mn_graph *g, bool training, mn_precision precision) {
#ifdef MN_WITH_CUDA
  mn_plan *plan = stored_plan(g, training, precision);
  char *src = NULL;
  mn_status st = mn_cuda_plan_source(plan, false, training, &src);
  mn_plan_free(plan);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  cr_assert_not_null(src);
  return src;
#else
  (void)g, (void)training, (void)precision;
  return NULL;
#endif
}

const char *mn_test_precision_name(mn_precision p) {
  switch (p) {
  case MN_PRECISION_BF16: return "bf16";
  case MN_PRECISION_F16: return "f16";
  default: return "f32";
  }
}

void mn_test_assert_compiles(const mn_graph *g, bool training) {
  mn_test_assert_compiles_precision(g, training, MN_PRECISION_F32);
  mn_test_assert_compiles_precision(g, training, MN_PRECISION_BF16);
}

static const mn_test_range *range_of(const mn_test_range *ranges, const char *name) {
  for (size_t i = 0; ranges && ranges[i].name; i++)
    if (strcmp(ranges[i].name, name) == 0) return &ranges[i];
  return NULL;
}

static mn_session *build(const mn_graph *g, bool training, mn_backend backend, bool tf32,
                         mn_precision precision) {
  mn_session_options o = mn_session_options_default();
  o.backend = backend;
  o.allow_tf32 = tf32;
  o.precision = precision;
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, &o, &s) : mn_build_inference_session(g, &o, &s);
  cr_assert_eq(st, MN_OK, "building the %s session failed: %s",
               backend == MN_BACKEND_CPU ? "CPU" : "CUDA", mn_last_error());
  return s;
}

static const uint32_t *fixed_of(const mn_test_u32_values *fixed, const char *name) {
  for (size_t i = 0; fixed && fixed[i].name; i++)
    if (strcmp(fixed[i].name, name) == 0) return fixed[i].values;
  return NULL;
}

/* Which U32 leaf gets ignore labels, and how often. */
typedef struct ignoring {
  const char *labels;
  double fraction;
} ignoring;

/* Feeds every named input and parameter of g to both sessions. */
static void feed_both(const mn_graph *g, mn_session *cpu, mn_session *gpu,
                      const mn_test_range *ranges, const mn_test_u32_values *fixed, ignoring ign,
                      mn_rng *rng) {
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_INPUT && n->op != MN_OP_PARAMETER) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    const mn_test_range *r = range_of(ranges, n->name);
    if (n->type.dtype == MN_U32) {
      uint32_t *u = malloc(count * sizeof *u);
      uint32_t lo = r ? (uint32_t)r->lo : 0, hi = r ? (uint32_t)r->hi : 2;
      const uint32_t *exact = fixed_of(fixed, n->name);
      bool ignored = ign.labels && strcmp(ign.labels, n->name) == 0;
      for (size_t k = 0; k < count; k++) {
        u[k] = exact ? exact[k] : lo + (uint32_t)(mn_rng_uniform(rng) * (double)(hi - lo));
        if (ignored && mn_rng_uniform(rng) < ign.fraction) u[k] = MN_IGNORE_LABEL;
      }
      cr_assert_eq(mn_session_set_input_u32(cpu, n->name, u, count), MN_OK, "%s", mn_last_error());
      cr_assert_eq(mn_session_set_input_u32(gpu, n->name, u, count), MN_OK, "%s", mn_last_error());
      free(u);
      continue;
    }
    bool param = n->op == MN_OP_PARAMETER;
    float *f = malloc(count * sizeof *f);
    mn_rng_fill(rng, f, count, r ? (float)r->lo : (param ? -0.5f : -1.0f),
                r ? (float)r->hi : (param ? 0.5f : 1.0f));
    mn_status (*set)(mn_session *, const char *, const float *, size_t) =
        param ? mn_session_set_parameter : mn_session_set_input;
    cr_assert_eq(set(cpu, n->name, f, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(set(gpu, n->name, f, count), MN_OK, "%s", mn_last_error());
    free(f);
  }
}

static double compare(const char *what, const float *got, const float *want, size_t n, double tol,
                      mn_precision precision) {
  double err = mn_test_rel_err(got, want, n);
  size_t worst = 0;
  for (size_t k = 1; k < n; k++)
    if (!(fabsf(got[k] - want[k]) <= fabsf(got[worst] - want[worst]))) worst = k;
  cr_assert(err <= tol, "%s %s: relative error %.3g > %.3g (element %zu: cuda %.9g, cpu %.9g)",
            mn_test_precision_name(precision), what, err, tol, worst, n ? (double)got[worst] : 0.0,
            n ? (double)want[worst] : 0.0);
  return err;
}

static double compare_backends(const mn_graph *g, bool training, double tol,
                               const mn_test_range *ranges, const mn_test_u32_values *fixed,
                               uint64_t seed, bool tf32, mn_precision precision, ignoring ign) {
  mn_test_require_cuda_device();
  double worst = 0;
#ifdef MN_WITH_CUDA
  mn_session *cpu = build(g, training, MN_BACKEND_CPU, false, precision);
  mn_session *gpu = build(g, training, MN_BACKEND_CUDA, tf32, precision);
  mn_rng rng = mn_rng_new(seed);
  feed_both(g, cpu, gpu, ranges, fixed, ign, &rng);
  cr_assert_eq(mn_cuda_poison(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_step(cpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(cpu), MN_OK, "cpu: %s", mn_last_error());
  cr_assert_eq(mn_session_step(gpu), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(gpu), MN_OK, "cuda: %s", mn_last_error());
  for (size_t i = 0; i < mn_session_num_outputs(cpu); i++) {
    const mn_node_rec *n = &g->nodes[g->outputs[i]];
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    cr_assert_eq(mn_session_read_output_by_index(gpu, i, a, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_output_by_index(cpu, i, b, count), MN_OK, "%s", mn_last_error());
    char what[96];
    snprintf(what, sizeof what, "output %zu (%s)", i, mn_op_name(n->op));
    double e = compare(what, a, b, count, tol, precision);
    worst = e > worst ? e : worst;
    free(a);
    free(b);
  }
  for (size_t i = 0; training && i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    if (n->op != MN_OP_PARAMETER) continue;
    size_t count = (size_t)mn_tensor_type_numel(&n->type);
    float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
    cr_assert_eq(mn_session_read_grad(gpu, n->name, a, count), MN_OK, "%s", mn_last_error());
    cr_assert_eq(mn_session_read_grad(cpu, n->name, b, count), MN_OK, "%s", mn_last_error());
    char what[160];
    snprintf(what, sizeof what, "gradient of %s", n->name);
    double e = compare(what, a, b, count, tol, precision);
    worst = e > worst ? e : worst;
    free(a);
    free(b);
  }
  mn_session_free(cpu);
  mn_session_free(gpu);
#else
  (void)g, (void)training, (void)tol, (void)ranges, (void)fixed, (void)seed, (void)tf32,
      (void)precision, (void)ign, (void)build, (void)feed_both, (void)compare;
#endif
  return worst;
}

double mn_test_compare_cuda(const mn_graph *g, bool training, double tol,
                            const mn_test_range *ranges, uint64_t seed) {
  return compare_backends(g, training, tol, ranges, NULL, seed, false, MN_PRECISION_F32,
                          (ignoring){0});
}

double mn_test_compare_cuda_precision(const mn_graph *g, bool training, mn_precision precision,
                                      double tol, const mn_test_range *ranges, uint64_t seed) {
  return compare_backends(g, training, tol, ranges, NULL, seed, false, precision, (ignoring){0});
}

double mn_test_compare_cuda_fixed(const mn_graph *g, bool training, mn_precision precision,
                                  double tol, const mn_test_range *ranges,
                                  const mn_test_u32_values *fixed, uint64_t seed) {
  return compare_backends(g, training, tol, ranges, fixed, seed, false, precision, (ignoring){0});
}

double mn_test_compare_cuda_tf32(const mn_graph *g, bool training, double tol,
                                 const mn_test_range *ranges, uint64_t seed) {
  return compare_backends(g, training, tol, ranges, NULL, seed, true, MN_PRECISION_F32,
                          (ignoring){0});
}

double mn_test_compare_cuda_ignoring(const mn_graph *g, bool training, mn_precision precision,
                                     double tol, const mn_test_range *ranges, const char *labels,
                                     double ignored, uint64_t seed) {
  return compare_backends(g, training, tol, ranges, NULL, seed, false, precision,
                          (ignoring){labels, ignored});
}

bool mn_test_cuda_device_present(void) {
#ifdef MN_WITH_CUDA
  return mn_cuda_usable_devices() > 0;
#else
  return false;
#endif
}

static void check_cuda(const mn_graph *g, bool training, const mn_test_range *ranges, uint64_t seed,
                       double bf16_tol) {
  mn_test_assert_compiles(g, training);
  if (!mn_test_cuda_device_present()) return;
  mn_test_compare_cuda(g, training, 1e-5, ranges, seed);
  mn_test_compare_cuda_precision(g, training, MN_PRECISION_BF16, bf16_tol, ranges, seed);
}

void mn_test_check_cuda(const mn_graph *g, bool training, const mn_test_range *ranges,
                        uint64_t seed) {
  check_cuda(g, training, ranges, seed, MN_TEST_BF16_TOL);
}

void mn_test_check_cuda_model(const mn_graph *g, bool training, const mn_test_range *ranges,
                              uint64_t seed) {
  check_cuda(g, training, ranges, seed, MN_TEST_BF16_MODEL_TOL);
}

void mn_test_finish_training_graph(mn_graph *g, mn_node y) {
  mn_node_info info;
  cr_assert_eq(mn_graph_node(g, y, &info), MN_OK, "%s", mn_graph_error(g));
  const mn_tensor_type *t = &info.type;
  mn_node c = mn_input(g, "c", t->shape, t->rank);
  mn_node target = mn_input(g, "t", t->shape, t->rank);
  mn_node loss = mn_mse_loss(g, mn_mul(g, y, c), target);
  mn_set_outputs(g, (mn_node[]){loss, y}, 2);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
}

void mn_test_check_cuda_unary(mn_node (*f)(mn_graph *, mn_node), const int64_t *shape, int rank,
                              double lo, double hi, uint64_t seed) {
  mn_graph *g = mn_graph_new();
  mn_test_finish_training_graph(g, f(g, mn_parameter(g, "a", shape, rank)));
  const mn_test_range ranges[] = {{"a", lo, hi}, {NULL, 0, 0}};
  mn_test_check_cuda(g, true, ranges, seed);
  mn_graph_free(g);
}
