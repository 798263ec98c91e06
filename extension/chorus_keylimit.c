/*
 * chorus_keylimit.c
 *		A writeset holds at most chorus.max_row_keys_per_table row keys of one
 *		table (docs/ISOLATION.md). Past that, the table's row keys are dropped
 *		as they come and, when the writeset is written, replaced by one table
 *		key in exclusive mode. That is the one mode that conflicts with every
 *		other writeset holding a key of the table, because every table a row
 *		key names (the row's own table, and the parent table a foreign-key
 *		reference names) also gets its table key in reference mode, once per
 *		writeset and outside the limit (chorus_keylimit_table_key). So a
 *		conflict the row keys would have found is never missed; a false one is
 *		possible. The backend's key buffer, the writeset and every
 *		node's certification index stay bounded however many rows a
 *		transaction changes. The origin decides; the writeset carries the
 *		result, so every node certifies the same keys.
 */
#include "postgres.h"

#include "utils/memutils.h"

#include "chorus_keylimit.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

#define TABLE_ID_SIZE (2 * NAMEDATALEN + 2)

typedef struct KeyCount
{
	char		id[TABLE_ID_SIZE];	/* schema, NUL, table, NUL (zero-padded) */
	uint32		count;			/* row keys appended */
	bool		escalated;		/* past the limit */
	bool		added;			/* its exclusive table key is in the buffer */
	bool		referenced;		/* its table key in reference mode is in the buffer */
} KeyCount;

/* One key in a key buffer: its parts' positions, as chorus_put_key_head and _blob wrote them. */
typedef struct KeyView
{
	int			start;			/* the key's first byte */
	int			end;			/* after its last */
	int			nparts;
	const char *nsp;
	uint32		nsplen;
	const char *rel;
	uint32		rellen;
} KeyView;

static uint32
get_u32(const char *p)
{
	const unsigned char *u = (const unsigned char *) p;

	return ((uint32) u[0] << 24) | ((uint32) u[1] << 16) | ((uint32) u[2] << 8) | u[3];
}

/* Read the key at pos of buf (len bytes): false past the end (the buffer is ours: never malformed). */
static bool
key_at(const char *buf, int len, int pos, KeyView *k)
{
	int			i;

	if (pos + 3 > len)
		return false;
	k->start = pos;
	k->nparts = ((unsigned char) buf[pos + 1] << 8) | (unsigned char) buf[pos + 2];
	pos += 3;
	k->nsp = k->rel = NULL;
	k->nsplen = k->rellen = 0;
	for (i = 0; i < k->nparts; i++)
	{
		uint32		n;

		if (pos + 4 > len)
			elog(ERROR, "chorus: the key buffer is damaged");
		n = get_u32(buf + pos);
		if (i == 0)
			k->nsp = buf + pos + 4, k->nsplen = n;
		else if (i == 1)
			k->rel = buf + pos + 4, k->rellen = n;
		pos += 4 + (int) n;
		if (pos > len)
			elog(ERROR, "chorus: the key buffer is damaged");
	}
	k->end = pos;
	return true;
}

/* Up to this many tables a writeset's counters are found by a walk of their list. */
#define KEYLIMIT_WALK 16

/* An entry of the hash table by name: the counter of the table. */
typedef struct KeyCountEntry
{
	char		id[TABLE_ID_SIZE];
	KeyCount   *count;
} KeyCountEntry;

/* Is c the counter of nsp.rel? */
static bool
count_is(const KeyCount *c, const char *nsp, uint32 nsplen, const char *rel, uint32 rellen)
{
	return c->id[nsplen] == '\0' && c->id[nsplen + 1 + rellen] == '\0' && memcmp(c->id, nsp, nsplen) == 0 &&
		memcmp(c->id + nsplen + 1, rel, rellen) == 0;
}

/* Enter counter c into kl's hash table by name. */
static void
count_enter(ChorusKeyLimit *kl, KeyCount *c)
{
	KeyCountEntry *e = hash_search(kl->tables, c->id, HASH_ENTER, NULL);

	e->count = c;
}

/* The counter of table nsp.rel (made if make), or NULL. */
static KeyCount *
table_count(ChorusKeyLimit *kl, MemoryContext cxt, const char *nsp, uint32 nsplen, const char *rel,
			uint32 rellen, bool make)
{
	char		id[TABLE_ID_SIZE];
	KeyCount   *c;
	int			i;

	if (nsplen >= NAMEDATALEN || rellen >= NAMEDATALEN)
		return NULL;			/* not a table's name (a name is never this long) */
	if (kl->tables == NULL)
	{
		/* the newest first: a row's keys are mostly of the table just named */
		for (i = kl->ncounts - 1; i >= 0; i--)
			if (count_is(kl->counts[i], nsp, nsplen, rel, rellen))
				return kl->counts[i];
		if (!make)
			return NULL;
	}
	memset(id, 0, sizeof(id));
	memcpy(id, nsp, nsplen);
	memcpy(id + nsplen + 1, rel, rellen);
	if (kl->tables != NULL)
	{
		KeyCountEntry *e = hash_search(kl->tables, id, HASH_FIND, NULL);

		if (e != NULL)
			return e->count;
		if (!make)
			return NULL;
	}
	c = MemoryContextAllocZero(cxt, sizeof(KeyCount));
	memcpy(c->id, id, sizeof(id));
	if (kl->ncounts == kl->maxcounts)
	{
		kl->maxcounts = kl->maxcounts ? kl->maxcounts * 2 : 4;
		kl->counts = kl->counts ? repalloc(kl->counts, sizeof(KeyCount *) * kl->maxcounts)
			: MemoryContextAlloc(cxt, sizeof(KeyCount *) * kl->maxcounts);
	}
	kl->counts[kl->ncounts++] = c;
	if (kl->tables != NULL)
		count_enter(kl, c);
	else if (kl->ncounts > KEYLIMIT_WALK)
	{
		HASHCTL		ctl;

		ctl.keysize = TABLE_ID_SIZE;
		ctl.entrysize = sizeof(KeyCountEntry);
		ctl.hcxt = cxt;
		kl->tables = hash_create("chorus row keys per table", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		for (i = 0; i < kl->ncounts; i++)
			count_enter(kl, kl->counts[i]);
	}
	return c;
}

/* The counter of the key's table (made if make), or NULL. */
static KeyCount *
key_table(ChorusKeyLimit *kl, MemoryContext cxt, const KeyView *k, bool make)
{
	if (k->nparts < 2)
		return NULL;
	return table_count(kl, cxt, k->nsp, k->nsplen, k->rel, k->rellen, make);
}

/* Append c's table key in reference mode unless it is there: 1 if appended. */
static uint32
reference_once(KeyCount *c, StringInfo keys)
{
	if (c == NULL || c->referenced)
		return 0;
	chorus_put_table_key(keys, CHORUS_KEY_REFERENCE, c->id, c->id + strlen(c->id) + 1);
	c->referenced = true;
	return 1;
}

/*
 * chorus_keylimit_table_key
 *		The table key of nsp.rel in reference mode, appended to keys the first
 *		time in the writeset. Returns how many keys it appended (0 or 1).
 */
uint32
chorus_keylimit_table_key(ChorusKeyLimit *kl, MemoryContext cxt, StringInfo keys, const char *nsp,
						  const char *rel)
{
	KeyCount   *c = table_count(kl, cxt, nsp, strlen(nsp), rel, strlen(rel), true);

	if (c == NULL)				/* never: names are shorter than NAMEDATALEN */
	{
		chorus_put_table_key(keys, CHORUS_KEY_REFERENCE, nsp, rel);
		return 1;
	}
	return reference_once(c, keys);
}

/*
 * chorus_keylimit_append
 *		Append to keys the keys of one row change (src, len: written as in a
 *		key buffer), leaving out row keys of tables past limit. Returns how
 *		many it appended.
 */
uint32
chorus_keylimit_append(ChorusKeyLimit *kl, MemoryContext cxt, StringInfo keys, const char *src, int len,
					   int limit)
{
	KeyView		k;
	uint32		n = 0;
	int			pos = 0;

	while (key_at(src, len, pos, &k))
	{
		KeyCount   *c = k.nparts > 2 ? key_table(kl, cxt, &k, true) : NULL;

		pos = k.end;
		if (c != NULL)
		{
			n += reference_once(c, keys);
			if (c->escalated)
				continue;
			if (++c->count > (uint32) limit)
			{
				c->escalated = true;
				kl->nescalated++;
				continue;
			}
		}
		appendBinaryStringInfo(keys, src + k.start, k.end - k.start);
		n++;
	}
	return n;
}

/*
 * chorus_keylimit_finish
 *		The keys as the writeset carries them: without the row keys of the
 *		tables past the limit, and with each such table's key in exclusive
 *		mode. Rewrites keys in place (again and again alike); returns the new
 *		count.
 */
uint32
chorus_keylimit_finish(ChorusKeyLimit *kl, StringInfo keys, uint32 nkeys)
{
	StringInfoData out;
	KeyCount   *c;
	int			i;
	KeyView		k;
	int			pos = 0;
	uint32		n = 0;

	if (kl->nescalated == 0)
		return nkeys;
	initStringInfo(&out);
	while (key_at(keys->data, keys->len, pos, &k))
	{
		pos = k.end;
		if (k.nparts > 2 && (c = key_table(kl, NULL, &k, false)) != NULL && c->escalated)
			continue;
		appendBinaryStringInfo(&out, keys->data + k.start, k.end - k.start);
		n++;
	}
	for (i = 0; i < kl->ncounts; i++)
	{
		c = kl->counts[i];
		if (!c->escalated || c->added)
			continue;
		chorus_put_table_key(&out, CHORUS_KEY_EXCLUSIVE, c->id, c->id + strlen(c->id) + 1);
		c->added = true;		/* written again (a second serialization), the buffer stays the same */
		n++;
	}
	resetStringInfo(keys);
	appendBinaryStringInfo(keys, out.data, out.len);
	pfree(out.data);
	return n;
}
