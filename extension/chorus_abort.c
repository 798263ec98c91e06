/*
 * chorus_abort.c
 *		Owns the abort slots in shared memory, one per PGPROC: how the
 *		coordinator (chorus.abort_local()) aborts a local transaction holding a
 *		lock that a certified remote writeset needs (local loses to remote,
 *		docs/ARCHITECTURE.md invariant 6), and how the backend learns of it, reports it
 *		with SQLSTATE 40001, or protects its transaction once its writeset is
 *		with the cluster.
 */
#include "postgres.h"

#include <signal.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "access/twophase.h"
#include "port/atomics.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/wait_event.h"

#include "chorus_abort.h"

/*
 * Per PGPROC slot: set by chorus.abort_local() when the coordinator aborts the
 * backend's transaction (by local transaction id, lxid) because the certified remote writeset gid needs a
 * lock it holds (docs/ARCHITECTURE.md invariant 6). gid 0: no request. The backend sets
 * CHORUS_ABORT_PROTECTED (by compare-and-swap, so exactly one of the two wins)
 * before it sends its writeset: from then on the transaction may be certified
 * and nothing but the cluster's verdict decides its fate.
 */
#define CHORUS_ABORT_PROTECTED PG_UINT64_MAX

typedef struct ChorusAbortSlot
{
	pg_atomic_uint64 gid;
	pg_atomic_uint32 xid;		/* the local transaction id (PGPROC.lxid) */
} ChorusAbortSlot;

static ChorusAbortSlot *chorus_abort_slots = NULL;
static int	chorus_abort_nslots = 0;

static int
chorus_proc_slots(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

/*
 * chorus_abort_shmem_size
 *		The shared memory of the slots (requested at start-up).
 */
Size
chorus_abort_shmem_size(void)
{
	return MAXALIGN(sizeof(ChorusAbortSlot) * chorus_proc_slots());
}

/*
 * chorus_abort_shmem_init
 *		Create (or attach to) the slots, all empty; the caller holds
 *		AddinShmemInitLock.
 */
void
chorus_abort_shmem_init(void)
{
	bool		found;

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
}

/*
 * chorus_abort_request
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
 * chorus_abort_take
 *		The GID of the request that aborts this backend's current transaction
 *		(0: none), and the request is dropped: it is reported once.
 */
uint64
chorus_abort_take(void)
{
	uint64		gid = chorus_abort_request();

	if (gid != 0)
		pg_atomic_write_u64(&chorus_abort_slots[MyProc->pgprocno].gid, 0);
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
	uint64		gid = chorus_abort_take();

	if (gid == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access: aborted by the certified remote transaction GID %llu",
					(unsigned long long) gid),
			 errdetail("This transaction held a lock the remote transaction needed; transactions certified first always win."),
			 errhint("Retry the transaction.")));
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

PG_FUNCTION_INFO_V1(chorus_abort_local);

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
