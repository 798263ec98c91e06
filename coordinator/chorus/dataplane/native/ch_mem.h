/*
 * ch_mem.h
 *		What the native core's objects share inside the library (mem.c): the
 *		byte budget every allocation is counted against, growable arrays, an
 *		open-addressing index from a 64-bit hash to a slot of the caller's
 *		array, and a double-ended queue of GIDs. Not part of the public API
 *		(ch_core.h), and not seen by cffi.
 */
#ifndef CH_MEM_H
#define CH_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ch_core.h"

#define CH_NIL UINT32_MAX		/* no slot */
#define CH_MAX_SLOTS (UINT32_MAX - 1)	/* slots are uint32_t, CH_NIL excluded */
#define CH_MAX_KEYS (1u << 24)	/* keys of one writeset (wire.MAX_PARTS bounds a key, not a set) */

/* The bytes an object holds, and how many it may hold. */
typedef struct ch_mem
{
	size_t		used;
	size_t		limit;
} ch_mem;

extern int	ch_mem_resize(ch_mem *m, void **p, size_t old_bytes, size_t new_bytes);
extern void ch_mem_release(ch_mem *m, void *p, size_t bytes);
extern int	ch_grow(ch_mem *m, void **p, size_t *cap, size_t len, size_t add, size_t elem);

/*
 * An index of the slots of some array by a 64-bit hash, linear probing at a
 * load of at most one half. Each entry is (hash >> 32) << 32 | (slot + 1);
 * the upper half of the hash also places it, so the index rehashes itself.
 * Equality is the caller's (eq): hashes only narrow the search.
 */
typedef struct ch_table
{
	uint64_t   *entries;
	size_t		cap;			/* a power of two, or 0 */
	size_t		live;
} ch_table;

typedef bool (*ch_eq_fn) (const void *ctx, uint32_t slot, const void *key);

extern int	ch_table_reserve(ch_mem *m, ch_table *t, size_t add);
extern uint32_t ch_table_find(const ch_table *t, uint64_t hash, ch_eq_fn eq, const void *ctx,
							  const void *key);
extern void ch_table_insert(ch_table *t, uint64_t hash, uint32_t slot);
extern void ch_table_delete(ch_table *t, uint64_t hash, uint32_t slot);
extern void ch_table_free(ch_mem *m, ch_table *t);

/* A double-ended queue of GIDs (Python's deque and list, as the references use them). */
typedef struct ch_gidq
{
	uint64_t   *buf;
	size_t		cap;
	size_t		head;
	size_t		len;
} ch_gidq;

extern int	ch_gidq_reserve(ch_mem *m, ch_gidq *q, size_t add);
extern void ch_gidq_free(ch_mem *m, ch_gidq *q);
extern uint64_t ch_gidq_at(const ch_gidq *q, size_t i);
extern void ch_gidq_push_back(ch_gidq *q, uint64_t gid);
extern void ch_gidq_push_front(ch_gidq *q, uint64_t gid);
extern uint64_t ch_gidq_pop_front(ch_gidq *q);
extern bool ch_gidq_remove(ch_gidq *q, uint64_t gid);
extern bool ch_gidq_contains(const ch_gidq *q, uint64_t gid);
extern void ch_gidq_sort(ch_gidq *q);

extern uint64_t ch_hash_digest(const uint8_t *digest);
extern uint64_t ch_hash_gid(uint64_t gid);

#endif							/* CH_MEM_H */
