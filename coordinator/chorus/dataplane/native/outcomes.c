/*
 * outcomes.c
 *		outcomes.py's OutcomeIndex in C: the outcome of the last certified (or
 *		failed) writesets by origin and transaction ID (its low 32 bits), and
 *		the GIDs they cover without a gap (complete_after). The order core
 *		(order.c) records into it as it certifies, so a writeset costs no
 *		Python here; the binding (dataplane/native.py, NativeOutcomes) reads
 *		it when chorus.commit_outcome asks, and keeps the reasons of the
 *		failed ones, which are texts.
 *
 *		The entries sit in a ring in the order they were first recorded, as
 *		the reference's OrderedDict keeps them: recording a transaction again
 *		changes its entry in place, and past ``size`` entries the oldest goes.
 *		Everything is allocated by ch_outcomes_init: recording never fails.
 */
#include <string.h>

#include "ch_mem.h"

typedef struct oc_entry
{
	uint64_t	gid;
	uint32_t	origin;
	uint32_t	xid;
	uint8_t		ok;
} oc_entry;

struct ch_outcomes
{
	ch_mem		mem;
	oc_entry   *ring;			/* size + 1 entries */
	size_t		cap;
	size_t		head;
	size_t		len;
	size_t		size;
	ch_table	index;			/* (origin, xid) -> its ring slot */
	int64_t		complete_after; /* every writeset ordered after it is here (-1: none yet) */
	int64_t		last;			/* the last GID seen */
};

typedef struct oc_key
{
	uint32_t	origin;
	uint32_t	xid;
} oc_key;

static uint64_t
oc_hash(uint32_t origin, uint32_t xid)
{
	return ch_hash_gid(((uint64_t) origin << 32) | xid);
}

static bool
oc_eq(const void *ctx, uint32_t slot, const void *key)
{
	const ch_outcomes *x = ctx;
	const oc_key *k = key;

	return x->ring[slot].origin == k->origin && x->ring[slot].xid == k->xid;
}

size_t
ch_outcomes_size(void)
{
	return sizeof(ch_outcomes);
}

int
ch_outcomes_init(ch_outcomes *x, size_t size, size_t max_bytes)
{
	int			rc;
	void	   *ring = NULL;

	memset(x, 0, sizeof(*x));
	x->mem.limit = max_bytes;
	x->complete_after = x->last = -1;
	if (size >= CH_MAX_SLOTS)
		return CH_EINVAL;
	x->size = size;
	x->cap = size + 1;
	if ((rc = ch_mem_resize(&x->mem, &ring, 0, x->cap * sizeof(oc_entry))) != CH_OK)
		return rc;
	x->ring = ring;
	if ((rc = ch_table_reserve(&x->mem, &x->index, x->cap)) != CH_OK)
	{
		ch_mem_release(&x->mem, x->ring, x->cap * sizeof(oc_entry));
		x->ring = NULL;
		return rc;
	}
	return CH_OK;
}

void
ch_outcomes_free(ch_outcomes *x)
{
	if (x->ring != NULL)
		ch_mem_release(&x->mem, x->ring, x->cap * sizeof(oc_entry));
	x->ring = NULL;
	ch_table_free(&x->mem, &x->index);
}

/* OutcomeIndex.seen: GID gid was delivered here; a GID skipped starts the record again */
void
ch_outcomes_seen(ch_outcomes *x, uint64_t gid)
{
	if ((int64_t) gid != x->last + 1 || x->complete_after < 0)
		x->complete_after = (int64_t) gid - 1;
	x->last = (int64_t) gid;
}

/* OutcomeIndex.record */
void
ch_outcomes_record(ch_outcomes *x, uint32_t origin, uint32_t xid, uint64_t gid, int ok)
{
	oc_key		k = {origin, xid};
	uint64_t	h = oc_hash(origin, xid);
	uint32_t	slot = ch_table_find(&x->index, h, oc_eq, x, &k);

	if (slot != CH_NIL)
	{
		x->ring[slot].gid = gid;
		x->ring[slot].ok = ok != 0;
		return;
	}
	slot = (uint32_t) ((x->head + x->len) % x->cap);
	x->ring[slot] = (oc_entry) {gid, origin, xid, ok != 0};
	ch_table_insert(&x->index, h, slot);
	x->len++;
	if (x->len > x->size)
	{
		oc_entry   *old = &x->ring[x->head];

		ch_table_delete(&x->index, oc_hash(old->origin, old->xid), (uint32_t) x->head);
		if ((int64_t) old->gid > x->complete_after)
			x->complete_after = (int64_t) old->gid;
		x->head = (x->head + 1) % x->cap;
		x->len--;
	}
}

/* OutcomeIndex.get: 1 with its GID and whether it committed, 0 if not here */
int
ch_outcomes_get(const ch_outcomes *x, uint32_t origin, uint32_t xid, uint64_t *gid, int *ok)
{
	oc_key		k = {origin, xid};
	uint32_t	slot = ch_table_find(&x->index, oc_hash(origin, xid), oc_eq, x, &k);

	if (slot == CH_NIL)
		return 0;
	*gid = x->ring[slot].gid;
	*ok = x->ring[slot].ok;
	return 1;
}

size_t
ch_outcomes_len(const ch_outcomes *x)
{
	return x->len;
}

int64_t
ch_outcomes_complete_after(const ch_outcomes *x)
{
	return x->complete_after;
}

/*
 * ch_outcomes_renumber
 *		The origins' ids change (the order core was given another certification
 *		index, which numbers them its own way): map[old id] is the new one, for
 *		old ids below n (others are left as they are).
 */
void
ch_outcomes_renumber(ch_outcomes *x, const uint32_t *map, size_t n)
{
	for (size_t i = 0; i < x->len; i++)
	{
		size_t		s = (x->head + i) % x->cap;
		oc_entry   *e = &x->ring[s];

		if (e->origin >= n || map[e->origin] == e->origin)
			continue;
		ch_table_delete(&x->index, oc_hash(e->origin, e->xid), (uint32_t) s);
		e->origin = map[e->origin];
	}
	/* entries renumbered are indexed again once all are (two may swap ids) */
	for (size_t i = 0; i < x->len; i++)
	{
		size_t		s = (x->head + i) % x->cap;
		oc_entry   *e = &x->ring[s];
		oc_key		k = {e->origin, e->xid};

		if (ch_table_find(&x->index, oc_hash(e->origin, e->xid), oc_eq, x, &k) != (uint32_t) s)
			ch_table_insert(&x->index, oc_hash(e->origin, e->xid), (uint32_t) s);
	}
}
