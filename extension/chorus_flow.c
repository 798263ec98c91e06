/*
 * chorus_flow.c
 *		Flow control and causal reads. While the cluster asks to slow down, a
 *		transaction's first write statement waits before it takes any lock; a
 *		causal read waits until this node has committed what the cluster had
 *		committed when it began (a marker through the total order, frame 'S').
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "chorus_coord.h"
#include "chorus_flow.h"
#include "chorus_settings.h"
#include "chorus_shmem.h"
#include "chorus_wire.h"

#define CHORUS_FLOW_WAIT_MAX_MS 10000

static TimestampTz chorus_causal_waited = 0;	/* start of the statement that waited last */

/*
 * chorus_flow_wait
 *		Flow control: while a node of the cluster has asked to slow down, wait
 *		(at most CHORUS_FLOW_WAIT_MAX_MS). The executor hook calls it for a
 *		write statement of a transaction that has not written replicated rows
 *		yet, before it takes any row lock, so it can never hold up an applier
 *		while it waits.
 */
void
chorus_flow_wait(void)
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

/*
 * chorus_causal_read
 *		Causal reads (READ COMMITTED), for a statement about to run: wait until
 *		this node has what the cluster had committed when the statement began,
 *		then run the statement on a fresh snapshot (the one it came with
 *		predates the wait). Once per client statement: queries a function runs
 *		share its start time. Not for EXPLAIN without ANALYZE, nor under
 *		REPEATABLE READ (chorus.sync_wait() before BEGIN instead).
 */
void
chorus_causal_read(QueryDesc *queryDesc, int eflags)
{
	if (IsolationUsesXactSnapshot() || (eflags & EXEC_FLAG_EXPLAIN_ONLY) != 0 ||
		chorus_causal_waited == GetCurrentStatementStartTimestamp())
		return;
	chorus_sync_wait(chorus_causal_reads_timeout);
	chorus_causal_waited = GetCurrentStatementStartTimestamp();
	UnregisterSnapshot(queryDesc->snapshot);
	queryDesc->snapshot = RegisterSnapshot(GetTransactionSnapshot());
}

/*
 * chorus_sync_wait
 *		Causal reads: ask the coordinator for a marker through the total order
 *		(frame 'S'); its answer is the last GID certified before the marker.
 *		Wait until this node has committed it, at most timeout_ms. Everything
 *		committed anywhere in the cluster before this call is then visible to a
 *		snapshot taken here afterwards.
 */
void
chorus_sync_wait(int timeout_ms)
{
	ChorusVerdict v;
	uint64		gid;
	uint64		committed;

	chorus_coord_ask(CHORUS_FRAME_SYNC, NULL, 0, &v);
	if (v.verdict != CHORUS_VERDICT_COMMIT)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: causal read refused: %s", v.msg)));
	gid = v.gid;
	committed = chorus_wait_committed(gid, timeout_ms, "this session waited for a causal read");
	if (committed < gid)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("chorus: causal read timed out: this node has committed GID %llu, the cluster was at GID %llu",
						(unsigned long long) committed, (unsigned long long) gid),
				 errhint("The node lags behind the cluster; raise chorus.causal_reads_timeout or read elsewhere.")));
}
