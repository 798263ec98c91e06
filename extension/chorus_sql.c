/*
 * chorus_sql.c
 *		The SQL-callable functions the coordinator runs the node with
 *		(docs/PROTOCOL.md section 4): initialising and resetting the watermark
 *		and the commit lanes, online and flow control, status, snapshots at a
 *		GID, holding commits, marking an apply, waits. The others are with
 *		their concern: the capture triggers (chorus_capture.c), the apply
 *		functions (chorus_apply.c), chorus.abort_local (chorus_abort.c),
 *		chorus.replicable and chorus.attach (chorus_ddl.c), the sequence
 *		functions (chorus_sequence.c).
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "access/htup_details.h"
#include "replication/origin.h"
#include "catalog/pg_authid_d.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_coord.h"
#include "chorus_wire.h"
#include "chorus_flow.h"
#include "chorus_settings.h"
#include "chorus_shmem.h"

PG_FUNCTION_INFO_V1(chorus_node_init);
PG_FUNCTION_INFO_V1(chorus_set_online);
PG_FUNCTION_INFO_V1(chorus_set_paused);
PG_FUNCTION_INFO_V1(chorus_committed_gid);
PG_FUNCTION_INFO_V1(chorus_apply_begin);
PG_FUNCTION_INFO_V1(chorus_status);
PG_FUNCTION_INFO_V1(chorus_cluster_info);
PG_FUNCTION_INFO_V1(chorus_sync_wait_sql);
PG_FUNCTION_INFO_V1(chorus_wait_turn);
PG_FUNCTION_INFO_V1(chorus_snapshot_gid);
PG_FUNCTION_INFO_V1(chorus_lane_state);
PG_FUNCTION_INFO_V1(chorus_hold_commits);
PG_FUNCTION_INFO_V1(chorus_release_commits);
PG_FUNCTION_INFO_V1(chorus_forget_watermark);

/*
 * chorus_snapshot_gid()
 *		The GID of the calling transaction's snapshot: the newest GID whose
 *		commit it sees (commits happen in GID order, so it sees exactly the
 *		GIDs up to this one). In a REPEATABLE READ transaction that exported its
 *		snapshot, the GID a donor's snapshot corresponds to.
 */
Datum
chorus_snapshot_gid(PG_FUNCTION_ARGS)
{
	uint64		gid;
	bool		clean;

	if (!chorus_shared->ready)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: the node is not initialised by its coordinator")));
	gid = chorus_visible_gid_clean(&clean);
	if (!clean)
		ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						errmsg("chorus: this snapshot sees GIDs after %llu while some before them are not committed",
							   (unsigned long long) gid),
						errdetail("With several commit lanes a snapshot is at one GID only when no commit above the watermark is visible."),
						errhint("Hold the commits above the highest committed GID (chorus.hold_commits) until the watermark reaches it, then take the snapshot.")));
	PG_RETURN_INT64((int64) gid);
}

/*
 * chorus_lane_state()
 *		(lanes, committed_gid, max_done, above): the commit lanes, the watermark,
 *		the highest GID committed through any lane and how many commits wait
 *		above the watermark.
 */
Datum
chorus_lane_state(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	uint64		max_done;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "chorus_lane_state: return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	max_done = chorus_shared->committed_gid;
	for (i = 0; chorus_shared->lanes > 1 && i < chorus_shared->lanes; i++)
		max_done = Max(max_done, chorus_shared->lane_done[i]);
	values[0] = Int32GetDatum(Max(chorus_shared->lanes, 1));
	values[1] = Int64GetDatum((int64) chorus_shared->committed_gid);
	values[2] = Int64GetDatum((int64) max_done);
	values[3] = Int32GetDatum(chorus_shared->nabove);
	LWLockRelease(chorus_shared->lock);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * chorus_hold_commits(above bigint, timeout_ms integer) returns bigint
 *		Commits of GIDs above `above` wait until chorus.release_commits() or the
 *		timeout (a crashed caller cannot stall the node). Returns the committed
 *		GID when the hold was set: if it is already past `above`, the caller
 *		chose too low a GID.
 */
Datum
chorus_hold_commits(PG_FUNCTION_ARGS)
{
	int64		above = PG_GETARG_INT64(0);
	int32		timeout_ms = PG_GETARG_INT32(1);
	uint64		committed;

	if (above <= 0 || timeout_ms <= 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: hold_commits needs a positive GID and timeout")));
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	chorus_shared->hold_above = (uint64) above;
	chorus_shared->hold_until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	committed = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	PG_RETURN_INT64((int64) committed);
}

Datum
chorus_release_commits(PG_FUNCTION_ARGS)
{
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	chorus_shared->hold_above = 0;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
	PG_RETURN_VOID();
}

/*
 * chorus_forget_watermark()
 *		Total recovery replaced the node's data: the next chorus.node_init()
 *		takes the durable GID as it is, not the live watermark of before.
 *		Writes are refused until then. Its coordinator must be stopped.
 */
Datum
chorus_forget_watermark(PG_FUNCTION_ARGS)
{
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	chorus_shared->online = false;
	chorus_shared->ready = false;
	chorus_shared->epoch++;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
	PG_RETURN_VOID();
}

/*
 * chorus_lane_origin_progress
 *		The GID recorded by lane's replication origin (0 if it has none).
 */
static uint64
chorus_lane_origin_progress(int lane)
{
	return (uint64) replorigin_get_progress(chorus_lane_origin(lane), false);
}

/*
 * chorus_node_init(committed_gid bigint, lanes int)
 *		The coordinator sets the watermark it read from chorus.durable_gid() and
 *		the number of commit lanes (chorus.set_lanes() made their origins), and
 *		marks the node ready. Writes stay refused until chorus.set_online(true).
 *		With several lanes each lane starts where its origin's progress says:
 *		a GID up to it is committed, one above it is not.
 */
Datum
chorus_node_init(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);
	int32		lanes = PG_NARGS() > 1 ? PG_GETARG_INT32(1) : 1;
	uint64		done[CHORUS_MAX_LANES];
	int			i;

	if (gid < 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: GID must not be negative")));
	if (lanes < 1 || lanes > CHORUS_MAX_LANES)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: commit lanes must be 1 to %d", CHORUS_MAX_LANES)));
	for (i = 0; i < lanes; i++)
		done[i] = lanes > 1 ? chorus_lane_origin_progress(i) : 0;
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (lanes > 1)
	{
		/*
		 * A restarted coordinator (PostgreSQL kept running) keeps the live
		 * lanes, which may be past what their origins recorded.
		 */
		bool		live = chorus_shared->ready && chorus_shared->lanes == lanes;

		for (i = 0; i < lanes; i++)
		{
			uint64		d = Max(done[i], (uint64) gid);

			if (live)
				d = Max(d, chorus_shared->lane_done[i]);
			chorus_shared->lane_done[i] = d;
			chorus_shared->lane_claimed[i] = d;
		}
		if (!live)
			chorus_shared->nabove = 0;
	}
	else
		chorus_shared->nabove = 0;
	chorus_shared->lanes = lanes;

	/*
	 * A restarted coordinator (PostgreSQL kept running): shared memory knows
	 * the live watermark, which may be past the durable GID the coordinator
	 * read if a backend committed meanwhile. Sessions still waiting for a turn
	 * the old coordinator gave them fail (the epoch changes): the new one
	 * applies their writesets from the cluster.
	 */
	if (chorus_shared->ready && chorus_shared->committed_gid > (uint64) gid)
		gid = (int64) chorus_shared->committed_gid;
	chorus_shared->committed_gid = (uint64) gid;
	if (!chorus_shared->ready || chorus_shared->claimed_gid < (uint64) gid)
		chorus_shared->claimed_gid = (uint64) gid;
	chorus_shared->epoch++;
	/*
	 * A session ended before it learnt whether its transaction was certified
	 * (chorus_check_lost): this coordinator applies it if it was before the
	 * node takes writes again, but transactions that began writing before
	 * now may have changed its rows as they were.
	 */
	if (chorus_shared->lost_unknown)
	{
		chorus_shared->lost_unknown = false;
		chorus_shared->lost_epoch = chorus_shared->epoch;
	}
	chorus_shared->base_gid = (uint64) gid;
	chorus_shared->ring_count = 0;
	chorus_shared->online = false;
	chorus_shared->paused = false;
	chorus_shared->ready = true;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
	PG_RETURN_VOID();
}

/*
 * chorus_set_online(bool, text)
 *		Allow or refuse writes to replicated tables on this node; the reason is
 *		what a refused write's error says.
 */
Datum
chorus_set_online(PG_FUNCTION_ARGS)
{
	bool		online = PG_GETARG_BOOL(0);
	char	   *reason = text_to_cstring(PG_GETARG_TEXT_PP(1));

	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (online && !chorus_shared->ready)
	{
		LWLockRelease(chorus_shared->lock);
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: node_init() must be called before set_online()")));
	}
	chorus_shared->online = online;
	strlcpy(chorus_shared->offline_reason, online ? "" : reason, sizeof(chorus_shared->offline_reason));
	LWLockRelease(chorus_shared->lock);
	PG_RETURN_VOID();
}

/*
 * chorus_set_paused(bool)
 *		Flow control on or off (the coordinator follows the cluster's requests).
 */
Datum
chorus_set_paused(PG_FUNCTION_ARGS)
{
	chorus_shared->paused = PG_GETARG_BOOL(0);
	PG_RETURN_VOID();
}

/*
 * chorus_committed_gid()
 *		The shared-memory watermark.
 */
Datum
chorus_committed_gid(PG_FUNCTION_ARGS)
{
	uint64		gid;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	gid = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	PG_RETURN_INT64((int64) gid);
}

/*
 * chorus_apply_begin(gid bigint, wait_for bigint, prev bigint)
 *		Mark the current transaction as the application of certified writeset
 *		gid: its commit waits for its turn and records gid. prev (omitted or
 *		-1: wait_for) is the previous certified GID.
 */
Datum
chorus_apply_begin(PG_FUNCTION_ARGS)
{
	chorus_apply_begin_commit(chorus_commit_state(), chorus_capture_state()->nrows > 0,
							  PG_GETARG_INT64(0), PG_GETARG_INT64(1),
							  PG_NARGS() > 2 ? PG_GETARG_INT64(2) : -1);
	PG_RETURN_VOID();
}

/*
 * chorus_status()
 *		(ready, online, committed_gid)
 */
Datum
chorus_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "chorus_status: return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	values[0] = BoolGetDatum(chorus_shared->ready);
	values[1] = BoolGetDatum(chorus_shared->online);
	values[2] = Int64GetDatum((int64) chorus_shared->committed_gid);
	LWLockRelease(chorus_shared->lock);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * chorus_cluster_info(what text)
 *		What the coordinator knows that shared memory does not hold, as JSON:
 *		the rows of chorus.node, chorus.members, chorus.conflicts and chorus.link_status
 *		(docs/OPERATIONS.md). Asked over this backend's coordinator socket.
 */
Datum
chorus_cluster_info(PG_FUNCTION_ARGS)
{
	text	   *what = PG_GETARG_TEXT_PP(0);
	ChorusVerdict v;

	if (VARSIZE_ANY_EXHDR(what) > 256)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("chorus: no such view")));
	/* conflicts show keys, so rows' values: as pg_stat_activity's queries, to those who may see all */
	if (VARSIZE_ANY_EXHDR(what) >= 9 && strncmp(VARDATA_ANY(what), "conflicts", 9) == 0 &&
		!has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for chorus.conflicts"),
				 errdetail("Only roles with privileges of pg_read_all_stats can read certification conflicts.")));
	/* the links' state names their sites, nodes and addresses: to the same roles (chorus.link_status) */
	if (VARSIZE_ANY_EXHDR(what) >= 5 && strncmp(VARDATA_ANY(what), "links", 5) == 0 &&
		!has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for chorus.link_status"),
				 errdetail("Only roles with privileges of pg_read_all_stats can read the state of links.")));
	chorus_coord_ask(CHORUS_FRAME_INFO, VARDATA_ANY(what), VARSIZE_ANY_EXHDR(what), &v);
	if (v.verdict != CHORUS_VERDICT_COMMIT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("chorus: the coordinator did not answer: %s", v.msg)));
	PG_RETURN_TEXT_P(cstring_to_text(v.msg));
}

/*
 * chorus_sync_wait(timeout_ms int)
 *		Causal reads on demand: wait until this node has committed everything
 *		certified in the cluster before the call. Run it before BEGIN of a
 *		REPEATABLE READ transaction (whose snapshot is taken by its first
 *		statement). NULL timeout: chorus.causal_reads_timeout.
 */
Datum
chorus_sync_wait_sql(PG_FUNCTION_ARGS)
{
	chorus_sync_wait(PG_ARGISNULL(0) ? chorus_causal_reads_timeout : Max(PG_GETARG_INT32(0), 1));
	PG_RETURN_VOID();
}

/*
 * chorus_wait_turn(wait_for bigint)
 *		Wait until every GID up to wait_for has committed here (an applier runs a
 *		schema change only then).
 */
Datum
chorus_wait_turn(PG_FUNCTION_ARGS)
{
	int64		wait_for = PG_GETARG_INT64(0);

	if (wait_for > 0)
		chorus_wait_for_turn((uint64) wait_for);
	PG_RETURN_VOID();
}
