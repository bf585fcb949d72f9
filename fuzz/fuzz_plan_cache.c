/* libFuzzer target for the plan-cache reader: the input is the content of a cache file for a
 * fixed small user graph. The reader must reject it or accept it without crashes, leaks or
 * undefined behavior. Each input is parsed twice: with the checksum (as mn_build_session_cached
 * reads) and without it, so that mutations get past the checksum to the structural checks. An
 * accepted plan is checked against the invariants the backends rely on and, when small,
 * instantiated on the CPU backend (create and destroy; running it is out of scope, because
 * without the checksum the file only has to be well-formed, not the lowering of the graph).
 *
 * Seeds (fuzz/corpus/plan_cache/) come from this file built with -DMN_FUZZ_WRITE_SEEDS and run
 * with a folder argument: the cache of the graph of fuzz/plan_cache_graph.h, and a few damaged
 * variants. scripts/fuzz.sh writes them afresh before every run, so that a change of the cache
 * format or key cannot leave the fuzzer on stale seeds that stop at the header; the checked-in
 * ones are checked by tests/test_fuzz_seeds.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/plan_cache_graph.h"
#include "io/plan_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) __builtin_trap();
}

/* What mn_plan_build and the backends take for granted of a plan read from a cache. */
static void check_plan(const mn_plan *p, const mn_graph *user) {
  const mn_graph *g = p->graph;
  check(g->num_nodes > 0 && g->num_outputs >= user->num_outputs);
  check(p->num_user_outputs == user->num_outputs);
  for (size_t i = 0; i < g->num_nodes; i++) {
    const mn_node_rec *n = &g->nodes[i];
    check((unsigned)n->op < MN_OP_COUNT && n->num_inputs >= 0 && n->num_inputs <= MN_MAX_INPUTS);
    for (int k = 0; k < n->num_inputs; k++)
      check(n->inputs[k] < i);
    check(p->node_buffer[i] < p->num_buffers);
    check(n->type.rank >= 0 && n->type.rank <= MN_MAX_RANK);
    check((n->op == MN_OP_CONSTANT) == (n->data != NULL));
  }
  for (size_t i = 0; i < p->num_buffers; i++)
    check(p->buffers[i].offset + p->buffers[i].bytes <= p->arena_bytes);
  for (size_t k = 0; k < p->num_params; k++) {
    check(g->nodes[p->params[k].param].op == MN_OP_PARAMETER);
    if (p->params[k].grad == MN_NO_NODE) continue;
    check(p->params[k].grad < g->num_nodes);
    check(mn_plan_buffer_of(p, p->params[k].grad)->bytes ==
          mn_plan_buffer_of(p, p->params[k].param)->bytes);
  }
  for (size_t k = 0; k < p->layout.num_sources; k++) {
    const mn_param_source *s = &p->layout.sources[k];
    check(s->node < g->num_nodes && mn_param_is_derived(&g->nodes[s->node]));
    size_t numel = (size_t)mn_tensor_type_numel(&g->nodes[s->node].type);
    check(s->offset <= numel && (size_t)mn_tensor_type_numel(&s->type) <= numel - s->offset);
    check(mn_graph_find_leaf(user, MN_OP_PARAMETER, s->name) != MN_NO_NODE);
  }
}

static mn_graph *fuzz_user;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fuzz_user) fuzz_user = mn_fuzz_plan_cache_graph(); /* kept for the whole run */
  mn_session_options o = mn_fuzz_plan_cache_options();
  for (unsigned flags = 0; flags <= MN_PLAN_CACHE_VERIFY_CHECKSUM; flags++) {
    mn_plan *plan = NULL;
    char why[256];
    mn_status st =
        mn_plan_cache_parse((const char *)data, size, fuzz_user, &o, flags, &plan, why, sizeof why);
    check((st == MN_OK) == (plan != NULL));
    check(st == MN_OK || st == MN_ERR_STATE || st == MN_ERR_FORMAT || st == MN_ERR_OUT_OF_MEMORY);
    check(st == MN_OK || why[0] != '\0');
    if (st != MN_OK) continue;
    check_plan(plan, fuzz_user);
    if (plan->arena_bytes > ((size_t)16 << 20)) {
      mn_plan_free(plan);
      continue;
    }
    mn_session *s = NULL;
    if (mn_session_create("fuzz", plan, &o, true, &s) == MN_OK) mn_session_free(s);
  }
  return 0;
}

#ifdef MN_FUZZ_WRITE_SEEDS
static void write_seed(const char *dir, const char *name, const char *text, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(text, 1, n, f) != n) exit(1);
  fclose(f);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  mn_graph *g = mn_fuzz_plan_cache_graph();
  mn_session_options o = mn_fuzz_plan_cache_options();
  mn_plan *plan = NULL;
  char *json = NULL;
  if (mn_lower_training("seeds", g, &o, &plan) != MN_OK ||
      mn_plan_cache_serialize(plan, g, &o, &json) != MN_OK)
    return 1;
  size_t n = strlen(json);
  write_seed(argv[1], "valid.json", json, n);
  write_seed(argv[1], "bad_truncated.json", json, n / 2);
  char *stale = strdup(json);
  strstr(stale, "\"key\":\"")[7] ^= 1;
  write_seed(argv[1], "bad_stale_key.json", stale, n);
  write_seed(argv[1], "bad_not_a_cache.json", "{\"format\":\"other\"}", 18);
  free(stale);
  free(json);
  mn_plan_free(plan);
  mn_graph_free(g);
  return 0;
}
#endif
