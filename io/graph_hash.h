/* Canonical 128-bit hashes of graphs for the plan cache: the key that says which user graph
 * (and options, and library) a cached plan was lowered from, and the checksum that says a
 * cached plan was read back exactly as it was written.
 *
 * Two independent 64-bit hashes run over one canonical byte stream, taken 8 bytes at a time:
 * streaming forms of MurmurHash64A and of xxHash64 (one lane). Every value enters as fixed-width
 * little-endian integers (floats by their bits), strings with their length, never a struct's raw
 * memory, so padding and field order in the C structs do not matter. Neither hash resists a chosen
 * collision; they guard against stale and damaged files, not against forged ones. */
#ifndef MN_IO_GRAPH_HASH_H
#define MN_IO_GRAPH_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "host/graph.h"

typedef struct mn_hash128 {
  uint64_t a, b;
} mn_hash128;

typedef struct mn_hasher {
  uint64_t mur, xxh, len;
  unsigned char tail[8];
  size_t ntail;
} mn_hasher;

void mn_hasher_init(mn_hasher *h);
void mn_hasher_bytes(mn_hasher *h, const void *data, size_t n);
void mn_hasher_u64(mn_hasher *h, uint64_t v);
void mn_hasher_f32(mn_hasher *h, float v);
/* Length-prefixed, and NULL hashes differently from "". */
void mn_hasher_str(mn_hasher *h, const char *s);
mn_hash128 mn_hasher_final(const mn_hasher *h);

#define MN_HASH128_HEX 33
/* 32 lowercase hex digits and a NUL. */
void mn_hash128_hex(mn_hash128 h, char out[MN_HASH128_HEX]);

/* One node: op by name, inputs, every attribute field, type, name and constant data. */
void mn_hash_node(mn_hasher *h, const mn_node_rec *n);
/* Every node in order, then the outputs. */
void mn_hash_graph(mn_hasher *h, const mn_graph *g);

/* The plan cache key of a user graph built with options o: the graph, the options that
 * change lowering (backend, allow_tf32, optimize, fusion, siblings; not the device ordinal), the
 * library version and the op table (names, arities, flags). */
mn_hash128 mn_plan_cache_key(const mn_graph *user, const mn_session_options *o);

#endif
