/* Sibling matmuls (optimizer/siblings.h): q/k/v and gate/up products of one x concatenated
 * into a derived weight. Sessions with the concatenation train like sessions without it; users
 * see only the source names (set_parameter, read_param, read_grad, checkpoints, safetensors,
 * the plan cache); and the pass leaves alone what the rules exclude and what the cost model
 * prices higher.
 *
 * Why some comparisons are bitwise: the reference matmul accumulates each output element
 * over K in double and rounds once, independently of the other columns, so Y = x P^T holds
 * exactly the separate products' columns, and slice_last copies them. Backward, dY is each
 * dY_i placed by slice_last_grad into zeros and summed (x + 0 is exact), so dP's rows are the
 * separate dW_i bit for bit. Only dx differs: one sum over all of P's rows against the
 * separate products' dx_i rounded and then added. So at the first step the loss and the
 * gradients that do not flow through a grouped x's dx (the MLP's weights: nothing after the
 * MLP's x is grouped) agree bitwise; the others (the attention block's and the norms', whose
 * gradients pass through the MLP's dx) and everything after the first update agree to
 * rounding. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "io/plan_cache.h"
#include "io/safetensors.h"
#include "optimizer/cost.h"
#include "optimizer/siblings.h"
#include "session/session.h"
#include "tests/support/mn_test.h"
#include "tests/support/session_util.h"
#include "tests/support/tmp_dir.h"

#define TOL 1e-5

TestSuite(siblings);

/* ---------------------------------------------------------------- a Llama block */

typedef struct dims {
  int64_t t, d, kv, ff; /* 4 heads of d / 4 */
} dims;

static const dims small = {.t = 4, .d = 16, .kv = 8, .ff = 24};

static const char *const param_names[] = {
    "norm1.weight",         "attn.q_proj.weight", "attn.k_proj.weight",
    "attn.v_proj.weight",   "attn.o_proj.weight", "norm2.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
#define NUM_PARAMS (sizeof param_names / sizeof param_names[0])

/* Pre-norm attention (q, k, v from one x) and a SwiGLU MLP (gate, up from one x); a leading
 * batch dim when batch > 0. */
static mn_graph *llama_block(dims c, int64_t batch) {
  mn_graph *g = mn_graph_new();
  int64_t hd = c.d / 4, shape[3] = {batch, c.t, c.d};
  int rank = batch ? 3 : 2;
  const int64_t *s = batch ? shape : shape + 1;
  mn_node x = mn_input(g, "x", s, rank), y = mn_input(g, "y", s, rank);
  mn_node p[NUM_PARAMS];
  int64_t rows[NUM_PARAMS] = {0, c.d, c.kv, c.kv, c.d, 0, c.ff, c.ff, c.d};
  for (size_t i = 0; i < NUM_PARAMS; i++)
    p[i] = rows[i] ? mn_parameter(g, param_names[i], MN_SHAPE(rows[i], i == 8 ? c.ff : c.d))
                   : mn_parameter(g, param_names[i], MN_SHAPE(c.d));
  mn_node a = mn_rms_norm(g, x, p[0], 1e-5f);
  mn_node q = mn_rope(g, mn_matmul_bt(g, a, p[1]), 10000.0f, (int)hd);
  mn_node k = mn_rope(g, mn_matmul_bt(g, a, p[2]), 10000.0f, (int)hd);
  mn_node v = mn_matmul_bt(g, a, p[3]);
  mn_node att = mn_causal_attention(g, q, k, v, 4, (int)(c.kv / hd), (int)hd);
  mn_node h = mn_add(g, x, mn_matmul_bt(g, att, p[4]));
  mn_node m = mn_rms_norm(g, h, p[5], 1e-5f);
  mn_node f = mn_swiglu(g, mn_matmul_bt(g, m, p[6]), mn_matmul_bt(g, m, p[7]));
  mn_node loss = mn_mse_loss(g, mn_add(g, h, mn_matmul_bt(g, f, p[8])), y);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  return g;
}

static mn_session_options cpu(mn_siblings_mode mode) {
  mn_session_options o = mn_session_options_default();
  o.backend = MN_BACKEND_CPU;
  o.siblings = mode;
  return o;
}

static mn_session *build_with(const mn_graph *g, const mn_session_options *o, bool training) {
  mn_session *s = NULL;
  mn_status st = training ? mn_build_session(g, o, &s) : mn_build_inference_session(g, o, &s);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  return s;
}

static mn_session *build(const mn_graph *g, mn_siblings_mode mode, bool optimize, bool training) {
  mn_session_options o = cpu(mode);
  o.optimize = optimize;
  return build_with(g, &o, training);
}

static size_t count_derived(const mn_graph *g) {
  size_t n = 0;
  for (size_t i = 0; i < g->num_nodes; i++)
    n += mn_param_is_derived(&g->nodes[i]);
  return n;
}

static const char *first_derived(const mn_session *s) {
  const mn_graph *g = mn_session_plan(s)->graph;
  for (size_t i = 0; i < g->num_nodes; i++)
    if (mn_param_is_derived(&g->nodes[i])) return g->nodes[i].name;
  cr_assert_fail("no derived parameter");
  return NULL;
}

static size_t numel_of(const mn_graph *g, const char *name) {
  mn_node id = mn_graph_find_leaf(g, MN_OP_PARAMETER, name);
  cr_assert_neq(id, MN_NO_NODE, "%s", name);
  return (size_t)mn_tensor_type_numel(&g->nodes[id].type);
}

static void feed(const mn_graph *g, mn_session *const *s, size_t n, uint64_t seed) {
  const char *inputs[] = {"x", "y"};
  for (size_t k = 0; k < 2; k++) {
    mn_node id = mn_graph_find_leaf(g, MN_OP_INPUT, inputs[k]);
    size_t count = (size_t)mn_tensor_type_numel(&g->nodes[id].type);
    float *v = malloc(count * sizeof *v);
    mn_rng r = mn_rng_new(seed + k);
    mn_rng_fill(&r, v, count, -1, 1);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(mn_session_set_input(s[i], inputs[k], v, count), MN_OK, "%s", mn_last_error());
    free(v);
  }
}

static void init(const mn_graph *g, mn_session *const *s, size_t n, uint64_t seed) {
  mn_rng r = mn_rng_new(seed);
  mn_test_init_normal(g, s, n, &r, 0.3f, true);
  feed(g, s, n, seed + 100);
}

static float run(mn_session *s) {
  cr_assert_eq(mn_session_step(s), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_wait(s), MN_OK, "%s", mn_last_error());
  return mn_session_read_loss(s);
}

static float *read_named(mn_session *s, const mn_graph *g, const char *name, bool grad) {
  size_t n = numel_of(g, name);
  float *v = malloc(n * sizeof *v);
  mn_status st = grad ? mn_session_read_grad(s, name, v, n) : mn_session_read_param(s, name, v, n);
  cr_assert_eq(st, MN_OK, "%s: %s", name, mn_last_error());
  return v;
}

/* Every parameter's gradient (grad) or value in a and b: bitwise where `bitwise` says so for
 * the name, else within TOL. */
static void compare(const mn_graph *g, mn_session *a, mn_session *b, bool grad,
                    bool (*bitwise)(const char *), const char *when) {
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    const char *name = param_names[i];
    size_t n = numel_of(g, name);
    float *x = read_named(a, g, name, grad), *y = read_named(b, g, name, grad);
    if (bitwise && bitwise(name))
      cr_assert(memcmp(x, y, n * sizeof *x) == 0, "%s of %s differs %s (rel err %g)",
                grad ? "grad" : "value", name, when, mn_test_rel_err(x, y, n));
    else
      cr_assert_leq(mn_test_rel_err(x, y, n), TOL, "%s of %s: rel err %g %s",
                    grad ? "grad" : "value", name, mn_test_rel_err(x, y, n), when);
    free(x);
    free(y);
  }
}

static bool mlp_weight(const char *name) { return strncmp(name, "mlp.", 4) == 0; }
/* Not `name != NULL`: GCC then takes name for possibly null in compare's messages and
 * fails -Werror=format-overflow. */
static bool every(const char *name) {
  (void)name;
  return true;
}

/* ---------------------------------------------------------------- agreement */

Test(siblings, training_agrees_with_separate_products) {
  mn_graph *g = llama_block(small, 0);
  mn_session *s[3] = {build(g, MN_SIBLINGS_ALWAYS, true, true),
                      build(g, MN_SIBLINGS_NEVER, true, true),
                      build(g, MN_SIBLINGS_NEVER, false, true)};
  cr_assert_eq(count_derived(mn_session_plan(s[0])->graph), 2, "q/k/v and gate/up");
  cr_assert_eq(count_derived(mn_session_plan(s[1])->graph), 0);
  init(g, s, 3, 1);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int step = 0; step < 3; step++) {
    float loss[3];
    for (int i = 0; i < 3; i++)
      loss[i] = run(s[i]);
    if (step == 0)
      cr_assert(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "loss %.9g vs %.9g", loss[0],
                loss[1]);
    cr_assert_leq(fabsf(loss[0] - loss[1]), TOL * fabsf(loss[1]), "step %d", step);
    cr_assert_leq(fabsf(loss[0] - loss[2]), TOL * fabsf(loss[2]), "step %d", step);
    compare(g, s[0], s[1], true, step == 0 ? mlp_weight : NULL, "(optimizer on)");
    compare(g, s[0], s[2], true, NULL, "(optimizer off)");
  }
  compare(g, s[0], s[1], false, NULL, "after 3 AdamW steps (optimizer on)");
  compare(g, s[0], s[2], false, NULL, "after 3 AdamW steps (optimizer off)");
  for (int i = 0; i < 3; i++)
    mn_session_free(s[i]);
  mn_graph_free(g);
}

Test(siblings, inference_with_batch_dim_is_bitwise) {
  mn_graph *g = llama_block(small, 2);
  mn_session *s[2] = {build(g, MN_SIBLINGS_ALWAYS, true, false),
                      build(g, MN_SIBLINGS_NEVER, true, false)};
  cr_assert_eq(count_derived(mn_session_plan(s[0])->graph), 2);
  init(g, s, 2, 2);
  cr_assert(run(s[0]) == run(s[1]));
  compare(g, s[0], s[1], false, every, "");
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_graph_free(g);
}

/* Forward: n products become one product and n slices (+1 per group). Backward: n weight and
 * n input gradients and n - 1 adds become n slice gradients, n - 1 adds and one product of
 * each kind (3 - n): q/k/v break even, gate/up costs one more. Pointwise fusion is off so
 * that the adds count one each. */
Test(siblings, dispatch_counts) {
  mn_graph *g = llama_block(small, 0);
  mn_session_options always = cpu(MN_SIBLINGS_ALWAYS), never = cpu(MN_SIBLINGS_NEVER);
  always.fusion = never.fusion = MN_FUSION_OFF;
  for (int training = 0; training < 2; training++) {
    mn_session *on = build_with(g, &always, training);
    mn_session *off = build_with(g, &never, training);
    size_t a = mn_plan_num_dispatches(mn_session_plan(on));
    size_t b = mn_plan_num_dispatches(mn_session_plan(off));
    cr_assert_eq(a, b + (training ? 1 : 2), "%s: %zu dispatches, %zu without the groups",
                 training ? "training" : "inference", a, b);
    mn_session_free(on);
    mn_session_free(off);
  }
  mn_graph_free(g);
}

/* The build report counts the groups of the forward stage: q/k/v and gate/up. */
Test(siblings, report_counts_groups) {
  mn_graph *g = llama_block(small, 0);
  for (int mode = 0; mode < 2; mode++) {
    mn_session_options o = cpu(mode ? MN_SIBLINGS_ALWAYS : MN_SIBLINGS_NEVER);
    mn_session *s = NULL;
    mn_optimize_report *r = NULL;
    cr_assert_eq(mn_build_session_with_report(g, &o, &s, &r), MN_OK, "%s", mn_last_error());
    char text[4096];
    mn_optimize_report_format(r, text, sizeof text);
    cr_assert(strstr(text, mode ? "sibling groups: 2" : "sibling groups: 0"), "%s", text);
    mn_optimize_report_free(r);
    mn_session_free(s);
  }
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- parameters by name */

Test(siblings, set_parameter_changes_only_its_rows) {
  mn_graph *g = llama_block(small, 0);
  mn_session *s = build(g, MN_SIBLINGS_ALWAYS, true, true);
  init(g, &s, 1, 3);
  float *q = read_named(s, g, "attn.q_proj.weight", false);
  float *v = read_named(s, g, "attn.v_proj.weight", false);
  size_t nk = numel_of(g, "attn.k_proj.weight");
  float *k = malloc(nk * sizeof *k);
  for (size_t i = 0; i < nk; i++)
    k[i] = (float)i * 0.5f - 3.0f;
  cr_assert_eq(mn_session_set_parameter(s, "attn.k_proj.weight", k, nk), MN_OK, "%s",
               mn_last_error());
  float *q2 = read_named(s, g, "attn.q_proj.weight", false);
  float *k2 = read_named(s, g, "attn.k_proj.weight", false);
  float *v2 = read_named(s, g, "attn.v_proj.weight", false);
  cr_assert(memcmp(q, q2, numel_of(g, "attn.q_proj.weight") * sizeof *q) == 0);
  cr_assert(memcmp(k, k2, nk * sizeof *k) == 0);
  cr_assert(memcmp(v, v2, nk * sizeof *v) == 0);
  mn_assert_error(mn_session_set_parameter(s, "attn.k_proj.weight", k, nk - 1), MN_ERR_SHAPE,
                  "\"attn.k_proj.weight\" [8,16] has 128 elements, n is 127");
  free(q);
  free(v);
  free(k);
  free(q2);
  free(k2);
  free(v2);
  mn_session_free(s);
  mn_graph_free(g);
}

Test(siblings, derived_name_is_not_a_parameter) {
  mn_graph *g = llama_block(small, 0);
  mn_session *s = build(g, MN_SIBLINGS_ALWAYS, true, true);
  const char *name = first_derived(s);
  cr_assert_str_eq(name, "#siblings(attn.q_proj.weight,attn.k_proj.weight,attn.v_proj.weight)");
  mn_node id = mn_graph_find_leaf(mn_session_plan(s)->graph, MN_OP_PARAMETER, name);
  size_t n = (size_t)mn_tensor_type_numel(&mn_session_plan(s)->graph->nodes[id].type);
  float *buf = calloc(n, sizeof *buf);
  mn_assert_error(mn_session_set_parameter(s, name, buf, n), MN_ERR_NOT_FOUND,
                  "no parameter named");
  mn_assert_error(mn_session_read_param(s, name, buf, n), MN_ERR_NOT_FOUND, "no parameter named");
  mn_assert_error(mn_session_read_grad(s, name, buf, n), MN_ERR_NOT_FOUND, "no parameter named");
  free(buf);
  mn_session_free(s);
  mn_graph_free(g);
}

/* The table comes with the plan, so lowering and creating separately gives it too. */
Test(siblings, sessions_read_the_table_from_the_plan) {
  mn_graph *g = llama_block(small, 0);
  mn_session_options o = cpu(MN_SIBLINGS_ALWAYS);
  mn_plan *plan = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &plan), MN_OK, "%s", mn_last_error());
  const mn_param_layout *l = &plan->layout;
  /* In node order (the compiler made swiglu's up product first), each in row order. */
  cr_assert_eq(l->num_sources, 5);
  const char *order[] = {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                         "mlp.up_proj.weight", "mlp.gate_proj.weight"};
  size_t offsets[] = {0, 16 * 16, 24 * 16, 0, 24 * 16};
  for (size_t i = 0; i < 5; i++) {
    const mn_param_source *src = &l->sources[i];
    const mn_node_rec *user = &g->nodes[mn_graph_find_leaf(g, MN_OP_PARAMETER, order[i])];
    cr_assert_str_eq(src->name, order[i]);
    cr_assert_eq(src->offset, offsets[i], "%s", order[i]);
    cr_assert(mn_type_same_shape(&src->type, &user->type), "%s", order[i]);
    cr_assert(mn_param_is_derived(&plan->graph->nodes[src->node]), "%s", order[i]);
    cr_assert_str_eq(src->derived, plan->graph->nodes[src->node].name);
  }
  mn_session *s = NULL;
  cr_assert_eq(mn_session_create("test", plan, &o, true, &s), MN_OK, "%s", mn_last_error());
  float w[8 * 16] = {1.0f};
  cr_assert_eq(mn_session_set_parameter(s, "attn.k_proj.weight", w, 8 * 16), MN_OK, "%s",
               mn_last_error());
  mn_session_free(s);
  mn_graph_free(g);
}

/* mn_plan_build refuses a table that does not describe the graph it binds to. */
typedef enum damage {
  SHIFTED,
  DROPPED,
  LEAF_NAME,
  NAMED_TWICE,
  NO_SUCH_DERIVED,
  EMPTY,
  OTHER_DTYPE,
  NUM_DAMAGES
} damage;

static void damage_table(mn_param_layout *l, damage d) {
  mn_param_source *k = &l->sources[1]; /* attn.k_proj.weight */
  switch (d) {
  case SHIFTED: k->offset += 1; break;
  case DROPPED:
    free(k->name);
    free(k->derived);
    memmove(k, k + 1, (l->num_sources - 2) * sizeof *k);
    l->num_sources--;
    break;
  case LEAF_NAME:
    free(k->name);
    k->name = strdup("norm1.weight");
    break;
  case NAMED_TWICE:
    free(k->name);
    k->name = strdup("attn.q_proj.weight");
    break;
  case NO_SUCH_DERIVED:
    free(k->derived);
    k->derived = strdup("attn.k_proj.weight");
    break;
  case EMPTY: mn_param_layout_clear(l); break;
  case OTHER_DTYPE: k->type.dtype = MN_U32; break;
  default: break;
  }
}

Test(siblings, plan_build_refuses_a_table_that_does_not_fit) {
  const char *want[NUM_DAMAGES] = {
      [SHIFTED] = "source \"attn.k_proj.weight\" is not at element 256 of \"#siblings(",
      [DROPPED] = "source \"attn.v_proj.weight\" is not at element 256 of",
      [LEAF_NAME] = "source \"norm1.weight\" is not the only tensor of its name",
      [NAMED_TWICE] = "source \"attn.q_proj.weight\" is not the only tensor of its name",
      [NO_SUCH_DERIVED] = "the graph has no derived parameter \"attn.k_proj.weight\"",
      [EMPTY] = "\" has 0 source",
      [OTHER_DTYPE] = "source \"attn.k_proj.weight\" has a type \"#siblings(",
  };
  mn_graph *g = llama_block(small, 0);
  mn_session_options o = cpu(MN_SIBLINGS_ALWAYS);
  mn_plan *good = NULL;
  cr_assert_eq(mn_lower_training("test", g, &o, &good), MN_OK, "%s", mn_last_error());
  for (int d = 0; d < NUM_DAMAGES; d++) {
    mn_param_layout l;
    cr_assert(mn_param_layout_copy(&l, &good->layout));
    damage_table(&l, (damage)d);
    mn_plan *bad = NULL;
    mn_graph *copy = mn_graph_clone(good->graph);
    mn_assert_error(mn_plan_build(copy, 1, NULL, &l, &bad), MN_ERR_STATE,
                    "mn_plan_build: derived parameters: ");
    cr_assert(strstr(mn_last_error(), want[d]), "damage %d: %s", d, mn_last_error());
    cr_assert_null(bad);
    mn_param_layout_clear(&l);
  }
  mn_plan_free(good);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- files */

/* Every tensor of two safetensors files: the same names, bytes equal. */
static void assert_same_files(const char *a, const char *b) {
  mn_safetensors *fa = NULL, *fb = NULL;
  cr_assert_eq(mn_safetensors_open(a, &fa), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_open(b, &fb), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_count(fa), mn_safetensors_count(fb));
  for (size_t i = 0; i < mn_safetensors_count(fa); i++) {
    const char *name = mn_safetensors_name(fa, i);
    const void *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    cr_assert_eq(mn_safetensors_raw(fa, name, &da, &na, NULL), MN_OK);
    cr_assert_eq(mn_safetensors_raw(fb, name, &db, &nb, NULL), MN_OK, "%s missing", name);
    cr_assert(na == nb && memcmp(da, db, na) == 0, "%s differs", name);
  }
  mn_safetensors_close(fa);
  mn_safetensors_close(fb);
}

static void checkpoint_between(mn_siblings_mode from, mn_siblings_mode to) {
  mn_graph *g = llama_block(small, 0);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_siblings");
  char saved[128], again[128];
  snprintf(saved, sizeof saved, "%s", mn_tmp_path(&dir, "a.safetensors"));
  snprintf(again, sizeof again, "%s", mn_tmp_path(&dir, "b.safetensors"));
  mn_session *src = build(g, from, true, true), *dst = build(g, to, true, true);
  init(g, &src, 1, 4);
  feed(g, &dst, 1, 104);
  cr_assert_eq(mn_session_set_adamw(src, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  run(src);
  run(src);
  cr_assert_eq(mn_session_save_checkpoint(src, saved), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_session_load_checkpoint(dst, saved), MN_OK, "%s", mn_last_error());
  /* Parameters and both Adam moments of every source came across exactly. */
  cr_assert_eq(mn_session_save_checkpoint(dst, again), MN_OK, "%s", mn_last_error());
  assert_same_files(saved, again);
  compare(g, src, dst, false, every, "after loading");
  float a = run(src), b = run(dst);
  cr_assert_leq(fabsf(a - b), TOL * fabsf(a));
  compare(g, src, dst, false, NULL, "one step after loading");
  mn_session_free(src);
  mn_session_free(dst);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

Test(siblings, checkpoint_from_concatenated_to_separate) {
  checkpoint_between(MN_SIBLINGS_ALWAYS, MN_SIBLINGS_NEVER);
}

Test(siblings, checkpoint_from_separate_to_concatenated) {
  checkpoint_between(MN_SIBLINGS_NEVER, MN_SIBLINGS_ALWAYS);
}

Test(siblings, save_safetensors_writes_source_names) {
  mn_graph *g = llama_block(small, 0);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_siblings");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "model.safetensors"));
  mn_session *s = build(g, MN_SIBLINGS_ALWAYS, true, true);
  init(g, &s, 1, 5);
  cr_assert_eq(mn_session_save_safetensors(s, path), MN_OK, "%s", mn_last_error());
  mn_safetensors *f = NULL;
  cr_assert_eq(mn_safetensors_open(path, &f), MN_OK, "%s", mn_last_error());
  cr_assert_eq(mn_safetensors_count(f), NUM_PARAMS);
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    size_t n = numel_of(g, param_names[i]);
    float *want = read_named(s, g, param_names[i], false), *got = malloc(n * sizeof *got);
    cr_assert_eq(mn_safetensors_read_f32(f, param_names[i], got, n), MN_OK, "%s", mn_last_error());
    cr_assert(memcmp(want, got, n * sizeof *got) == 0, "%s", param_names[i]);
    free(want);
    free(got);
  }
  mn_safetensors_close(f);
  /* And it loads back, strictly, into a session without the concatenation. */
  mn_session *plain = build(g, MN_SIBLINGS_NEVER, false, true);
  cr_assert_eq(mn_session_load_safetensors(plain, path, true), MN_OK, "%s", mn_last_error());
  compare(g, s, plain, false, every, "after loading");
  mn_session_free(plain);
  mn_session_free(s);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

Test(siblings, load_safetensors_strict_names_a_missing_source) {
  mn_graph *g = llama_block(small, 0);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_siblings");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "partial.safetensors"));
  mn_st_tensor t[NUM_PARAMS];
  float *data[NUM_PARAMS];
  size_t nt = 0;
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    size_t n = numel_of(g, param_names[i]);
    data[i] = malloc(n * sizeof *data[i]);
    for (size_t k = 0; k < n; k++)
      data[i][k] = 0.25f + (float)i;
    if (strcmp(param_names[i], "attn.k_proj.weight") == 0) continue;
    const mn_node_rec *r = &g->nodes[mn_graph_find_leaf(g, MN_OP_PARAMETER, param_names[i])];
    t[nt] = (mn_st_tensor){.name = param_names[i],
                           .dtype = "F32",
                           .rank = r->type.rank,
                           .data = data[i],
                           .bytes = n * sizeof(float)};
    memcpy(t[nt++].shape, r->type.shape, sizeof t[0].shape);
  }
  cr_assert_eq(mn_safetensors_write(path, t, nt, NULL, 0), MN_OK, "%s", mn_last_error());
  mn_session *s = build(g, MN_SIBLINGS_ALWAYS, true, true);
  init(g, &s, 1, 6);
  float *before = read_named(s, g, "attn.q_proj.weight", false);
  mn_assert_error(mn_session_load_safetensors(s, path, true), MN_ERR_NOT_FOUND,
                  "1 parameter is not in the file: attn.k_proj.weight");
  cr_assert_null(strstr(mn_last_error(), "#siblings"), "%s", mn_last_error());
  float *after = read_named(s, g, "attn.q_proj.weight", false);
  cr_assert(memcmp(before, after, numel_of(g, "attn.q_proj.weight") * sizeof *after) == 0,
            "a refused load changed q");
  cr_assert_eq(mn_session_load_safetensors(s, path, false), MN_OK, "%s", mn_last_error());
  cr_assert(strstr(mn_last_error(), "kept its value: attn.k_proj.weight"), "%s", mn_last_error());
  float *q = read_named(s, g, "attn.q_proj.weight", false);
  cr_assert(memcmp(q, data[1], numel_of(g, "attn.q_proj.weight") * sizeof *q) == 0);
  for (size_t i = 0; i < NUM_PARAMS; i++)
    free(data[i]);
  free(before);
  free(after);
  free(q);
  mn_session_free(s);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- the plan cache */

Test(siblings, plan_cache_round_trip) {
  mn_graph *g = llama_block(small, 0);
  mn_tmp_dir dir = mn_tmp_dir_make("mn_siblings");
  char path[128];
  snprintf(path, sizeof path, "%s", mn_tmp_path(&dir, "plan.json"));
  mn_session_options o = cpu(MN_SIBLINGS_ALWAYS);
  mn_session *s[2];
  cr_assert_eq(mn_build_session_cached(g, path, &o, &s[0]), MN_OK, "%s", mn_last_error());
  char *cold = mn_test_read_file(path, NULL);
  /* A hit: the plan read back, and the file left as it was (not even rewritten). */
  struct timespec past[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
  cr_assert_eq(utimensat(AT_FDCWD, path, past, 0), 0);
  cr_assert_eq(mn_build_session_cached(g, path, &o, &s[1]), MN_OK, "%s", mn_last_error());
  char *warm = mn_test_read_file(path, NULL);
  cr_assert_str_eq(cold, warm);
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_assert_eq(sb.st_mtim.tv_sec, 1000000000, "the cached plan was not used");
  cr_assert_eq(count_derived(mn_session_plan(s[1])->graph), 2);
  init(g, s, 2, 7);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mn_session_set_adamw(s[i], 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f), MN_OK);
  for (int step = 0; step < 3; step++)
    cr_assert(run(s[0]) == run(s[1]), "step %d", step);
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    float *a = read_named(s[0], g, param_names[i], true);
    float *b = read_named(s[1], g, param_names[i], true);
    cr_assert(memcmp(a, b, numel_of(g, param_names[i]) * sizeof *a) == 0, "%s", param_names[i]);
    free(a);
    free(b);
  }
  compare(g, s[0], s[1], false, every, "");

  /* The reader checks the table of sources against the graph (checksum off, so that the
   * structural check is what refuses). Each edit applies within k's entry of param_sources. */
  const char *k_entry = "{\"name\":\"attn.k_proj.weight\",\"param\":";
  cr_assert_not_null(strstr(cold, k_entry), "%s", cold);
  char param_from[32];
  snprintf(param_from, sizeof param_from, "\"param\":%ld",
           strtol(strstr(cold, k_entry) + strlen(k_entry), NULL, 10));
  const char *edits[][3] = {
      {"k_proj.weight\"", "k_proj.weighx\"", "the graph has no parameter named"},
      {"\"shape\":[8,16]", "\"shape\":[9,16]", "\"attn.k_proj.weight\" has another type"},
      {"attn.k_proj", "attn.v_proj", "\"attn.v_proj.weight\" appears twice"},
      {"\"offset\":", "\"offset\":-", "bad offset"},
      {"\"offset\":", "\"offset\":1+", "not valid JSON"},
      {"\"dtype\":\"f32\"", "\"dtype\":\"u32\"", "another type"},
      {"\"dtype\":\"f32\"", "\"dtype\":\"f32\",\"rows\":8", "unknown field \"rows\""},
      {"\"dtype\":\"f32\"", "\"dtype\":\"f32\",\"dtype\":\"f32\"", "field dtype twice"},
      {param_from, "\"param\":0", "param is no derived parameter node"},
      {"\"name\":", "\"name\":0,\"y\":", "unknown field \"y\""},
      {"\"param_sources\":[", "\"param_sources\":[[],", "param_sources 0 is not an object"},
      {"\"param_sources\":[", "\"param_sources\":{\"a\":[", "param_sources is not an array"},
      /* no longer marked derived: a parameter the graph does not have */
      {"{\"variant\":1},\"name\":\"#siblings(", "{\"variant\":2},\"name\":\"#siblings(",
       "the graph has no parameter named \"#siblings("},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    bool whole_file = strncmp(edits[i][0], "\"param_sources", 14) == 0 ||
                      strncmp(edits[i][0], "{\"variant", 10) == 0;
    const char *from = whole_file ? cold : strstr(cold, k_entry);
    char *at = strstr(from, edits[i][0]);
    cr_assert_not_null(at, "%s", edits[i][0]);
    size_t head = (size_t)(at - cold), old_len = strlen(edits[i][0]);
    char *text = malloc(strlen(cold) + strlen(edits[i][1]) + 1);
    memcpy(text, cold, head);
    strcpy(text + head, edits[i][1]);
    strcat(text, at + old_len);
    if (strcmp(edits[i][1], "\"param_sources\":{\"a\":[") == 0) {
      /* Close the object that now wraps the list. */
      char *end = strstr(text, "],\"nodes\":");
      cr_assert_not_null(end);
      memmove(end + 2, end + 1, strlen(end + 1) + 1);
      end[1] = '}';
    }
    mn_plan *plan = NULL;
    char why[256];
    mn_status st = mn_plan_cache_parse(text, strlen(text), g, &o, 0, &plan, why, sizeof why);
    cr_assert_eq(st, MN_ERR_FORMAT, "edit %zu accepted", i);
    cr_assert(strstr(why, edits[i][2]), "edit %zu: %s", i, why);
    free(text);
  }
  /* A source moved within its derived parameter: each entry is valid, the tiling is not. */
  char *moved = strdup(cold);
  char *off = strstr(strstr(moved, k_entry), "\"offset\":256");
  cr_assert_not_null(off, "%s", moved);
  memcpy(off, "\"offset\":255", strlen("\"offset\":255"));
  mn_plan *plan = NULL;
  char why[256];
  cr_assert_eq(mn_plan_cache_parse(moved, strlen(moved), g, &o, 0, &plan, why, sizeof why),
               MN_ERR_FORMAT);
  cr_assert(strstr(why, "param_sources: source \"attn.k_proj.weight\" is not at element 256"), "%s",
            why);
  /* Sources listed in another order describe the same layout, but the checksum covers the
   * table as written. */
  char *swapped = strdup(cold);
  char *q = strstr(swapped, "{\"name\":\"attn.q_proj.weight\"");
  cr_assert_not_null(q);
  char *q_end = strchr(q, '}') + 1, *k = q_end + 1, *k_end = strchr(k, '}') + 1;
  cr_assert_eq(strncmp(k, k_entry, strlen(k_entry)), 0, "%s", k);
  size_t ql = (size_t)(q_end - q), kl = (size_t)(k_end - k);
  char *both = malloc(ql + kl + 1);
  memcpy(both, k, kl);
  both[kl] = ',';
  memcpy(both + kl + 1, q, ql);
  memcpy(q, both, ql + kl + 1);
  free(both);
  cr_assert_eq(mn_plan_cache_parse(swapped, strlen(swapped), g, &o, 0, &plan, why, sizeof why),
               MN_OK, "%s", why);
  mn_plan_free(plan);
  cr_assert_eq(mn_plan_cache_parse(swapped, strlen(swapped), g, &o, MN_PLAN_CACHE_VERIFY_CHECKSUM,
                                   &plan, why, sizeof why),
               MN_ERR_FORMAT);
  cr_assert_str_eq(why, "checksum mismatch");
  free(swapped);
  free(moved);
  free(cold);
  free(warm);
  mn_session_free(s[0]);
  mn_session_free(s[1]);
  mn_tmp_dir_remove(&dir);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- where it must not fire */

/* A loss over products of x: the mean of each product added up. */
typedef struct mini {
  mn_graph *g;
  mn_node x, loss;
} mini;

static mini mini_new(int64_t t, int64_t k, bool normed) {
  mini m = {.g = mn_graph_new(), .loss = MN_NO_NODE};
  m.x = mn_input(m.g, "x", MN_SHAPE(t, k));
  if (normed) m.x = mn_rms_norm(m.g, m.x, mn_parameter(m.g, "norm.weight", MN_SHAPE(k)), 1e-5f);
  return m;
}

static mn_node product(mini *m, mn_node x, const char *w, int64_t rows) {
  const mn_tensor_type *t = &m->g->nodes[x].type;
  mn_node p = mn_matmul_bt(m->g, x, mn_parameter(m->g, w, MN_SHAPE(rows, t->shape[t->rank - 1])));
  mn_node term = mn_mean_all(m->g, p);
  m->loss = m->loss == MN_NO_NODE ? term : mn_add(m->g, m->loss, term);
  return p;
}

/* Outputs: the loss, then `extra`. */
static mn_graph *mini_done(mini *m, const mn_node *extra, size_t n) {
  mn_node outs[4] = {m->loss};
  if (n) memcpy(outs + 1, extra, n * sizeof *extra);
  mn_set_outputs(m->g, outs, n + 1);
  cr_assert_eq(mn_graph_status(m->g), MN_OK, "%s", mn_graph_error(m->g));
  return m->g;
}

/* The derived parameters lowering makes of g, and (into names) each one's sources from the
 * plan's table, "(a/3,b/5) ": name and rows, in row order. */
static size_t groups(const mn_graph *g, bool training, mn_siblings_mode mode, char *names,
                     size_t size) {
  mn_session_options o = cpu(mode);
  mn_plan *plan = NULL;
  mn_status st =
      training ? mn_lower_training("test", g, &o, &plan) : mn_lower_inference("test", g, &o, &plan);
  cr_assert_eq(st, MN_OK, "%s", mn_last_error());
  size_t n = 0, used = 0;
  if (size) names[0] = '\0';
  for (size_t i = 0; i < plan->graph->num_nodes; i++) {
    if (!mn_param_is_derived(&plan->graph->nodes[i])) continue;
    n++;
    const mn_param_source *src = NULL;
    size_t count = mn_param_layout_sources_of(&plan->layout, (mn_node)i, &src);
    for (size_t k = 0; k < count && used < size; k++)
      used += (size_t)snprintf(names + used, size - used, "%s%s/%lld%s", k ? "," : "(", src[k].name,
                               (long long)src[k].type.shape[0], k + 1 == count ? ") " : "");
  }
  mn_plan_free(plan);
  return n;
}

/* One group in both training and inference sessions of g (mode ALWAYS), of exactly `want`. */
static void expect_group(const mn_graph *g, const char *want) {
  char names[512];
  for (int training = 0; training < 2; training++) {
    cr_assert_eq(groups(g, training, MN_SIBLINGS_ALWAYS, names, sizeof names), 1, "%s", names);
    cr_assert(strncmp(names, want, strlen(want)) == 0, "got %s, expected %s", names, want);
  }
}

static void expect_none(const mn_graph *g) {
  char names[512];
  for (int training = 0; training < 2; training++)
    cr_assert_eq(groups(g, training, MN_SIBLINGS_ALWAYS, names, sizeof names), 0, "%s", names);
}

Test(siblings, not_a_tied_weight) {
  mini m = mini_new(4, 8, true);
  mn_node z = mn_input(m.g, "z", MN_SHAPE(4, 8));
  product(&m, m.x, "a", 3);
  product(&m, m.x, "b", 5);
  product(&m, m.x, "c", 2);
  /* "a" is read by a second product (of z), as a tied embedding is read twice. */
  mn_node tied = mn_matmul_bt(m.g, z, mn_graph_find_leaf(m.g, MN_OP_PARAMETER, "a"));
  m.loss = mn_add(m.g, m.loss, mn_mean_all(m.g, tied));
  mn_graph *g = mini_done(&m, NULL, 0);
  expect_group(g, "(b/5,c/2)");
  mn_graph_free(g);
}

Test(siblings, not_a_weight_or_product_that_is_an_output) {
  mini m = mini_new(4, 8, true);
  product(&m, m.x, "a", 3);
  product(&m, m.x, "b", 5);
  product(&m, m.x, "c", 2);
  mn_node out_w = mn_graph_find_leaf(m.g, MN_OP_PARAMETER, "c");
  mn_graph *g = mini_done(&m, &out_w, 1);
  expect_group(g, "(a/3,b/5)");
  mn_graph_free(g);

  m = mini_new(4, 8, true);
  product(&m, m.x, "a", 3);
  mn_node out_p = product(&m, m.x, "b", 5);
  product(&m, m.x, "c", 2);
  g = mini_done(&m, &out_p, 1);
  expect_group(g, "(a/3,c/2)");
  mn_graph_free(g);
}

Test(siblings, not_products_of_different_inputs) {
  mini m = mini_new(4, 8, false);
  mn_node x2 = mn_input(m.g, "x2", MN_SHAPE(4, 8)), x3 = mn_input(m.g, "x3", MN_SHAPE(4, 12));
  product(&m, m.x, "a", 3);
  product(&m, x2, "b", 3); /* same dims, another x */
  product(&m, x3, "c", 3); /* other in dims */
  mn_graph *g = mini_done(&m, NULL, 0);
  expect_none(g);
  mn_graph_free(g);
}

Test(siblings, not_a_single_product_or_matmul) {
  mini m = mini_new(4, 8, true);
  product(&m, m.x, "a", 3);
  mn_node w = mn_parameter(m.g, "b", MN_SHAPE(8, 3)); /* [in, out]: matmul, not matmul_bt */
  m.loss = mn_add(m.g, m.loss, mn_mean_all(m.g, mn_matmul(m.g, m.x, w)));
  mn_graph *g = mini_done(&m, NULL, 0);
  expect_none(g);
  mn_graph_free(g);
}

/* A product the loss does not depend on gets no gradient, so training leaves its weight
 * alone (AdamW would decay it in a group); inference takes it. */
Test(siblings, not_a_weight_without_gradient_in_training) {
  mini m = mini_new(4, 8, true);
  product(&m, m.x, "a", 3);
  product(&m, m.x, "b", 5);
  mn_node side = mn_relu(m.g, mn_matmul_bt(m.g, m.x, mn_parameter(m.g, "c", MN_SHAPE(2, 8))));
  mn_graph *g = mini_done(&m, &side, 1);
  char names[512];
  cr_assert_eq(groups(g, true, MN_SIBLINGS_ALWAYS, names, sizeof names), 1);
  cr_assert_str_eq(names, "(a/3,b/5) ");
  cr_assert_eq(groups(g, false, MN_SIBLINGS_ALWAYS, names, sizeof names), 1);
  cr_assert_str_eq(names, "(a/3,b/5,c/2) ");
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- the cost decision */

Test(siblings, auto_refuses_a_large_training_shape) {
  dims big = {.t = 512, .d = 1024, .kv = 256, .ff = 2816};
  mn_graph *g = llama_block(big, 0);
  cr_assert_eq(groups(g, true, MN_SIBLINGS_AUTO, NULL, 0), 0);
  cr_assert_eq(groups(g, true, MN_SIBLINGS_ALWAYS, NULL, 0), 2);
  mn_tensor_type x = mn_type_make(MN_F32, (int64_t[]){512, 1024}, 2);
  mn_siblings_price p = mn_siblings_price_group(&x, (int64_t[]){1024, 256, 256}, 3, true, true);
  cr_assert_gt(p.concat, p.separate);
  mn_graph_free(g);
}

/* Decode (one row): the slices cost a launch more than the products they replace save. */
Test(siblings, auto_refuses_decode) {
  dims decode = {.t = 1, .d = 1024, .kv = 256, .ff = 2816};
  mn_graph *g = llama_block(decode, 0);
  cr_assert_eq(groups(g, false, MN_SIBLINGS_AUTO, NULL, 0), 0);
  mn_tensor_type x = mn_type_make(MN_F32, (int64_t[]){1, 1024}, 2);
  mn_siblings_price p = mn_siblings_price_group(&x, (int64_t[]){1024, 256, 256}, 3, false, false);
  cr_assert_gt(p.concat - p.separate, 0.9 * MN_COST_LAUNCH_BYTES);
  mn_graph_free(g);
}

/* Narrow products of a long, wide x (low-rank adapters, small heads): reading x once saves
 * more than the launch the slices add. */
Test(siblings, auto_fires_on_narrow_products_of_a_wide_x) {
  for (int training = 0; training < 2; training++) {
    mini m = mini_new(1024, 4096, true);
    const char *names[] = {"a", "b", "c", "d"};
    for (size_t i = 0; i < 4; i++)
      product(&m, m.x, names[i], 16);
    mn_graph *g = mini_done(&m, NULL, 0);
    char got[256];
    cr_assert_eq(groups(g, training, MN_SIBLINGS_AUTO, got, sizeof got), 1);
    cr_assert_str_eq(got, "(a/16,b/16,c/16,d/16) ");
    mn_graph_free(g);
  }
  mn_tensor_type x = mn_type_make(MN_F32, (int64_t[]){1024, 4096}, 2);
  int64_t rows[4] = {16, 16, 16, 16};
  mn_siblings_price p = mn_siblings_price_group(&x, rows, 4, false, false);
  cr_assert_lt(p.concat, p.separate);
  p = mn_siblings_price_group(&x, rows, 4, true, true);
  cr_assert_lt(p.concat, p.separate);
}

Test(siblings, never_and_optimize_off) {
  mn_graph *g = llama_block(small, 0);
  cr_assert_eq(groups(g, true, MN_SIBLINGS_NEVER, NULL, 0), 0);
  mn_session *s = build(g, MN_SIBLINGS_ALWAYS, false, true);
  cr_assert_eq(count_derived(mn_session_plan(s)->graph), 0);
  mn_session_free(s);
  mn_graph_free(g);
}

/* ---------------------------------------------------------------- options */

Test(siblings, unknown_modes_are_refused) {
  mn_graph *g = llama_block(small, 0);
  mn_session_options o = cpu((mn_siblings_mode)7);
  mn_session *s = NULL;
  mn_assert_error(mn_build_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session: options: unknown siblings mode 7");
  cr_assert_null(s);
  o = cpu(MN_SIBLINGS_AUTO);
  o.fusion = (mn_fusion_mode)-1;
  mn_assert_error(mn_build_inference_session(g, &o, &s), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_inference_session: options: unknown fusion mode -1");
  mn_assert_error(mn_build_session_cached(g, "/nonexistent/plan.json", &o, &s),
                  MN_ERR_INVALID_ARGUMENT, "mn_build_session_cached: options: unknown fusion mode");
  mn_optimize_report *r = NULL;
  mn_assert_error(mn_build_session_with_report(g, &o, &s, &r), MN_ERR_INVALID_ARGUMENT,
                  "mn_build_session_with_report: options: unknown fusion mode");
  cr_assert_null(r);
  mn_graph_free(g);
}
