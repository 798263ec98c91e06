/*
 * chorus.c
 *		Module start-up: GUCs, shared memory, and the SQL-callable functions the
 *		coordinator uses (docs/PROTOCOL.md section 4).
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "access/htup_details.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "chorus.h"

PG_MODULE_MAGIC;

ChorusShared *chorus_shared = NULL;

char	   *chorus_socket_path = NULL;
bool		chorus_capture_enabled = true;
int			chorus_max_writeset_mb = 256;
char	   *chorus_exclude_schemas = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

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
	DefineCustomIntVariable("chorus.max_writeset_size",
							"Largest writeset a transaction may produce, in megabytes.",
							NULL, &chorus_max_writeset_mb, 256, 1, 900, PGC_SUSET,
							GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.exclude_schemas",
							   "Comma-separated schemas whose new tables are not replicated.",
							   NULL, &chorus_exclude_schemas, "", PGC_SUSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("chorus");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = chorus_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = chorus_shmem_startup;

	chorus_register_callbacks();
}

PG_FUNCTION_INFO_V1(chorus_node_init);
PG_FUNCTION_INFO_V1(chorus_set_online);
PG_FUNCTION_INFO_V1(chorus_committed_gid);
PG_FUNCTION_INFO_V1(chorus_apply_begin);
PG_FUNCTION_INFO_V1(chorus_status);

/*
 * chorus_node_init(committed_gid bigint)
 *		The coordinator sets the watermark it read from chorus.durable_gid() and
 *		marks the node ready. Writes stay refused until chorus.set_online(true).
 */
Datum
chorus_node_init(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);

	if (gid < 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: GID must not be negative")));
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	chorus_shared->committed_gid = (uint64) gid;
	chorus_shared->base_gid = (uint64) gid;
	chorus_shared->ring_count = 0;
	chorus_shared->online = false;
	chorus_shared->ready = true;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
	PG_RETURN_VOID();
}

/*
 * chorus_set_online(bool)
 *		Allow or refuse writes to replicated tables on this node.
 */
Datum
chorus_set_online(PG_FUNCTION_ARGS)
{
	bool		online = PG_GETARG_BOOL(0);

	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (online && !chorus_shared->ready)
	{
		LWLockRelease(chorus_shared->lock);
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: node_init() must be called before set_online()")));
	}
	chorus_shared->online = online;
	LWLockRelease(chorus_shared->lock);
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

	if (gid <= 0 || wait_for < 0 || wait_for >= gid)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: invalid apply GID %lld after %lld",
							   (long long) gid, (long long) wait_for)));
	if (chorus_xact.nrows > 0)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: apply_begin() in a transaction that already captured rows")));
	chorus_xact.applying = true;
	chorus_xact.gid = (uint64) gid;
	chorus_xact.wait_for = (uint64) wait_for;
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
