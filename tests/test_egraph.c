/* The e-graph core (optimizer/egraph.c): union-find, hash-consing, the congruence
 * rebuild, and extraction (optimizer/extract.c) over classes that refer to themselves. */
#include <stdlib.h>
#include <time.h>

#include "optimizer/egraph.h"
#include "optimizer/extract.h"
#include "tests/support/mn_test.h"

static mn_egraph eg;
static uint32_t f32_4;

static void setup(void) {
  cr_assert(eg_init(&eg, 16));
  mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){4}, 1);
  f32_4 = eg_intern_type(&eg, &t);
}

static void teardown(void) { eg_free(&eg); }

TestSuite(egraph, .init = setup, .fini = teardown);

static eg_node_key key(mn_op op, int n, const eg_id *kids, uint32_t type) {
  eg_node_key k;
  memset(&k, 0, sizeof k);
  k.op = op;
  k.num_kids = n;
  for (int i = 0; i < n; i++)
    k.kids[i] = kids[i];
  k.type = type;
  k.identity = EG_NONE;
  return k;
}

/* A named leaf: its identity keeps it apart from every other leaf. */
static eg_id leaf(uint32_t identity) {
  eg_node_key k = key(MN_OP_INPUT, 0, NULL, f32_4);
  k.identity = identity;
  return eg_add(&eg, &k);
}

static eg_id unary(mn_op op, eg_id x) {
  eg_node_key k = key(op, 1, &x, f32_4);
  return eg_add(&eg, &k);
}

static eg_id binary(mn_op op, eg_id a, eg_id b) {
  eg_node_key k = key(op, 2, (eg_id[]){a, b}, f32_4);
  return eg_add(&eg, &k);
}

static eg_id constant(const float *data) {
  eg_node_key k = key(MN_OP_CONSTANT, 0, NULL, f32_4);
  k.data = data;
  return eg_add(&eg, &k);
}

Test(egraph, types_are_interned) {
  mn_tensor_type a = mn_type_make(MN_F32, (int64_t[]){4}, 1);
  mn_tensor_type b = mn_type_make(MN_U32, (int64_t[]){4}, 1);
  mn_tensor_type c = mn_type_make(MN_F32, (int64_t[]){2, 2}, 2);
  cr_assert_eq(eg_intern_type(&eg, &a), f32_4);
  cr_assert_neq(eg_intern_type(&eg, &b), f32_4);
  cr_assert_neq(eg_intern_type(&eg, &c), f32_4);
  cr_assert_neq(eg_intern_type(&eg, &b), eg_intern_type(&eg, &c));
  /* Many types: the table grows and still finds each one. */
  uint32_t ids[600];
  for (int i = 0; i < 600; i++) {
    mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){i + 10, 3}, 2);
    ids[i] = eg_intern_type(&eg, &t);
  }
  for (int i = 0; i < 600; i++) {
    mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){i + 10, 3}, 2);
    cr_assert_eq(eg_intern_type(&eg, &t), ids[i]);
  }
}

Test(egraph, union_find) {
  eg_id a = leaf(0), b = leaf(1), c = leaf(2);
  cr_assert_neq(eg_find(&eg, a), eg_find(&eg, b));
  eg_id r = eg_union(&eg, a, b);
  cr_assert_eq(eg_find(&eg, a), r);
  cr_assert_eq(eg_find(&eg, b), r);
  cr_assert_neq(eg_find(&eg, c), r);
  size_t unions = eg.unions;
  cr_assert_eq(eg_union(&eg, b, a), r, "merging merged classes changes nothing");
  cr_assert_eq(eg.unions, unions);
  eg_union(&eg, c, a);
  cr_assert_eq(eg_find(&eg, c), eg_find(&eg, b));
  /* The merged class lists every node once. */
  size_t n = 0;
  EG_FOR_NODES(&eg, eg_find(&eg, a), id) n++;
  cr_assert_eq(n, 3);
}

Test(egraph, hashcons_finds_equal_nodes) {
  eg_id x = leaf(0), y = leaf(1);
  eg_id e1 = unary(MN_OP_EXP, x), e2 = unary(MN_OP_EXP, x);
  cr_assert_eq(e1, e2, "the same op over the same class is one node");
  cr_assert_neq(unary(MN_OP_EXP, y), e1);
  cr_assert_neq(unary(MN_OP_TANH, x), e1);
  cr_assert_neq(binary(MN_OP_ADD, x, y), binary(MN_OP_ADD, y, x), "inputs in order");
  size_t live = eg.live_nodes;
  binary(MN_OP_ADD, x, y);
  cr_assert_eq(eg.live_nodes, live);
  /* Two leaves of one type stay apart: each has an identity. */
  cr_assert_neq(leaf(5), leaf(6));
  cr_assert_eq(leaf(5), leaf(5));
}

Test(egraph, hashcons_compares_attributes_field_by_field) {
  eg_id x = leaf(0);
  eg_node_key k = key(MN_OP_SCALE, 1, &x, f32_4);
  k.attrs.scale = 2.0f;
  eg_id s2 = eg_add(&eg, &k);
  cr_assert_eq(eg_add(&eg, &k), s2);
  k.attrs.scale = 3.0f;
  cr_assert_neq(eg_add(&eg, &k), s2);
  k.attrs.scale = 0.0f;
  eg_id pz = eg_add(&eg, &k);
  k.attrs.scale = -0.0f;
  cr_assert_neq(eg_add(&eg, &k), pz, "-0.0 is another scale than +0.0");
  k.attrs.scale = 2.0f;
  k.attrs.variant = 1;
  cr_assert_neq(eg_add(&eg, &k), s2);
}

Test(egraph, constants_by_content) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {1, 2, 3, 5};
  eg_id ca = constant(a);
  cr_assert_eq(constant(b), ca, "equal contents are one constant");
  cr_assert_neq(constant(c), ca);
  cr_assert_eq(eg.classes[eg_find(&eg, ca)].const_node, ca);
}

Test(egraph, congruence_after_merge) {
  eg_id a = leaf(0), b = leaf(1);
  eg_id fa = unary(MN_OP_EXP, a), fb = unary(MN_OP_EXP, b);
  eg_id ga = binary(MN_OP_MUL, fa, a), gb = binary(MN_OP_MUL, fb, b);
  cr_assert_neq(eg_find(&eg, fa), eg_find(&eg, fb));
  size_t live = eg.live_nodes;
  eg_union(&eg, a, b);
  eg_rebuild(&eg);
  cr_assert_eq(eg_find(&eg, fa), eg_find(&eg, fb), "f(a) and f(b) are one class");
  cr_assert_eq(eg_find(&eg, ga), eg_find(&eg, gb), "and so are the nodes above them");
  cr_assert_eq(eg.live_nodes, live - 2, "the congruent duplicates retire");
  cr_assert_eq(eg.congruent, 2);
  /* A retired node points at the one that stayed; adding it again finds that one. */
  eg_id stayed = eg_resolve(&eg, fb);
  cr_assert(!eg.nodes[stayed].dead);
  cr_assert_eq(eg_find(&eg, unary(MN_OP_EXP, b)), eg_find(&eg, fa));
}

Test(egraph, congruence_propagates_up_a_chain) {
  enum { DEPTH = 200 };
  eg_id a = leaf(0), b = leaf(1), ta = a, tb = b;
  for (int i = 0; i < DEPTH; i++) {
    ta = unary(i % 2 ? MN_OP_EXP : MN_OP_NEG, ta);
    tb = unary(i % 2 ? MN_OP_EXP : MN_OP_NEG, tb);
  }
  eg_union(&eg, a, b);
  eg_rebuild(&eg);
  cr_assert_eq(eg_find(&eg, ta), eg_find(&eg, tb));
  cr_assert_eq(eg.live_nodes, 2 + DEPTH);
  cr_assert_eq(eg.num_work, 0);
}

Test(egraph, merge_refuses_different_types) {
  mn_tensor_type t = mn_type_make(MN_F32, (int64_t[]){2, 2}, 2);
  eg_node_key k = key(MN_OP_INPUT, 0, NULL, eg_intern_type(&eg, &t));
  k.identity = 9;
  eg_id other = eg_add(&eg, &k), x = leaf(0);
  eg_union(&eg, x, other);
  cr_assert(eg.type_clash);
  cr_assert_neq(eg_find(&eg, x), eg_find(&eg, other));
}

/* Merging n leaves pairwise under a wide, deep graph: the rebuild must touch each use
 * a bounded number of times, so 100k nodes take well under a second. */
Test(egraph, rebuild_is_near_linear) {
  enum { N = 50000 };
  eg_id *l = malloc(N * sizeof *l), *f = malloc(N * sizeof *f);
  for (int i = 0; i < N; i++) {
    l[i] = leaf((uint32_t)i);
    f[i] = unary(MN_OP_EXP, l[i]);
  }
  clock_t t0 = clock();
  for (int i = 1; i < N; i++)
    eg_union(&eg, l[0], l[i]);
  eg_rebuild(&eg);
  double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
  cr_assert_eq(eg_find(&eg, f[0]), eg_find(&eg, f[N - 1]));
  cr_assert_eq(eg.live_nodes, N + 1);
  cr_assert_lt(s, 1.0, "rebuild took %.3f s", s);
  free(l);
  free(f);
}

/* x * 1 merged with x makes a class that contains a node over itself; extraction must
 * take the leaf, never the cycle, and the emitted graph is x -> exp. */
Test(egraph, extraction_never_picks_a_cycle) {
  float ones[4] = {1, 1, 1, 1};
  eg_id x = leaf(0), one = constant(ones);
  eg_id m = binary(MN_OP_MUL, x, one);
  eg_id e = unary(MN_OP_EXP, m);
  eg_union(&eg, m, x);
  eg_rebuild(&eg);
  eg_id *best = malloc(eg.num_nodes * sizeof *best);
  cr_assert_eq(mn_extract(&eg, best), MN_OK);
  eg_id cx = eg_find(&eg, x);
  cr_assert_eq(best[cx], x, "the class of x and x*1 extracts to x");
  cr_assert_eq(best[eg_find(&eg, e)], e);

  /* The same through the emitter, from the graph those nodes stand for. */
  mn_graph *g = mn_graph_new();
  mn_node gx = mn_input(g, "x", MN_SHAPE(4));
  mn_node gone = mn_constant(g, ones, MN_SHAPE(4));
  mn_node ge = mn_exp(g, mn_mul(g, gx, gone));
  mn_set_outputs(g, &ge, 1);
  eg_id orig[4] = {x, one, m, e};
  eg.classes[eg_find(&eg, e)].pinned = e;
  mn_graph *out = NULL;
  cr_assert_eq(mn_emit_graph(&eg, best, g, orig, &out), MN_OK, "%s", mn_last_error());
  cr_assert_eq(out->num_nodes, 2, "x and exp(x): the constant and the mul are gone");
  cr_assert_eq(out->nodes[0].op, MN_OP_INPUT);
  cr_assert_str_eq(out->nodes[0].name, "x");
  cr_assert_eq(out->nodes[1].op, MN_OP_EXP);
  cr_assert_eq(out->nodes[1].inputs[0], 0);
  cr_assert_eq(out->outputs[0], 1);
  mn_graph_free(out);
  mn_graph_free(g);
  free(best);
}

/* A pinned class (a graph output) extracts to its pinned node even when the class
 * holds something cheaper. */
Test(egraph, extraction_keeps_pinned_nodes) {
  eg_id x = leaf(0);
  eg_id nn = unary(MN_OP_NEG, unary(MN_OP_NEG, x));
  eg_id top = unary(MN_OP_EXP, nn);
  eg_union(&eg, nn, x);
  eg_rebuild(&eg);
  eg_id *best = malloc(eg.num_nodes * sizeof *best);
  cr_assert_eq(mn_extract(&eg, best), MN_OK);
  cr_assert_eq(best[eg_find(&eg, x)], x);
  cr_assert_eq(best[eg_find(&eg, top)], top);
  /* Now the class of x is an output pinned to neg(neg(x)): that node is cyclic (its
   * input is the class itself), so the pin cannot hold and extraction relaxes it. */
  eg.classes[eg_find(&eg, x)].pinned = nn;
  cr_assert_eq(mn_extract(&eg, best), MN_OK);
  cr_assert_eq(best[eg_find(&eg, x)], x);
  free(best);
}
