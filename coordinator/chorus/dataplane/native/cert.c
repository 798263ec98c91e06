/*
 * cert.c
 *		The certification index (docs/NATIVE.md section 3.2, "Certification
 *		index"): a port of coordinator/chorus/certifier.py's PyCertifier, the
 *		reference, with the same verdicts, purges and snapshot contents for the
 *		same calls (tests/unit/test_dataplane_cert.py).
 *
 *		A writeset W with snapshot watermark last_seen fails iff some indexed W'
 *		with last_seen < GID(W') from another origin holds a key of W in a
 *		conflicting mode (docs/ARCHITECTURE.md invariant 2). Per key digest and
 *		mode the index keeps the newest (gid, origin) and the newest from
 *		another origin than that one (ch_cert_slot), which answers "the newest
 *		GID from any origin other than X" in O(1).
 *
 *		The keys live in an array of entries indexed by digest (ch_table). The
 *		entries are also linked in the order their key was first indexed, and
 *		each remembers its modes in the order they were first indexed: that is
 *		the order of PyCertifier's dicts, which its snapshot shows. A key
 *		purged and indexed again goes to the end, as in a Python dict.
 *
 *		The GID history (PyCertifier._by_gid) is a FIFO of (gid, count) with a
 *		FIFO of the digests beside it; purging pops it from the front while the
 *		GID is at or below the new horizon. The schema changes' GIDs above the
 *		horizon are a sorted array.
 *
 *		The reason texts are not made here: the verdict says which key, which
 *		GID and origin, and whether that GID was a schema change, and the
 *		binding (dataplane/native.py) words it as PyCertifier does.
 */
#include <stdlib.h>
#include <string.h>

#include "ch_mem.h"
#include "chorus_wire.h"		/* extension/: the key modes */

typedef struct cert_entry
{
	ch_cert_key key;
	uint32_t	prev;			/* insertion order; also the free list's link */
	uint32_t	next;
} cert_entry;

typedef struct cert_hist
{
	uint64_t	gid;
	uint32_t	count;			/* its digests, next in the digest FIFO */
} cert_hist;

struct ch_cert
{
	ch_mem		mem;
	uint64_t	horizon;

	cert_entry *entries;		/* slab of keys; free slots linked through next */
	size_t		cap;			/* entries allocated */
	uint32_t	used;			/* entries ever handed out (high-water mark) */
	uint32_t	free;			/* first free slot below used, or CH_NIL */
	uint32_t	live;			/* keys in the index */
	uint32_t	first;			/* insertion order, oldest */
	uint32_t	last;
	ch_table	index;			/* digest -> slot */

	cert_hist  *hist;			/* FIFO ring of (gid, count) */
	size_t		hcap;
	size_t		hhead;
	size_t		hlen;
	uint8_t    *digs;			/* FIFO ring of 16-byte digests */
	size_t		dcap;
	size_t		dhead;
	size_t		dlen;

	uint64_t   *schema;			/* sorted, no duplicates */
	size_t		nschema;
	size_t		schemacap;
};

/* wire.modes_conflict: exclusive conflicts with every mode; update with update */
static inline bool
modes_conflict(int a, int b)
{
	return a == CHORUS_KEY_EXCLUSIVE || b == CHORUS_KEY_EXCLUSIVE ||
		(a == CHORUS_KEY_UPDATE && b == CHORUS_KEY_UPDATE);
}

static bool
entry_eq(const void *ctx, uint32_t slot, const void *key)
{
	return memcmp(((const cert_entry *) ctx)[slot].key.digest, key, 16) == 0;
}

static cert_entry *
find(const ch_cert *c, const uint8_t *digest)
{
	uint32_t	slot = ch_table_find(&c->index, ch_hash_digest(digest), entry_eq, c->entries, digest);

	return slot == CH_NIL ? NULL : &c->entries[slot];
}

size_t
ch_cert_size(void)
{
	return sizeof(ch_cert);
}

int
ch_cert_init(ch_cert *c, uint64_t horizon, size_t max_bytes)
{
	memset(c, 0, sizeof(*c));
	c->mem.limit = max_bytes;
	c->horizon = horizon;
	c->free = c->first = c->last = CH_NIL;
	return CH_OK;
}

void
ch_cert_free(ch_cert *c)
{
	ch_mem_release(&c->mem, c->entries, c->cap * sizeof(cert_entry));
	ch_table_free(&c->mem, &c->index);
	ch_mem_release(&c->mem, c->hist, c->hcap * sizeof(cert_hist));
	ch_mem_release(&c->mem, c->digs, c->dcap * 16);
	ch_mem_release(&c->mem, c->schema, c->schemacap * sizeof(uint64_t));
	memset(c, 0, sizeof(*c));
}

uint64_t
ch_cert_horizon(const ch_cert *c)
{
	return c->horizon;
}

size_t
ch_cert_len(const ch_cert *c)
{
	return c->live;
}

size_t
ch_cert_bytes(const ch_cert *c)
{
	return c->mem.used;
}

/* ---- room, before anything changes ---- */

/* Room for add more keys: entries (reusing the free ones first) and the digest index. */
static int
reserve_keys(ch_cert *c, size_t add)
{
	size_t		freed = c->used - c->live;	/* slots on the free list */
	int			rc;

	if (add > CH_MAX_SLOTS - c->live)
		return CH_EFULL;
	rc = ch_grow(&c->mem, (void **) &c->entries, &c->cap, c->used, add > freed ? add - freed : 0,
				 sizeof(cert_entry));
	if (rc != CH_OK)
		return rc;
	return ch_table_reserve(&c->mem, &c->index, add);
}

/* Grow a FIFO ring of elem-byte elements to hold len + add, unwrapping it. */
static int
ring_reserve(ch_mem *m, void **buf, size_t *cap, size_t *head, size_t len, size_t add, size_t elem)
{
	size_t		oldcap = *cap;
	void	   *fresh = NULL;
	size_t		want = oldcap ? oldcap : 8;
	int			rc;

	if (add > SIZE_MAX / 2 / elem - len)
		return CH_EFULL;
	if (len + add <= oldcap)
		return CH_OK;
	while (want < len + add)
		want *= 2;
	rc = ch_mem_resize(m, &fresh, 0, want * elem);
	if (rc != CH_OK)
		return rc;
	if (len > 0)
	{
		size_t		tail = oldcap - *head;	/* elements from head to the array's end */

		if (tail >= len)
			memcpy(fresh, (uint8_t *) *buf + *head * elem, len * elem);
		else
		{
			memcpy(fresh, (uint8_t *) *buf + *head * elem, tail * elem);
			memcpy((uint8_t *) fresh + tail * elem, *buf, (len - tail) * elem);
		}
	}
	ch_mem_release(m, *buf, oldcap * elem);
	*buf = fresh;
	*cap = want;
	*head = 0;
	return CH_OK;
}

/* Room to index n keys under one more GID (and, for a schema change, its GID). */
static int
reserve_index(ch_cert *c, size_t n, bool schema)
{
	int			rc;

	if ((rc = reserve_keys(c, n)) != CH_OK ||
		(rc = ring_reserve(&c->mem, (void **) &c->hist, &c->hcap, &c->hhead, c->hlen, 1,
						   sizeof(cert_hist))) != CH_OK ||
		(rc = ring_reserve(&c->mem, (void **) &c->digs, &c->dcap, &c->dhead, c->dlen, n, 16)) != CH_OK)
		return rc;
	if (schema)
		return ch_grow(&c->mem, (void **) &c->schema, &c->schemacap, c->nschema, 1, sizeof(uint64_t));
	return CH_OK;
}

/* ---- changes (room reserved) ---- */

/* A new key at the end of the insertion order, with no modes yet. */
static cert_entry *
add_key(ch_cert *c, const uint8_t *digest)
{
	uint32_t	slot;
	cert_entry *e;

	if (c->free != CH_NIL)
	{
		slot = c->free;
		c->free = c->entries[slot].next;
	}
	else
		slot = c->used++;
	e = &c->entries[slot];
	memset(e, 0, sizeof(*e));
	memcpy(e->key.digest, digest, 16);
	e->prev = c->last;
	e->next = CH_NIL;
	if (c->last != CH_NIL)
		c->entries[c->last].next = slot;
	else
		c->first = slot;
	c->last = slot;
	c->live++;
	ch_table_insert(&c->index, ch_hash_digest(digest), slot);
	return e;
}

static void
drop_key(ch_cert *c, cert_entry *e)
{
	uint32_t	slot = (uint32_t) (e - c->entries);

	ch_table_delete(&c->index, ch_hash_digest(e->key.digest), slot);
	if (e->prev != CH_NIL)
		c->entries[e->prev].next = e->next;
	else
		c->first = e->next;
	if (e->next != CH_NIL)
		c->entries[e->next].prev = e->prev;
	else
		c->last = e->prev;
	e->next = c->free;
	c->free = slot;
	c->live--;
}

/* The slot of mode in e, added after its other modes if it has none yet. */
static ch_cert_slot *
mode_slot(cert_entry *e, int mode)
{
	for (int i = 0; i < e->key.nmodes; i++)
		if (e->key.modes[i] == mode)
			return &e->key.slots[i];
	e->key.modes[e->key.nmodes] = (uint8_t) mode;
	memset(&e->key.slots[e->key.nmodes], 0, sizeof(ch_cert_slot));
	return &e->key.slots[e->key.nmodes++];
}

/* _Slot.add: the newest becomes (gid, origin); the previous newest stays if from another origin */
static inline void
slot_add(ch_cert_slot *s, uint64_t gid, uint32_t origin)
{
	if (origin != s->origin)
	{
		s->gid2 = s->gid;
		s->origin2 = s->origin;
	}
	s->gid = gid;
	s->origin = origin;
}

static void
push_history(ch_cert *c, uint64_t gid, const uint8_t *digests, size_t n)
{
	size_t		j = c->hhead + c->hlen;

	c->hist[j >= c->hcap ? j - c->hcap : j] = (cert_hist) {gid, (uint32_t) n};
	c->hlen++;
	for (size_t i = 0; i < n; i++)
	{
		size_t		k = c->dhead + c->dlen++;

		memcpy(c->digs + (k >= c->dcap ? k - c->dcap : k) * 16, digests + i * 16, 16);
	}
}

/* Index n keys under (gid, origin), and remember them under gid (PyCertifier's setdefault/add loop). */
static void
index_keys(ch_cert *c, uint64_t gid, uint32_t origin, const uint8_t *digests, const uint8_t *modes,
		   size_t n)
{
	for (size_t i = 0; i < n; i++)
	{
		cert_entry *e = find(c, digests + i * 16);

		if (e == NULL)
			e = add_key(c, digests + i * 16);
		slot_add(mode_slot(e, modes[i]), gid, origin);
	}
	if (n > 0)
		push_history(c, gid, digests, n);
}

static size_t
schema_pos(const ch_cert *c, uint64_t gid)
{
	size_t		lo = 0,
				hi = c->nschema;

	while (lo < hi)
	{
		size_t		mid = lo + (hi - lo) / 2;

		if (c->schema[mid] < gid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool
schema_has(const ch_cert *c, uint64_t gid)
{
	size_t		i = schema_pos(c, gid);

	return i < c->nschema && c->schema[i] == gid;
}

static void
schema_add(ch_cert *c, uint64_t gid)
{
	size_t		i = schema_pos(c, gid);

	if (i < c->nschema && c->schema[i] == gid)
		return;
	memmove(c->schema + i + 1, c->schema + i, (c->nschema - i) * sizeof(uint64_t));
	c->schema[i] = gid;
	c->nschema++;
}

static int
check_keys(const uint8_t *digests, const uint8_t *modes, size_t n)
{
	if (n > CH_MAX_KEYS || (n > 0 && (digests == NULL || modes == NULL)))
		return CH_EINVAL;
	for (size_t i = 0; i < n; i++)
		if (modes[i] < CHORUS_KEY_REFERENCE || modes[i] > CHORUS_KEY_EXCLUSIVE)
			return CH_EINVAL;
	return CH_OK;
}

/* ---- the API ---- */

/*
 * Certify writeset gid from origin, which saw last_seen, with its n keys; if
 * it passes, index them (PyCertifier.certify). *v says the verdict. On an
 * error return nothing changed and *v is not set.
 */
int
ch_cert_certify(ch_cert *c, uint64_t gid, uint32_t origin, uint64_t last_seen,
				const uint8_t *digests, const uint8_t *modes, size_t n, ch_cert_verdict *v)
{
	int			rc;

	if ((rc = check_keys(digests, modes, n)) != CH_OK)
		return rc;
	if (last_seen < c->horizon)
	{
		memset(v, 0, sizeof(*v));
		v->kind = CH_CERT_TOO_OLD;
		return CH_OK;
	}
	for (size_t i = 0; i < n; i++)
	{
		const cert_entry *e = find(c, digests + i * 16);

		if (e == NULL)
			continue;
		for (int m = 0; m < e->key.nmodes; m++)
		{
			const ch_cert_slot *s = &e->key.slots[m];
			uint64_t	other_gid;
			uint32_t	other_origin;

			if (!modes_conflict(modes[i], e->key.modes[m]))
				continue;
			/* _Slot.newest_not_from(origin) */
			if (s->origin != origin)
			{
				other_gid = s->gid;
				other_origin = s->origin;
			}
			else
			{
				other_gid = s->gid2;
				other_origin = s->origin2;
			}
			if (other_gid > last_seen)
			{
				v->kind = CH_CERT_CONFLICT;
				v->key = (uint32_t) i;
				v->gid = other_gid;
				v->origin = other_origin;
				v->schema = schema_has(c, other_gid);
				return CH_OK;
			}
		}
	}
	if (n > 0 && (rc = reserve_index(c, n, false)) != CH_OK)
		return rc;
	index_keys(c, gid, origin, digests, modes, n);
	memset(v, 0, sizeof(*v));
	v->kind = CH_CERT_OK;
	return CH_OK;
}

/*
 * Index the n keys of schema change gid from origin without certifying it,
 * and remember gid as a schema change if it has keys (PyCertifier.record).
 */
int
ch_cert_record(ch_cert *c, uint64_t gid, uint32_t origin, const uint8_t *digests,
			   const uint8_t *modes, size_t n)
{
	int			rc;

	if ((rc = check_keys(digests, modes, n)) != CH_OK)
		return rc;
	if (n == 0)
		return CH_OK;
	if ((rc = reserve_index(c, n, true)) != CH_OK)
		return rc;
	index_keys(c, gid, origin, digests, modes, n);
	schema_add(c, gid);
	return CH_OK;
}

/*
 * Forget what is at or below horizon (PyCertifier.purge): the schema GIDs, and
 * each key of the GIDs popped from the history whose every mode's newest GID
 * is at or below it. *dropped is how many keys went. A horizon not above the
 * current one does nothing.
 */
int
ch_cert_purge(ch_cert *c, uint64_t horizon, size_t *dropped)
{
	size_t		gone;

	*dropped = 0;
	if (horizon <= c->horizon)
		return CH_OK;
	c->horizon = horizon;
	for (gone = 0; gone < c->nschema && c->schema[gone] <= horizon; gone++)
		;
	if (gone > 0)
	{
		memmove(c->schema, c->schema + gone, (c->nschema - gone) * sizeof(uint64_t));
		c->nschema -= gone;
	}
	while (c->hlen > 0 && c->hist[c->hhead].gid <= horizon)
	{
		uint32_t	count = c->hist[c->hhead].count;

		c->hhead = c->hhead + 1 == c->hcap ? 0 : c->hhead + 1;
		c->hlen--;
		for (uint32_t i = 0; i < count; i++)
		{
			cert_entry *e = find(c, c->digs + c->dhead * 16);
			bool		old = true;

			c->dhead = c->dhead + 1 == c->dcap ? 0 : c->dhead + 1;
			c->dlen--;
			if (e == NULL)
				continue;
			for (int m = 0; m < e->key.nmodes; m++)
				old = old && e->key.slots[m].gid <= horizon;
			if (old)
			{
				drop_key(c, e);
				(*dropped)++;
			}
		}
	}
	return CH_OK;
}

/* The keys in insertion order, at most cap of them; returns how many there are. */
size_t
ch_cert_dump_keys(const ch_cert *c, ch_cert_key *out, size_t cap)
{
	size_t		n = 0;

	for (uint32_t s = c->first; s != CH_NIL && n < cap; s = c->entries[s].next)
		out[n++] = c->entries[s].key;
	return c->live;
}

size_t
ch_cert_history_len(const ch_cert *c)
{
	return c->hlen;
}

size_t
ch_cert_history_keys(const ch_cert *c)
{
	return c->dlen;
}

/* The history, oldest first: gids and counts (history_len each), digests (history_keys * 16 bytes). */
void
ch_cert_dump_history(const ch_cert *c, uint64_t *gids, uint32_t *counts, uint8_t *digests)
{
	for (size_t i = 0; i < c->hlen; i++)
	{
		size_t		j = c->hhead + i;
		const cert_hist *h = &c->hist[j >= c->hcap ? j - c->hcap : j];

		gids[i] = h->gid;
		counts[i] = h->count;
	}
	for (size_t i = 0; i < c->dlen; i++)
	{
		size_t		j = c->dhead + i;

		memcpy(digests + i * 16, c->digs + (j >= c->dcap ? j - c->dcap : j) * 16, 16);
	}
}

size_t
ch_cert_schema_len(const ch_cert *c)
{
	return c->nschema;
}

void
ch_cert_dump_schema(const ch_cert *c, uint64_t *out)
{
	if (c->nschema > 0)
		memcpy(out, c->schema, c->nschema * sizeof(uint64_t));
}

/* A key with no modes at the end of the insertion order (CH_EINVAL if it is there). */
int
ch_cert_load_key(ch_cert *c, const uint8_t *digest)
{
	int			rc;

	if (find(c, digest) != NULL)
		return CH_EINVAL;
	if ((rc = reserve_keys(c, 1)) != CH_OK)
		return rc;
	add_key(c, digest);
	return CH_OK;
}

/* Set the slot of mode of a loaded key, added after its other modes if new. */
int
ch_cert_load_slot(ch_cert *c, const uint8_t *digest, int mode, const ch_cert_slot *slot)
{
	cert_entry *e = find(c, digest);

	if (e == NULL || mode < CHORUS_KEY_REFERENCE || mode > CHORUS_KEY_EXCLUSIVE)
		return CH_EINVAL;
	*mode_slot(e, mode) = *slot;
	return CH_OK;
}

int
ch_cert_load_history(ch_cert *c, uint64_t gid, const uint8_t *digests, size_t n)
{
	int			rc;

	if (n > CH_MAX_KEYS || (n > 0 && digests == NULL))
		return CH_EINVAL;
	if ((rc = ring_reserve(&c->mem, (void **) &c->hist, &c->hcap, &c->hhead, c->hlen, 1,
						   sizeof(cert_hist))) != CH_OK ||
		(rc = ring_reserve(&c->mem, (void **) &c->digs, &c->dcap, &c->dhead, c->dlen, n, 16)) != CH_OK)
		return rc;
	push_history(c, gid, digests, n);
	return CH_OK;
}

int
ch_cert_load_schema(ch_cert *c, uint64_t gid)
{
	int			rc;

	if ((rc = ch_grow(&c->mem, (void **) &c->schema, &c->schemacap, c->nschema, 1,
					  sizeof(uint64_t))) != CH_OK)
		return rc;
	schema_add(c, gid);
	return CH_OK;
}
