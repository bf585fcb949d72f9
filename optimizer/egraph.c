#include "optimizer/egraph.h"

#include <stdlib.h>
#include <string.h>

#define EG_TOMB   UINT32_MAX
#define EG_NO_USE UINT32_MAX

static uint64_t mix(uint64_t h, uint64_t v) {
  h = (h ^ v) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

uint64_t eg_hash_floats(const float *data, size_t n) {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (size_t i = 0; i < n; i++)
    h = mix(h, f32_bits(data[i]));
  return mix(h, n);
}

/* Attributes field by field (never the struct's bytes: padding is unspecified); floats
 * by their bits, so that hash and equality agree for every value. */
static uint64_t attrs_hash(uint64_t h, const mn_op_attrs *a) {
  h = mix(h, f32_bits(a->scale));
  h = mix(h, f32_bits(a->eps));
  h = mix(h, f32_bits(a->theta));
  h = mix(h, (uint64_t)(uint32_t)a->pos_offset);
  h = mix(h, (uint64_t)(uint32_t)a->head_dim);
  h = mix(h, (uint64_t)(uint32_t)a->num_heads);
  h = mix(h, (uint64_t)(uint32_t)a->num_kv_heads);
  h = mix(h, (uint64_t)(uint32_t)a->stride);
  h = mix(h, (uint64_t)(uint32_t)a->padding);
  h = mix(h, (uint64_t)(uint32_t)a->groups);
  h = mix(h, (uint64_t)(uint32_t)a->channels_a);
  h = mix(h, (uint64_t)(uint32_t)a->variant);
  h = mix(h, (uint64_t)(uint32_t)a->act);
  h = mix(h, (uint64_t)a->num_rows);
  return mix(h, (uint64_t)a->seed);
}

static bool attrs_equal(const mn_op_attrs *a, const mn_op_attrs *b) {
  return f32_bits(a->scale) == f32_bits(b->scale) && f32_bits(a->eps) == f32_bits(b->eps) &&
         f32_bits(a->theta) == f32_bits(b->theta) && a->pos_offset == b->pos_offset &&
         a->head_dim == b->head_dim && a->num_heads == b->num_heads &&
         a->num_kv_heads == b->num_kv_heads && a->stride == b->stride && a->padding == b->padding &&
         a->groups == b->groups && a->channels_a == b->channels_a && a->variant == b->variant &&
         a->act == b->act && a->num_rows == b->num_rows && a->seed == b->seed;
}

static uint64_t prog_hash(const mn_fused_prog *p) {
  uint64_t h = mix(0x452821E638D01377ull, (uint64_t)p->num_instrs);
  for (int i = 0; i < p->num_instrs; i++) {
    const mn_fused_instr *in = &p->instrs[i];
    h = mix(h, (uint64_t)in->op);
    h = mix(h, f32_bits(in->scale));
    for (int k = 0; k < MN_FUSED_MAX_ARGS; k++)
      h = mix(h, in->args[k]);
  }
  return h;
}

static uint64_t node_hash(const eg_node *n) {
  uint64_t h = mix(0x13198A2E03707344ull, (uint64_t)n->op);
  h = mix(h, (uint64_t)n->num_kids);
  for (int i = 0; i < n->num_kids; i++)
    h = mix(h, n->kids[i]);
  h = mix(h, n->type);
  h = mix(h, n->identity);
  h = mix(h, n->data_hash);
  return attrs_hash(h, &n->attrs);
}

static bool node_equal(const mn_egraph *eg, const eg_node *a, const eg_node *b) {
  if (a->op != b->op || a->num_kids != b->num_kids || a->type != b->type ||
      a->identity != b->identity || a->data_hash != b->data_hash)
    return false;
  for (int i = 0; i < a->num_kids; i++)
    if (a->kids[i] != b->kids[i]) return false;
  if (!attrs_equal(&a->attrs, &b->attrs)) return false;
  if (!mn_fused_prog_equal(a->fused, b->fused)) return false;
  if ((a->data == NULL) != (b->data == NULL)) return false;
  if (!a->data || a->data == b->data) return true;
  size_t n = (size_t)mn_tensor_type_numel(&eg->types[a->type]);
  return memcmp(a->data, b->data, n * sizeof(float)) == 0;
}

static uint64_t type_hash(const mn_tensor_type *t) {
  uint64_t h = mix(0xA4093822299F31D0ull, (uint64_t)t->dtype);
  h = mix(h, (uint64_t)t->rank);
  for (int i = 0; i < t->rank; i++)
    h = mix(h, (uint64_t)t->shape[i]);
  return h;
}

static bool type_equal(const mn_tensor_type *a, const mn_tensor_type *b) {
  return a->dtype == b->dtype && mn_type_same_shape(a, b);
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 16;
  while (c < need)
    c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

bool eg_init(mn_egraph *eg, size_t expected_nodes) {
  memset(eg, 0, sizeof *eg);
  size_t cap = expected_nodes < 64 ? 64 : expected_nodes;
  eg->nodes = malloc(cap * sizeof *eg->nodes);
  eg->classes = malloc(cap * sizeof *eg->classes);
  eg->stamp = calloc(cap, sizeof *eg->stamp);
  eg->cmark = calloc(cap, sizeof *eg->cmark);
  eg->cap_nodes = cap;
  eg->table_cap = 64;
  while (eg->table_cap < 4 * cap)
    eg->table_cap *= 2;
  eg->table = calloc(eg->table_cap, sizeof *eg->table);
  eg->type_table_cap = 256;
  eg->type_table = calloc(eg->type_table_cap, sizeof *eg->type_table);
  if (!eg->nodes || !eg->classes || !eg->stamp || !eg->cmark || !eg->table || !eg->type_table) {
    eg_free(eg);
    return false;
  }
  return true;
}

void eg_free(mn_egraph *eg) {
  for (size_t i = 0; i < eg->num_owned; i++)
    free(eg->owned[i]);
  free(eg->owned);
  free(eg->nodes);
  free(eg->classes);
  free(eg->uses);
  free(eg->types);
  free(eg->type_table);
  free(eg->table);
  free(eg->worklist);
  free(eg->scratch);
  free(eg->stamp);
  free(eg->cmark);
  free(eg->tmp);
  memset(eg, 0, sizeof *eg);
}

bool eg_own_data(mn_egraph *eg, float *data) {
  if (!grow((void **)&eg->owned, &eg->cap_owned, eg->num_owned + 1, sizeof *eg->owned)) {
    free(data);
    eg->oom = true;
    return false;
  }
  eg->owned[eg->num_owned++] = data;
  return true;
}

uint32_t eg_intern_type(mn_egraph *eg, const mn_tensor_type *t) {
  if (2 * (eg->num_types + 1) > eg->type_table_cap) {
    size_t cap = eg->type_table_cap * 2;
    uint32_t *tab = calloc(cap, sizeof *tab);
    if (!tab) return eg->oom = true, UINT32_MAX;
    for (size_t i = 0; i < eg->num_types; i++) {
      size_t s = type_hash(&eg->types[i]) & (cap - 1);
      while (tab[s])
        s = (s + 1) & (cap - 1);
      tab[s] = (uint32_t)i + 1;
    }
    free(eg->type_table);
    eg->type_table = tab;
    eg->type_table_cap = cap;
  }
  size_t mask = eg->type_table_cap - 1, s = type_hash(t) & mask;
  for (; eg->type_table[s]; s = (s + 1) & mask)
    if (type_equal(&eg->types[eg->type_table[s] - 1], t)) return eg->type_table[s] - 1;
  if (!grow((void **)&eg->types, &eg->cap_types, eg->num_types + 1, sizeof *eg->types))
    return eg->oom = true, UINT32_MAX;
  mn_tensor_type copy;
  memset(&copy, 0, sizeof copy);
  copy.dtype = t->dtype;
  copy.rank = t->rank;
  for (int i = 0; i < t->rank; i++)
    copy.shape[i] = t->shape[i];
  eg->types[eg->num_types] = copy;
  eg->type_table[s] = (uint32_t)eg->num_types + 1;
  return (uint32_t)eg->num_types++;
}

/* ---- the hash-cons table: linear probing over node ids (+1), with tombstones */

static eg_id table_lookup(const mn_egraph *eg, const eg_node *n, uint64_t h) {
  size_t mask = eg->table_cap - 1;
  for (size_t s = h & mask; eg->table[s]; s = (s + 1) & mask) {
    uint32_t e = eg->table[s];
    if (e != EG_TOMB && node_equal(eg, &eg->nodes[e - 1], n)) return e - 1;
  }
  return EG_NONE;
}

static bool table_grow(mn_egraph *eg) {
  size_t cap = 64;
  while (cap < 4 * (eg->table_live + 1))
    cap *= 2;
  uint32_t *tab = calloc(cap, sizeof *tab);
  if (!tab) return false;
  for (size_t i = 0; i < eg->table_cap; i++) {
    uint32_t e = eg->table[i];
    if (!e || e == EG_TOMB) continue;
    size_t s = node_hash(&eg->nodes[e - 1]) & (cap - 1);
    while (tab[s])
      s = (s + 1) & (cap - 1);
    tab[s] = e;
  }
  free(eg->table);
  eg->table = tab;
  eg->table_cap = cap;
  eg->table_used = eg->table_live;
  return true;
}

static bool table_insert(mn_egraph *eg, eg_id id, uint64_t h) {
  if (2 * (eg->table_used + 1) > eg->table_cap && !table_grow(eg)) return eg->oom = true, false;
  size_t mask = eg->table_cap - 1, s = h & mask;
  while (eg->table[s] && eg->table[s] != EG_TOMB)
    s = (s + 1) & mask;
  if (!eg->table[s]) eg->table_used++;
  eg->table[s] = id + 1;
  eg->table_live++;
  eg->nodes[id].in_table = true;
  return true;
}

static void table_remove(mn_egraph *eg, eg_id id) {
  size_t mask = eg->table_cap - 1;
  for (size_t s = node_hash(&eg->nodes[id]) & mask; eg->table[s]; s = (s + 1) & mask) {
    if (eg->table[s] != id + 1) continue;
    eg->table[s] = EG_TOMB;
    eg->table_live--;
    break;
  }
  eg->nodes[id].in_table = false;
}

/* ---- nodes, classes, uses */

static void link_use(mn_egraph *eg, eg_id cls, uint32_t u) {
  eg_class *c = &eg->classes[cls];
  eg->uses[u].next = EG_NO_USE;
  if (c->last_use == EG_NO_USE)
    c->first_use = u;
  else
    eg->uses[c->last_use].next = u;
  c->last_use = u;
}

static bool add_use(mn_egraph *eg, eg_id cls, eg_id node) {
  if (!grow((void **)&eg->uses, &eg->cap_uses, eg->num_uses + 1, sizeof *eg->uses))
    return eg->oom = true, false;
  eg->uses[eg->num_uses].node = node;
  link_use(eg, cls, (uint32_t)eg->num_uses++);
  return true;
}

static bool grow_nodes(mn_egraph *eg) {
  if (eg->num_nodes < eg->cap_nodes) return true;
  size_t cap = eg->cap_nodes * 2;
  eg_node *n = realloc(eg->nodes, cap * sizeof *n);
  if (n) eg->nodes = n;
  eg_class *c = realloc(eg->classes, cap * sizeof *c);
  if (c) eg->classes = c;
  uint32_t *st = realloc(eg->stamp, cap * sizeof *st);
  if (st) {
    memset(st + eg->cap_nodes, 0, (cap - eg->cap_nodes) * sizeof *st);
    eg->stamp = st;
  }
  uint32_t *cm = realloc(eg->cmark, cap * sizeof *cm);
  if (cm) {
    memset(cm + eg->cap_nodes, 0, (cap - eg->cap_nodes) * sizeof *cm);
    eg->cmark = cm;
  }
  if (!n || !c || !st || !cm) return false;
  eg->cap_nodes = cap;
  return true;
}

eg_id eg_add(mn_egraph *eg, const eg_node_key *k) {
  if (eg->oom) return EG_NONE;
  eg_node n;
  memset(&n, 0, sizeof n);
  n.op = k->op;
  n.num_kids = k->num_kids;
  for (int i = 0; i < k->num_kids; i++)
    n.kids[i] = eg_find(eg, k->kids[i]);
  n.type = k->type;
  n.attrs = k->attrs;
  n.identity = k->identity;
  n.data = k->data;
  n.fused = k->fused;
  if (k->data)
    n.data_hash = eg_hash_floats(k->data, (size_t)mn_tensor_type_numel(&eg->types[k->type]));
  else if (k->fused)
    n.data_hash = prog_hash(k->fused);
  uint64_t h = node_hash(&n);
  eg_id found = table_lookup(eg, &n, h);
  if (found != EG_NONE) return found;
  if (!grow_nodes(eg)) return eg->oom = true, EG_NONE;
  eg_id id = (eg_id)eg->num_nodes++;
  n.next_in_class = EG_NONE;
  n.replaced_by = EG_NONE;
  eg->nodes[id] = n;
  eg->classes[id] = (eg_class){.parent = id,
                               .size = 1,
                               .first_node = id,
                               .last_node = id,
                               .first_use = EG_NO_USE,
                               .last_use = EG_NO_USE,
                               .type = n.type,
                               .const_node = n.op == MN_OP_CONSTANT ? id : EG_NONE,
                               .pinned = EG_NONE};
  eg->live_nodes++;
  if (!table_insert(eg, id, h)) return EG_NONE;
  for (int i = 0; i < n.num_kids; i++) {
    bool repeated = false;
    for (int j = 0; j < i; j++)
      repeated |= n.kids[j] == n.kids[i];
    if (!repeated && !add_use(eg, n.kids[i], id)) return EG_NONE;
  }
  return id;
}

eg_id eg_union(mn_egraph *eg, eg_id a, eg_id b) {
  a = eg_find(eg, a);
  b = eg_find(eg, b);
  if (a == b) return a;
  if (eg->classes[a].type != eg->classes[b].type) {
    eg->type_clash = true;
    return a;
  }
  if (eg->classes[a].size < eg->classes[b].size) {
    eg_id t = a;
    a = b;
    b = t;
  }
  eg_class *A = &eg->classes[a], *B = &eg->classes[b];
  B->parent = a;
  A->size += B->size;
  eg->nodes[A->last_node].next_in_class = B->first_node;
  A->last_node = B->last_node;
  if (B->first_use != EG_NO_USE) {
    if (A->first_use == EG_NO_USE)
      A->first_use = B->first_use;
    else
      eg->uses[A->last_use].next = B->first_use;
    A->last_use = B->last_use;
  }
  if (A->const_node == EG_NONE) A->const_node = B->const_node;
  if (A->pinned == EG_NONE) A->pinned = B->pinned;
  eg->unions++;
  if (!grow((void **)&eg->worklist, &eg->cap_work, eg->num_work + 1, sizeof *eg->worklist))
    eg->oom = true;
  else
    eg->worklist[eg->num_work++] = a;
  return a;
}

eg_id eg_resolve(const mn_egraph *eg, eg_id n) {
  while (n != EG_NONE && eg->nodes[n].dead)
    n = eg->nodes[n].replaced_by;
  return n;
}

/* Re-canonicalizes every node that uses class c. A node that becomes equal to one
 * already in the table is a congruent duplicate: its class merges with that node's,
 * and it is retired. The use list is detached first, because those merges splice lists. */
static void repair(mn_egraph *eg, eg_id c) {
  size_t n = 0;
  for (uint32_t u = eg->classes[c].first_use; u != EG_NO_USE; u = eg->uses[u].next) {
    if (!grow((void **)&eg->tmp, &eg->cap_tmp, n + 1, sizeof *eg->tmp)) {
      eg->oom = true;
      return;
    }
    eg->tmp[n++] = u;
  }
  eg->classes[c].first_use = eg->classes[c].last_use = EG_NO_USE;
  for (size_t i = 0; i < n; i++) {
    eg_id pid = eg->uses[eg->tmp[i]].node;
    eg_node *p = &eg->nodes[pid];
    if (p->dead) continue;
    if (p->in_table) table_remove(eg, pid);
    for (int k = 0; k < p->num_kids; k++)
      p->kids[k] = eg_find(eg, p->kids[k]);
  }
  uint32_t gen = ++eg->stamp_gen;
  for (size_t i = 0; i < n && !eg->oom; i++) {
    uint32_t u = eg->tmp[i];
    eg_id pid = eg->uses[u].node;
    eg_node *p = &eg->nodes[pid];
    if (p->dead || eg->stamp[pid] == gen) continue;
    eg->stamp[pid] = gen;
    if (!p->in_table) {
      uint64_t h = node_hash(p);
      eg_id q = table_lookup(eg, p, h);
      if (q != EG_NONE) {
        p->dead = true;
        p->replaced_by = q;
        eg->live_nodes--;
        eg->congruent++;
        eg_union(eg, pid, q);
        continue;
      }
      if (!table_insert(eg, pid, h)) return;
    }
    link_use(eg, eg_find(eg, c), u);
  }
}

void eg_rebuild(mn_egraph *eg) {
  while (eg->num_work && !eg->oom) {
    if (!grow((void **)&eg->scratch, &eg->cap_scratch, eg->num_work, sizeof *eg->scratch)) {
      eg->oom = true;
      return;
    }
    size_t n = eg->num_work;
    uint32_t round = ++eg->cmark_gen;
    memcpy(eg->scratch, eg->worklist, n * sizeof *eg->scratch);
    eg->num_work = 0;
    for (size_t i = 0; i < n && !eg->oom; i++) {
      eg_id c = eg_find(eg, eg->scratch[i]);
      if (eg->cmark[c] == round) continue; /* each root once per round */
      eg->cmark[c] = round;
      repair(eg, c);
    }
  }
}
