/*
 * mem.c
 *		The byte budget, growable arrays, the hash index and the GID queue the
 *		native core's objects are made of (ch_mem.h). Nothing here changes
 *		what an object holds, only where and in how much memory: the objects
 *		grow first and change their state after, so a refused allocation
 *		leaves them as they were.
 */
#include <stdlib.h>
#include <string.h>

#include "ch_mem.h"

/*
 * Resize *p from old_bytes to new_bytes (0 frees it), counted against m's
 * budget. On failure *p is unchanged: CH_EFULL past the budget, CH_ENOMEM if
 * realloc failed.
 */
int
ch_mem_resize(ch_mem *m, void **p, size_t old_bytes, size_t new_bytes)
{
	void	   *q;

	if (new_bytes > old_bytes && new_bytes - old_bytes > m->limit - m->used)
		return CH_EFULL;
	if (new_bytes == 0)
	{
		free(*p);
		*p = NULL;
		m->used -= old_bytes;
		return CH_OK;
	}
	q = realloc(*p, new_bytes);
	if (q == NULL)
		return CH_ENOMEM;
	*p = q;
	m->used = m->used - old_bytes + new_bytes;
	return CH_OK;
}

void
ch_mem_release(ch_mem *m, void *p, size_t bytes)
{
	free(p);
	m->used -= bytes;
}

/*
 * Make room for add more elements of elem bytes after len in the array *p of
 * *cap elements: the capacity doubles (from 4) until it suffices.
 */
int
ch_grow(ch_mem *m, void **p, size_t *cap, size_t len, size_t add, size_t elem)
{
	size_t		want = *cap;
	int			rc;

	if (add > SIZE_MAX / elem - len)
		return CH_EFULL;
	if (len + add <= *cap)
		return CH_OK;
	if (want < 4)
		want = 4;
	while (want < len + add)
	{
		if (want > SIZE_MAX / 2 / elem)
			return CH_EFULL;
		want *= 2;
	}
	rc = ch_mem_resize(m, p, *cap * elem, want * elem);
	if (rc == CH_OK)
		*cap = want;
	return rc;
}

/* ---- the hash index ---- */

static inline size_t
table_home(const ch_table *t, uint64_t entry)
{
	return (size_t) (entry >> 32) & (t->cap - 1);
}

static inline uint64_t
table_entry(uint64_t hash, uint32_t slot)
{
	return (hash & 0xFFFFFFFF00000000ULL) | ((uint64_t) slot + 1);
}

/* Room for add more slots, rehashing into a larger array if the load would pass one half. */
int
ch_table_reserve(ch_mem *m, ch_table *t, size_t add)
{
	size_t		want = t->cap ? t->cap : 8;
	uint64_t   *old = t->entries;
	size_t		oldcap = t->cap;
	void	   *fresh = NULL;
	int			rc;

	if (add > CH_MAX_SLOTS - t->live)
		return CH_EFULL;
	while ((t->live + add) * 2 > want)
		want *= 2;
	if (want == t->cap)
		return CH_OK;
	rc = ch_mem_resize(m, &fresh, 0, want * sizeof(uint64_t));
	if (rc != CH_OK)
		return rc;
	memset(fresh, 0, want * sizeof(uint64_t));
	t->entries = fresh;
	t->cap = want;
	for (size_t i = 0; i < oldcap; i++)
	{
		size_t		j;

		if (old[i] == 0)
			continue;
		j = table_home(t, old[i]);
		while (t->entries[j] != 0)
			j = (j + 1) & (want - 1);
		t->entries[j] = old[i];
	}
	ch_mem_release(m, old, oldcap * sizeof(uint64_t));
	return CH_OK;
}

uint32_t
ch_table_find(const ch_table *t, uint64_t hash, ch_eq_fn eq, const void *ctx, const void *key)
{
	uint64_t	tag = hash & 0xFFFFFFFF00000000ULL;
	size_t		i;

	if (t->cap == 0)
		return CH_NIL;
	for (i = table_home(t, hash); t->entries[i] != 0; i = (i + 1) & (t->cap - 1))
	{
		uint64_t	e = t->entries[i];

		if ((e & 0xFFFFFFFF00000000ULL) == tag && eq(ctx, (uint32_t) (e & 0xFFFFFFFF) - 1, key))
			return (uint32_t) (e & 0xFFFFFFFF) - 1;
	}
	return CH_NIL;
}

/* Index slot under hash; the caller reserved room and knows its key is absent. */
void
ch_table_insert(ch_table *t, uint64_t hash, uint32_t slot)
{
	size_t		i = table_home(t, hash);

	while (t->entries[i] != 0)
		i = (i + 1) & (t->cap - 1);
	t->entries[i] = table_entry(hash, slot);
	t->live++;
}

/* Drop slot (indexed under hash), shifting back the entries after it (no tombstones). */
void
ch_table_delete(ch_table *t, uint64_t hash, uint32_t slot)
{
	uint64_t	e = table_entry(hash, slot);
	size_t		mask = t->cap - 1;
	size_t		i = table_home(t, hash);
	size_t		j;

	while (t->entries[i] != e)
		i = (i + 1) & mask;
	for (j = (i + 1) & mask; t->entries[j] != 0; j = (j + 1) & mask)
	{
		size_t		k = table_home(t, t->entries[j]);

		/* move the entry at j into the hole at i unless its home lies in (i, j] */
		if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j)))
		{
			t->entries[i] = t->entries[j];
			i = j;
		}
	}
	t->entries[i] = 0;
	t->live--;
}

void
ch_table_free(ch_mem *m, ch_table *t)
{
	ch_mem_release(m, t->entries, t->cap * sizeof(uint64_t));
	t->entries = NULL;
	t->cap = t->live = 0;
}

/* ---- the GID queue ---- */

/* Room for add more GIDs; growing unwraps the ring to the start of the new array. */
int
ch_gidq_reserve(ch_mem *m, ch_gidq *q, size_t add)
{
	void	   *fresh = NULL;
	size_t		want = q->cap ? q->cap : 8;
	int			rc;

	if (add > SIZE_MAX / 2 / sizeof(uint64_t) - q->len)
		return CH_EFULL;
	if (q->len + add <= q->cap)
		return CH_OK;
	while (want < q->len + add)
		want *= 2;
	rc = ch_mem_resize(m, &fresh, 0, want * sizeof(uint64_t));
	if (rc != CH_OK)
		return rc;
	for (size_t i = 0; i < q->len; i++)
		((uint64_t *) fresh)[i] = ch_gidq_at(q, i);
	ch_mem_release(m, q->buf, q->cap * sizeof(uint64_t));
	q->buf = fresh;
	q->cap = want;
	q->head = 0;
	return CH_OK;
}

void
ch_gidq_free(ch_mem *m, ch_gidq *q)
{
	ch_mem_release(m, q->buf, q->cap * sizeof(uint64_t));
	memset(q, 0, sizeof(*q));
}

uint64_t
ch_gidq_at(const ch_gidq *q, size_t i)
{
	size_t		j = q->head + i;

	return q->buf[j >= q->cap ? j - q->cap : j];
}

void
ch_gidq_push_back(ch_gidq *q, uint64_t gid)
{
	size_t		j = q->head + q->len;

	q->buf[j >= q->cap ? j - q->cap : j] = gid;
	q->len++;
}

void
ch_gidq_push_front(ch_gidq *q, uint64_t gid)
{
	q->head = q->head == 0 ? q->cap - 1 : q->head - 1;
	q->buf[q->head] = gid;
	q->len++;
}

uint64_t
ch_gidq_pop_front(ch_gidq *q)
{
	uint64_t	gid = q->buf[q->head];

	q->head = q->head + 1 == q->cap ? 0 : q->head + 1;
	q->len--;
	return gid;
}

/* Remove the first occurrence of gid (deque.remove, list.remove); whether there was one. */
bool
ch_gidq_remove(ch_gidq *q, uint64_t gid)
{
	size_t		i;

	for (i = 0; i < q->len; i++)
		if (ch_gidq_at(q, i) == gid)
			break;
	if (i == q->len)
		return false;
	for (; i + 1 < q->len; i++)
	{
		size_t		j = q->head + i;

		q->buf[j >= q->cap ? j - q->cap : j] = ch_gidq_at(q, i + 1);
	}
	q->len--;
	return true;
}

bool
ch_gidq_contains(const ch_gidq *q, uint64_t gid)
{
	for (size_t i = 0; i < q->len; i++)
		if (ch_gidq_at(q, i) == gid)
			return true;
	return false;
}

static int
gid_cmp(const void *a, const void *b)
{
	uint64_t	x = *(const uint64_t *) a;
	uint64_t	y = *(const uint64_t *) b;

	return (x > y) - (x < y);
}

static void
gids_reverse(uint64_t *a, size_t lo, size_t hi)
{
	while (lo + 1 < hi)
	{
		uint64_t	t = a[lo];

		a[lo++] = a[--hi];
		a[hi] = t;
	}
}

/* Sort ascending, in place (deque(sorted(q))). */
void
ch_gidq_sort(ch_gidq *q)
{
	if (q->head + q->len > q->cap)
	{
		/* wrapped: rotate the array left by head first (three reversals, no allocation) */
		gids_reverse(q->buf, 0, q->head);
		gids_reverse(q->buf, q->head, q->cap);
		gids_reverse(q->buf, 0, q->cap);
		q->head = 0;
	}
	if (q->len > 0)
		qsort(q->buf + q->head, q->len, sizeof(uint64_t), gid_cmp);
}

/* ---- hashing ---- */

static inline uint64_t
mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xFF51AFD7ED558CCDULL;
	x ^= x >> 33;
	x *= 0xC4CEB9FE1A85EC53ULL;
	x ^= x >> 33;
	return x;
}

/* Digests are BLAKE2b output, uniform already; mixing keeps forged ones from clustering. */
uint64_t
ch_hash_digest(const uint8_t *digest)
{
	uint64_t	a,
				b;

	memcpy(&a, digest, 8);
	memcpy(&b, digest + 8, 8);
	return mix64(a ^ mix64(b));
}

uint64_t
ch_hash_gid(uint64_t gid)
{
	return mix64(gid);
}
