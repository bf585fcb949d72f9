/* Rewrite rules as data. A rule is a row: a name, a left-hand pattern, a right-hand
 * replacement and optional hooks (a side condition, the attributes of the nodes it
 * builds). Adding a rule is adding a row to the table in rules.c (plus, when needed, a
 * condition function); the engine in rewrite.c compiles, matches and applies them.
 *
 * Pattern syntax (s-expressions):
 *   (op p1 p2 ..)  a node of op (its printable name in host/ops.h) over sub-patterns
 *   ?x             a variable: any class; the same name twice must be the same class
 *   ?x:pred        a variable whose class satisfies a predicate (see mn_rule_predicates)
 * The replacement uses the same syntax, its variables bound by the pattern. A built
 * node's type is the matched root's (for the replacement's root) or its first input's
 * (inner nodes, pointwise ops only); pointwise nodes whose inputs do not all have that
 * type are never built, so a rule cannot change a shape or a dtype. */
#ifndef MN_OPTIMIZER_RULES_H
#define MN_OPTIMIZER_RULES_H

#include "optimizer/egraph.h"

#define MN_PAT_MAX_ENTRIES 8
#define MN_PAT_MAX_VARS    4
#define MN_MAX_RULES       32

enum {
  MN_RULE_COMMUTE = 1 << 0,   /* the root is commutative: also match its two inputs swapped */
  MN_RULE_OUTPUT_OK = 1 << 1, /* may rewrite a class holding a graph output (default: never) */
  /* Runs only in the optimizer's full stage (after autodiff): the rule builds an op that has
   * no VJP rule, which the forward graph autodiff differentiates must not hold. */
  MN_RULE_FULL_ONLY = 1 << 2,
};

/* One match of a rule's pattern: the root node, the class bound to each variable and
 * the node matched at each operator entry of the pattern (in pre-order). */
typedef struct mn_match {
  eg_id root;
  eg_id vars[MN_PAT_MAX_VARS];
  eg_id nodes[MN_PAT_MAX_ENTRIES];
} mn_match;

typedef bool (*mn_rule_cond)(mn_egraph *eg, const mn_match *m);
/* Attributes of the replacement's operator entry `entry` (pre-order; 0 is its root). */
typedef void (*mn_rule_attrs)(mn_egraph *eg, const mn_match *m, int entry, mn_op_attrs *out);
/* A rule written as code (no pattern): derives an equal value for node `node` and
 * returns the id of the node it added, or EG_NONE. */
typedef eg_id (*mn_rule_custom)(mn_egraph *eg, eg_id node);

typedef struct mn_rule {
  const char *name;
  const char *lhs, *rhs;
  mn_rule_cond cond;     /* NULL: always */
  mn_rule_attrs attrs;   /* NULL: zero attributes */
  mn_rule_custom custom; /* instead of lhs/rhs */
  unsigned flags;
} mn_rule;

typedef bool (*mn_class_pred)(mn_egraph *eg, eg_id cls);
typedef struct mn_rule_predicate {
  const char *name;
  mn_class_pred fn;
} mn_rule_predicate;

/* The rule table and the predicates patterns may name. */
const mn_rule *mn_rule_table(size_t *count);
const mn_rule_predicate *mn_rule_predicates(size_t *count);

/* Largest result (elements) that constant folding computes at build time. */
#define MN_FOLD_MAX_ELEMS 4096

#endif
