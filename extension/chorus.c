/*
 * chorus.c
 *		Module start-up: GUCs, shared memory, and the SQL-callable functions the
 *		coordinator uses (docs/PROTOCOL.md section 4).
 */
#include "postgres.h"

#include <signal.h>

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "access/htup_details.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "tcop/utility.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "executor/executor.h"
#include "storage/latch.h"
#include "utils/wait_event.h"
#include "utils/timestamp.h"
#include "utils/snapmgr.h"
#include "replication/origin.h"

#include "chorus.h"

PG_MODULE_MAGIC;

ChorusShared *chorus_shared = NULL;
ChorusAbortSlot *chorus_abort_slots = NULL;
int			chorus_abort_nslots = 0;

char	   *chorus_socket_path = NULL;
bool		chorus_capture_enabled = true;
int			chorus_max_writeset_mb = 256;
bool		chorus_causal_reads = false;
int			chorus_causal_reads_timeout = 10000;
char	   *chorus_exclude_schemas = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;
static emit_log_hook_type prev_emit_log_hook = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

#define CHORUS_FLOW_WAIT_MAX_MS 10000

static TimestampTz chorus_causal_waited = 0;	/* start of the statement that waited last */

/*
 * chorus_executor_start
 *		Flow control: while a node of the cluster has asked to slow down, a
 *		write statement of a transaction that has not written replicated rows
 *		yet waits (at most CHORUS_FLOW_WAIT_MAX_MS) before it takes any row lock,
 *		so it can never hold up an applier while it waits.
 */
static void
chorus_executor_start(QueryDesc *queryDesc, int eflags)
{
	chorus_check_aborted();
	if (chorus_shared != NULL && queryDesc->operation != CMD_SELECT && chorus_capture_enabled &&
		!chorus_xact.applying && chorus_xact.nrows == 0 && chorus_shared->paused)
	{
		int			waited = 0;

		while (chorus_shared->paused && waited < CHORUS_FLOW_WAIT_MAX_MS)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 2, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
			waited += 2;
		}
	}
	if (chorus_causal_reads && chorus_shared != NULL && !chorus_xact.applying &&
		!IsolationUsesXactSnapshot() && (eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0 &&
		chorus_causal_waited != GetCurrentStatementStartTimestamp())
	{
		/*
		 * Causal reads (READ COMMITTED): wait until this node has what the
		 * cluster had committed when the statement began, then run the
		 * statement on a fresh snapshot (the one it came with predates the
		 * wait). Once per client statement: queries a function runs share its
		 * start time.
		 */
		chorus_sync_wait(chorus_causal_reads_timeout);
		chorus_causal_waited = GetCurrentStatementStartTimestamp();
		UnregisterSnapshot(queryDesc->snapshot);
		queryDesc->snapshot = RegisterSnapshot(GetTransactionSnapshot());
	}
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * chorus_abort_slot
 *		This backend's abort slot if it holds a request for its current
 *		transaction: the GID that aborted it, else 0. A stale request (for an
 *		earlier transaction) is dropped.
 */
static uint64
chorus_abort_request(void)
{
	ChorusAbortSlot *slot;
	uint64		gid;

	if (chorus_abort_slots == NULL || MyProc == NULL || MyProc->pgprocno >= chorus_abort_nslots)
		return 0;
	slot = &chorus_abort_slots[MyProc->pgprocno];
	gid = pg_atomic_read_u64(&slot->gid);
	if (gid == 0 || gid == CHORUS_ABORT_PROTECTED)
		return 0;
	if (pg_atomic_read_u32(&slot->xid) != MyProc->lxid)
	{
		/* stale; a fresh request racing in wins the swap and stays */
		(void) pg_atomic_compare_exchange_u64(&slot->gid, &gid, 0);
		return 0;
	}
	return gid;
}

/*
 * chorus_check_aborted
 *		At each statement and at commit: a transaction the coordinator aborted
 *		while it was idle fails here with 40001 (its locks were taken by a remote
 *		writeset that was certified first; it would lose certification anyway).
 */
void
chorus_check_aborted(void)
{
	uint64		gid = chorus_abort_request();

	if (gid == 0)
		return;
	pg_atomic_write_u64(&chorus_abort_slots[MyProc->pgprocno].gid, 0);
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access: aborted by the certified remote transaction GID %llu",
					(unsigned long long) gid),
			 errdetail("This transaction held a lock the remote transaction needed; transactions certified first always win."),
			 errhint("Retry the transaction.")));
}

/*
 * chorus_emit_log
 *		A running statement the coordinator aborted is cancelled (as by
 *		pg_cancel_backend), a session still idle after the grace period is
 *		terminated (as by pg_terminate_backend); their errors are reported as
 *		what they are, a certification loss: SQLSTATE 40001 and the GID that won.
 */
static void
chorus_emit_log(ErrorData *edata)
{
	if (edata->elevel >= ERROR &&
		(edata->sqlerrcode == ERRCODE_QUERY_CANCELED ||
		 edata->sqlerrcode == ERRCODE_ADMIN_SHUTDOWN ||
		 edata->sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE))
	{
		uint64		gid = chorus_abort_request();

		if (gid != 0)
		{
			pg_atomic_write_u64(&chorus_abort_slots[MyProc->pgprocno].gid, 0);
			edata->sqlerrcode = ERRCODE_T_R_SERIALIZATION_FAILURE;
			edata->message = psprintf("could not serialize access: aborted by the certified "
									  "remote transaction GID %llu", (unsigned long long) gid);
			edata->detail = pstrdup(edata->elevel == ERROR
									? "This transaction held a lock the remote transaction needed; transactions certified first always win."
									: "This session stayed idle in a transaction holding a lock the remote transaction needed; its connection was closed.");
			edata->hint = pstrdup("Retry the transaction.");
		}
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * chorus_clear_aborted
 *		At the end of each transaction: drop a request and the protection. A
 *		request that races in later names an xid that has ended and is dropped
 *		as stale.
 */
void
chorus_clear_aborted(void)
{
	if (chorus_abort_slots != NULL && MyProc != NULL && MyProc->pgprocno < chorus_abort_nslots)
		pg_atomic_write_u64(&chorus_abort_slots[MyProc->pgprocno].gid, 0);
}

/*
 * chorus_protect_commit
 *		Just before the writeset goes to the coordinator: either an abort request
 *		already holds the slot (the transaction fails with 40001 here, before the
 *		cluster has seen it), or the slot becomes protected and chorus.abort_local()
 *		leaves this transaction alone until it ends. A certified transaction must
 *		never be aborted with 40001: its client would retry it while the
 *		coordinator replays it.
 */
void
chorus_protect_commit(void)
{
	ChorusAbortSlot *slot;
	uint64		old;

	if (chorus_abort_slots == NULL || MyProc == NULL || MyProc->pgprocno >= chorus_abort_nslots)
		return;
	slot = &chorus_abort_slots[MyProc->pgprocno];
	old = pg_atomic_read_u64(&slot->gid);
	for (;;)
	{
		if (old == CHORUS_ABORT_PROTECTED)
			return;
		if (old != 0 && chorus_abort_request() != 0)
			chorus_check_aborted();		/* does not return */
		if (pg_atomic_compare_exchange_u64(&slot->gid, &old, CHORUS_ABORT_PROTECTED))
			return;
	}
}

/*
 * chorus_process_utility
 *		Schema changes are ordered through the cluster before they run
 *		(chorus_ddl.c). Utility statements inside a transaction aborted for a
 *		remote writeset fail like DML (COMMIT is checked in the pre-commit
 *		callback, so the block ends cleanly).
 */
static void
chorus_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					   ProcessUtilityContext context, ParamListInfo params,
					   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	bool		replicated;
	bool		restart = IsA(pstmt->utilityStmt, TruncateStmt) &&
		((TruncateStmt *) pstmt->utilityStmt)->restart_seqs;
	bool		outer_restart = chorus_truncate_restart;

	if (!IsA(pstmt->utilityStmt, TransactionStmt))
		chorus_check_aborted();
	if ((chorus_xact.applying || chorus_replaying) && chorus_shared != NULL)
	{
		/* a replayed schema change: this node's tablespaces */
		pstmt = chorus_ddl_replay_fixups(pstmt);
		if (pstmt == NULL)
			return;
	}
	replicated = chorus_shared != NULL && chorus_ddl_utility(pstmt, queryString, context, params);
	PG_TRY();
	{
		chorus_truncate_restart = restart;
		if (prev_process_utility)
			prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
		chorus_truncate_restart = outer_restart;
		if (replicated)
			chorus_ddl_record(pstmt);
	}
	PG_FINALLY();
	{
		chorus_truncate_restart = outer_restart;
		if (replicated)
			chorus_ddl_done();
	}
	PG_END_TRY();
}

static int
chorus_proc_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

void		_PG_init(void);

/*
 * chorus_shmem_request
 *		Reserve our shared memory and one LWLock.
 */
static void
chorus_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(ChorusShared)));
	RequestAddinShmemSpace(MAXALIGN(sizeof(ChorusAbortSlot) * chorus_proc_slots()));
	RequestNamedLWLockTranche("chorus", 1);
}

/*
 * chorus_shmem_startup
 *		Create (or attach to) the shared state. After a crash-restart the state is
 *		new: not ready until the coordinator calls chorus.node_init().
 */
static void
chorus_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	chorus_shared = ShmemInitStruct("chorus", sizeof(ChorusShared), &found);
	if (!found)
	{
		memset(chorus_shared, 0, sizeof(ChorusShared));
		chorus_shared->lock = &(GetNamedLWLockTranche("chorus"))->lock;
		ConditionVariableInit(&chorus_shared->commit_cv);
	}
	chorus_abort_nslots = chorus_proc_slots();
	chorus_abort_slots = ShmemInitStruct("chorus abort slots",
										 sizeof(ChorusAbortSlot) * chorus_abort_nslots, &found);
	if (!found)
	{
		for (int i = 0; i < chorus_abort_nslots; i++)
		{
			pg_atomic_init_u64(&chorus_abort_slots[i].gid, 0);
			pg_atomic_init_u32(&chorus_abort_slots[i].xid, InvalidTransactionId);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * _PG_init
 *		Define GUCs, install hooks and transaction callbacks. Chorus must be in
 *		shared_preload_libraries: it needs shared memory and must see every commit.
 */
void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("chorus must be loaded via shared_preload_libraries"),
				 errhint("Add chorus to shared_preload_libraries in postgresql.conf and restart.")));

	DefineCustomStringVariable("chorus.socket_path",
							   "Unix socket of this node's Chorus coordinator.",
							   "Empty: replication is off and writes to replicated tables fail.",
							   &chorus_socket_path, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.capture",
							 "Capture this session's writes to replicated tables.",
							 "Off: the session's writes stay local (for loading identical data on every node).",
							 &chorus_capture_enabled, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.replaying",
							 "This session runs schema changes replicated from another node (set by the coordinator).",
							 "Their node-local parts are fixed up as in an apply: a tablespace this node lacks is left out.",
							 &chorus_replaying, false, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.causal_reads",
							 "Each READ COMMITTED statement first waits until this node has committed everything the cluster had committed when it began.",
							 "Like Galera's wsrep_sync_wait. For REPEATABLE READ, call chorus.sync_wait() before BEGIN.",
							 &chorus_causal_reads, false, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.causal_reads_timeout",
							"How long a causal read waits for this node to catch up before it fails.",
							NULL, &chorus_causal_reads_timeout, 10000, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.max_writeset_size",
							"Largest writeset a transaction may produce, in megabytes.",
							NULL, &chorus_max_writeset_mb, 256, 1, 900, PGC_SUSET,
							GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.exclude_schemas",
							   "Comma-separated schemas whose new tables are not replicated.",
							   NULL, &chorus_exclude_schemas, "", PGC_SUSET, 0, NULL, NULL, NULL);
	chorus_define_ddl_gucs();
	MarkGUCPrefixReserved("chorus");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = chorus_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = chorus_shmem_startup;

	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = chorus_executor_start;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = chorus_emit_log;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = chorus_process_utility;

	chorus_register_callbacks();
}

PG_FUNCTION_INFO_V1(chorus_node_init);
PG_FUNCTION_INFO_V1(chorus_set_online);
PG_FUNCTION_INFO_V1(chorus_set_paused);
PG_FUNCTION_INFO_V1(chorus_committed_gid);
PG_FUNCTION_INFO_V1(chorus_apply_begin);
PG_FUNCTION_INFO_V1(chorus_status);
PG_FUNCTION_INFO_V1(chorus_abort_local);
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
 * chorus_apply_begin(gid bigint, wait_for bigint)
 *		Mark the current transaction as the application of certified writeset
 *		gid: its commit waits for its turn and records gid.
 */
Datum
chorus_apply_begin(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);
	int64		wait_for = PG_GETARG_INT64(1);
	int64		prev = PG_NARGS() > 2 ? PG_GETARG_INT64(2) : -1;
	bool		done;

	if (prev < 0)
		prev = wait_for;			/* one lane: the same */

	if (gid <= 0 || wait_for < 0 || wait_for >= gid || prev < wait_for || prev >= gid)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: invalid apply GID %lld after %lld (previous GID %lld)",
							   (long long) gid, (long long) wait_for, (long long) prev)));
	if (chorus_xact.nrows > 0)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: apply_begin() in a transaction that already captured rows")));
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		/*
		 * Committed through its lane already (before a restart, found by the
		 * lane's origin): the watermark must still move over it.
		 */
		done = (uint64) gid <= chorus_shared->lane_done[chorus_lane_of((uint64) gid)];
		if (done)
			chorus_note_committed((uint64) gid, (uint64) prev);
	}
	else
		done = (uint64) gid <= chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	if (done)
	{
		ConditionVariableBroadcast(&chorus_shared->commit_cv);
		ereport(ERROR, (errcode(ERRCODE_CHORUS_ALREADY_COMMITTED),
						errmsg("chorus: GID %lld is already committed on this node", (long long) gid)));
	}
	chorus_xact.applying = true;
	chorus_xact.gid = (uint64) gid;
	chorus_xact.wait_for = (uint64) wait_for;
	chorus_xact.prev = (uint64) prev;
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
 * chorus_abort_local(pid int, gid bigint, how text)
 *		Abort the transaction of local backend pid because certified writeset gid
 *		waits for a lock it holds. how = 'flag': its next statement or its COMMIT
 *		fails with 40001; 'cancel': also cancel its running statement now if it
 *		waits for a lock (40001); 'interrupt': cancel whatever statement runs;
 *		'close': terminate the
 *		session (for one idle in transaction past the grace period: PostgreSQL
 *		cannot abort an idle transaction and keep its connection); 'terminate':
 *		end the session even if its transaction is certified (a certified local
 *		transaction ordered after gid that holds a row lock gid needs, taken
 *		without writing the row: the coordinator commits it from its writeset
 *		after gid). Returns false
 *		if pid is not a backend in a transaction, or if that transaction
 *		has sent its writeset to be certified (chorus_protect_commit).
 */
Datum
chorus_abort_local(PG_FUNCTION_ARGS)
{
	int			pid = PG_GETARG_INT32(0);
	int64		gid = PG_GETARG_INT64(1);
	char	   *how = text_to_cstring(PG_GETARG_TEXT_PP(2));
	int			sig;
	PGPROC	   *proc;
	LocalTransactionId lxid;
	ChorusAbortSlot *slot;
	uint64		old;

	if (strcmp(how, "flag") == 0)
		sig = 0;
	else if (strcmp(how, "cancel") == 0 || strcmp(how, "interrupt") == 0)
		sig = SIGINT;
	else if (strcmp(how, "close") == 0 || strcmp(how, "terminate") == 0)
		sig = SIGTERM;
	else
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: abort_local: how must be flag, cancel, interrupt, close or terminate, not \"%s\"", how)));
	if (gid <= 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: invalid GID %lld", (long long) gid)));
	proc = BackendPidGetProc(pid);
	if (proc == NULL || proc == MyProc || proc->pgprocno >= chorus_abort_nslots)
		PG_RETURN_BOOL(false);
	if (strcmp(how, "terminate") == 0)
		PG_RETURN_BOOL(kill(pid, SIGTERM) == 0);
	/* the local transaction id: read-only transactions holding a table lock have one too */
	lxid = proc->lxid;
	if (!LocalTransactionIdIsValid(lxid))
		PG_RETURN_BOOL(false);
	slot = &chorus_abort_slots[proc->pgprocno];
	old = pg_atomic_read_u64(&slot->gid);
	for (;;)
	{
		if (old == CHORUS_ABORT_PROTECTED)
			PG_RETURN_BOOL(false);	/* its writeset is with the cluster already */
		pg_atomic_write_u32(&slot->xid, lxid);
		if (pg_atomic_compare_exchange_u64(&slot->gid, &old, (uint64) gid))
			break;
	}

	/*
	 * A cancel is sent only to a statement waiting for a lock: one that runs
	 * on gets the 40001 at its next statement or COMMIT from the flag, so a
	 * signal cannot land in the COMMIT the client sends next (PostgreSQL would
	 * then leave the block aborted instead of ending it). 'interrupt' cancels
	 * whatever runs (a long statement, after the grace period).
	 */
	if (sig == SIGINT && strcmp(how, "cancel") == 0 &&
		(*(volatile uint32 *) &proc->wait_event_info & 0xFF000000) != PG_WAIT_LOCK)
		sig = 0;
	/* the backend runs as our OS user; this is what pg_cancel/terminate_backend do */
	if (sig != 0 && kill(pid, sig) != 0)
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(true);
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
