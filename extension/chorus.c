/*
 * chorus.c
 *		Module start-up: _PG_init defines the settings, reserves shared memory
 *		and installs the hooks and transaction callbacks. The hooks are here:
 *		shared memory, the executor (abort requests, flow control, causal
 *		reads), error reports (an abort by the coordinator is reported as
 *		40001) and utility statements (schema changes, chorus_ddl.c; the
 *		capture triggers' guard, chorus_attach.c).
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "executor/executor.h"
#include "parser/analyze.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/elog.h"

#include "chorus_abort.h"
#include "chorus_apply_exec.h"
#include "chorus_attach.h"
#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_ddl.h"
#include "chorus_ddl_replay.h"
#include "chorus_flow.h"
#include "chorus_settings.h"
#include "chorus_sequence.h"
#include "chorus_shmem.h"
#include "chorus_xact.h"

PG_MODULE_MAGIC;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;
static ExecutorFinish_hook_type prev_executor_finish = NULL;
static emit_log_hook_type prev_emit_log_hook = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;
static post_parse_analyze_hook_type prev_post_parse_analyze = NULL;

/*
 * chorus_executor_start
 *		Before each statement: a transaction the coordinator aborted fails
 *		here; flow control holds a transaction's first write statement while
 *		the cluster asks to slow down; causal reads wait for the cluster
 *		(chorus_flow.c); code run by a replicated schema change may not write
 *		rows (chorus_ddl_check_write); a row an apply writes through SPI is
 *		checked as the executor path checks it (chorus_apply_spi_start).
 */
static void
chorus_executor_start(QueryDesc *queryDesc, int eflags)
{
	ChorusCapture *cap = chorus_capture_state();
	ChorusCommitState *cs = chorus_commit_state();
	Oid			apply_relid = InvalidOid;

	chorus_check_aborted();
	if (chorus_shared != NULL && queryDesc->operation != CMD_SELECT && chorus_capture_enabled &&
		!cs->applying && cap->nrows == 0 && chorus_shared->paused)
		chorus_flow_wait();
	if (chorus_causal_reads && chorus_shared != NULL && !cs->applying)
		chorus_causal_read(queryDesc, eflags);
	chorus_ddl_check_write(queryDesc);
	if (cs->applying)
		chorus_apply_spi_start(queryDesc, true, &apply_relid);
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
	if (OidIsValid(apply_relid))
		chorus_apply_spi_start(queryDesc, false, &apply_relid);
}

/*
 * chorus_executor_finish
 *		After a statement's AFTER triggers fired: under EXPLAIN ANALYZE, the
 *		capture triggers are not listed (chorus_attach.c).
 */
static void
chorus_executor_finish(QueryDesc *queryDesc)
{
	if (prev_executor_finish)
		prev_executor_finish(queryDesc);
	else
		standard_ExecutorFinish(queryDesc);
	if (queryDesc->instrument_options != 0 && queryDesc->estate != NULL)
		chorus_hide_capture(queryDesc->estate);
}

/*
 * chorus_post_parse_analyze
 *		After parse analysis: setval() calls become calls that replicate
 *		(chorus_sequence.c).
 */
static void
chorus_post_parse_analyze(ParseState *pstate, Query *query, JumbleState *jstate)
{
	if (prev_post_parse_analyze)
		prev_post_parse_analyze(pstate, query, jstate);
	chorus_setval_rewrite(query, pstate->p_sourcetext);
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
		uint64		gid = chorus_abort_take();

		if (gid != 0)
		{
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
 * chorus_replay_as_role
 *		In a replaying session (chorus/concurrent.py: CREATE INDEX CONCURRENTLY
 *		and the like from another node), a statement runs as the role that ran
 *		it on its origin (chorus.replay_role), in a restricted security context,
 *		as a replay in an apply does (chorus_apply.c): it can do no more than
 *		that role, and cannot SET ROLE to the session's superuser. The session's
 *		own settings (SET, SHOW, transaction control) are left to the session.
 *		Returns whether it changed the user.
 */
static bool
chorus_replay_as_role(Node *stmt)
{
	Oid			role;
	Oid			uid;
	int			sec;

	if (chorus_replay_role == NULL || chorus_replay_role[0] == '\0' ||
		IsA(stmt, VariableSetStmt) || IsA(stmt, VariableShowStmt) || IsA(stmt, TransactionStmt))
		return false;
	role = get_role_oid(chorus_replay_role, true);
	if (!OidIsValid(role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("chorus: role \"%s\" does not exist on this node", chorus_replay_role),
				 errdetail("The statement ran as this role on its origin; it runs as no one else here.")));
	GetUserIdAndSecContext(&uid, &sec);
	SetUserIdAndSecContext(role, sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	return true;
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
	bool		defining = chorus_setval_stores_query(pstmt->utilityStmt);
	ChorusCapture *cap = chorus_capture_state();
	ChorusCommitState *cs = chorus_commit_state();
	Oid			save_uid;
	int			save_sec;
	volatile bool swapped = false;	/* the user id or context changed for the statement */
	bool		replay = (cs->applying || chorus_replaying) && chorus_shared != NULL;

	if (!IsA(pstmt->utilityStmt, TransactionStmt))
		chorus_check_aborted();
	/* no statement switches a table's capture off (chorus_attach.c), replayed or not */
	if (chorus_shared != NULL)
		pstmt = chorus_capture_guard(pstmt);
	if (replay)
	{
		/* a replayed schema change: this node's tablespaces */
		pstmt = chorus_ddl_replay_fixups(pstmt);
		if (pstmt == NULL)
			return;
		chorus_ddl_replay_enter(pstmt->utilityStmt, context);
	}
	else
		chorus_ddl_nested(pstmt->utilityStmt, context);
	replicated = chorus_shared != NULL && chorus_ddl_utility(cap, cs, pstmt, queryString, context, params);
	if (defining)
		chorus_setval_defining++;
	GetUserIdAndSecContext(&save_uid, &save_sec);
	PG_TRY();
	{
		chorus_truncate_restart = restart;
		if (chorus_replaying)
			swapped = chorus_replay_as_role(pstmt->utilityStmt);
		if (replay && IsA(pstmt->utilityStmt, RefreshMatViewStmt))
		{
			swapped = true;
			/*
			 * REFRESH MATERIALIZED VIEW restricts itself: it runs the view's query
			 * as the view's owner in a restricted security context, and needs an
			 * unrestricted one around it for CONCURRENTLY's temporary tables, as on
			 * the origin. The role stays the replay's (no SET ROLE either way).
			 */
			SetUserIdAndSecContext(save_uid, save_sec & ~SECURITY_RESTRICTED_OPERATION);
		}
		if (chorus_shared != NULL)
			chorus_capture_before(pstmt->utilityStmt);
		if (prev_process_utility)
			prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
		/*
		 * Only what this hook changed is put back: a SET ROLE or SET SESSION
		 * AUTHORIZATION the statement itself made must stay.
		 */
		if (swapped)
			SetUserIdAndSecContext(save_uid, save_sec);
		chorus_truncate_restart = outer_restart;
		if (replicated)
			chorus_ddl_record(cap, pstmt);
	}
	PG_FINALLY();
	{
		if (swapped)
			SetUserIdAndSecContext(save_uid, save_sec);
		if (replay)
			chorus_ddl_replay_leave();
		chorus_truncate_restart = outer_restart;
		if (defining)
			chorus_setval_defining--;
		if (replicated)
			chorus_ddl_done();
	}
	PG_END_TRY();
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
	RequestAddinShmemSpace(chorus_shmem_size());
	RequestAddinShmemSpace(chorus_abort_shmem_size());
	RequestNamedLWLockTranche("chorus", 1);
}

/*
 * chorus_shmem_startup
 *		Create (or attach to) the shared state and the abort slots.
 */
static void
chorus_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	chorus_shmem_init();
	chorus_abort_shmem_init();
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

	chorus_define_settings();

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = chorus_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = chorus_shmem_startup;

	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = chorus_executor_start;
	prev_executor_finish = ExecutorFinish_hook;
	ExecutorFinish_hook = chorus_executor_finish;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = chorus_emit_log;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = chorus_process_utility;
	prev_post_parse_analyze = post_parse_analyze_hook;
	post_parse_analyze_hook = chorus_post_parse_analyze;

	chorus_register_callbacks();
}
