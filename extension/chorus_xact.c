/*
 * chorus_xact.c
 *		The transaction callbacks: the commit path of every replicated
 *		transaction (docs/PROTOCOL.md section 1). At PRE_COMMIT a local
 *		transaction sends its writeset to the coordinator and waits for the
 *		verdict; every replicated commit (local, applied or a schema change)
 *		then waits for its turn in GID order and records its GID in the commit
 *		record; at COMMIT the watermark moves and the coordinator hears of it;
 *		at ABORT a certified transaction is reported. Savepoints trim the
 *		capture. Each callback takes the transaction's capture and commit state
 *		and passes them to the steps.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"

#include "chorus_abort.h"
#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_coord.h"
#include "chorus_ddl.h"
#include "chorus_shmem.h"
#include "chorus_stamp.h"
#include "chorus_wire.h"
#include "chorus_sequence.h"
#include "chorus_xact.h"

/*
 * chorus_request_verdict
 *		Certify the local transaction: its writeset, as captured, goes to the
 *		coordinator, and the verdict sets its commit state.
 */
static void
chorus_request_verdict(ChorusCapture *cap, ChorusCommitState *cs)
{
	StringInfoData head;
	ChorusFrameBody ws;

	initStringInfo(&head);
	chorus_serialize_writeset(cap, &head, &ws, cs->xid, 0);
	chorus_certify(cs, &ws);
	pfree(head.data);
}

/*
 * chorus_stamp_local
 *		A certified local transaction on a site with links stamps its rows with
 *		its GID (chorus_stamp.c), as every other node's apply of its writeset does.
 */
static void
chorus_stamp_local(ChorusCapture *cap, uint64 gid, int64 commit_time)
{
	ChorusWsReader r;

	/* a writeset with a schema change is not stamped (as its apply does not: chorus_apply.c) */
	if (!chorus_stamping() || cap->nkeys == 0 || cap->has_schema)
		return;
	memset(&r, 0, sizeof(r));
	r.buf = cap->keys.data;
	r.len = (size_t) cap->keys.len;
	chorus_stamp_keys(&r, cap->nkeys, gid, commit_time);
}

static bool chorus_cancel_held = false;

/*
 * chorus_hold_cancel / chorus_resume_cancel
 *		Query cancels wait while a writeset is with the cluster, until the
 *		transaction has ended. Error recovery may have reset the hold count
 *		already.
 */
static void
chorus_hold_cancel(void)
{
	if (!chorus_cancel_held)
	{
		HOLD_CANCEL_INTERRUPTS();
		chorus_cancel_held = true;
	}
}

static void
chorus_resume_cancel(void)
{
	if (chorus_cancel_held)
	{
		chorus_cancel_held = false;
		if (QueryCancelHoldoffCount > 0)
			RESUME_CANCEL_INTERRUPTS();
	}
}

/*
 * chorus_xact_end
 *		The end of a top-level transaction, committed or aborted: cancels are
 *		no longer held, the abort slot is cleared, and the transaction's schema
 *		change, capture and commit state are forgotten.
 */
static void
chorus_xact_end(ChorusCapture *cap, ChorusCommitState *cs)
{
	chorus_resume_cancel();
	chorus_clear_aborted();
	chorus_ddl_reset();
	chorus_capture_reset(cap);
	chorus_commit_reset(cs);
}

/*
 * chorus_xact_callback
 *		PRE_COMMIT: certify (local) and wait for our turn (local and applied).
 *		COMMIT: advance the watermark. ABORT: a certified local transaction that
 *		did not commit is reported, so the coordinator replays it.
 */
static void
chorus_xact_callback(XactEvent event, void *arg)
{
	ChorusCapture *cap = chorus_capture_state();
	ChorusCommitState *cs = chorus_commit_state();

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			chorus_check_aborted();
			if (!cs->applying)
				chorus_setval_items(cap);
			if (cs->ddl)
			{
				cs->xid = GetTopTransactionId();
				chorus_ddl_confirm(cap, cs);
				chorus_claim_turn(cs->gid, &cs->claimed);
				chorus_take_origin(cs);
			}
			else if (cs->applying)
			{
				cs->xid = GetTopTransactionId();
				chorus_wait_own_turn(cs->gid, cs->wait_for);
				chorus_claim_turn(cs->gid, &cs->claimed);
				chorus_take_origin(cs);
			}
			else if (cap->nrows > 0)
			{
				cs->xid = GetTopTransactionId();
				chorus_protect_commit();

				/*
				 * From here the cluster decides: a cancel cannot take back a
				 * writeset that may be certified (like a commit, this wait is
				 * not cancellable until the commit record is written;
				 * terminating the session still works and the coordinator then
				 * commits the writeset itself if certified).
				 */
				chorus_hold_cancel();
				chorus_check_lost(cap->last_seen,
								  cap->writable_checked ? cap->write_epoch : PG_UINT64_MAX);
				chorus_request_verdict(cap, cs);
				chorus_stamp_local(cap, cs->gid, cs->commit_time);
				chorus_wait_own_turn(cs->gid, cs->wait_for);
				chorus_claim_turn(cs->gid, &cs->claimed);
				chorus_take_origin(cs);
			}
			break;
		case XACT_EVENT_COMMIT:
			if (cs->applying || cs->certified)
			{
				int			sync = chorus_restore_sync_commit(cs);

				chorus_release_origin(cs);
				chorus_record_commit(cs->gid, cs->prev, cs->xid);
				/* durable before the client is told: one flush for many commits */
				if (sync > SYNCHRONOUS_COMMIT_OFF && cs->certified && chorus_shared->lanes > 1)
					chorus_flush_prefix(cs->gid);
				else if (sync > SYNCHRONOUS_COMMIT_OFF)
					XLogFlush(XactLastCommitEnd);
				if (cs->certified)
					chorus_send_done(CHORUS_FRAME_COMMITTED, cs->gid, cs->xid);
			}
			chorus_xact_end(cap, cs);
			break;
		case XACT_EVENT_ABORT:
			if (cs->claimed)
			{
				/* give the GID back, so a replay can take it */
				chorus_unclaim_turn(cs->gid);
				cs->claimed = false;
			}
			chorus_restore_sync_commit(cs);
			chorus_release_origin(cs);
			/* ended while it waited for its verdict: learn it, before the row locks go */
			chorus_certification_ended();
			if (cs->certified && !cs->ddl && !cs->applying)
			{
				/* before its row locks go: chorus_check_lost */
				chorus_note_lost(cs->gid, false);
			}
			if (cs->certified)
				chorus_send_done(CHORUS_FRAME_ABORTED, cs->gid, cs->xid);
			chorus_xact_end(cap, cs);
			break;
		case XACT_EVENT_PRE_PREPARE:
			/*
			 * A prepared transaction commits later, by COMMIT PREPARED, on
			 * this node alone: what it wrote would never be certified, and
			 * the other nodes would never have it. Refused while it can
			 * still roll back (this event comes before the point of no
			 * return); a transaction that wrote nothing replicated may be
			 * prepared.
			 */
			if (!cs->applying && (cap->nrows > 0 || cap->sequences != NIL || cap->has_schema))
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("chorus: PREPARE TRANSACTION is not supported for a transaction that writes replicated tables, sequences or schema"),
						 errdetail("Every node certifies a transaction at COMMIT; a prepared transaction would commit on this node alone."),
						 errhint("Use COMMIT. Two-phase commit with an external transaction manager works only for transactions that write nothing Chorus replicates.")));
			break;
		case XACT_EVENT_PREPARE:
			chorus_xact_end(cap, cs);
			break;
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			chorus_capture_reset(cap);
			chorus_commit_reset(cs);
			break;
		default:
			break;
	}
}

/*
 * chorus_subxact_callback
 *		Savepoints: rows captured in a rolled-back subtransaction are dropped.
 */
static void
chorus_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	ChorusCapture *cap = chorus_capture_state();

	switch (event)
	{
		case SUBXACT_EVENT_START_SUB:
			chorus_subxact_start(cap, mySubid);
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			chorus_subxact_abort(cap, mySubid);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			chorus_subxact_commit(cap, mySubid);
			break;
		default:
			break;
	}
}

/*
 * chorus_register_callbacks
 *		Install the transaction and subtransaction callbacks (from _PG_init).
 */
void
chorus_register_callbacks(void)
{
	RegisterXactCallback(chorus_xact_callback, NULL);
	RegisterSubXactCallback(chorus_subxact_callback, NULL);
}
