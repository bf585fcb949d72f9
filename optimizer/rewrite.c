#include "optimizer/rewrite.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/error.h"

/* A pattern compiled to pre-order entries: an operator entry's inputs are entries after
 * it, so a matcher that walks the array in order always knows an entry's class (its
 * parent, matched earlier, assigned it). */
typedef struct pat_entry {
  int var;  /* variable index, or -1 for an operator */
  int pred; /* predicate index, or -1 */
  mn_op op;
  int num_kids;
  int kids[MN_MAX_INPUTS];
} pat_entry;

typedef struct pattern {
  pat_entry e[MN_PAT_MAX_ENTRIES];
  int n;
} pattern;

typedef struct compiled_rule {
  const mn_rule *rule;
  pattern lhs, rhs;
  bool ok;
} compiled_rule;

static compiled_rule compiled[MN_MAX_RULES];
static size_t num_compiled;
static uint8_t rules_by_op[MN_OP_COUNT][MN_MAX_RULES]; /* pattern rules by root op */
static uint8_t num_by_op[MN_OP_COUNT];
static char compile_error[256];
static pthread_once_t compile_once = PTHREAD_ONCE_INIT;

typedef struct parser {
  const char *s;
  size_t pos;
  char names[MN_PAT_MAX_VARS][16];
  int num_vars;
  bool define; /* the pattern side: variables are introduced; the replacement only uses */
  const char *err;
} parser;

static void skip_space(parser *p) {
  while (p->s[p->pos] == ' ')
    p->pos++;
}

static size_t read_word(parser *p, char *out, size_t size) {
  size_t n = 0;
  for (char c = p->s[p->pos];
       (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; c = p->s[++p->pos])
    if (n + 1 < size) out[n++] = c;
  out[n] = '\0';
  return n;
}

static int parse_var(parser *p, pattern *out) {
  char name[16], pred[16] = "";
  p->pos++;
  if (!read_word(p, name, sizeof name)) return p->err = "variable without a name", -1;
  if (p->s[p->pos] == ':') {
    p->pos++;
    if (!read_word(p, pred, sizeof pred)) return p->err = "predicate without a name", -1;
  }
  int var = -1;
  for (int i = 0; i < p->num_vars; i++)
    if (strcmp(p->names[i], name) == 0) var = i;
  if (var < 0) {
    if (!p->define) return p->err = "replacement uses a variable the pattern does not bind", -1;
    if (p->num_vars == MN_PAT_MAX_VARS) return p->err = "too many variables", -1;
    var = p->num_vars++;
    snprintf(p->names[var], sizeof p->names[var], "%s", name);
  }
  int pi = -1;
  if (pred[0]) {
    size_t np;
    const mn_rule_predicate *preds = mn_rule_predicates(&np);
    for (size_t i = 0; i < np; i++)
      if (strcmp(preds[i].name, pred) == 0) pi = (int)i;
    if (pi < 0) return p->err = "unknown predicate", -1;
  }
  if (out->n == MN_PAT_MAX_ENTRIES) return p->err = "pattern too large", -1;
  out->e[out->n] = (pat_entry){.var = var, .pred = pi};
  return out->n++;
}

static int parse_entry(parser *p, pattern *out) {
  skip_space(p);
  if (p->s[p->pos] == '?') return parse_var(p, out);
  if (p->s[p->pos] != '(') return p->err = "expected '(' or '?'", -1;
  p->pos++;
  char name[40];
  read_word(p, name, sizeof name);
  int op = -1;
  for (int i = 0; i < MN_OP_COUNT; i++)
    if (strcmp(mn_op_table[i].name, name) == 0) op = i;
  if (op < 0) return p->err = "unknown op", -1;
  if (out->n == MN_PAT_MAX_ENTRIES) return p->err = "pattern too large", -1;
  int idx = out->n++;
  out->e[idx] = (pat_entry){.var = -1, .pred = -1, .op = (mn_op)op};
  for (;;) {
    skip_space(p);
    if (p->s[p->pos] == ')') break;
    if (!p->s[p->pos]) return p->err = "missing ')'", -1;
    if (out->e[idx].num_kids == MN_MAX_INPUTS) return p->err = "too many inputs", -1;
    int kid = parse_entry(p, out);
    if (kid < 0) return -1;
    out->e[idx].kids[out->e[idx].num_kids++] = kid;
  }
  p->pos++;
  if (mn_op_table[op].arity != out->e[idx].num_kids) return p->err = "wrong number of inputs", -1;
  return idx;
}

static bool parse_pattern(parser *p, const char *text, pattern *out) {
  p->s = text;
  p->pos = 0;
  out->n = 0;
  if (parse_entry(p, out) < 0) return false;
  skip_space(p);
  if (p->s[p->pos]) return p->err = "text after the pattern", false;
  return true;
}

static void compile_rules(void) {
  size_t n;
  const mn_rule *table = mn_rule_table(&n);
  if (n > MN_MAX_RULES) {
    snprintf(compile_error, sizeof compile_error, "%zu rules, at most %d", n, MN_MAX_RULES);
    n = MN_MAX_RULES;
  }
  for (size_t i = 0; i < n; i++) {
    compiled_rule *c = &compiled[i];
    c->rule = &table[i];
    if (table[i].custom) {
      c->ok = true;
      continue;
    }
    parser p = {.define = true};
    bool ok = table[i].lhs && table[i].rhs && parse_pattern(&p, table[i].lhs, &c->lhs);
    if (ok && c->lhs.e[0].var >= 0) ok = (p.err = "the pattern's root must be an op", false);
    p.define = false;
    ok = ok && parse_pattern(&p, table[i].rhs, &c->rhs);
    if (!ok) {
      if (!compile_error[0])
        snprintf(compile_error, sizeof compile_error, "rule \"%s\": %s at offset %zu",
                 table[i].name, p.err ? p.err : "no pattern", p.pos);
      continue;
    }
    c->ok = true;
    mn_op root = c->lhs.e[0].op;
    rules_by_op[root][num_by_op[root]++] = (uint8_t)i;
  }
  num_compiled = n;
}

const char *mn_rules_compile_error(void) {
  pthread_once(&compile_once, compile_rules);
  return compile_error[0] ? compile_error : NULL;
}

/* ---- matching */

typedef struct found {
  uint32_t rule;
  mn_match m;
} found;

typedef struct matcher {
  mn_egraph *eg;
  const compiled_rule *cr;
  uint32_t rule;
  mn_match m;
  eg_id cls[MN_PAT_MAX_ENTRIES];
  found *list;
  size_t n, cap, max;
  bool full, oom;
} matcher;

static void emit(matcher *mt) {
  if (mt->cr->rule->cond && !mt->cr->rule->cond(mt->eg, &mt->m)) return;
  if (mt->n == mt->max) {
    mt->full = true;
    return;
  }
  if (mt->n == mt->cap) {
    size_t cap = mt->cap ? 2 * mt->cap : 256;
    found *l = realloc(mt->list, cap * sizeof *l);
    if (!l) {
      mt->oom = true;
      return;
    }
    mt->list = l;
    mt->cap = cap;
  }
  mt->list[mt->n++] = (found){.rule = mt->rule, .m = mt->m};
}

static void match_entry(matcher *mt, int pi) {
  const pattern *p = &mt->cr->lhs;
  if (mt->full || mt->oom) return;
  if (pi == p->n) {
    emit(mt);
    return;
  }
  const pat_entry *e = &p->e[pi];
  mn_egraph *eg = mt->eg;
  eg_id c = eg_find(eg, mt->cls[pi]);
  if (e->var >= 0) {
    size_t np;
    if (e->pred >= 0 && !mn_rule_predicates(&np)[e->pred].fn(eg, c)) return;
    eg_id old = mt->m.vars[e->var];
    if (old != EG_NONE && eg_find(eg, old) != c) return;
    mt->m.vars[e->var] = c;
    match_entry(mt, pi + 1);
    mt->m.vars[e->var] = old;
    return;
  }
  EG_FOR_NODES(eg, c, id) {
    const eg_node *n = &eg->nodes[id];
    if (n->dead || n->op != e->op || n->num_kids != e->num_kids) continue;
    mt->m.nodes[pi] = id;
    for (int k = 0; k < e->num_kids; k++)
      mt->cls[e->kids[k]] = n->kids[k];
    match_entry(mt, pi + 1);
  }
}

/* Every match of rule `r` rooted at node `id` (both input orders for commutative roots). */
static void match_root(matcher *mt, uint32_t r, eg_id id) {
  const compiled_rule *cr = &compiled[r];
  const eg_node *n = &mt->eg->nodes[id];
  const pat_entry *root = &cr->lhs.e[0];
  if (n->num_kids != root->num_kids) return;
  int orders = (cr->rule->flags & MN_RULE_COMMUTE) && n->num_kids == 2 ? 2 : 1;
  for (int o = 0; o < orders; o++) {
    mt->cr = cr;
    mt->rule = r;
    memset(&mt->m, 0, sizeof mt->m);
    for (int v = 0; v < MN_PAT_MAX_VARS; v++)
      mt->m.vars[v] = EG_NONE;
    mt->m.root = id;
    mt->m.nodes[0] = id;
    for (int k = 0; k < n->num_kids; k++)
      mt->cls[root->kids[k]] = n->kids[o ? n->num_kids - 1 - k : k];
    match_entry(mt, 1);
  }
}

/* ---- applying */

/* Types of the replacement's entries; false when a pointwise node's inputs would not all
 * have its type, or an inner non-pointwise op has no type to take. */
static bool rhs_types(mn_egraph *eg, const compiled_rule *cr, const mn_match *m, int entry,
                      uint32_t root_type, uint32_t *types) {
  const pat_entry *e = &cr->rhs.e[entry];
  if (e->var >= 0) {
    types[entry] = eg->classes[eg_find(eg, m->vars[e->var])].type;
    return entry != 0 || types[entry] == root_type;
  }
  for (int k = 0; k < e->num_kids; k++)
    if (!rhs_types(eg, cr, m, e->kids[k], root_type, types)) return false;
  bool pointwise = (mn_op_flags(e->op) & MN_OPF_POINTWISE) != 0;
  if (entry != 0 && (!pointwise || e->num_kids == 0)) return false;
  types[entry] = entry == 0 ? root_type : types[e->kids[0]];
  for (int k = 0; pointwise && k < e->num_kids; k++)
    if (types[e->kids[k]] != types[entry]) return false;
  return true;
}

static eg_id build_rhs(mn_egraph *eg, const compiled_rule *cr, const mn_match *m, int entry,
                       const uint32_t *types) {
  const pat_entry *e = &cr->rhs.e[entry];
  if (e->var >= 0) return m->vars[e->var];
  eg_node_key k;
  memset(&k, 0, sizeof k);
  k.op = e->op;
  k.num_kids = e->num_kids;
  for (int i = 0; i < e->num_kids; i++)
    if ((k.kids[i] = build_rhs(eg, cr, m, e->kids[i], types)) == EG_NONE) return EG_NONE;
  k.type = types[entry];
  k.identity = EG_NONE;
  if (cr->rule->attrs) cr->rule->attrs(eg, m, entry, &k.attrs);
  return eg_add(eg, &k);
}

static bool runs_in_stage(const mn_rule *r, const mn_saturate_limits *lim) {
  return lim->full_stage || !(r->flags & MN_RULE_FULL_ONLY);
}

static bool may_rewrite(mn_egraph *eg, const mn_rule *r, eg_id node) {
  return eg->classes[eg_find(eg, node)].pinned == EG_NONE || (r->flags & MN_RULE_OUTPUT_OK);
}

/* Merges node's class with the derived value's; counts the rule when they differed. */
static mn_status merge(mn_egraph *eg, uint32_t r, eg_id node, eg_id derived,
                       mn_saturate_result *res) {
  if (derived == EG_NONE) return eg->oom ? MN_ERR_OUT_OF_MEMORY : MN_OK;
  if (eg_find(eg, node) == eg_find(eg, derived)) return MN_OK;
  eg_union(eg, node, derived);
  if (eg->type_clash)
    return mn_fail(MN_ERR_STATE, "optimizer: rule \"%s\" equated values of different types",
                   compiled[r].rule->name);
  res->fired[r]++;
  return eg->oom ? MN_ERR_OUT_OF_MEMORY : MN_OK;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static mn_status run_iteration(mn_egraph *eg, matcher *mt, const mn_saturate_limits *lim,
                               double deadline, mn_saturate_result *res) {
  size_t snapshot = eg->num_nodes;
  mt->n = 0;
  for (size_t id = 0; id < snapshot && !mt->full && !mt->oom; id++) {
    const eg_node *n = &eg->nodes[id];
    if (n->dead) continue;
    for (uint8_t i = 0; i < num_by_op[n->op]; i++) {
      uint32_t r = rules_by_op[n->op][i];
      if (runs_in_stage(compiled[r].rule, lim) && may_rewrite(eg, compiled[r].rule, (eg_id)id))
        match_root(mt, r, (eg_id)id);
    }
    if ((id & 255) == 255 && now_ms() > deadline) {
      res->hit_time_limit = true;
      break;
    }
  }
  if (mt->oom) return MN_ERR_OUT_OF_MEMORY;
  if (mt->full) res->hit_node_limit = true;
  for (size_t i = 0; i < mt->n; i++) {
    if (eg->num_nodes >= lim->max_nodes) return res->hit_node_limit = true, MN_OK;
    const found *f = &mt->list[i];
    const compiled_rule *cr = &compiled[f->rule];
    if (!may_rewrite(eg, cr->rule, f->m.root)) continue;
    uint32_t types[MN_PAT_MAX_ENTRIES];
    uint32_t root_type = eg->classes[eg_find(eg, f->m.root)].type;
    if (!rhs_types(eg, cr, &f->m, 0, root_type, types)) continue;
    mn_status st = merge(eg, f->rule, f->m.root, build_rhs(eg, cr, &f->m, 0, types), res);
    if (st != MN_OK) return st;
  }
  for (size_t r = 0; r < num_compiled; r++) {
    const mn_rule *rule = compiled[r].rule;
    if (!rule->custom || !runs_in_stage(rule, lim)) continue;
    for (size_t id = 0; id < snapshot; id++) {
      if (eg->num_nodes >= lim->max_nodes) return res->hit_node_limit = true, MN_OK;
      if (eg->nodes[id].dead || !may_rewrite(eg, rule, (eg_id)id)) continue;
      mn_status st = merge(eg, (uint32_t)r, (eg_id)id, rule->custom(eg, (eg_id)id), res);
      if (st != MN_OK) return st;
    }
  }
  return MN_OK;
}

mn_status mn_saturate(mn_egraph *eg, const mn_saturate_limits *lim, mn_saturate_result *res) {
  pthread_once(&compile_once, compile_rules);
  memset(res, 0, sizeof *res);
  double deadline = now_ms() + lim->max_ms;
  matcher mt = {.eg = eg, .max = lim->max_nodes > 1024 ? 4 * lim->max_nodes : 4096};
  mn_status st = MN_OK;
  eg_rebuild(eg);
  while (st == MN_OK) {
    if (res->iterations >= lim->max_iterations) {
      res->hit_iteration_limit = true;
      break;
    }
    size_t unions = eg->unions, nodes = eg->num_nodes;
    st = run_iteration(eg, &mt, lim, deadline, res);
    eg_rebuild(eg);
    if (eg->oom) st = MN_ERR_OUT_OF_MEMORY;
    res->iterations++;
    if (st != MN_OK || res->hit_node_limit || res->hit_time_limit) break;
    if (eg->unions == unions && eg->num_nodes == nodes) {
      res->saturated = true;
      break;
    }
    if (now_ms() > deadline) res->hit_time_limit = true;
    if (res->hit_time_limit) break;
  }
  free(mt.list);
  if (st == MN_ERR_OUT_OF_MEMORY) return mn_fail(st, "optimizer: out of memory saturating rules");
  return st;
}
