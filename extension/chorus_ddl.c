/*
 * chorus_ddl.c
 *		Replicated schema changes (docs/DDL.md), from the utility hook to the
 *		report of their outcome, in one of two ways.
 *
 *		A statement on its own (autocommit, top level) runs in total order
 *		(total order isolation): its place in the total order is taken first (a
 *		writeset with the TOI flag: the statement, and an exclusive key on every
 *		table it names). Once every earlier GID has committed here, it runs. A
 *		schema change inside a transaction block, a function, a procedure or a
 *		DO block runs at once instead, as part of its transaction: its content
 *		joins the transaction's writeset, in order with its rows, and the whole
 *		is certified at commit like any writeset (its exclusive table keys make
 *		a concurrent transaction that did not see it fail, and the other way
 *		round; every schema change also holds one cluster-wide key, so two
 *		concurrent ones never both commit).
 *
 *		Either way the content is the same:
 *		a schema change item holding the statement in the form every node
 *		replays (with the settings it depends on and the role that ran it) and
 *		the rows the statement produced where replaying it would not give the
 *		same rows everywhere (CREATE TABLE AS, volatile column defaults, SET
 *		LOGGED). The origin sends that content with its report; every node
 *		applies it at the statement's GID (chorus_apply.c).
 *
 *		Which statements replicate is chorus_ddl_classify.c's decision, the
 *		rows a statement ships chorus_ddl_rows.c's, and the node-local parts of
 *		a replayed one chorus_ddl_replay.c's. Here too: chorus.replicable()
 *		and chorus.attach(), which the SQL side calls for new tables.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_node.h"
#include "parser/parsetree.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_coord.h"
#include "chorus_ddl.h"
#include "chorus_ddl_check.h"
#include "chorus_ddl_classify.h"
#include "chorus_ddl_rows.h"
#include "chorus_settings.h"
#include "chorus_shmem.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

/* Depth of replicated schema changes running in this backend (nested DDL is theirs). */
static int	chorus_ddl_depth = 0;

/* Depth of replayed statements running in this backend (an apply session, a replaying one). */
static int	chorus_replay_depth = 0;

/*
 * The settings a statement's meaning depends on: carried with it and set for
 * its replay on every node. check_function_bodies is not among them: a replay
 * never checks function bodies (the origin did, if it had it on), so a body
 * naming an object of the origin's session only does not stop the others.
 * default_tablespace is not among them either: tablespaces are per node (a
 * node lacking one, or that skipped an ALTER ... SET TABLESPACE, places a
 * table by its own defaults).
 */
static const char *const chorus_ddl_settings[] = {
	"search_path", "TimeZone", "DateStyle", "IntervalStyle", "standard_conforming_strings",
	"default_table_access_method", "default_toast_compression",
	"extra_float_digits", "bytea_output", "xmloption", "xmlbinary", "array_nulls",
	"transform_null_equals", "backslash_quote", "timezone_abbreviations",
	"default_text_search_config", "lc_monetary", "lc_numeric", "lc_time",
};
#define CHORUS_NSETTINGS lengthof(chorus_ddl_settings)

/* One replicated statement, from its ordering to its recording. */
typedef struct ChorusDdlRun
{
	ChorusDdlKeys keys;
	bool		toi;			/* ordered before it ran (else part of its transaction) */
	char	   *statement;		/* as the client wrote it */
	const char *values[CHORUS_NSETTINGS];	/* the settings it ran under */
	char	   *role;
	bool		target_existed; /* CREATE TABLE AS ... IF NOT EXISTS over an existing table */
	CommandId	cid;			/* the command counter when it started */
} ChorusDdlRun;

static ChorusDdlRun *chorus_ddl_run = NULL;

static void chorus_ddl_concurrent(ChorusCapture *cap, ChorusDdlRun *run);
static void chorus_attach_relation(Oid relid);

/*
 * chorus_ddl_settings_of
 *		The current values of the settings a statement depends on.
 */
static void
chorus_ddl_settings_of(const char **values)
{
	int			i;

	for (i = 0; i < (int) CHORUS_NSETTINGS; i++)
	{
		const char *v = GetConfigOption(chorus_ddl_settings[i], true, false);

		values[i] = pstrdup(v ? v : "");
	}
}

/*
 * chorus_ddl_order_writeset
 *		The statement's request for its place in the total order: the TOI flag,
 *		one schema change item (for logs and inspection: the content comes
 *		with the outcome) and the keys.
 */
static void
chorus_ddl_order_writeset(StringInfo out, ChorusDdlRun *run)
{
	uint64		committed;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	committed = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	/* no tables, one item (the schema change), its keys */
	chorus_put_header(out, CHORUS_WS_FLAG_TOI | CHORUS_WS_FLAG_DDL, 0, committed, 0, 1, run->keys.n);
	chorus_put_schema_item(out, CHORUS_NSETTINGS, chorus_ddl_settings, run->values, run->role, run->statement);
	appendBinaryStringInfo(out, run->keys.buf.data, run->keys.buf.len);
}

/*
 * chorus_ddl_utility
 *		Called for every utility statement before it runs. Returns true if the
 *		statement is a replicated schema change that now holds its turn (the
 *		caller runs it, then calls chorus_ddl_record() if it succeeded and
 *		chorus_ddl_done() in any case).
 */
bool
chorus_ddl_utility(ChorusCapture *cap, ChorusCommitState *cs, PlannedStmt *pstmt,
				   const char *queryString, ProcessUtilityContext context, ParamListInfo params)
{
	ChorusDdlRun *run;
	ChorusDdlKind kind;
	const char *why = NULL;
	StringInfoData ws;
	CreateTableAsStmt *ctas;
	MemoryContext old;

	if (!chorus_capture_enabled || !chorus_replicate_ddl || cs->applying ||
		chorus_ddl_depth > 0 || creating_extension || IsBinaryUpgrade)
		return false;

	run = MemoryContextAllocZero(TopTransactionContext, sizeof(ChorusDdlRun));
	old = MemoryContextSwitchTo(TopTransactionContext);
	initStringInfo(&run->keys.buf);
	kind = chorus_ddl_classify(pstmt->utilityStmt, &run->keys, &why);
	MemoryContextSwitchTo(old);
	if (kind == CHORUS_DDL_LOCAL)
		return false;
	if (kind == CHORUS_DDL_REFUSE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: %s", why),
				 errhint("Run the statement in a form that is replicated, or "
						 "SET chorus.replicate_ddl = off and run it on every node.")));
	ctas = chorus_ctas_of(pstmt->utilityStmt);
	if (params != NULL && params->numParams > 0 && ctas == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: a schema change with parameters cannot be replayed on the other nodes"),
				 errhint("Build the statement with its values (format() and EXECUTE in PL/pgSQL).")));
	chorus_check_writable();

	old = MemoryContextSwitchTo(TopTransactionContext);
	/* on its own: in total order; else (a block, a function, after other changes): with its transaction */
	run->toi = context == PROCESS_UTILITY_TOPLEVEL && !IsTransactionBlock() && !cs->ddl &&
		!cap->has_schema && cap->nrows == 0;
	if (pstmt->stmt_len > 0)
		run->statement = pnstrdup(queryString + pstmt->stmt_location, pstmt->stmt_len);
	else
		run->statement = pstrdup(queryString + Max(pstmt->stmt_location, 0));
	chorus_ddl_settings_of(run->values);
	run->role = GetUserNameFromId(GetUserId(), false);
	if (ctas != NULL && ctas->if_not_exists)
		run->target_existed = OidIsValid(RangeVarGetRelid(ctas->into->rel, NoLock, true));
	MemoryContextSwitchTo(old);

	if (run->keys.concurrent)
	{
		chorus_ddl_concurrent(cap, run);
		return false;
	}
	if (run->toi)
	{
		initStringInfo(&ws);
		chorus_ddl_order_writeset(&ws, run);
		chorus_ddl_order(cs, &ws);
		pfree(ws.data);
	}
	run->cid = GetCurrentCommandId(false);
	chorus_ddl_run = run;
	chorus_ddl_depth++;
	return true;
}

/*
 * chorus_ddl_item
 *		Append a schema change item with the run's settings and role.
 */
static void
chorus_ddl_item(ChorusCapture *cap, ChorusDdlRun *run, const char *statement)
{
	chorus_put_schema_item(&cap->rows, CHORUS_NSETTINGS, chorus_ddl_settings, run->values,
						   run->role, statement);
	cap->nrows++;
	cap->has_schema = true;
}

/*
 * chorus_ddl_schema_key
 *		The cluster-wide key every schema change holds, exclusive: two
 *		concurrent ones never both commit.
 */
static void
chorus_ddl_schema_key(ChorusCapture *cap)
{
	MemoryContext old;

	if (cap->schema_key_done)
		return;
	old = MemoryContextSwitchTo(cap->cxt);
	chorus_put_table_key(&cap->keys, CHORUS_KEY_EXCLUSIVE, CHORUS_SCHEMA_KEY_NSP, CHORUS_SCHEMA_KEY_REL);
	cap->nkeys++;
	cap->schema_key_done = true;
	MemoryContextSwitchTo(old);
}

/*
 * chorus_ddl_concurrent
 *		CREATE INDEX, DROP INDEX and REINDEX CONCURRENTLY, and ALTER TABLE ...
 *		DETACH PARTITION ... CONCURRENTLY, run beside the total order, as on a
 *		single PostgreSQL they run beside other sessions' writes. PostgreSQL
 *		commits their first step (the index's catalog entry, marking it
 *		invalid, the new copies, the pending detach) in a transaction of its own
 *		before the long part: the statement joins that transaction's writeset
 *		(flag CONCURRENT, no table keys: row writes anywhere go on; the
 *		cluster-wide schema key orders it against other schema changes), so
 *		the step commits at a GID like any writeset, and a certification loss
 *		ends the statement before anything is built. At that GID every other
 *		node starts the same statement in a session of its own
 *		(chorus/concurrent.py) and goes on once it holds the
 *		table's lock; the later steps commit nothing that is replicated.
 */
static void
chorus_ddl_concurrent(ChorusCapture *cap, ChorusDdlRun *run)
{
	chorus_capture_begin(cap);
	chorus_note_snapshot(cap);
	chorus_ddl_schema_key(cap);
	chorus_ddl_item(cap, run, run->statement);
	cap->concurrent = true;
}

/*
 * chorus_table_replicable
 *		Whether Chorus replicates table relid by itself: a permanent plain
 *		table (partitions included; not a partitioned table itself, whose rows
 *		live in its partitions, which capture them: a trigger on the parent
 *		would be cloned onto every partition and clash with theirs on ATTACH
 *		PARTITION) outside the system schemas and chorus.exclude_schemas. Read
 *		from the catalogs, not by a query: no search_path is involved.
 */
bool
chorus_table_replicable(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Form_pg_class c;
	bool		ok;
	char	   *nsp;

	if (!HeapTupleIsValid(tup))
		return false;
	c = (Form_pg_class) GETSTRUCT(tup);
	ok = c->relkind == RELKIND_RELATION && c->relpersistence == RELPERSISTENCE_PERMANENT &&
		!IsCatalogNamespace(c->relnamespace) && !IsToastNamespace(c->relnamespace) &&
		!isAnyTempNamespace(c->relnamespace);
	nsp = ok ? get_namespace_name(c->relnamespace) : NULL;
	ReleaseSysCache(tup);
	if (nsp == NULL || strcmp(nsp, "information_schema") == 0 || strcmp(nsp, "chorus") == 0 ||
		strncmp(nsp, "pg_toast", 8) == 0 || strncmp(nsp, "pg_temp", 7) == 0)
		return false;
	if (chorus_exclude_schemas != NULL && chorus_exclude_schemas[0] != '\0')
	{
		/* comma-separated, spaces left out (as the setting's documentation says) */
		StringInfoData names;
		char	   *p,
				   *name;

		initStringInfo(&names);
		for (p = chorus_exclude_schemas; *p; p++)
			if (*p != ' ')
				appendStringInfoChar(&names, *p);
		for (name = strtok(names.data, ","); name != NULL; name = strtok(NULL, ","))
			if (strcmp(name, nsp) == 0)
				return false;
	}
	return true;
}

PG_FUNCTION_INFO_V1(chorus_replicable);

/*
 * chorus.replicable(rel regclass) returns boolean
 *		Is rel a table Chorus replicates by itself (chorus_table_replicable)?
 */
Datum
chorus_replicable(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(chorus_table_replicable(PG_GETARG_OID(0)));
}

/*
 * chorus_attach_table
 *		Capture rows of a new table from now on, if it is replicable (the event
 *		trigger does this for CREATE TABLE and CREATE TABLE AS; EXPLAIN ANALYZE
 *		CREATE TABLE AS runs no event trigger). The triggers are made in C as
 *		the bootstrap superuser (an application role need not have the TRIGGER
 *		right on what it creates, nor any right on schema chorus), in a
 *		restricted security context; no query runs and no user code.
 */
static void
chorus_attach_table(Oid relid)
{
	Oid			save_uid;
	int			save_sec;

	if (!chorus_table_replicable(relid))
		return;
	GetUserIdAndSecContext(&save_uid, &save_sec);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID,
						   save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	PG_TRY();
	{
		chorus_attach_relation(relid);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_uid, save_sec);
	}
	PG_END_TRY();
}

/*
 * chorus_ddl_record
 *		The replicated statement ran here: add its content to the transaction's
 *		writeset (the schema change item in its replay form, and rows where the
 *		replay would not reproduce them), with its table keys.
 */
void
chorus_ddl_record(ChorusCapture *cap, PlannedStmt *pstmt)
{
	ChorusDdlRun *run = chorus_ddl_run;
	Node	   *stmt = pstmt->utilityStmt;
	CreateTableAsStmt *ctas = chorus_ctas_of(stmt);
	MemoryContext old;

	if (run == NULL)
		return;
	chorus_ddl_run = NULL;
	chorus_capture_begin(cap);
	if (!run->toi)
		chorus_note_snapshot(cap);	/* certified at commit, against what its snapshot saw */
	old = MemoryContextSwitchTo(cap->cxt);
	appendBinaryStringInfo(&cap->keys, run->keys.buf.data, run->keys.buf.len);
	cap->nkeys += run->keys.n;
	MemoryContextSwitchTo(old);
	chorus_ddl_schema_key(cap);

	if (IsA(stmt, ViewStmt))
	{
		/* a view over a temporary table is made temporary: it stays in this session */
		Oid			relid;

		CommandCounterIncrement();
		relid = RangeVarGetRelid(((ViewStmt *) stmt)->view, NoLock, true);
		if (OidIsValid(relid) && get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
			return;
	}
	chorus_ddl_check_made(run->cid);

	if (ctas != NULL && ctas->objtype == OBJECT_TABLE)
	{
		/* the structure as DDL, the rows as data: the query need not give them elsewhere */
		Oid			relid;
		Relation	rel;

		if (run->target_existed)
			return;
		CommandCounterIncrement();
		relid = RangeVarGetRelid(ctas->into->rel, NoLock, false);
		chorus_attach_table(relid); /* before this opens it: ALTER TABLE refuses a table in use */
		rel = table_open(relid, AccessShareLock);
		chorus_ddl_item(cap, run, chorus_ddl_create_text(rel));
		cap->table_epoch++;
		if (rel->rd_rel->relpersistence == RELPERSISTENCE_PERMANENT)
			chorus_ddl_ship_rows(cap, rel, false);
		table_close(rel, AccessShareLock);
		return;
	}
	chorus_ddl_item(cap, run, run->statement);
	cap->table_epoch++;
	if (IsA(stmt, AlterTableStmt))
	{
		AlterTableStmt *ats = (AlterTableStmt *) stmt;
		int			ship = chorus_alter_rows(ats);

		if (ship > 0)
		{
			Oid			relid = RangeVarGetRelid(ats->relation, NoLock, true);

			if (OidIsValid(relid) && get_rel_relkind(relid) == RELKIND_RELATION)
			{
				Relation	rel = table_open(relid, AccessShareLock);

				if (rel->rd_rel->relpersistence == RELPERSISTENCE_PERMANENT)
					chorus_ddl_ship_rows(cap, rel, ship == 2);
				table_close(rel, AccessShareLock);
			}
		}
	}
}

/* The replicated statement finished (or failed): nested DDL is no longer its. */
void
chorus_ddl_done(void)
{
	if (chorus_ddl_depth > 0)
		chorus_ddl_depth--;
	chorus_ddl_run = NULL;
}

/* At transaction end (an error may have skipped chorus_ddl_done). */
void
chorus_ddl_reset(void)
{
	chorus_replay_depth = 0;
	chorus_ddl_depth = 0;
	chorus_ddl_run = NULL;
}

/*
 * chorus_ddl_confirm
 *		At PRE_COMMIT of a schema change run in total order: it ran here; tell
 *		the cluster, with its content (the transaction's writeset, as captured
 *		in cap: the statement in its replay form and the rows it produced),
 *		which every node applies at its GID; and wait until that report is in
 *		the total order before committing, so no node can end up with the
 *		change while the others skip it.
 */
void
chorus_ddl_confirm(ChorusCapture *cap, ChorusCommitState *cs)
{
	StringInfoData head;
	ChorusFrameBody body;
	ChorusVerdict v;

	chorus_capture_begin(cap);
	initStringInfo(&head);
	chorus_put_u64(&head, cs->gid);
	chorus_put_u32(&head, cs->xid);
	chorus_serialize_writeset(cap, &head, &body, cs->xid, 0);
	chorus_coord_ask_parts(CHORUS_FRAME_RAN, &body, &v);
	pfree(head.data);
	if (v.verdict == CHORUS_VERDICT_UNDONE)
		chorus_refuse_unless_commit(&v);
	if (v.verdict != CHORUS_VERDICT_COMMIT)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("chorus: the schema change was not committed: %s", v.msg)));
}

/*
 * A replicated schema change is replayed on the other nodes as the statement
 * its origin ran: what it does there must be what it did here. Code an
 * ordinary role wrote that runs inside it (a function a CHECK constraint
 * calls while the constraint is validated, a USING expression, an event
 * trigger that runs as the role) may therefore neither write rows of
 * permanent tables (the origin's writes replicate with the statement, and
 * the replay would write them again) nor make a schema change of its own
 * (which would replicate only through the replay, where the code may decide
 * otherwise). Both are refused, on the origin and in a replay alike
 * (docs/SECURITY.md). Superusers' code is trusted; temporary objects,
 * materialized views (REFRESH ... CONCURRENTLY writes its own) and extension
 * scripts are each node's own doing.
 */

/* Is this backend running a replicated schema change, on its origin or replayed? */
static bool
chorus_ddl_inside(void)
{
	return (chorus_ddl_depth > 0 || chorus_replay_depth > 0) && !creating_extension && !superuser();
}

/*
 * chorus_ddl_replay_enter, chorus_ddl_replay_leave
 *		Around a statement an apply session or a replaying session runs (the
 *		utility hook): statements run inside it are nested in a replay.
 */
void
chorus_ddl_replay_enter(Node *stmt, ProcessUtilityContext context)
{
	if (chorus_replay_depth > 0)
		chorus_ddl_nested(stmt, context);
	chorus_replay_depth++;
}

void
chorus_ddl_replay_leave(void)
{
	if (chorus_replay_depth > 0)
		chorus_replay_depth--;
}

/*
 * chorus_ddl_nested
 *		A utility statement about to run: inside a replicated schema change,
 *		an ordinary role's own schema change (one that would replicate) is
 *		refused. The parts of one statement (PROCESS_UTILITY_SUBCOMMAND: the
 *		index of a primary key, say) are the statement's.
 */
void
chorus_ddl_nested(Node *stmt, ProcessUtilityContext context)
{
	ChorusDdlKeys keys;
	const char *why = NULL;

	if (context == PROCESS_UTILITY_SUBCOMMAND || !chorus_ddl_inside() || IsA(stmt, TransactionStmt) ||
		IsA(stmt, VariableSetStmt) || IsA(stmt, VariableShowStmt))
		return;
	initStringInfo(&keys.buf);
	keys.n = 0;
	keys.any_temp = keys.any_persistent = keys.concurrent = false;
	if (chorus_ddl_classify(stmt, &keys, &why) == CHORUS_DDL_LOCAL)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("chorus: code run by a replicated schema change may not make a schema change of its own"),
			 errdetail("The other nodes replay the outer statement; what the code inside it does there "
					   "may differ (docs/SECURITY.md)."),
			 errhint("Run the inner statement on its own, or from a function owned by a superuser.")));
}

/*
 * chorus_ddl_check_write
 *		A statement about to run in the executor: inside a replicated schema
 *		change, an ordinary role's code may not write rows of a permanent
 *		table (materialized views, temporary tables and catalogs excepted).
 */
void
chorus_ddl_check_write(QueryDesc *qd)
{
	PlannedStmt *ps = qd->plannedstmt;
	ListCell   *lc;

	if (ps == NULL || (qd->operation == CMD_SELECT && !ps->hasModifyingCTE) || !chorus_ddl_inside())
		return;
	foreach(lc, ps->resultRelations)
	{
		RangeTblEntry *rte = rt_fetch(lfirst_int(lc), ps->rtable);
		char		kind = get_rel_relkind(rte->relid);

		if (kind == RELKIND_MATVIEW || get_rel_persistence(rte->relid) != RELPERSISTENCE_PERMANENT ||
			IsCatalogRelationOid(rte->relid))
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: code run by a replicated schema change may not write rows of table %s",
						quote_identifier(get_rel_name(rte->relid))),
				 errdetail("The rows it writes here replicate with the schema change, and every other node "
						   "replaying the change would run the code and write them again (docs/SECURITY.md)."),
				 errhint("Write the rows in a statement of their own, or from a function owned by a superuser.")));
	}
}

PG_FUNCTION_INFO_V1(chorus_attach);

/* Create one of the capture triggers on relid, firing whatever session_replication_role says. */
static void
chorus_create_capture_trigger(Oid relid, bool truncate)
{
	CreateTrigStmt *stmt = makeNode(CreateTrigStmt);

	stmt->trigname = truncate ? "chorus_capture_truncate" : "chorus_capture";
	stmt->funcname = list_make2(makeString("chorus"), makeString(truncate ? "capture_truncate" : "capture"));
	stmt->row = !truncate;
	stmt->timing = TRIGGER_TYPE_AFTER;
	stmt->events = truncate ? TRIGGER_TYPE_TRUNCATE
		: (TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE);
	(void) CreateTriggerFiringOn(stmt, "chorus.attach()", relid, InvalidOid, InvalidOid, InvalidOid,
								 InvalidOid, InvalidOid, NULL, false, false, TRIGGER_FIRES_ALWAYS);
	CommandCounterIncrement();
}

/*
 * chorus.attach(rel regclass)
 *		Capture the table's row changes: its two capture triggers, made here and
 *		not by CREATE TRIGGER statements, so no event trigger sees them and no
 *		search_path resolves anything. Idempotent.
 */
Datum
chorus_attach(PG_FUNCTION_ARGS)
{
	chorus_attach_relation(PG_GETARG_OID(0));
	PG_RETURN_VOID();
}

/* Give relid its capture triggers, those it lacks (chorus.attach). */
static void
chorus_attach_relation(Oid relid)
{
	Relation	rel = table_open(relid, ShareRowExclusiveLock);

	if (!OidIsValid(get_trigger_oid(relid, "chorus_capture", true)))
		chorus_create_capture_trigger(relid, false);
	if (!OidIsValid(get_trigger_oid(relid, "chorus_capture_truncate", true)))
		chorus_create_capture_trigger(relid, true);
	table_close(rel, NoLock);
}
