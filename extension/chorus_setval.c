/*-------------------------------------------------------------------------
 *
 * chorus_setval.c
 *		setval() replicates (docs/DDL.md, "Sequences").
 *
 *		Each node draws a sequence's values from its own class (start + (k-1)
 *		× increment, stepping by increment × chorus.max_nodes), so a sequence's
 *		position is per node and not replicated. A setval() moves one node's
 *		sequence only: after a pg_restore (which ends with setval of every
 *		sequence) or an ORM's "reset sequences", the other nodes would go on
 *		drawing values the restored rows already hold.
 *
 *		So, in a captured session, a call to setval(seq, v[, is_called]) is
 *		rewritten after parse analysis into chorus.setval_captured(seq, v,
 *		is_called), which runs setval and notes the sequence. At commit, each
 *		noted sequence restarts, on this node and (as a schema change item of
 *		the writeset, at its GID) on every other, at the node's first value
 *		above the value it reached (chorus.spread_sequence). Values stay unique
 *		across the cluster and above everything setval asked for; the next value
 *		is not exactly setval's (as with every sequence under Chorus, ids are
 *		unique, not consecutive).
 *
 * Portions: setval's semantics are PostgreSQL's (src/backend/commands/sequence.c).
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_settings.h"
#include "chorus_setval.h"
#include "chorus_wswrite.h"

PG_FUNCTION_INFO_V1(chorus_setval_captured);

/*
 * Statements being defined whose parse trees are stored (views, rules, SQL
 * function bodies, materialized views): their setval calls are left alone, so
 * the stored definition is what the statement says on every node.
 */
int			chorus_setval_defining = 0;

/* Whether a utility statement stores the queries analyzed while it runs. */
bool
chorus_setval_stores_query(Node *stmt)
{
	return IsA(stmt, ViewStmt) || IsA(stmt, RuleStmt) || IsA(stmt, CreateFunctionStmt) ||
		(IsA(stmt, CreateTableAsStmt) && ((CreateTableAsStmt *) stmt)->objtype == OBJECT_MATVIEW);
}

/*
 * The OID of chorus.setval_captured(regclass, bigint, boolean), or InvalidOid.
 * Looked up in the catalog, not by name resolution: the caller needs no right
 * on schema chorus (as for the capture triggers' functions).
 */
static Oid
setval_captured_oid(void)
{
	Oid			nsp = get_namespace_oid("chorus", true);
	Oid			args[3] = {REGCLASSOID, INT8OID, BOOLOID};

	if (!OidIsValid(nsp))
		return InvalidOid;
	return GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid, CStringGetDatum("setval_captured"),
						   PointerGetDatum(buildoidvector(args, 3)), ObjectIdGetDatum(nsp));
}

/* Replace setval calls in a query tree by calls of the function whose OID is *context. */
static bool
setval_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, FuncExpr))
	{
		FuncExpr   *f = (FuncExpr *) node;

		if (f->funcid == F_SETVAL_REGCLASS_INT8 || f->funcid == F_SETVAL_REGCLASS_INT8_BOOL)
		{
			Oid		   *captured = (Oid *) context;

			if (!OidIsValid(*captured))
			{
				*captured = setval_captured_oid();
				if (!OidIsValid(*captured))
					return true;	/* the extension is not in this database: nothing to do */
			}
			if (list_length(f->args) == 2)
				f->args = lappend(f->args, makeBoolConst(true, false));
			f->funcid = *captured;
		}
	}
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, setval_walker, context, 0);
	return expression_tree_walker(node, setval_walker, context);
}

/*
 * chorus_setval_rewrite
 *		After parse analysis of a statement of a captured session: its setval
 *		calls become calls of chorus.setval_captured.
 */
void
chorus_setval_rewrite(Query *query)
{
	Oid			captured = InvalidOid;

	if (!chorus_capture_enabled || chorus_socket_path == NULL || chorus_socket_path[0] == '\0' ||
		chorus_commit_state()->applying || chorus_setval_defining > 0)
		return;
	(void) query_tree_walker(query, setval_walker, &captured, 0);
}

/*
 * chorus_setval_captured(seq regclass, value bigint, is_called boolean) returns bigint
 *		setval(seq, value, is_called), and the sequence noted for its commit.
 */
Datum
chorus_setval_captured(PG_FUNCTION_ARGS)
{
	Oid			seq = PG_GETARG_OID(0);
	Datum		result = DirectFunctionCall3(setval3_oid, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
											 PG_GETARG_DATUM(2));
	ChorusCapture *cap = chorus_capture_state();

	if (chorus_capture_enabled && !chorus_commit_state()->applying &&
		get_rel_persistence(seq) == RELPERSISTENCE_PERMANENT)
	{
		MemoryContext old;

		chorus_capture_begin(cap);
		/* what the transaction saw of the order, as for a captured row (certification checks it) */
		chorus_note_snapshot(cap);
		old = MemoryContextSwitchTo(cap->cxt);
		cap->sequences = list_append_unique_oid(cap->sequences, seq);
		MemoryContextSwitchTo(old);
	}
	PG_RETURN_DATUM(result);
}

/*
 * chorus_setval_items
 *		At commit: restart each sequence setval moved, here and, through an
 *		item of the writeset, on every node, above the value it reached.
 */
void
chorus_setval_items(ChorusCapture *cap)
{
	ListCell   *lc;
	Oid			save_uid;
	int			save_sec;
	char	   *superuser;

	if (cap->sequences == NIL)
		return;
	superuser = GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false);
	GetUserIdAndSecContext(&save_uid, &save_sec);
	/* the spread needs the extension's own rights, whoever called setval */
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	PushActiveSnapshot(GetTransactionSnapshot());	/* (at commit there is none) */
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "chorus: SPI_connect failed");
	foreach(lc, cap->sequences)
	{
		Oid			seq = lfirst_oid(lc);
		char	   *nsp,
				   *rel,
				   *name;
		StringInfoData sql;
		bool		isnull;
		int64		above;
		MemoryContext old;

		if (get_rel_relkind(seq) != RELKIND_SEQUENCE)
			continue;			/* dropped since */
		nsp = get_namespace_name(get_rel_namespace(seq));
		rel = get_rel_name(seq);
		if (nsp == NULL || rel == NULL)
			continue;
		name = quote_qualified_identifier(nsp, rel);
		initStringInfo(&sql);
		appendStringInfo(&sql, "SELECT last_value - CASE WHEN is_called THEN 0 ELSE 1 END FROM %s", name);
		if (SPI_execute(sql.data, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "chorus: cannot read the position of sequence %s", name);
		above = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		resetStringInfo(&sql);
		appendStringInfo(&sql, "SELECT chorus.spread_sequence(%s::regclass, " INT64_FORMAT ")",
						 quote_literal_cstr(name), above);
		if (SPI_execute(sql.data, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "chorus: cannot restart sequence %s in this node's class", name);
		old = MemoryContextSwitchTo(cap->cxt);
		chorus_put_schema_item(&cap->rows, 0, NULL, NULL, superuser, sql.data);
		MemoryContextSwitchTo(old);
		cap->nrows++;
		cap->has_schema = true;
	}
	SPI_finish();
	PopActiveSnapshot();
	SetUserIdAndSecContext(save_uid, save_sec);
	list_free(cap->sequences);
	cap->sequences = NIL;
}
