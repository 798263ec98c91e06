/*
 * chorus_shmem.c
 *		Owns the node's shared state (ChorusShared): whether the node is ready
 *		and online, the watermark (the last GID up to which every certified GID
 *		is committed here), the commit lanes and their turns, the commits above
 *		the watermark, the hold of commits for a snapshot, and the ring of
 *		recent (GID, xid) commits that gives a snapshot its GID. Every wait for
 *		a GID and every move of the watermark is here.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "utils/inval.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "chorus_settings.h"
#include "chorus_shmem.h"

ChorusShared *chorus_shared = NULL;

/*
 * chorus_shmem_size
 *		The shared memory the node's state needs (requested at start-up).
 */
Size
chorus_shmem_size(void)
{
	return MAXALIGN(sizeof(ChorusShared));
}

/*
 * chorus_shmem_init
 *		Create (or attach to) the shared state; the caller holds
 *		AddinShmemInitLock. After a crash-restart the state is new: not ready
 *		until the coordinator calls chorus.node_init().
 */
void
chorus_shmem_init(void)
{
	bool		found;

	chorus_shared = ShmemInitStruct("chorus", sizeof(ChorusShared), &found);
	if (!found)
	{
		memset(chorus_shared, 0, sizeof(ChorusShared));
		chorus_shared->lock = &(GetNamedLWLockTranche("chorus"))->lock;
		ConditionVariableInit(&chorus_shared->commit_cv);
	}
}

/*
 * chorus_check_writable
 *		Called at the first captured change of a transaction: refuse the write
 *		right away when this node cannot commit it. Returns the coordinator's
 *		epoch (bumped by each node_init) the transaction began writing in.
 */
uint64
chorus_check_writable(void)
{
	bool		ready,
				online;
	uint64		epoch;
	char		reason[sizeof(chorus_shared->offline_reason)];

	if (chorus_socket_path == NULL || chorus_socket_path[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 errdetail("chorus.socket_path is not set: no coordinator is configured.")));
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	ready = chorus_shared->ready;
	online = chorus_shared->online;
	epoch = chorus_shared->epoch;
	memcpy(reason, chorus_shared->offline_reason, sizeof(reason));
	LWLockRelease(chorus_shared->lock);
	reason[sizeof(reason) - 1] = '\0';
	if (!ready)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 errdetail("The Chorus coordinator has not started on this node (or PostgreSQL restarted since)."),
				 errhint("Start it with \"chorus run\"; reads keep working.")));
	if (!online)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 reason[0] ? errdetail("%s.", reason) :
				 errdetail("The node is not online in the primary component of its cluster (joining, recovering, or partitioned away)."),
				 errhint("See \"chorus status\"; reads keep working.")));
	return epoch;
}

/*
 * chorus_note_lost
 *		This session's certified transaction, GID gid, ends without committing
 *		(unknown: it ended before it learnt its verdict). Called at its abort,
 *		before its row locks are released: a transaction that then takes
 *		them checks at its commit, later.
 */
void
chorus_note_lost(uint64 gid, bool unknown)
{
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (gid > chorus_shared->lost_gid)
		chorus_shared->lost_gid = gid;
	if (unknown)
		chorus_shared->lost_unknown = true;
	LWLockRelease(chorus_shared->lock);
}

/*
 * chorus_check_lost
 *		Refuse to commit a local transaction that may have changed rows of a
 *		lost transaction (chorus_note_lost) as they were before it: one whose
 *		snapshots (last_seen) did not all see the newest lost GID, or that
 *		began writing (write_epoch) before a node_init that followed a session
 *		whose verdict is not known. Serialization failure: a retry sees them.
 */
void
chorus_check_lost(uint64 last_seen, uint64 write_epoch)
{
	uint64		lost;
	bool		unknown;
	uint64		epoch;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	lost = chorus_shared->lost_gid;
	unknown = chorus_shared->lost_unknown;
	epoch = chorus_shared->lost_epoch;
	LWLockRelease(chorus_shared->lock);
	if (lost > last_seen)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("chorus: could not serialize access: certified transaction GID %llu of this node did not commit in its session and is applied from its writeset",
						(unsigned long long) lost),
				 errdetail("This transaction did not see it (it saw GID %llu) and may have changed its rows as they were before it.",
						   (unsigned long long) last_seen),
				 errhint("Retry the transaction.")));
	if (unknown || write_epoch < epoch)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("chorus: could not serialize access: a certified transaction of this node may have ended without committing in its session"),
				 errdetail("A session ended before it learnt its verdict; until this node's coordinator starts again, transactions that began writing before are refused."),
				 errhint("Retry the transaction.")));
}

/*
 * chorus_visible_gid_clean
 *		The newest GID such that it and every certified GID before it are
 *		visible to the active snapshot: the transaction's last_seen. With one
 *		commit lane commits happen in GID order, so visibility is a prefix of
 *		the ring and this is the newest visible GID. With several lanes it is
 *		the watermark, lowered below the lowest GID the snapshot does not see.
 *		*clean: no GID above the result is visible either (the snapshot is a
 *		prefix of the order, as a donor's must be).
 */
uint64
chorus_visible_gid_clean(bool *clean)
{
	Snapshot	snap = GetActiveSnapshot();
	uint64		result;
	uint64		i,
				n,
				oldest;

	*clean = true;
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	n = chorus_shared->ring_count;
	oldest = n > CHORUS_RING_SIZE ? n - CHORUS_RING_SIZE : 0;
	if (chorus_shared->lanes <= 1)
	{
		result = (n > CHORUS_RING_SIZE) ? 0 : chorus_shared->base_gid;
		for (i = n; i > oldest; i--)
		{
			ChorusCommit *c = &chorus_shared->ring[(i - 1) % CHORUS_RING_SIZE];

			if (snap == NULL || !XidInMVCCSnapshot(c->xid, snap))
			{
				result = c->gid;
				break;
			}
		}
	}
	else
	{
		uint64		lowest_unseen = PG_UINT64_MAX;
		uint64		highest_seen = 0;

		result = chorus_shared->committed_gid;
		for (i = n; i > oldest; i--)
		{
			ChorusCommit *c = &chorus_shared->ring[(i - 1) % CHORUS_RING_SIZE];

			if (snap != NULL && XidInMVCCSnapshot(c->xid, snap))
				lowest_unseen = Min(lowest_unseen, c->gid);
			else
				highest_seen = Max(highest_seen, c->gid);
		}
		if (n > CHORUS_RING_SIZE && lowest_unseen != PG_UINT64_MAX &&
			snap != NULL &&
			XidInMVCCSnapshot(chorus_shared->ring[oldest % CHORUS_RING_SIZE].xid, snap))
			result = 0;			/* older than the ring: cannot tell */
		else if (lowest_unseen != PG_UINT64_MAX)
			result = Min(result, lowest_unseen - 1);
		*clean = highest_seen <= result;
	}
	LWLockRelease(chorus_shared->lock);
	return result;
}

uint64
chorus_visible_gid(void)
{
	bool		clean;

	return chorus_visible_gid_clean(&clean);
}

/*
 * chorus_lane_of
 *		The commit lane of GID gid (0 with one lane).
 */
int
chorus_lane_of(uint64 gid)
{
	int			lanes = chorus_shared->lanes;

	return lanes > 1 ? (int) (gid % (uint64) lanes) : 0;
}

/*
 * chorus_lane_origin
 *		The replication origin that records the commits of a lane: "chorus" for
 *		lane 0, "chorus_lane_<k>" for lane k (made by chorus.set_lanes()).
 */
/*
 * This backend's lookups of the lanes' origins, by lane (InvalidRepOriginId:
 * not looked up), kept from one commit to the next: a lookup by name costs
 * about 3 µs, per commit (docs/NATIVE.md, "Step 5, second measures"). Any
 * change of pg_replication_origin forgets them, as it does the catalog
 * cache's entries they come from.
 */
static RepOriginId lane_origins[CHORUS_MAX_LANES];
static bool lane_origins_watched = false;

static void
lane_origins_forget(Datum arg, int cacheid, uint32 hashvalue)
{
	memset(lane_origins, 0, sizeof(lane_origins));
}

RepOriginId
chorus_lane_origin(int lane)
{
	char		name[NAMEDATALEN];
	RepOriginId origin;

	if (!lane_origins_watched)
	{
		CacheRegisterSyscacheCallback(REPLORIGIDENT, lane_origins_forget, (Datum) 0);
		lane_origins_watched = true;
	}
	if (lane >= 0 && lane < CHORUS_MAX_LANES && lane_origins[lane] != InvalidRepOriginId)
		return lane_origins[lane];
	if (lane == 0)
		strlcpy(name, CHORUS_ORIGIN_NAME, sizeof(name));
	else
		snprintf(name, sizeof(name), "%s%d", CHORUS_LANE_ORIGIN_PREFIX, lane);
	origin = replorigin_by_name(name, true);
	if (origin == InvalidRepOriginId)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: replication origin \"%s\" of commit lane %d is missing", name, lane),
						errhint(lane == 0 ? "Run CREATE EXTENSION chorus in this database."
								: "The coordinator makes the origins of its commit lanes (chorus.set_lanes).")));
	if (lane >= 0 && lane < CHORUS_MAX_LANES)
		lane_origins[lane] = origin;
	return origin;
}

/*
 * chorus_wait_done
 *		Sleep until this node has committed GID gid (lane >= 0: through that
 *		commit lane; -1: the watermark), at most timeout_ms (-1: no
 *		limit). Returns the committed GID: below gid if the time ran out. what
 *		says who waits, for the error if the node is reset meanwhile.
 */
static uint64
chorus_wait_done(int lane, uint64 gid, int timeout_ms, const char *what)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), Max(timeout_ms, 0));
	uint64		committed;
	uint64		epoch;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	epoch = chorus_shared->epoch;
	LWLockRelease(chorus_shared->lock);
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		bool		ready;
		long		left;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		committed = lane < 0 ? chorus_shared->committed_gid : chorus_shared->lane_done[lane];
		ready = chorus_shared->ready && chorus_shared->epoch == epoch;
		LWLockRelease(chorus_shared->lock);
		if (!ready)
		{
			ConditionVariableCancelSleep();
			ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
							errmsg("chorus: the node was reset (its coordinator restarted) while %s", what)));
		}
		if (committed >= gid)
			break;
		if (timeout_ms < 0)
		{
			ConditionVariableSleep(&chorus_shared->commit_cv, PG_WAIT_EXTENSION);
			continue;
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return committed;
}

/*
 * chorus_wait_committed
 *		Sleep until this node has committed every certified GID up to gid (the
 *		watermark), at most timeout_ms (-1: no limit). Returns the watermark:
 *		below gid if the time ran out. what says who waits, for the error if the
 *		node is reset meanwhile.
 */
uint64
chorus_wait_committed(uint64 gid, int timeout_ms, const char *what)
{
	return chorus_wait_done(-1, gid, timeout_ms, what);
}

/*
 * chorus_wait_for_turn
 *		Sleep until every certified writeset before ours has committed here.
 */
void
chorus_wait_for_turn(uint64 wait_for)
{
	(void) chorus_wait_committed(wait_for, -1, "this transaction waited to commit");
}

/*
 * chorus_wait_own_turn
 *		The wait of a row writeset's commit (local or applied). One lane: every
 *		certified writeset before it has committed. Several lanes: the previous
 *		certified GID of its lane has (the coordinator has dispatched it only
 *		after the earlier writesets it conflicts with committed, and a local
 *		transaction that passed certification conflicts with none that is not
 *		committed).
 */
void
chorus_wait_own_turn(uint64 gid, uint64 wait_for)
{
	if (chorus_shared->lanes > 1)
		(void) chorus_wait_done(chorus_lane_of(gid), wait_for, -1,
								"this transaction waited to commit");
	else
		chorus_wait_for_turn(wait_for);
}

/*
 * chorus_wait_hold
 *		While chorus.hold_commits() holds commits above a GID (a cluster-wide
 *		snapshot for verify), the commit of a GID above it waits, until the hold
 *		is released or expires.
 */
static void
chorus_wait_hold(uint64 gid)
{
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		uint64		above;
		TimestampTz until;
		long		left;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		above = chorus_shared->hold_above;
		until = chorus_shared->hold_until;
		LWLockRelease(chorus_shared->lock);
		if (above == 0 || gid <= above)
			break;
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		if (left <= 0)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, Min(left, 100), PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}

/*
 * chorus_note_committed
 *		Several lanes: GID gid, whose certified predecessor is prev, is
 *		committed here. The watermark moves over it if prev is committed, and
 *		then over every commit waiting above it whose predecessor it reaches
 *		(csn-pending-lists: the watermark only passes a contiguous prefix); else
 *		it waits in above[]. The caller holds the lock exclusively.
 */
static void
chorus_note_committed(uint64 gid, uint64 prev)
{
	ChorusShared *sh = chorus_shared;
	bool		moved = true;
	int			i;

	if (gid <= sh->committed_gid)
		return;
	if (prev > sh->committed_gid)
	{
		for (i = 0; i < sh->nabove; i++)
			if (sh->above[i].gid == gid)
				return;			/* noted already */
		if (sh->nabove < CHORUS_MAX_ABOVE)
		{
			sh->above[sh->nabove].prev = prev;
			sh->above[sh->nabove].gid = gid;
			sh->nabove++;
		}
		return;
	}
	sh->committed_gid = gid;
	while (moved)
	{
		moved = false;
		for (i = 0; i < sh->nabove; i++)
		{
			if (sh->above[i].gid <= sh->committed_gid || sh->above[i].prev <= sh->committed_gid)
			{
				if (sh->above[i].gid > sh->committed_gid)
				{
					sh->committed_gid = sh->above[i].gid;
					moved = true;
				}
				sh->above[i] = sh->above[--sh->nabove];
				i--;
			}
		}
	}
}

/*
 * chorus_gid_committed
 *		Whether GID gid (certified after prev) is committed on this node
 *		already, for an apply of it. With several lanes one committed through
 *		its lane before a restart (its lane's origin says so) is noted, so the
 *		watermark moves over it.
 */
bool
chorus_gid_committed(uint64 gid, uint64 prev)
{
	bool		done;

	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		/*
		 * Committed through its lane already (before a restart, found by the
		 * lane's origin): the watermark must still move over it.
		 */
		done = gid <= chorus_shared->lane_done[chorus_lane_of(gid)];
		if (done)
			chorus_note_committed(gid, prev);
	}
	else
		done = gid <= chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	if (done)
		ConditionVariableBroadcast(&chorus_shared->commit_cv);
	return done;
}

/*
 * chorus_wait_above_room
 *		Several lanes: a commit that may land above the watermark waits until
 *		there is room to note it (the room is far beyond the sessions that can
 *		commit at once; this never waits in practice).
 */
static void
chorus_wait_above_room(void)
{
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		int			n;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		n = chorus_shared->nabove;
		LWLockRelease(chorus_shared->lock);
		if (n < CHORUS_MAX_ABOVE - 1)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, 100, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}

/*
 * chorus_claim_turn
 *		After the wait for its turn: take GID gid (*claimed is set when the
 *		session has it, under the lock: an abort gives it back). Exactly one
 *		session commits each GID: an apply of a GID committed here already
 *		(a local backend of a restarted coordinator committed it, or a
 *		recovery stream repeats it) fails with ERRCODE_CHORUS_ALREADY_COMMITTED,
 *		which the applier treats as done.
 */
void
chorus_claim_turn(uint64 gid, bool *claimed_it)
{
	uint64		committed,
				claimed;

	chorus_wait_hold(gid);
	if (chorus_shared->lanes > 1)
		chorus_wait_above_room();
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(gid);

		committed = chorus_shared->lane_done[lane];
		claimed = chorus_shared->lane_claimed[lane];
		if (gid > committed && gid > claimed)
		{
			chorus_shared->lane_claimed[lane] = gid;
			*claimed_it = true;
		}
	}
	else
	{
		committed = chorus_shared->committed_gid;
		claimed = chorus_shared->claimed_gid;
		if (gid > committed && gid > claimed)
		{
			chorus_shared->claimed_gid = gid;
			*claimed_it = true;
		}
	}
	LWLockRelease(chorus_shared->lock);
	if (gid <= committed)
		ereport(ERROR, (errcode(ERRCODE_CHORUS_ALREADY_COMMITTED),
						errmsg("chorus: GID %llu is already committed on this node",
							   (unsigned long long) gid)));
	if (!*claimed_it)
		ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						errmsg("chorus: GID %llu is being committed by another session",
							   (unsigned long long) gid)));
}

/*
 * chorus_unclaim_turn
 *		An aborted transaction gives back GID gid, which it claimed, so a
 *		replay can take it.
 */
void
chorus_unclaim_turn(uint64 gid)
{
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(gid);

		if (chorus_shared->lane_claimed[lane] == gid)
			chorus_shared->lane_claimed[lane] = chorus_shared->lane_done[lane];
	}
	else if (chorus_shared->claimed_gid == gid)
		chorus_shared->claimed_gid = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
}

/*
 * chorus_record_commit
 *		After the commit of GID gid (certified after prev) by transaction xid:
 *		advance the watermark, remember (gid, xid) for last_seen, wake the next
 *		committer.
 */
void
chorus_record_commit(uint64 gid, uint64 prev, TransactionId xid)
{
	ChorusCommit *c;

	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(gid);

		if (gid > chorus_shared->lane_done[lane])
			chorus_shared->lane_done[lane] = gid;
		chorus_note_committed(gid, prev);
		if (XactLastCommitEnd > chorus_shared->last_commit_end)
			chorus_shared->last_commit_end = XactLastCommitEnd;
	}
	else if (gid > chorus_shared->committed_gid)
		chorus_shared->committed_gid = gid;
	c = &chorus_shared->ring[chorus_shared->ring_count % CHORUS_RING_SIZE];
	c->gid = gid;
	c->xid = xid;
	chorus_shared->ring_count++;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
}

/*
 * chorus_flush_prefix
 *		Several commit lanes: before the client of GID gid is told its commit
 *		happened, every GID before it is committed here too, and flushed with it.
 *		Then the node's durable watermark covers every commit it acknowledged,
 *		as with one lane (a crash of every node at once re-forms the cluster from
 *		the highest watermark, which must hold every acknowledged commit). Runs
 *		after the commit, so it never raises: if the node is reset meanwhile it
 *		stops waiting (the new coordinator re-applies what is missing).
 */
void
chorus_flush_prefix(uint64 gid)
{
	uint64		epoch;
	XLogRecPtr	upto = XactLastCommitEnd;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	epoch = chorus_shared->epoch;
	LWLockRelease(chorus_shared->lock);
	for (;;)
	{
		bool		done;

		/* on the wait list again each time: a broadcast takes us off it */
		ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		done = chorus_shared->committed_gid >= gid || !chorus_shared->ready || chorus_shared->epoch != epoch;
		upto = Max(upto, chorus_shared->last_commit_end);
		LWLockRelease(chorus_shared->lock);
		if (done)
			break;

		/*
		 * Not ConditionVariableTimedSleep: it exits the process when the
		 * postmaster dies, and exiting inside the commit would PANIC (the
		 * transaction is committed). Prepared to sleep on the condition
		 * variable, we have our latch set by a broadcast all the same.
		 */
		if (WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH, 100,
					  PG_WAIT_EXTENSION) & WL_POSTMASTER_DEATH)
			break;
		ResetLatch(MyLatch);
	}
	ConditionVariableCancelSleep();
	XLogFlush(upto);			/* the commit records of every GID up to ours */
}
