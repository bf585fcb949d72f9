/* The groups that the fusion pass (fusion.c) forms and fusion_build.c turns into fused
 * nodes: private to those two files. */
#ifndef MN_OPTIMIZER_FUSION_GROUPS_H
#define MN_OPTIMIZER_FUSION_GROUPS_H

#include "host/graph.h"

typedef struct mn_fuser {
  const mn_graph *g;
  uint32_t *user_start, *users; /* users of node i: users[user_start[i] .. user_start[i+1]) */
  unsigned char *is_output;
  unsigned char *kind; /* per node: FUSE_* in fusion.c */
  int32_t *group_of;   /* per node: the group it joined, -1 */
  /* Per node: its place in the order of the fused graph, its id until it joins a group and
   * then the group's place. Every edge of the graph with each formed group contracted to one
   * node runs from a lower place to a higher one, which keeps that graph acyclic. */
  double *pos;
  mn_node *members;      /* every group's members, group after group, ascending */
  uint32_t *group_start; /* group k's members: members[group_start[k] .. [k+1]) */
  mn_node *roots;        /* per group: its last member, whose value is the fused node's */
  size_t num_groups, num_members;
} mn_fuser;

/* The members of group k and how many. */
static inline const mn_node *mn_fuser_group(const mn_fuser *f, size_t k, size_t *n) {
  size_t end = k + 1 < f->num_groups ? f->group_start[k + 1] : f->num_members;
  *n = end - f->group_start[k];
  return f->members + f->group_start[k];
}

/* Whether member v of group gid has a value that leaves the group: a graph output or read
 * by a node outside it. */
bool mn_fuser_leaves(const mn_fuser *f, int32_t gid, mn_node v);

/* The graph with every group fused: nodes in the order of their places, each group as one
 * fused node followed by an extra_output node per member (but the root) whose value
 * leaves, inputs and outputs renumbered. MN_ERR_OUT_OF_MEMORY, or MN_ERR_STATE when the
 * groups are not in a valid order (a bug: the caller keeps the graph unfused). */
mn_status mn_fuser_rebuild(const mn_fuser *f, mn_graph **out);

#endif
