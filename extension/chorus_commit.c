/*
 * chorus_commit.c
 *		Owns the commit state of the backend's current transaction
 *		(ChorusCommitState: whether it applies a certified writeset or was
 *		certified, its GID and what its commit waits for, the replication
 *		origin it holds) and the steps that change it: getting the verdict
 *		(docs/PROTOCOL.md section 1), marking an apply, ordering a schema
 *		change, and recording the GID in the commit record through the
 *		replication origin of its commit lane.
 */
#include "postgres.h"

#include "access/xact.h"
#include "replication/origin.h"
#include "utils/timestamp.h"

#include "chorus_abort.h"
#include "chorus_commit.h"
#include "chorus_coord.h"
#include "chorus_shmem.h"
#include "chorus_wire.h"

/* The current transaction's commit state: only the entry points take it from here. */
static ChorusCommitState chorus_commit_current;

/*
 * chorus_commit_state
 *		This backend's commit state, for the entry points (triggers, hooks,
 *		callbacks, SQL functions) to pass to the functions that use it.
 */
ChorusCommitState *
chorus_commit_state(void)
{
	return &chorus_commit_current;
}

/*
 * chorus_commit_reset
 *		Forget the transaction's commit state (end of transaction).
 */
void
chorus_commit_reset(ChorusCommitState *cs)
{
	memset(cs, 0, sizeof(*cs));
}

/*
 * chorus_apply_begin_commit
 *		Mark the current transaction as the application of certified writeset
 *		gid: its commit waits for wait_for (prev, the previous certified GID,
 *		-1: wait_for), takes its turn and records gid. captured: the
 *		transaction has captured rows already (an error).
 */
void
chorus_apply_begin_commit(ChorusCommitState *cs, bool captured, int64 gid, int64 wait_for, int64 prev)
{
	if (prev < 0)
		prev = wait_for;			/* one lane: the same */

	if (gid <= 0 || wait_for < 0 || wait_for >= gid || prev < wait_for || prev >= gid)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: invalid apply GID %lld after %lld (previous GID %lld)",
							   (long long) gid, (long long) wait_for, (long long) prev)));
	if (captured)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: apply_begin() in a transaction that already captured rows")));
	if (chorus_gid_committed((uint64) gid, (uint64) prev))
		ereport(ERROR, (errcode(ERRCODE_CHORUS_ALREADY_COMMITTED),
						errmsg("chorus: GID %lld is already committed on this node", (long long) gid)));
	cs->applying = true;
	cs->gid = (uint64) gid;
	cs->wait_for = (uint64) wait_for;
	cs->prev = (uint64) prev;
}

/*
 * chorus_certify
 *		Send the transaction's writeset ws (frame 'W') and wait for the verdict
 *		(frame 'V'): the transaction is certified, or ends with the error the
 *		verdict calls for.
 */
void
chorus_certify(ChorusCommitState *cs, const ChorusFrameBody *ws)
{
	ChorusVerdict v;

	chorus_coord_certify(ws, &v);
	if (v.verdict == CHORUS_VERDICT_CONFLICT)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("chorus: %s", v.msg),
				 errdetail("Another node's transaction, ordered first, wrote the same data (this transaction was GID %llu).",
						   (unsigned long long) v.gid),
				 errhint("Retry the transaction.")));
	chorus_refuse_unless_commit(&v);
	cs->certified = true;
	cs->gid = v.gid;
	cs->wait_for = v.wait_for;
	cs->prev = v.prev;
	cs->commit_time = chorus_verdict_commit_time(&v);
}

/*
 * chorus_ddl_order
 *		Send a schema change's ordering request ws (a writeset with the TOI
 *		flag) and wait for its
 *		place in the total order; then wait until everything before it has
 *		committed here. The statement runs after this, holding the turn.
 */
void
chorus_ddl_order(ChorusCommitState *cs, StringInfo ws)
{
	ChorusVerdict v;

	chorus_protect_commit();
	chorus_coord_ask(CHORUS_FRAME_WRITESET, ws->data, ws->len, &v);
	chorus_refuse_unless_commit(&v);
	cs->certified = true;
	cs->ddl = true;
	cs->gid = v.gid;
	cs->wait_for = v.wait_for;
	cs->prev = v.prev;
	/* a schema change runs after everything before it, whatever the lanes */
	chorus_wait_for_turn(v.prev);
}

/*
 * chorus_take_origin
 *		Record our GID in the commit record: the replication origin's progress
 *		is written with the commit and replayed by crash recovery, so the
 *		node's last GID is durable atomically with the commit. Commits happen
 *		one at a time in GID order, so one origin is enough (with several
 *		commit lanes, one per lane: each lane's commits are in order); it is
 *		held only from our turn until our commit.
 */
void
chorus_take_origin(ChorusCommitState *cs)
{
	RepOriginId origin = chorus_lane_origin(chorus_lane_of(cs->gid));

	replorigin_session_setup(origin);
	cs->origin_held = true;
	replorigin_session_origin = origin;
	replorigin_session_origin_lsn = (XLogRecPtr) cs->gid;
	replorigin_session_origin_timestamp = GetCurrentTimestamp();

	/*
	 * Commit without waiting for the WAL flush, so that the next GID can take
	 * its turn as soon as our commit record is in WAL and visible; the COMMIT
	 * callback flushes before the client hears of the commit. Several commits
	 * then share one flush (group commit), in GID order.
	 */
	cs->saved_sync_commit = synchronous_commit;
	cs->sync_commit_saved = true;
	synchronous_commit = SYNCHRONOUS_COMMIT_OFF;
}

/*
 * chorus_restore_sync_commit
 *		Undo the per-commit synchronous_commit change; returns the value the
 *		session had (SYNCHRONOUS_COMMIT_OFF if it was not changed).
 */
int
chorus_restore_sync_commit(ChorusCommitState *cs)
{
	if (!cs->sync_commit_saved)
		return SYNCHRONOUS_COMMIT_OFF;
	synchronous_commit = cs->saved_sync_commit;
	cs->sync_commit_saved = false;
	return cs->saved_sync_commit;
}

/*
 * chorus_release_origin
 *		Give up the replication origin taken for the commit, if held.
 */
void
chorus_release_origin(ChorusCommitState *cs)
{
	if (!cs->origin_held)
		return;
	replorigin_session_origin = InvalidRepOriginId;
	replorigin_session_origin_lsn = InvalidXLogRecPtr;
	replorigin_session_origin_timestamp = 0;
	replorigin_session_reset();
	cs->origin_held = false;
}
