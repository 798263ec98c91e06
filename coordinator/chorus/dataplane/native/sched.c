/*
 * sched.c
 *		The apply scheduler (docs/NATIVE.md section 3.2, "Scheduler"): a port of
 *		coordinator/chorus/commit/scheduler.py's PyScheduler, the reference,
 *		with the same dependencies, runs, replays and descriptions for the same
 *		calls (tests/unit/test_dataplane_sched.py). Seed streams-parallel-apply
 *		4.5; docs/ARCHITECTURE.md invariant 4.
 *
 *		Every certified writeset is registered in GID order with its keys. It
 *		depends on every earlier registered one that holds one of its keys in a
 *		conflicting mode; per key the scheduler keeps the holders' count, the
 *		newest exclusive and update holders and the non-exclusive holders since
 *		the last exclusive one (sch_key, PyScheduler's _KeyState), so that
 *		registering costs O(its keys). A schema change (barrier) depends on
 *		everything registered and everything after it depends on it.
 *
 *		Items and key states are slabs indexed by GID and by digest (ch_table).
 *		An item keeps the GIDs it depended on when registered and a count of
 *		those still registered ("waiting", PyScheduler's len(deps)). GIDs are
 *		registered in increasing order and never again once committed, so a
 *		dependency is pending exactly while it is registered: committing a GID
 *		only decrements its dependents' counts. An item keeps the slots of its
 *		key states, which live at least as long as it does (it is one of their
 *		holders).
 *
 *		The remote queue and the replay list are GID deques (ch_gidq) used as
 *		the reference uses its deque and list, duplicates and all.
 *
 *		One difference from the reference, where it has no contract: a GID
 *		must be above every GID registered before (PyScheduler.add's docstring
 *		says so; CommitPipeline._admit stops the daemon otherwise), and here an
 *		add that breaks it is refused with CH_EINVAL.
 */
#include <stdlib.h>
#include <string.h>

#include "ch_mem.h"
#include "chorus_wire.h"		/* extension/: the key modes */

typedef struct sch_item
{
	uint64_t	gid;
	uint64_t	follows;		/* the GID registered just before it */
	uint64_t	epoch;			/* the last add that depended on it (no duplicates) */
	uint32_t   *keys;			/* slots of its key states, one per key listed */
	uint64_t   *deps;			/* what it depended on when registered */
	uint64_t   *dependents;		/* what depends on it */
	uint32_t	nkeys;
	uint32_t	ndeps;
	uint32_t	waiting;		/* of deps, how many are still registered */
	uint32_t	next_free;
	size_t		ndependents;
	size_t		capdependents;
	bool		local;
	bool		dispatched;
	bool		replay;
	bool		barrier;
	bool		alone;			/* an attempt failed: never part of a run again */
} sch_item;

typedef struct sch_key
{
	uint8_t		digest[16];
	int64_t		holders;		/* registered writesets holding it, any mode */
	uint64_t	last_exclusive;
	uint64_t	last_update;
	uint64_t   *since;			/* non-exclusive holders since the last exclusive one */
	size_t		nsince;
	size_t		capsince;
	uint32_t	adding;			/* during an add: its non-exclusive listings */
	uint32_t	next_free;
	bool		fresh;			/* during an add: made by it */
} sch_key;

struct ch_sched
{
	ch_mem		mem;

	sch_item   *items;
	size_t		itemcap;
	uint32_t	itemused;		/* slots ever handed out */
	uint32_t	itemfree;		/* free list, or CH_NIL */
	uint32_t	nitems;
	ch_table	byid;

	sch_key    *keys;
	size_t		keycap;
	uint32_t	keyused;
	uint32_t	keyfree;
	uint32_t	nkeys;
	ch_table	bykey;

	uint64_t   *order;			/* registered GIDs in order, and committed ones until compacted */
	size_t		norder;
	size_t		ordercap;

	ch_gidq		remote;			/* undispatched remote GIDs */
	ch_gidq		replays;		/* local GIDs to replay */
	uint64_t	barrier;		/* the newest schema change registered */
	uint64_t	last;			/* the newest GID registered */
	uint64_t	epoch;

	uint64_t   *scratch;		/* an add's dependencies while it finds them */
	size_t		scratchcap;
};

static bool
item_eq(const void *ctx, uint32_t slot, const void *key)
{
	return ((const sch_item *) ctx)[slot].gid == *(const uint64_t *) key;
}

static bool
key_eq(const void *ctx, uint32_t slot, const void *key)
{
	return memcmp(((const sch_key *) ctx)[slot].digest, key, 16) == 0;
}

static sch_item *
find_item(const ch_sched *s, uint64_t gid)
{
	uint32_t	slot = ch_table_find(&s->byid, ch_hash_gid(gid), item_eq, s->items, &gid);

	return slot == CH_NIL ? NULL : &s->items[slot];
}

static uint32_t
find_key(const ch_sched *s, const uint8_t *digest)
{
	return ch_table_find(&s->bykey, ch_hash_digest(digest), key_eq, s->keys, digest);
}

size_t
ch_sched_size(void)
{
	return sizeof(ch_sched);
}

int
ch_sched_init(ch_sched *s, size_t max_bytes)
{
	memset(s, 0, sizeof(*s));
	s->mem.limit = max_bytes;
	s->itemfree = s->keyfree = CH_NIL;
	return CH_OK;
}

static void
free_item_arrays(ch_sched *s, sch_item *it)
{
	ch_mem_release(&s->mem, it->keys, (size_t) it->nkeys * sizeof(uint32_t));
	ch_mem_release(&s->mem, it->deps, (size_t) it->ndeps * sizeof(uint64_t));
	ch_mem_release(&s->mem, it->dependents, it->capdependents * sizeof(uint64_t));
}

void
ch_sched_free(ch_sched *s)
{
	for (size_t i = 0; i < s->norder; i++)
	{
		sch_item   *it = find_item(s, s->order[i]);

		if (it != NULL)
			free_item_arrays(s, it);
	}
	for (uint32_t i = 0; i < s->keyused; i++)
		ch_mem_release(&s->mem, s->keys[i].since, s->keys[i].capsince * sizeof(uint64_t));
	ch_mem_release(&s->mem, s->items, s->itemcap * sizeof(sch_item));
	ch_mem_release(&s->mem, s->keys, s->keycap * sizeof(sch_key));
	ch_table_free(&s->mem, &s->byid);
	ch_table_free(&s->mem, &s->bykey);
	ch_mem_release(&s->mem, s->order, s->ordercap * sizeof(uint64_t));
	ch_gidq_free(&s->mem, &s->remote);
	ch_gidq_free(&s->mem, &s->replays);
	ch_mem_release(&s->mem, s->scratch, s->scratchcap * sizeof(uint64_t));
	memset(s, 0, sizeof(*s));
}

size_t
ch_sched_len(const ch_sched *s)
{
	return s->nitems;
}

size_t
ch_sched_queued(const ch_sched *s)
{
	return s->remote.len + s->replays.len;
}

size_t
ch_sched_remote_len(const ch_sched *s)
{
	return s->remote.len;
}

size_t
ch_sched_bytes(const ch_sched *s)
{
	return s->mem.used;
}

/* ---- registering ---- */

/* PyScheduler._depend, on the state before the add: note other once if it is registered. */
static int
depend(ch_sched *s, uint64_t other, size_t *ndeps)
{
	sch_item   *it = find_item(s, other);
	int			rc;

	if (it == NULL || it->epoch == s->epoch)
		return CH_OK;
	rc = ch_grow(&s->mem, (void **) &s->scratch, &s->scratchcap, *ndeps, 1, sizeof(uint64_t));
	if (rc != CH_OK)
		return rc;
	it->epoch = s->epoch;
	s->scratch[(*ndeps)++] = other;
	return CH_OK;
}

/*
 * What the new writeset depends on. PyScheduler.add updates each key's state
 * as it goes, but what a later listing of the same key then finds is either
 * the new GID itself (never a dependency) or what an earlier listing already
 * found, so the union over the state before the add is the same set.
 */
static int
find_deps(ch_sched *s, const uint8_t *digests, const uint8_t *modes, size_t n, bool barrier,
		  size_t *ndeps)
{
	int			rc = CH_OK;

	*ndeps = 0;
	if (barrier)
	{
		for (size_t i = 0; i < s->norder && rc == CH_OK; i++)
			rc = depend(s, s->order[i], ndeps);
	}
	else
		rc = depend(s, s->barrier, ndeps);
	for (size_t i = 0; i < n && rc == CH_OK; i++)
	{
		uint32_t	k = find_key(s, digests + i * 16);
		const sch_key *ks;

		if (k == CH_NIL)
			continue;
		ks = &s->keys[k];
		rc = depend(s, ks->last_exclusive, ndeps);
		if (modes[i] == CHORUS_KEY_EXCLUSIVE)
		{
			for (size_t j = 0; j < ks->nsince && rc == CH_OK; j++)
				rc = depend(s, ks->since[j], ndeps);
		}
		else if (modes[i] == CHORUS_KEY_UPDATE && rc == CH_OK)
			rc = depend(s, ks->last_update, ndeps);
	}
	return rc;
}

/* Drop the GIDs no longer registered from the order (in place). */
static void
compact_order(ch_sched *s)
{
	size_t		n = 0;

	for (size_t i = 0; i < s->norder; i++)
		if (find_item(s, s->order[i]) != NULL)
			s->order[n++] = s->order[i];
	s->norder = n;
}

/* A key state for digest from the reserved room, marked fresh. */
static uint32_t
new_key(ch_sched *s, const uint8_t *digest)
{
	uint32_t	slot;
	sch_key    *ks;

	if (s->keyfree != CH_NIL)
	{
		slot = s->keyfree;
		s->keyfree = s->keys[slot].next_free;
	}
	else
		slot = s->keyused++;
	ks = &s->keys[slot];
	memset(ks, 0, sizeof(*ks));
	memcpy(ks->digest, digest, 16);
	ks->fresh = true;
	s->nkeys++;
	ch_table_insert(&s->bykey, ch_hash_digest(digest), slot);
	return slot;
}

static void
drop_key(ch_sched *s, uint32_t slot)
{
	sch_key    *ks = &s->keys[slot];

	ch_table_delete(&s->bykey, ch_hash_digest(ks->digest), slot);
	ch_mem_release(&s->mem, ks->since, ks->capsince * sizeof(uint64_t));
	ks->since = NULL;
	ks->nsince = ks->capsince = 0;
	ks->fresh = false;
	ks->next_free = s->keyfree;
	s->keyfree = slot;
	s->nkeys--;
}

/*
 * Room for everything the add will hold, before it changes anything: slots
 * and indexes, the item's arrays, one more dependent for each dependency, the
 * key states it makes and their lists. On failure what it made is undone.
 */
static int
make_room(ch_sched *s, const uint8_t *digests, const uint8_t *modes, size_t n, bool local,
		  size_t ndeps, uint32_t **keys, uint64_t **deps)
{
	size_t		freeitems = s->itemused - s->nitems;
	size_t		freekeys = s->keyused - s->nkeys;
	int			rc;

	*keys = NULL;
	*deps = NULL;
	if (s->nitems >= CH_MAX_SLOTS || n > CH_MAX_SLOTS - s->nkeys)
		return CH_EFULL;
	if ((rc = ch_grow(&s->mem, (void **) &s->items, &s->itemcap, s->itemused, freeitems ? 0 : 1,
					  sizeof(sch_item))) != CH_OK ||
		(rc = ch_table_reserve(&s->mem, &s->byid, 1)) != CH_OK ||
		(rc = ch_grow(&s->mem, (void **) &s->order, &s->ordercap, s->norder, 1,
					  sizeof(uint64_t))) != CH_OK ||
		(!local && (rc = ch_gidq_reserve(&s->mem, &s->remote, 1)) != CH_OK) ||
		(rc = ch_grow(&s->mem, (void **) &s->keys, &s->keycap, s->keyused,
					  n > freekeys ? n - freekeys : 0, sizeof(sch_key))) != CH_OK ||
		(rc = ch_table_reserve(&s->mem, &s->bykey, n)) != CH_OK ||
		(rc = ch_mem_resize(&s->mem, (void **) keys, 0, n * sizeof(uint32_t))) != CH_OK)
		return rc;
	if ((rc = ch_mem_resize(&s->mem, (void **) deps, 0, ndeps * sizeof(uint64_t))) != CH_OK)
		goto fail;
	for (size_t i = 0; i < ndeps; i++)
	{
		sch_item   *o = find_item(s, s->scratch[i]);

		rc = ch_grow(&s->mem, (void **) &o->dependents, &o->capdependents, o->ndependents, 1,
					 sizeof(uint64_t));
		if (rc != CH_OK)
			goto fail;
	}

	/* the key states (new ones from the reserved room), then room in their lists */
	for (size_t i = 0; i < n; i++)
	{
		uint32_t	k = find_key(s, digests + i * 16);

		(*keys)[i] = k != CH_NIL ? k : new_key(s, digests + i * 16);
		if (modes[i] != CHORUS_KEY_EXCLUSIVE)
			s->keys[(*keys)[i]].adding++;
	}
	for (size_t i = 0; i < n; i++)
	{
		sch_key    *ks = &s->keys[(*keys)[i]];

		if (ks->adding == 0)
			continue;
		rc = ch_grow(&s->mem, (void **) &ks->since, &ks->capsince, ks->nsince, ks->adding,
					 sizeof(uint64_t));
		ks->adding = 0;
		if (rc != CH_OK)
		{
			for (size_t j = 0; j < n; j++)
			{
				ks = &s->keys[(*keys)[j]];
				ks->adding = 0;
				if (ks->fresh)
					drop_key(s, (*keys)[j]);
			}
			goto fail;
		}
	}
	return CH_OK;

fail:
	ch_mem_release(&s->mem, *keys, n * sizeof(uint32_t));
	ch_mem_release(&s->mem, *deps, ndeps * sizeof(uint64_t));
	*keys = NULL;
	*deps = NULL;
	return rc;
}

/*
 * Register certified writeset gid with its n keys (PyScheduler.add). A remote
 * one (!local) is queued for dispatch; a barrier waits for everything before
 * it, and everything after it waits for it.
 */
int
ch_sched_add(ch_sched *s, uint64_t gid, const uint8_t *digests, const uint8_t *modes, size_t n,
			 int local, int barrier)
{
	size_t		ndeps;
	uint32_t   *keys;
	uint64_t   *deps;
	uint32_t	slot;
	sch_item   *it;
	int			rc;

	if (gid <= s->last || n > CH_MAX_KEYS || (n > 0 && (digests == NULL || modes == NULL)))
		return CH_EINVAL;
	if (s->norder > 2 * (size_t) s->nitems + 64)
		compact_order(s);
	s->epoch++;
	if ((rc = find_deps(s, digests, modes, n, barrier, &ndeps)) != CH_OK ||
		(rc = make_room(s, digests, modes, n, !!local, ndeps, &keys, &deps)) != CH_OK)
		return rc;

	/* nothing fails from here on */
	if (s->itemfree != CH_NIL)
	{
		slot = s->itemfree;
		s->itemfree = s->items[slot].next_free;
	}
	else
		slot = s->itemused++;
	it = &s->items[slot];
	memset(it, 0, sizeof(*it));
	it->gid = gid;
	it->follows = s->last;
	it->local = !!local;
	it->barrier = !!barrier;
	it->keys = keys;
	it->nkeys = (uint32_t) n;
	it->deps = deps;
	it->ndeps = it->waiting = (uint32_t) ndeps;
	if (ndeps > 0)
		memcpy(deps, s->scratch, ndeps * sizeof(uint64_t));
	s->last = gid;
	for (size_t i = 0; i < ndeps; i++)
	{
		sch_item   *o = find_item(s, deps[i]);

		o->dependents[o->ndependents++] = gid;
	}
	if (barrier)
		s->barrier = gid;
	ch_table_insert(&s->byid, ch_hash_gid(gid), slot);
	s->nitems++;
	s->order[s->norder++] = gid;

	for (size_t i = 0; i < n; i++)
	{
		sch_key    *ks = &s->keys[keys[i]];

		ks->fresh = false;
		if (modes[i] == CHORUS_KEY_EXCLUSIVE)
		{
			ks->last_exclusive = gid;
			ks->nsince = 0;
		}
		else
		{
			if (modes[i] == CHORUS_KEY_UPDATE)
				ks->last_update = gid;
			ks->since[ks->nsince++] = gid;
			if (ks->nsince > 2 * (uint64_t) (ks->holders > 0 ? ks->holders : 0) + 16)
			{
				/* drop the committed ones */
				size_t		m = 0;

				for (size_t j = 0; j < ks->nsince; j++)
					if (find_item(s, ks->since[j]) != NULL)
						ks->since[m++] = ks->since[j];
				ks->nsince = m;
			}
		}
		ks->holders++;
	}
	if (!local)
		ch_gidq_push_back(&s->remote, gid);
	return CH_OK;
}

/* ---- dispatching ---- */

/* A local writeset's backend could not commit it: apply it from its writeset. */
int
ch_sched_replay(ch_sched *s, uint64_t gid)
{
	sch_item   *it = find_item(s, gid);
	int			rc;

	if (it == NULL || !it->local || it->replay)
		return CH_OK;
	if ((rc = ch_gidq_reserve(&s->mem, &s->replays, 1)) != CH_OK)
		return rc;
	it->replay = true;
	ch_gidq_push_back(&s->replays, gid);
	return CH_OK;
}

/*
 * After a database restart every registered writeset is (re)applied, local
 * ones by replay (PyScheduler.replay_all_from, whose argument it does not
 * read either). out (cap at least ch_sched_len) gets every registered GID
 * in order.
 */
int
ch_sched_replay_all(ch_sched *s, uint64_t *out, size_t cap)
{
	size_t		n = 0,
				nlocal = 0;
	int			rc;

	if (cap < s->nitems || (s->nitems > 0 && out == NULL))
		return CH_EINVAL;
	for (size_t i = 0; i < s->norder; i++)
	{
		sch_item   *it = find_item(s, s->order[i]);

		if (it != NULL)
			nlocal += it->local;
	}
	if ((rc = ch_gidq_reserve(&s->mem, &s->replays,
							  nlocal > s->replays.len ? nlocal - s->replays.len : 0)) != CH_OK ||
		(rc = ch_gidq_reserve(&s->mem, &s->remote,
							  s->nitems - nlocal > s->remote.len ? s->nitems - nlocal - s->remote.len : 0)) != CH_OK)
		return rc;
	s->replays.len = s->replays.head = 0;
	s->remote.len = s->remote.head = 0;
	for (size_t i = 0; i < s->norder; i++)
	{
		sch_item   *it = find_item(s, s->order[i]);

		if (it == NULL)
			continue;
		it->dispatched = false;
		if (it->local)
		{
			it->replay = true;
			ch_gidq_push_back(&s->replays, it->gid);
		}
		else
			ch_gidq_push_back(&s->remote, it->gid);
		out[n++] = it->gid;
	}
	return CH_OK;
}

/*
 * The next local writeset to replay, once what it depends on has committed
 * (PyScheduler.next_replay): 1 and *gid, 0 if none is ready, or an error.
 */
int
ch_sched_next_replay(ch_sched *s, uint64_t *gid)
{
	sch_item   *it;

	if (s->replays.len == 0)
		return 0;
	it = find_item(s, ch_gidq_at(&s->replays, 0));
	if (it == NULL)
		return CH_ESTATE;
	if (it->waiting > 0)
		return 0;
	*gid = ch_gidq_pop_front(&s->replays);
	it->dispatched = true;
	return 1;
}

/* PyScheduler's deps.issubset(run): each pending dependency is in the run. */
static bool
waits_only_on(const sch_item *it, const uint64_t *run, size_t len)
{
	uint32_t	inside = 0;

	if (it->waiting == 0)
		return true;
	if (it->waiting > len)
		return false;
	for (uint32_t i = 0; i < it->ndeps; i++)
		for (size_t j = 0; j < len; j++)
			if (it->deps[i] == run[j])
			{
				inside++;
				break;
			}
	/* run members are registered, so each dependency found there is a pending one */
	return inside == it->waiting;
}

/*
 * Up to limit runs of remote GIDs to dispatch now, in GID order
 * (PyScheduler.ready_runs). A run is a ready GID and the GIDs registered
 * right after it that wait for nothing but the run's earlier GIDs, at most
 * max_run of them and only while fits (if given) accepts the run with the
 * next one; a schema change, and a GID whose earlier attempt failed, goes
 * alone. fits must not call the scheduler.
 *
 * gids and lens must each hold min(remote queue, limit * max(max_run, 1))
 * entries (cap): the runs' GIDs one after the other, and each run's length.
 * *nruns is how many runs. Returns CH_OK, or CH_EINVAL (cap too small,
 * nothing done), or CH_ESTATE / CH_ECALLBACK half way, as the reference
 * raises: the GIDs taken so far stay dispatched.
 */
int
ch_sched_ready_runs(ch_sched *s, size_t limit, size_t max_run, ch_sched_fits_fn fits, void *arg,
					uint64_t *gids, size_t cap, uint32_t *lens, size_t *nruns)
{
	size_t		per = max_run > 1 ? max_run : 1;
	size_t		need = s->remote.len;
	size_t		total = 0;

	*nruns = 0;
	if (limit <= SIZE_MAX / per && limit * per < need)
		need = limit * per;
	if (cap < need)
		return CH_EINVAL;
	while (s->remote.len > 0 && *nruns < limit)
	{
		sch_item   *head = find_item(s, ch_gidq_at(&s->remote, 0));
		size_t		start = total;
		bool		alone;

		if (head == NULL)
			return CH_ESTATE;
		if (head->waiting > 0)
			break;
		ch_gidq_pop_front(&s->remote);
		head->dispatched = true;
		gids[total++] = head->gid;
		alone = head->barrier || head->alone;
		while (!alone && total - start < max_run && s->remote.len > 0)
		{
			uint64_t	g = ch_gidq_at(&s->remote, 0);
			sch_item   *next = find_item(s, g);

			if (next == NULL)
				return CH_ESTATE;
			if (next->follows != gids[total - 1] || next->barrier || next->alone ||
				!waits_only_on(next, gids + start, total - start))
				break;
			if (fits != NULL)
			{
				int			ok;

				gids[total] = g;	/* the run with it, for fits to see */
				ok = fits(arg, gids + start, total - start + 1);
				if (ok < 0)
					return CH_ECALLBACK;
				if (ok == 0)
					break;
				if ((next = find_item(s, g)) == NULL)
					return CH_ESTATE;
			}
			ch_gidq_pop_front(&s->remote);
			next->dispatched = true;
			gids[total++] = g;
		}
		lens[(*nruns)++] = (uint32_t) (total - start);
	}
	return CH_OK;
}

/*
 * An apply attempt of gid failed transiently: it goes back to the front, to
 * be applied alone from now on (PyScheduler.redispatch).
 */
int
ch_sched_redispatch(ch_sched *s, uint64_t gid)
{
	sch_item   *it = find_item(s, gid);
	int			rc;

	if (it == NULL)
		return CH_OK;
	if ((rc = ch_gidq_reserve(&s->mem, it->local ? &s->replays : &s->remote, 1)) != CH_OK)
		return rc;
	it->dispatched = false;
	it->alone = true;
	if (it->local)
		ch_gidq_push_front(&s->replays, gid);
	else
	{
		ch_gidq_push_front(&s->remote, gid);
		ch_gidq_sort(&s->remote);
	}
	return CH_OK;
}

/* ---- committing ---- */

/* gid committed on this node: release what waited for it (PyScheduler.committed). */
int
ch_sched_committed(ch_sched *s, uint64_t gid)
{
	sch_item   *it = find_item(s, gid);
	uint32_t	slot;

	if (it == NULL)
		return CH_OK;
	for (uint32_t i = 0; i < it->nkeys; i++)
	{
		/* a key state outlives its holders: this listing's is still there */
		sch_key    *ks = &s->keys[it->keys[i]];

		if (--ks->holders <= 0)
			drop_key(s, it->keys[i]);
	}
	for (size_t i = 0; i < it->ndependents; i++)
	{
		sch_item   *d = find_item(s, it->dependents[i]);

		if (d != NULL)
			d->waiting--;
	}
	if (it->replay)
		ch_gidq_remove(&s->replays, gid);
	if (!it->local && !it->dispatched)	/* committed without this node applying it */
		ch_gidq_remove(&s->remote, gid);
	slot = (uint32_t) (it - s->items);
	ch_table_delete(&s->byid, ch_hash_gid(gid), slot);
	free_item_arrays(s, it);
	memset(it, 0, sizeof(*it));
	it->next_free = s->itemfree;
	s->itemfree = slot;
	s->nitems--;
	return CH_OK;
}

/* Every registered GID at or below gid committed, in order. */
int
ch_sched_committed_upto(ch_sched *s, uint64_t gid)
{
	for (size_t i = 0; i < s->norder && s->order[i] <= gid; i++)
		ch_sched_committed(s, s->order[i]);
	return CH_OK;
}

/* PyScheduler.describe: waits_for is the first five of sorted(deps). */
void
ch_sched_describe(const ch_sched *s, uint64_t gid, ch_sched_info *out)
{
	const sch_item *it = find_item(s, gid);

	memset(out, 0, sizeof(*out));
	if (it == NULL)
		return;
	out->scheduled = 1;
	out->local = it->local;
	out->dispatched = it->dispatched;
	out->replay = it->replay;
	for (uint32_t i = 0; i < it->ndeps; i++)
	{
		uint64_t	d = it->deps[i];
		uint32_t	j;

		if (find_item(s, d) == NULL)
			continue;
		/* insert into the sorted five smallest */
		if (out->nwaits == 5 && d >= out->waits_for[4])
			continue;
		j = out->nwaits < 5 ? out->nwaits++ : 4;
		while (j > 0 && out->waits_for[j - 1] > d)
		{
			out->waits_for[j] = out->waits_for[j - 1];
			j--;
		}
		out->waits_for[j] = d;
	}
}

/* The registered GIDs in order, at most cap of them; returns how many there are. */
size_t
ch_sched_pending(const ch_sched *s, uint64_t *out, size_t cap)
{
	size_t		n = 0;

	for (size_t i = 0; i < s->norder && n < cap; i++)
		if (find_item(s, s->order[i]) != NULL)
			out[n++] = s->order[i];
	return s->nitems;
}
