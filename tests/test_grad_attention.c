/* Gradient checks of causal, full and cross attention, the structure of the backward
 * nodes their rule emits, and the refusal to train through the KV-cache ops. */
#include <stdio.h>
#include <stdlib.h>

#include "host/plan.h"
#include "tests/support/gradcheck.h"

typedef enum att_kind { CAUSAL, FULL, CROSS } att_kind;

typedef struct att_case {
  att_kind kind;
  int heads, kv_heads, head_dim;
} att_case;

static mn_node attend(mn_graph *g, const att_case *a, mn_node q, mn_node k, mn_node v) {
  switch (a->kind) {
  case CAUSAL: return mn_causal_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
  case FULL: return mn_full_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
  case CROSS: break;
  }
  return mn_cross_attention(g, q, k, v, a->heads, a->kv_heads, a->head_dim);
}

/* Scores scale * q.k stay within about +-2 for these ranges, so the softmax is neither
 * uniform (gradients of q and k near zero) nor saturated. */
#define QKV_LO (-1.5f)
#define QKV_HI 1.5f

/* The loss is read back as f32, so a finite difference carries noise of about
 * 6e-8 * |L| / 2h ~ 1e-4 at the default h = 1e-3, while gradients of q and k are often
 * ~0.03: relative errors reached 9e-4 there. The softmax is smooth on this range, so
 * h = 4e-3 cuts that noise 4x at a truncation error of order h^2 (worst seen 1.1e-4). */
static const mn_gc_options gc_opts = {.h = 4e-3, .max_probes = 48};

/* One of q, k, v (`which`) is the gradchecked leaf; the other two are constants. Each
 * input gets a check of its own because mn_gradcheck reads a later leaf's analytic
 * gradient after the previous leaf's last perturbed step, an O(h) error. */
typedef struct qkv_case {
  att_case a;
  int which;
  int rank;
  int64_t shape[3][MN_MAX_RANK];
  float *data[3];
} qkv_case;

static mn_node build_qkv(mn_graph *g, const mn_node *x, void *u) {
  qkv_case *c = u;
  mn_node in[3];
  for (int i = 0; i < 3; i++)
    in[i] = i == c->which ? x[0] : mn_constant(g, c->data[i], c->shape[i], c->rank);
  return attend(g, &c->a, in[0], in[1], in[2]);
}

/* Gradchecks q, k and v of one case: q [B?, t, H*hd], k and v [B?, s, KVH*hd];
 * batches 0 means rank 2. */
static void check(const char *what, att_case a, int64_t batches, int64_t t, int64_t s) {
  static const char *names[3] = {"q", "k", "v"};
  int64_t widths[3] = {(int64_t)a.heads * a.head_dim, (int64_t)a.kv_heads * a.head_dim,
                       (int64_t)a.kv_heads * a.head_dim};
  int64_t lens[3] = {t, s, s};
  qkv_case c = {.a = a, .rank = batches ? 3 : 2};
  mn_rng rng = mn_rng_new(7);
  for (int i = 0; i < 3; i++) {
    int64_t *sh = c.shape[i];
    if (batches) *sh++ = batches;
    sh[0] = lens[i];
    sh[1] = widths[i];
    size_t n = (size_t)((batches ? batches : 1) * lens[i] * widths[i]);
    c.data[i] = malloc(n * sizeof *c.data[i]);
    mn_rng_fill(&rng, c.data[i], n, QKV_LO, QKV_HI);
  }
  for (int i = 0; i < 3; i++) {
    mn_gc_leaf leaf = {.name = names[i], .rank = c.rank, .lo = QKV_LO, .hi = QKV_HI};
    memcpy(leaf.shape, c.shape[i], sizeof leaf.shape);
    c.which = i;
    char label[96];
    snprintf(label, sizeof label, "%s, d%s", what, names[i]);
    mn_gradcheck(label, &leaf, 1, build_qkv, &c, &gc_opts);
  }
  for (int i = 0; i < 3; i++)
    free(c.data[i]);
}

Test(grad_attention, causal_mha) { check("causal mha", (att_case){CAUSAL, 2, 2, 4}, 0, 5, 5); }
Test(grad_attention, causal_gqa) { check("causal gqa", (att_case){CAUSAL, 9, 3, 4}, 0, 3, 3); }
Test(grad_attention, causal_mqa_hd6) {
  check("causal mqa hd6", (att_case){CAUSAL, 4, 1, 6}, 0, 4, 4);
}
Test(grad_attention, causal_t1) { check("causal t=1", (att_case){CAUSAL, 2, 2, 4}, 0, 1, 1); }
Test(grad_attention, causal_batched) { check("causal b=2", (att_case){CAUSAL, 3, 1, 4}, 2, 3, 3); }

Test(grad_attention, full_mha) { check("full mha", (att_case){FULL, 3, 3, 4}, 0, 5, 5); }
Test(grad_attention, full_gqa) { check("full gqa", (att_case){FULL, 9, 3, 4}, 0, 3, 3); }
Test(grad_attention, full_mqa_hd6) { check("full mqa hd6", (att_case){FULL, 2, 1, 6}, 0, 3, 3); }
Test(grad_attention, full_t1) { check("full t=1", (att_case){FULL, 2, 1, 4}, 0, 1, 1); }
Test(grad_attention, full_batched) { check("full b=2", (att_case){FULL, 4, 2, 4}, 2, 3, 3); }

Test(grad_attention, cross_mha) { check("cross mha", (att_case){CROSS, 2, 2, 4}, 0, 5, 3); }
Test(grad_attention, cross_gqa) { check("cross gqa", (att_case){CROSS, 9, 3, 4}, 0, 5, 3); }
Test(grad_attention, cross_mqa_hd6) { check("cross mqa hd6", (att_case){CROSS, 3, 1, 6}, 0, 3, 5); }
Test(grad_attention, cross_t1) { check("cross t=1", (att_case){CROSS, 2, 2, 4}, 0, 1, 3); }
/* One key: every probability is 1, so q and k get exactly zero gradient and v gets the
 * sum of dy over queries. */
Test(grad_attention, cross_s1) { check("cross s=1", (att_case){CROSS, 2, 1, 4}, 0, 4, 1); }
Test(grad_attention, cross_batched) { check("cross b=2", (att_case){CROSS, 6, 2, 4}, 2, 5, 3); }

/* Self-attention reads one tensor as q, k and v: its gradient is the sum of the three. */
static mn_node build_self(mn_graph *g, const mn_node *x, void *u) {
  return attend(g, u, x[0], x[0], x[0]);
}
Test(grad_attention, self_attention_sums_roles) {
  mn_gc_leaf l[] = {MN_GC_LEAF("x", QKV_LO, QKV_HI, 4, 8)};
  att_case causal = {CAUSAL, 2, 2, 4}, full = {FULL, 2, 2, 4};
  mn_gradcheck("causal self", l, 1, build_self, &causal, &gc_opts);
  mn_gradcheck("full self", l, 1, build_self, &full, &gc_opts);
}

/* ---------------------------------------------------------------- structure */

typedef struct grad_nodes {
  int count[4];         /* ATTENTION_GRAD_Q, _K, _V, _KV nodes in the training plan */
  mn_op_attrs attrs[4]; /* of the last such node */
  mn_tensor_type type[4];
  int num_inputs[4];
} grad_nodes;

/* Builds a training session of sum(attention(q, k, v)) where bit i of `params` makes
 * input i (q, k, v) a parameter and the others plain inputs, and counts the gradient
 * nodes of the plan. */
static grad_nodes count_grads(att_kind kind, unsigned params) {
  att_case a = {kind, 4, 2, 4};
  mn_graph *g = mn_graph_new();
  const char *names[3] = {"q", "k", "v"};
  int64_t widths[3] = {16, 8, 8};
  mn_node x[3];
  for (int i = 0; i < 3; i++) {
    int64_t shape[2] = {3, widths[i]};
    x[i] =
        (params >> i) & 1 ? mn_parameter(g, names[i], shape, 2) : mn_input(g, names[i], shape, 2);
  }
  mn_node loss = mn_sum_all(g, attend(g, &a, x[0], x[1], x[2]));
  mn_set_outputs(g, &loss, 1);
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  so.optimize = false;
  mn_session *s = NULL;
  cr_assert_eq(mn_build_session(g, &so, &s), MN_OK, "build: %s", mn_last_error());
  const mn_graph *pg = mn_session_plan(s)->graph;
  static const mn_op ops[4] = {MN_OP_ATTENTION_GRAD_Q, MN_OP_ATTENTION_GRAD_K,
                               MN_OP_ATTENTION_GRAD_V, MN_OP_ATTENTION_GRAD_KV};
  grad_nodes r;
  memset(&r, 0, sizeof r);
  for (size_t n = 0; n < pg->num_nodes; n++)
    for (int i = 0; i < 4; i++)
      if (pg->nodes[n].op == ops[i]) {
        r.count[i]++;
        r.attrs[i] = pg->nodes[n].attrs;
        r.type[i] = pg->nodes[n].type;
        r.num_inputs[i] = pg->nodes[n].num_inputs;
      }
  mn_session_free(s);
  mn_graph_free(g);
  return r;
}

static void expect_counts(grad_nodes r, int q, int k, int v, int kv) {
  cr_assert_eq(r.count[0], q, "attention_grad_q nodes: %d, expected %d", r.count[0], q);
  cr_assert_eq(r.count[1], k, "attention_grad_k nodes: %d, expected %d", r.count[1], k);
  cr_assert_eq(r.count[2], v, "attention_grad_v nodes: %d, expected %d", r.count[2], v);
  cr_assert_eq(r.count[3], kv, "attention_grad_kv nodes: %d, expected %d", r.count[3], kv);
}

/* dK and dV together come from one attention_grad_kv node. */
Test(grad_attention, only_wanted_inputs_get_nodes) {
  expect_counts(count_grads(CAUSAL, 1), 1, 0, 0, 0);
  expect_counts(count_grads(CAUSAL, 2), 0, 1, 0, 0);
  expect_counts(count_grads(FULL, 4), 0, 0, 1, 0);
  expect_counts(count_grads(CROSS, 5), 1, 0, 1, 0);
  expect_counts(count_grads(CROSS, 6), 0, 0, 0, 1);
  expect_counts(count_grads(CROSS, 7), 1, 0, 0, 1);
}

/* The backward nodes carry the forward attrs, variant 1 only for causal, and the types
 * of q and of [dK | dV] rows. */
Test(grad_attention, backward_attrs_and_types) {
  att_kind kinds[3] = {CAUSAL, FULL, CROSS};
  for (int i = 0; i < 3; i++) {
    grad_nodes r = count_grads(kinds[i], 7);
    expect_counts(r, 1, 0, 0, 1);
    for (int j = 0; j < 4; j += 3) {
      cr_assert_eq(r.attrs[j].variant, kinds[i] == CAUSAL ? 1 : 0);
      cr_assert_eq(r.attrs[j].num_heads, 4);
      cr_assert_eq(r.attrs[j].num_kv_heads, 2);
      cr_assert_eq(r.attrs[j].head_dim, 4);
      cr_assert_eq(r.num_inputs[j], 4);
      cr_assert_eq(r.type[j].rank, 2);
      cr_assert_eq(r.type[j].shape[0], 3);
      cr_assert_eq(r.type[j].shape[1], 16);
    }
  }
}

/* ---------------------------------------------------------------- KV cache */

/* k and v caches [6, 8] (2 kv heads of 4), q [1, 16] (4 heads). `param` names the one
 * tensor that is a parameter: "q" feeds cached_attention, "new_kv" feeds cache_write. */
static mn_status build_cache_session(const char *param) {
  mn_graph *g = mn_graph_new();
  bool q_param = strcmp(param, "q") == 0;
  mn_node q = q_param ? mn_parameter(g, "q", MN_SHAPE(1, 16)) : mn_input(g, "q", MN_SHAPE(1, 16));
  mn_node new_kv =
      q_param ? mn_input(g, "new_kv", MN_SHAPE(1, 8)) : mn_parameter(g, "new_kv", MN_SHAPE(1, 8));
  mn_node kc = mn_input(g, "k_cache", MN_SHAPE(6, 8));
  mn_node vc = mn_input(g, "v_cache", MN_SHAPE(6, 8));
  mn_node pos = mn_input_u32(g, "kv_pos", MN_SHAPE(1));
  mn_node len = mn_input_u32(g, "kv_len", MN_SHAPE(1));
  mn_node kw = mn_cache_write(g, new_kv, kc, pos);
  mn_node y = mn_cached_attention(g, q, kw, vc, len, 4, 2, 4);
  mn_node loss = mn_sum_all(g, y);
  mn_set_outputs(g, &loss, 1);
  cr_assert_eq(mn_graph_status(g), MN_OK, "%s", mn_graph_error(g));
  mn_session_options so = mn_session_options_default();
  so.backend = MN_BACKEND_CPU;
  mn_session *s = NULL;
  mn_status st = mn_build_session(g, &so, &s);
  cr_assert_null(s);
  mn_graph_free(g);
  return st;
}

Test(grad_attention, cache_write_is_not_differentiable) {
  mn_assert_error(build_cache_session("new_kv"), MN_ERR_UNSUPPORTED, "(cache_write)");
}

Test(grad_attention, cached_attention_is_not_differentiable) {
  mn_assert_error(build_cache_session("q"), MN_ERR_UNSUPPORTED, "(cached_attention)");
}
