/* The program's commands on several streams while the step graph is captured, so that the
 * graph holds the data dependencies of the plan instead of one chain: a command waits only for
 * the earlier commands whose memory it reads or overwrites (the conflict tracking of a
 * recorded graph session), and independent branches (q, k and v products, a weight gradient
 * beside its input gradient, the two halves of an attention backward) become sibling nodes
 * that the GPU may overlap.
 *
 * Each command's accesses are address ranges on the device: the buffers of its node's inputs
 * are read, its node's buffers (the value and any extra values, which in-place ops share with
 * the tensor they update) and anything else it names are written. The scratch and staging
 * regions count as one range each, written by every command that uses them, so that their
 * users keep program order. The error record (first error wins, atomically) and the step's
 * scalars (read-only during the program) are not tracked. Matrix products of different
 * streams get cuBLASLt workspaces of their own. */
#include <stdlib.h>
#include <string.h>

#include "cuda/schedule.h"
#include "host/decode_layer.h"
#include "host/error.h"
#include "host/graph.h"

typedef struct span {
  uintptr_t lo, hi;
  bool write;
} span;

#define MAX_SPANS (MN_CU_MAX_ARGS + 8)

typedef struct access {
  span s[MAX_SPANS];
  int n;
} access;

static void add(access *a, uintptr_t lo, uintptr_t hi, bool write) {
  if (!lo || hi <= lo) return;
  for (int i = 0; i < a->n; i++)
    if (a->s[i].lo == lo && a->s[i].hi == hi) {
      a->s[i].write = a->s[i].write || write;
      return;
    }
  if (a->n < MAX_SPANS) a->s[a->n++] = (span){lo, hi, write};
}

static uintptr_t buffer_base(const cuda_state *st, const mn_session *s, mn_node node) {
  return (uintptr_t)mn_cu_resolve(st, s, (mn_cu_arg){.kind = MN_CU_ARG_NODE, .node = node});
}

static bool writes_buffer(const mn_plan *p, mn_node id, uint32_t b) {
  if (p->node_buffer[id] == b) return true;
  const mn_node_rec *n = &p->graph->nodes[id];
  for (int k = 1; k <= mn_node_num_extra_outputs(n); k++)
    if (p->node_buffer[mn_plan_extra_output(p, id, k)] == b) return true;
  /* A decode layer's caches are inputs it writes. */
  for (int k = 0; k < n->num_inputs; k++)
    if (mn_decode_layer_writes(n, k) && p->node_buffer[n->inputs[k]] == b) return true;
  return false;
}

static bool is_input(const mn_node_rec *n, mn_node x) {
  for (int i = 0; i < n->num_inputs; i++)
    if (n->inputs[i] == x) return true;
  return false;
}

/* How a command uses an argument: known to be written (a product's result, a memset's or a
 * copy's target), or judged from the node (a kernel argument: read when it is one of the
 * node's inputs that the node does not overwrite, written otherwise). */
typedef enum use { USE_JUDGED, USE_WRITTEN } use;

static void add_arg(access *a, const cuda_state *st, const mn_session *s, mn_node owner,
                    mn_cu_arg arg, use how) {
  const mn_plan *p = s->plan;
  switch (arg.kind) {
  case MN_CU_ARG_NODE: {
    uint32_t b = p->node_buffer[arg.node];
    uintptr_t lo = buffer_base(st, s, arg.node);
    bool read = how == USE_JUDGED && is_input(&p->graph->nodes[owner], arg.node) &&
                !writes_buffer(p, owner, b);
    add(a, lo, lo + p->buffers[b].bytes, !read);
    break;
  }
  case MN_CU_ARG_SCRATCH: add(a, (uintptr_t)st->scratch, (uintptr_t)st->scratch + 1, true); break;
  case MN_CU_ARG_STAGE: add(a, (uintptr_t)st->stage, (uintptr_t)st->stage + 1, true); break;
  /* Weight copies change only outside the program (the update, the refresh before a step). */
  case MN_CU_ARG_SHADOW:
  case MN_CU_ARG_ERROR:
  case MN_CU_ARG_SCALARS:
  case MN_CU_ARG_VALUE:
  case MN_CU_ARG_NONE: break;
  }
}

static void accesses(const cuda_state *st, const mn_session *s, size_t i, access *a) {
  const mn_plan *p = s->plan;
  const mn_cu_cmd *c = &st->prog.cmds[i];
  a->n = 0;
  uintptr_t own = buffer_base(st, s, c->node);
  add(a, own, own + mn_plan_buffer_of(p, c->node)->bytes, true);
  for (int k = 1; k <= mn_node_num_extra_outputs(&p->graph->nodes[c->node]); k++) {
    mn_node x = mn_plan_extra_output(p, c->node, k);
    uintptr_t lo = buffer_base(st, s, x);
    add(a, lo, lo + mn_plan_buffer_of(p, x)->bytes, true);
  }
  switch (c->kind) {
  case MN_CU_CMD_LAUNCH:
    for (int k = 0; k < c->num_args; k++)
      add_arg(a, st, s, c->node, c->args[k], USE_JUDGED);
    break;
  case MN_CU_CMD_MATMUL: {
    const mn_cu_matmul_desc *d = &c->mm;
    bool bias_out = d->epilogue == MN_CU_EPI_BGRAD_A || d->epilogue == MN_CU_EPI_BGRAD_B;
    add_arg(a, st, s, c->node, d->a, USE_JUDGED);
    add_arg(a, st, s, c->node, d->b, USE_JUDGED);
    add_arg(a, st, s, c->node, d->aux, USE_JUDGED);
    add_arg(a, st, s, c->node, d->bias, bias_out ? USE_WRITTEN : USE_JUDGED);
    add_arg(a, st, s, c->node, d->c, USE_WRITTEN);
    add_arg(a, st, s, c->node, d->c_fallback, USE_WRITTEN);
    break;
  }
  case MN_CU_CMD_MEMSET:
  case MN_CU_CMD_COPY:
    add_arg(a, st, s, c->node, c->args[0], USE_WRITTEN);
    if (c->kind == MN_CU_CMD_COPY) add_arg(a, st, s, c->node, c->args[1], USE_JUDGED);
    break;
  }
}

static bool conflict(const access *x, const access *y) {
  for (int i = 0; i < x->n; i++)
    for (int j = 0; j < y->n; j++)
      if ((x->s[i].write || y->s[j].write) && x->s[i].lo < y->s[j].hi && y->s[j].lo < x->s[i].hi)
        return true;
  return false;
}

/* Programs longer than this are scheduled without heights (O(n^2) conflict tests). */
#define HEIGHT_MAX_CMDS 4096

/* Each command's longest chain of conflicting commands to the end of the program (1: no later
 * command waits for it); all 0 for a long program. NULL when out of memory. */
static size_t *heights(const cuda_state *st, const access *acc, size_t n) {
  size_t *h = calloc(n ? n : 1, sizeof *h);
  if (!h || n > HEIGHT_MAX_CMDS) return h;
  for (size_t i = n; i-- > 0;) {
    if (mn_cu_cmd_skipped(st, i)) continue;
    size_t longest = 0;
    for (size_t k = i + 1; k < n; k++)
      if (h[k] > longest && !mn_cu_cmd_skipped(st, k) && conflict(&acc[i], &acc[k])) longest = h[k];
    h[i] = longest + 1;
  }
  return h;
}

/* Whether a later command that also waits for command `dep` has a longer way to the end than
 * command i: it, not i, should continue dep's stream. The MLP step's weight-gradient products
 * took the chain after the loss and the ReLU gradients (program order puts them first), so the
 * input-gradient chain, the step's critical path, waited on them at every layer. */
static bool longer_way_after(const cuda_state *st, const access *acc, const size_t *height,
                             size_t n, size_t i, size_t dep) {
  if (n > HEIGHT_MAX_CMDS) return false; /* no heights */
  for (size_t k = i + 1; k < n; k++)
    if (height[k] > height[i] && !mn_cu_cmd_skipped(st, k) && conflict(&acc[k], &acc[dep]))
      return true;
  return false;
}

static bool reports_errors(const mn_cu_cmd *c) {
  for (int k = 0; c->kind == MN_CU_CMD_LAUNCH && k < c->num_args; k++)
    if (c->args[k].kind == MN_CU_ARG_ERROR) return true;
  return false;
}

size_t mn_cu_schedule_last_touch(const cuda_state *st, const mn_session *s, const uintptr_t *lo,
                                 const uintptr_t *hi, int n, bool errors) {
  access ranges = {.n = 0}, a;
  for (int r = 0; r < n; r++)
    add(&ranges, lo[r], hi[r], true);
  for (size_t i = st->prog.num_cmds; i-- > 0;) {
    if (mn_cu_cmd_skipped(st, i)) continue;
    if (errors && reports_errors(&st->prog.cmds[i])) return i + 1;
    accesses(st, s, i, &a);
    if (conflict(&ranges, &a)) return i + 1;
  }
  return 0;
}

int mn_cu_schedule_streams(const cuda_state *st, const mn_session *s) {
  const char *env = getenv("MN_CUDA_STREAMS");
  int n = MN_CU_DEFAULT_STREAMS;
  if (env && *env)
    n = atoi(env);
  else if (mn_cu_small_step(&st->prog, s->plan))
    n = MN_CU_SMALL_STEP_STREAMS;
  return n < 1 ? 1 : n > MN_CU_MAX_STREAMS ? MN_CU_MAX_STREAMS : n;
}

mn_status mn_cu_schedule_build(cuda_state *st, const mn_session *s, int streams) {
  mn_cu_lanes *ln = &st->lanes;
  free(ln->lane);
  free(ln->wait);
  size_t n = st->prog.num_cmds;
  ln->streams = streams;
  ln->lane = malloc((n ? n : 1) * sizeof *ln->lane);
  ln->wait = calloc((n ? n : 1) * (size_t)streams, sizeof *ln->wait);
  access *acc = malloc((n ? n : 1) * sizeof *acc);
  if (!acc || !ln->lane || !ln->wait) {
    free(acc);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory (the stream schedule)");
  }
  /* One stream (the default) is program order: nothing to compare. */
  if (streams == 1) {
    for (size_t i = 0; i < n; i++)
      ln->lane[i] = mn_cu_cmd_skipped(st, i) ? -1 : 0;
    free(acc);
    return MN_OK;
  }
  for (size_t i = 0; i < n; i++)
    if (!mn_cu_cmd_skipped(st, i)) accesses(st, s, i, &acc[i]);
  size_t *height = heights(st, acc, n);
  if (!height) {
    free(acc);
    return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory (the stream schedule)");
  }
  /* tail[l]: the last command given to stream l (+1; 0: none yet). */
  size_t tail[MN_CU_MAX_STREAMS] = {0};
  for (size_t i = 0; i < n; i++) {
    ln->lane[i] = -1;
    if (mn_cu_cmd_skipped(st, i)) continue;
    /* latest[l]: the latest command of stream l that command i must follow (+1); earlier ones
     * of that stream precede it anyway. */
    size_t latest[MN_CU_MAX_STREAMS] = {0};
    size_t newest = 0;
    int newest_lane = -1, found = 0;
    for (size_t j = i; j-- > 0 && found < streams;) {
      int l = ln->lane[j];
      if (l < 0 || latest[l] > j) continue;
      if (!conflict(&acc[i], &acc[j])) continue;
      latest[l] = j + 1;
      found++;
      if (j + 1 > newest) {
        newest = j + 1;
        newest_lane = l;
      }
    }
    /* Continue the chain of the newest dependency when it ends its stream; else an unused
     * stream; else the one idle longest (its last command is the oldest). A stream left to a
     * later command with a longer way is not taken as the idle one either: with the MLP's bias
     * sums credited to a node of their own, they and the second weight gradient left the
     * input-gradient chain its stream, then took it back as the idle one and put that chain
     * behind them on the other stream (0.0593 ms against 0.0531, H200). */
    int lane = -1, kept = -1;
    if (newest_lane >= 0 && tail[newest_lane] == newest) {
      if (longer_way_after(st, acc, height, n, i, newest - 1))
        kept = newest_lane;
      else
        lane = newest_lane;
    }
    for (int l = 0; lane < 0 && l < streams; l++)
      if (tail[l] == 0) lane = l;
    if (lane < 0) {
      for (int l = 0; l < streams; l++)
        if (l != kept && (lane < 0 || tail[l] < tail[lane])) lane = l;
      if (lane < 0) lane = kept;
    }
    ln->lane[i] = lane;
    for (int l = 0; l < streams; l++)
      if (l != lane && latest[l]) ln->wait[i * (size_t)streams + (size_t)l] = latest[l];
    tail[lane] = i + 1;
  }
  free(height);
  free(acc);
  return MN_OK;
}

mn_status mn_cu_lanes_prepare(cuda_state *st, const mn_session *s) {
  mn_cu_lanes *ln = &st->lanes;
  int streams = mn_cu_schedule_streams(st, s);
  mn_status rc = mn_cu_schedule_build(st, s, streams);
  ln->stream[0] = st->stream;
  ln->workspace[0] = st->workspace;
  for (int l = 1; rc == MN_OK && l < streams; l++) {
    if (!ln->stream[l])
      rc = mn_cu_check(cudaStreamCreateWithFlags(&ln->stream[l], cudaStreamNonBlocking),
                       "creating a stream");
    if (rc == MN_OK && !ln->workspace[l] && st->workspace_bytes)
      rc = mn_cu_check(cudaMalloc(&ln->workspace[l], st->workspace_bytes), "a cuBLASLt workspace");
  }
  if (rc != MN_OK || streams == 1) return rc;
  /* A split update's early part runs on a stream that no command of the program uses. */
  if (st->split.early.kernel >= 0 && streams < MN_CU_MAX_STREAMS) {
    if (!ln->stream[streams])
      rc = mn_cu_check(cudaStreamCreateWithFlags(&ln->stream[streams], cudaStreamNonBlocking),
                       "creating a stream");
    for (int e = 0; rc == MN_OK && e < 2; e++)
      if (!ln->part[e])
        rc = mn_cu_check(cudaEventCreateWithFlags(&ln->part[e], cudaEventDisableTiming),
                         "creating an event");
  }
  for (int l = 0; rc == MN_OK && l < streams; l++)
    if (!ln->join[l])
      rc = mn_cu_check(cudaEventCreateWithFlags(&ln->join[l], cudaEventDisableTiming),
                       "creating an event");
  if (rc == MN_OK && !ln->fork)
    rc = mn_cu_check(cudaEventCreateWithFlags(&ln->fork, cudaEventDisableTiming),
                     "creating an event");
  for (int e = 0; rc == MN_OK && e < 2; e++)
    if (!ln->edge[e])
      rc = mn_cu_check(cudaEventCreateWithFlags(&ln->edge[e], cudaEventDisableTiming),
                       "creating an event");
  size_t n = st->prog.num_cmds;
  if (rc == MN_OK && ln->num_events < n) {
    cudaEvent_t *ev = realloc(ln->events, n * sizeof *ev);
    if (!ev) return mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory (events)");
    ln->events = ev;
    while (rc == MN_OK && ln->num_events < n) {
      rc =
          mn_cu_check(cudaEventCreateWithFlags(&ln->events[ln->num_events], cudaEventDisableTiming),
                      "creating an event");
      if (rc == MN_OK) ln->num_events++;
    }
  }
  return rc;
}

mn_status mn_cu_lanes_wait_all(cuda_state *st, cudaEvent_t ev, cudaStream_t target) {
  mn_cu_lanes *ln = &st->lanes;
  mn_status rc = mn_cu_check(cudaEventRecord(ev, st->stream), "ordering the capture");
  if (rc == MN_OK) rc = mn_cu_check(cudaStreamWaitEvent(target, ev, 0), "ordering the capture");
  for (int l = 1; rc == MN_OK && ln->active && l < ln->streams; l++) {
    rc = mn_cu_check(cudaEventRecord(ln->join[l], ln->stream[l]), "ordering the capture");
    if (rc == MN_OK)
      rc = mn_cu_check(cudaStreamWaitEvent(target, ln->join[l], 0), "ordering the capture");
  }
  return rc;
}

mn_status mn_cu_enqueue_program(cuda_state *st, const mn_session *s, mn_cu_after_cmd after) {
  mn_status rc = MN_OK;
  mn_cu_lanes *ln = &st->lanes;
  if (!ln->lane || ln->stream[0] != st->stream)
    return mn_fail(MN_ERR_STATE, "cuda backend: the streams of the capture were not prepared");
  size_t n = st->prog.num_cmds;
  int streams = ln->streams;
  /* Which commands another stream waits for: only those record an event. */
  bool *marked = calloc(n ? n : 1, sizeof *marked);
  if (rc == MN_OK && !marked) rc = mn_fail(MN_ERR_OUT_OF_MEMORY, "cuda backend: out of memory");
  for (size_t i = 0; rc == MN_OK && i < n; i++)
    for (int l = 0; l < streams; l++)
      if (ln->wait[i * (size_t)streams + (size_t)l])
        marked[ln->wait[i * (size_t)streams + (size_t)l] - 1] = true;
  cudaStream_t origin = st->stream;
  void *origin_ws = st->workspace;
  if (rc == MN_OK && streams > 1)
    rc = mn_cu_check(cudaEventRecord(ln->fork, origin), "forking the capture");
  for (int l = 1; rc == MN_OK && l < streams; l++)
    rc = mn_cu_check(cudaStreamWaitEvent(ln->stream[l], ln->fork, 0), "forking the capture");
  ln->active = true;
  for (size_t i = 0; rc == MN_OK && i < n; i++) {
    int lane = ln->lane[i];
    if (lane < 0) {
      if (after) rc = after(st, s, i);
      continue;
    }
    for (int l = 0; rc == MN_OK && l < streams; l++) {
      size_t w = ln->wait[i * (size_t)streams + (size_t)l];
      if (w)
        rc = mn_cu_check(cudaStreamWaitEvent(ln->stream[lane], ln->events[w - 1], 0),
                         "ordering the capture");
    }
    st->stream = ln->stream[lane];
    st->workspace = ln->workspace[lane];
    if (rc == MN_OK) rc = mn_cu_enqueue_cmd(st, s, i);
    st->stream = origin;
    st->workspace = origin_ws;
    if (rc == MN_OK && marked[i])
      rc = mn_cu_check(cudaEventRecord(ln->events[i], ln->stream[lane]), "ordering the capture");
    if (rc == MN_OK && after) rc = after(st, s, i);
  }
  ln->active = false;
  /* Join every stream back, also after a failure, so that the capture can end. */
  for (int l = 1; l < streams; l++) {
    mn_status j = mn_cu_check(cudaEventRecord(ln->join[l], ln->stream[l]), "joining the capture");
    if (j == MN_OK)
      j = mn_cu_check(cudaStreamWaitEvent(origin, ln->join[l], 0), "joining the capture");
    if (rc == MN_OK) rc = j;
  }
  free(marked);
  return rc;
}

typedef struct node_index {
  cudaGraphNode_t node;
  size_t index;
} node_index;

static int by_node(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const node_index *)a)->node,
            y = (uintptr_t)((const node_index *)b)->node;
  return (x > y) - (x < y);
}

static size_t index_of(const node_index *sorted, size_t n, cudaGraphNode_t node) {
  node_index key = {.node = node};
  const node_index *hit = bsearch(&key, sorted, n, sizeof *sorted, by_node);
  return hit ? hit->index : n;
}

size_t mn_cu_graph_width(void *graph, size_t *programmatic) {
  cudaGraph_t g = graph;
  size_t n = 0, e = 0;
  *programmatic = 0;
  if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess || n == 0) return 0;
  /* Programmatic (overlapping) launches make edges with data: a query without room for it is
   * refused as lossy, so the listing asks for it. */
  if (cudaGraphGetEdges(g, NULL, NULL, NULL, &e) != cudaSuccess) return 0;
  cudaGraphNode_t *nodes = malloc(n * sizeof *nodes);
  cudaGraphNode_t *from = malloc((e ? e : 1) * sizeof *from),
                  *to = malloc((e ? e : 1) * sizeof *to);
  cudaGraphEdgeData *data = malloc((e ? e : 1) * sizeof *data);
  node_index *sorted = malloc(n * sizeof *sorted);
  size_t *indeg = calloc(n, sizeof *indeg), *depth = calloc(n, sizeof *depth);
  size_t *src = malloc((e ? e : 1) * sizeof *src), *dst = malloc((e ? e : 1) * sizeof *dst);
  size_t *queue = malloc(n * sizeof *queue), *count = calloc(n, sizeof *count);
  size_t width = 0;
  bool ok = nodes && from && to && sorted && indeg && depth && src && dst && queue && count &&
            cudaGraphGetNodes(g, nodes, &n) == cudaSuccess && data &&
            cudaGraphGetEdges(g, from, to, data, &e) == cudaSuccess;
  if (ok) {
    for (size_t i = 0; i < n; i++)
      sorted[i] = (node_index){nodes[i], i};
    qsort(sorted, n, sizeof *sorted, by_node);
    for (size_t k = 0; k < e; k++) {
      if (data[k].type == cudaGraphDependencyTypeProgrammatic) ++*programmatic;
      src[k] = index_of(sorted, n, from[k]);
      dst[k] = index_of(sorted, n, to[k]);
      if (src[k] < n && dst[k] < n) indeg[dst[k]]++;
    }
    /* Kahn's order; a node's depth is its longest path from a root. Edges are scanned per
     * popped node through a sort by source. */
    size_t *order = malloc((e ? e : 1) * sizeof *order), *first = calloc(n + 1, sizeof *first);
    if (order && first) {
      for (size_t k = 0; k < e; k++)
        if (src[k] < n) first[src[k] + 1]++;
      for (size_t i = 0; i < n; i++)
        first[i + 1] += first[i];
      size_t *fill = calloc(n, sizeof *fill);
      if (fill) {
        for (size_t k = 0; k < e; k++)
          if (src[k] < n) order[first[src[k]] + fill[src[k]]++] = k;
        free(fill);
        size_t head = 0, tailq = 0;
        for (size_t i = 0; i < n; i++)
          if (indeg[i] == 0) queue[tailq++] = i;
        while (head < tailq) {
          size_t v = queue[head++];
          if (++count[depth[v]] > width) width = count[depth[v]];
          for (size_t k = first[v]; k < first[v + 1]; k++) {
            size_t w = dst[order[k]];
            if (w >= n) continue;
            if (depth[v] + 1 > depth[w]) depth[w] = depth[v] + 1;
            if (--indeg[w] == 0) queue[tailq++] = w;
          }
        }
      }
    }
    free(order);
    free(first);
  }
  free(nodes);
  free(from);
  free(data);
  free(to);
  free(sorted);
  free(indeg);
  free(depth);
  free(src);
  free(dst);
  free(queue);
  free(count);
  return width;
}

void mn_cu_lanes_free(cuda_state *st) {
  mn_cu_lanes *ln = &st->lanes;
  for (int l = 1; l < MN_CU_MAX_STREAMS; l++) {
    if (ln->stream[l]) cudaStreamDestroy(ln->stream[l]);
    cudaFree(ln->workspace[l]);
  }
  for (int l = 0; l < MN_CU_MAX_STREAMS; l++)
    if (ln->join[l]) cudaEventDestroy(ln->join[l]);
  if (ln->fork) cudaEventDestroy(ln->fork);
  for (int e = 0; e < 2; e++) {
    if (ln->edge[e]) cudaEventDestroy(ln->edge[e]);
    if (ln->part[e]) cudaEventDestroy(ln->part[e]);
  }
  for (size_t i = 0; i < ln->num_events; i++)
    cudaEventDestroy(ln->events[i]);
  free(ln->events);
  free(ln->lane);
  free(ln->wait);
  *ln = (mn_cu_lanes){0};
}
