#include "io/graph_hash.h"

#include <stdio.h>
#include <string.h>

#define MUR_M    0xc6a4a7935bd1e995ULL
#define MUR_R    47
#define MUR_SEED 0x6d656761ULL /* "mega" */
#define XXH_P1   0x9e3779b185ebca87ULL
#define XXH_P2   0xc2b2ae3d27d4eb4fULL
#define XXH_P3   0x165667b19e3779f9ULL
#define XXH_SEED 0x6e657572ULL /* "neur" */

/* Bumped when the canonical stream below changes, so old keys stop matching. */
#define MN_GRAPH_HASH_SCHEME 4

void mn_hasher_init(mn_hasher *h) {
  memset(h, 0, sizeof *h);
  h->mur = MUR_SEED;
  h->xxh = XXH_SEED;
}

static uint64_t load_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* One 8-byte word into both lanes: MurmurHash64A's step and xxHash64's round. */
static void block(mn_hasher *h, uint64_t k) {
  uint64_t m = k * MUR_M;
  m ^= m >> MUR_R;
  m *= MUR_M;
  h->mur = (h->mur ^ m) * MUR_M;
  h->xxh = rotl64(h->xxh + k * XXH_P2, 31) * XXH_P1;
}

void mn_hasher_bytes(mn_hasher *h, const void *data, size_t n) {
  const unsigned char *p = data;
  h->len += n;
  size_t i = 0;
  /* ntail stays below 8; the bound in the conditions lets the compiler see it. */
  while (h->ntail > 0 && h->ntail < 8 && i < n) {
    h->tail[h->ntail++] = p[i++];
    if (h->ntail == 8) {
      block(h, load_le64(h->tail));
      h->ntail = 0;
    }
  }
  for (; i + 8 <= n; i += 8)
    block(h, load_le64(p + i));
  while (i < n && h->ntail < 8)
    h->tail[h->ntail++] = p[i++];
}

void mn_hasher_u64(mn_hasher *h, uint64_t v) {
  if (h->ntail == 0) { /* the common case: words stay aligned to the stream */
    h->len += 8;
    block(h, v);
    return;
  }
  unsigned char b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  mn_hasher_bytes(h, b, sizeof b);
}

void mn_hasher_f32(mn_hasher *h, float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  mn_hasher_u64(h, bits);
}

void mn_hasher_str(mn_hasher *h, const char *s) {
  if (!s) {
    mn_hasher_u64(h, UINT64_MAX);
    return;
  }
  size_t n = strlen(s);
  mn_hasher_u64(h, n);
  mn_hasher_bytes(h, s, n);
  /* Zero padding to a whole word keeps the rest of the stream on mn_hasher_u64's fast path. */
  static const unsigned char zeros[8];
  if (n % 8) mn_hasher_bytes(h, zeros, 8 - n % 8);
}

mn_hash128 mn_hasher_final(const mn_hasher *h) {
  uint64_t m = h->mur, x = h->xxh;
  if (h->ntail) {
    uint64_t k = 0;
    for (size_t i = h->ntail; i-- > 0;)
      k = (k << 8) | h->tail[i];
    m = (m ^ k) * MUR_M;
    x = rotl64(x + k * XXH_P2, 31) * XXH_P1;
  }
  m ^= h->len * MUR_M;
  m ^= m >> MUR_R;
  m *= MUR_M;
  m ^= m >> MUR_R;
  x ^= h->len;
  x ^= x >> 33;
  x *= XXH_P2;
  x ^= x >> 29;
  x *= XXH_P3;
  x ^= x >> 32;
  return (mn_hash128){.a = m, .b = x};
}

void mn_hash128_hex(mn_hash128 h, char out[MN_HASH128_HEX]) {
  snprintf(out, MN_HASH128_HEX, "%016llx%016llx", (unsigned long long)h.a, (unsigned long long)h.b);
}

static void hash_attrs(mn_hasher *h, const mn_op_attrs *a) {
  mn_hasher_f32(h, a->scale);
  mn_hasher_f32(h, a->eps);
  mn_hasher_f32(h, a->theta);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->pos_offset);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->head_dim);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->num_heads);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->num_kv_heads);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->stride);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->padding);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->groups);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->channels_a);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->variant);
  mn_hasher_u64(h, (uint64_t)(int64_t)a->act);
  mn_hasher_u64(h, (uint64_t)a->num_rows);
  mn_hasher_u64(h, (uint64_t)a->seed);
}

void mn_hash_node(mn_hasher *h, const mn_node_rec *n) {
  mn_hasher_str(h, mn_op_name(n->op));
  mn_hasher_u64(h, (uint64_t)(int64_t)n->num_inputs);
  for (int k = 0; k < n->num_inputs && k < MN_MAX_INPUTS; k++)
    mn_hasher_u64(h, n->inputs[k]);
  hash_attrs(h, &n->attrs);
  mn_hasher_u64(h, (uint64_t)n->type.dtype);
  mn_hasher_u64(h, (uint64_t)(int64_t)n->type.rank);
  for (int k = 0; k < n->type.rank && k < MN_MAX_RANK; k++)
    mn_hasher_u64(h, (uint64_t)n->type.shape[k]);
  mn_hasher_str(h, n->name);
  if (n->op == MN_OP_CONSTANT && n->data) {
    size_t numel = (size_t)mn_tensor_type_numel(&n->type);
    mn_hasher_u64(h, numel);
    /* The floats' bytes in host order: a cache carried to a host of the other byte
     * order only misses. */
    mn_hasher_bytes(h, n->data, numel * sizeof(float));
  } else {
    mn_hasher_u64(h, UINT64_MAX);
  }
  /* Only fused nodes hash a program, so that every other node hashes as it always did. */
  if (n->fused) mn_hasher_u64(h, (uint64_t)(int64_t)n->fused->num_instrs);
  for (int i = 0; n->fused && i < n->fused->num_instrs; i++) {
    const mn_fused_instr *in = &n->fused->instrs[i];
    mn_hasher_str(h, mn_op_name(in->op));
    mn_hasher_f32(h, in->scale);
    mn_hasher_f32(h, in->eps);
    for (int k = 0; k < MN_FUSED_MAX_ARGS; k++)
      mn_hasher_u64(h, in->args[k]);
    mn_hasher_u64(h, in->out);
  }
}

void mn_hash_graph(mn_hasher *h, const mn_graph *g) {
  mn_hasher_u64(h, g->num_nodes);
  for (size_t i = 0; i < g->num_nodes; i++)
    mn_hash_node(h, &g->nodes[i]);
  mn_hasher_u64(h, g->num_outputs);
  for (size_t i = 0; i < g->num_outputs; i++)
    mn_hasher_u64(h, g->outputs[i]);
}

mn_hash128 mn_plan_cache_key(const mn_graph *user, const mn_session_options *o) {
  mn_hasher h;
  mn_hasher_init(&h);
  mn_hasher_str(&h, "meganeura plan cache key");
  mn_hasher_u64(&h, MN_GRAPH_HASH_SCHEME);
  mn_hasher_str(&h, mn_version());
  /* The op table stands in for the parts of lowering that a development build can change
   * without a version bump: a renumbered, added or re-flagged op changes every key. */
  mn_hasher_u64(&h, MN_OP_COUNT);
  for (int op = 0; op < MN_OP_COUNT; op++) {
    mn_hasher_str(&h, mn_op_table[op].name);
    mn_hasher_u64(&h, (uint64_t)(int64_t)mn_op_table[op].arity);
    mn_hasher_u64(&h, mn_op_table[op].flags);
  }
  mn_hasher_u64(&h, (uint64_t)o->backend);
  mn_hasher_u64(&h, o->allow_tf32 ? 1 : 0);
  mn_hasher_u64(&h, o->optimize ? 1 : 0);
  mn_hasher_u64(&h, (uint64_t)o->fusion);
  mn_hasher_u64(&h, (uint64_t)o->siblings);
  mn_hasher_u64(&h, (uint64_t)o->precision);
  mn_hash_graph(&h, user);
  return mn_hasher_final(&h);
}
