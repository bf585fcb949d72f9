/* The e-graph: e-nodes (an op over child e-classes) grouped into e-classes of equal
 * value, with union-find over classes, hash-consing of nodes and the congruence rebuild
 * that keeps both consistent after merges (the "egg" design: deferred, worklist-driven
 * repair, so that each rebuild costs time near-linear in the nodes it touches).
 *
 * Every node is created together with a class of the same id, so a node id is also the
 * id of the class it was added to; eg_find gives the class it belongs to now. */
#ifndef MN_OPTIMIZER_EGRAPH_H
#define MN_OPTIMIZER_EGRAPH_H

#include <stdint.h>

#include "host/graph.h"

typedef uint32_t eg_id;
#define EG_NONE UINT32_MAX

typedef struct eg_node {
  mn_op op;
  int num_kids;
  eg_id kids[MN_MAX_INPUTS]; /* classes, canonical as of the node's last (re)insertion */
  uint32_t type;             /* index into mn_egraph.types */
  mn_op_attrs attrs;
  /* Nodes that must never be merged with another (named leaves, in-place ops) carry the
   * id of the graph node they came from; EG_NONE for every other node. */
  uint32_t identity;
  const float *data;          /* constants: numel floats (borrowed or in owned_data) */
  const mn_fused_prog *fused; /* fused nodes: the program (borrowed from the input graph) */
  uint64_t data_hash;         /* constants: hash of data; fused nodes: of the program */
  eg_id next_in_class;        /* intrusive list of a class's nodes */
  eg_id replaced_by;          /* a congruent duplicate points at the node that stayed */
  bool dead;                  /* a congruent duplicate: skipped by matching and extraction */
  bool in_table;              /* currently in the hash-cons table */
} eg_node;

typedef struct eg_class {
  eg_id parent; /* union-find; == own id at a root */
  uint32_t size;
  eg_id first_node, last_node;
  uint32_t first_use, last_use; /* list of nodes using this class, in mn_egraph.uses */
  uint32_t type;
  eg_id const_node; /* a CONSTANT node in the class, or EG_NONE */
  eg_id pinned;     /* a graph output's node: extraction must pick it (EG_NONE: free) */
} eg_class;

typedef struct eg_use {
  eg_id node;
  uint32_t next;
} eg_use;

typedef struct mn_egraph {
  eg_node *nodes; /* nodes[i] and classes[i] are created together */
  eg_class *classes;
  size_t num_nodes, cap_nodes;
  size_t live_nodes; /* nodes that are not congruent duplicates */
  eg_use *uses;
  size_t num_uses, cap_uses;
  mn_tensor_type *types; /* interned: equal types share an index */
  size_t num_types, cap_types;
  uint32_t *type_table; /* open addressing over types, index + 1 (0: empty) */
  size_t type_table_cap;
  uint32_t *table; /* hash-cons: node id + 1, 0 empty, EG_TOMB deleted */
  size_t table_cap, table_used, table_live;
  eg_id *worklist; /* classes merged since the last rebuild */
  size_t num_work, cap_work;
  eg_id *scratch; /* rebuild's copy of the worklist */
  size_t cap_scratch;
  uint32_t *stamp; /* per node: dedup marks for one repair */
  uint32_t stamp_gen;
  uint32_t *cmark; /* per class: repaired in this rebuild round */
  uint32_t cmark_gen;
  uint32_t *tmp; /* repair's copy of a use list */
  size_t cap_tmp;
  float **owned; /* constant data the optimizer created (folding) */
  size_t num_owned, cap_owned;
  size_t unions;    /* merges that joined two different classes */
  size_t congruent; /* merges found by the rebuild (congruence) */
  bool oom;         /* an allocation failed: the e-graph must not be used */
  bool type_clash;  /* a merge of classes with different types was refused */
} mn_egraph;

/* A node to add: op, num_kids, kids, type, attrs, identity, data and fused are read. */
typedef struct eg_node_key {
  mn_op op;
  int num_kids;
  eg_id kids[MN_MAX_INPUTS];
  uint32_t type;
  mn_op_attrs attrs;
  uint32_t identity;
  const float *data;
  const mn_fused_prog *fused;
} eg_node_key;

bool eg_init(mn_egraph *eg, size_t expected_nodes);
void eg_free(mn_egraph *eg);

/* The class's root, with path halving. */
static inline eg_id eg_find(mn_egraph *eg, eg_id c) {
  while (eg->classes[c].parent != c) {
    eg->classes[c].parent = eg->classes[eg->classes[c].parent].parent;
    c = eg->classes[c].parent;
  }
  return c;
}

/* Interned index of t; UINT32_MAX when out of memory. */
uint32_t eg_intern_type(mn_egraph *eg, const mn_tensor_type *t);
static inline const mn_tensor_type *eg_type(const mn_egraph *eg, uint32_t type) {
  return &eg->types[type];
}
static inline const mn_tensor_type *eg_class_type(mn_egraph *eg, eg_id c) {
  return &eg->types[eg->classes[eg_find(eg, c)].type];
}

/* Adds the node, or finds the equal node already present (hash-consing). Returns the
 * node's id (its class is eg_find of it); EG_NONE when out of memory. */
eg_id eg_add(mn_egraph *eg, const eg_node_key *k);

/* Merges the classes of a and b; returns the root. Refuses (and sets type_clash) when
 * their types differ. The hash-cons is repaired by the next eg_rebuild. */
eg_id eg_union(mn_egraph *eg, eg_id a, eg_id b);

/* Restores the invariants after merges: every node's kids canonical, the hash-cons
 * free of duplicates, congruent nodes (same op over the same classes) in one class. */
void eg_rebuild(mn_egraph *eg);

/* A congruent duplicate's surviving node (the node itself when alive). */
eg_id eg_resolve(const mn_egraph *eg, eg_id n);

/* Takes ownership of data (malloc'd) for the e-graph's lifetime; false when out of memory
 * (data is then freed). */
bool eg_own_data(mn_egraph *eg, float *data);

/* Hash of numel floats by their bits. */
uint64_t eg_hash_floats(const float *data, size_t n);

/* Iteration over a class's nodes and uses. */
#define EG_FOR_NODES(eg, cls, var)                                                                 \
  for (eg_id var = (eg)->classes[(cls)].first_node; var != EG_NONE;                                \
       var = (eg)->nodes[var].next_in_class)
#define EG_FOR_USES(eg, cls, var)                                                                  \
  for (uint32_t var = (eg)->classes[(cls)].first_use; var != UINT32_MAX; var = (eg)->uses[var].next)

#endif
