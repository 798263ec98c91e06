/*-------------------------------------------------------------------------
 *
 * chorus_sequence.c
 *		Sequences never collide between nodes, and setval() replicates
 *		(docs/DDL.md, "Sequences").
 *
 *		Each node draws a sequence's values from its own class (start + (k-1)
 *		× increment, stepping by increment × chorus.max_nodes): chorus.
 *		spread_sequence() gives a sequence this node's class. So a sequence's
 *		position is per node and not replicated. A setval() moves one node's
 *		sequence only: after a pg_restore (which ends with setval of every
 *		sequence) or an ORM's "reset sequences", the other nodes would go on
 *		drawing values the restored rows already hold.
 *
 *		So, in a captured session, a call to setval(seq, v[, is_called]) is
 *		rewritten after parse analysis into chorus.setval_captured(seq, v,
 *		is_called), which runs setval and notes the sequence. At commit, each
 *		noted sequence restarts, on this node and (as a schema change item of
 *		the writeset, at its GID) on every other, at the node's first value of
 *		its own class beyond the value it reached (chorus.restart_sequence).
 *		Values stay unique across the cluster and beyond everything setval
 *		asked for; the next value is not exactly setval's (as with every
 *		sequence under Chorus, ids are unique, not consecutive).
 *
 *		Everything here is done in C on the catalogs and the sequence itself:
 *		no query runs, so no search_path can redirect anything, and the only
 *		change of user (to a sequence's owner, to restart it) covers a call
 *		that runs no user code.
 *
 * Portions: setval's semantics are PostgreSQL's (src/backend/commands/sequence.c).
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_sequence.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/int.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "parser/parse_node.h"
#include "storage/bufmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_settings.h"
#include "chorus_sequence.h"
#include "chorus_table.h"
#include "chorus_wswrite.h"

PG_FUNCTION_INFO_V1(chorus_setval_captured);
PG_FUNCTION_INFO_V1(chorus_spread_sequence);
PG_FUNCTION_INFO_V1(chorus_alter_sequence);
PG_FUNCTION_INFO_V1(chorus_restart_sequence);

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
 * may_call_setval
 *		Whether the text of a statement can name setval: a call the parser
 *		resolved to setval was written as an identifier setval, unquoted (any
 *		case) or quoted, or as a Unicode-escaped one (U&"..."), which is not
 *		matched here and so always walked. A statement that names none of them
 *		cannot hold a call of it: its tree is not walked (the walk, on every
 *		statement of a captured session, cost 3 µs per pgbench transaction,
 *		docs/NATIVE.md). No text (a caller that gives none): walked.
 */
static bool
may_call_setval(const char *text)
{
	const char *p;

	if (text == NULL)
		return true;
	for (p = text; *p != '\0'; p++)
	{
		if ((p[0] == 's' || p[0] == 'S') && pg_strncasecmp(p, "setval", 6) == 0)
			return true;
		if ((p[0] == 'u' || p[0] == 'U') && p[1] == '&')
			return true;
	}
	return false;
}

/*
 * chorus_setval_rewrite
 *		After parse analysis of a statement of a captured session: its setval
 *		calls become calls of chorus.setval_captured. text: the source text the
 *		statement was analyzed from (NULL if none).
 */
void
chorus_setval_rewrite(Query *query, const char *text)
{
	Oid			captured = InvalidOid;

	if (!chorus_capture_enabled || chorus_socket_path == NULL || chorus_socket_path[0] == '\0' ||
		chorus_commit_state()->applying || chorus_setval_defining > 0 || !may_call_setval(text))
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
 * Sequence seq's increment and start (false if it is not a sequence any more).
 */
static bool
sequence_params(Oid seq, int64 *increment, int64 *start)
{
	HeapTuple	tup = SearchSysCache1(SEQRELID, ObjectIdGetDatum(seq));
	Form_pg_sequence s;

	if (!HeapTupleIsValid(tup))
		return false;
	s = (Form_pg_sequence) GETSTRUCT(tup);
	*increment = s->seqincrement;
	*start = s->seqstart;
	ReleaseSysCache(tup);
	return true;
}

/*
 * sequence_position
 *		The value the sequence's next value must lie beyond: the last it
 *		handed out, or, when it is not called (setval(s, v, false): the next
 *		value is v), the value just before last_value in its direction. (Not
 *		one increment before it: a node's class steps by increment × nodes,
 *		and a restart beyond v - increment could hand out values below v.)
 *		Read from its one tuple as nextval and setval do (commands/sequence.c),
 *		without a query and without a privilege check (its caller moved it).
 */
static int64
sequence_position(Oid seq, int64 increment)
{
	Relation	rel = relation_open(seq, AccessShareLock);
	Buffer		buf = ReadBuffer(rel, 0);
	Page		page;
	ItemId		lp;
	HeapTupleHeader tup;
	Form_pg_sequence_data data;
	int64		pos;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	lp = PageGetItemId(page, FirstOffsetNumber);
	if (!ItemIdIsNormal(lp))
		elog(ERROR, "chorus: sequence \"%s\" has no tuple", RelationGetRelationName(rel));
	tup = (HeapTupleHeader) PageGetItem(page, lp);
	data = (Form_pg_sequence_data) ((char *) tup + tup->t_hoff);
	pos = data->last_value;
	if (!data->is_called && pg_sub_s64_overflow(pos, increment > 0 ? 1 : -1, &pos))
		pos = data->last_value;
	UnlockReleaseBuffer(buf);
	relation_close(rel, AccessShareLock);
	return pos;
}

/*
 * sequence_beyond
 *		The first value start + j × increment (j ≥ 0) beyond position in the
 *		sequence's direction (above it when ascending, below when
 *		descending): where a sequence of that progression restarts so as to
 *		hand out nothing at or before position. Errors on overflow.
 */
static int64
sequence_beyond(int64 start, int64 increment, int64 position, const char *name)
{
	int64		gap,
				steps,
				value;

	if (increment > 0 ? position < start : position > start)
		return start;
	if (pg_sub_s64_overflow(increment > 0 ? position : start, increment > 0 ? start : position, &gap) ||
		pg_mul_s64_overflow(gap / (increment > 0 ? increment : -increment) + 1, increment, &steps) ||
		pg_add_s64_overflow(start, steps, &value))
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("chorus: sequence \"%s\" cannot restart beyond " INT64_FORMAT " in this node's class",
						name, position)));
	return value;
}

/*
 * chorus_sequence_restart
 *		Restart sequence seq at its first value beyond position in its own
 *		progression (this node's class, if it has one): nextval then hands
 *		out that value. As the sequence's owner, in a restricted security
 *		context: setval runs no user code, and needs no more than the owner's
 *		rights whoever moved the sequence. False if seq is not a sequence.
 */
static bool
chorus_sequence_restart(Oid seq, int64 position)
{
	int64		increment,
				start,
				first;
	Oid			save_uid;
	int			save_sec;
	char	   *name = get_rel_name(seq);

	if (name == NULL || get_rel_relkind(seq) != RELKIND_SEQUENCE || !sequence_params(seq, &increment, &start))
		return false;
	first = sequence_beyond(start, increment, position, name);
	GetUserIdAndSecContext(&save_uid, &save_sec);
	SetUserIdAndSecContext(chorus_relation_owner(seq),
						   save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	PG_TRY();
	{
		(void) DirectFunctionCall3(setval3_oid, ObjectIdGetDatum(seq), Int64GetDatum(first),
								   BoolGetDatum(false));
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_uid, save_sec);
	}
	PG_END_TRY();
	return true;
}

/*
 * chorus.restart_sequence(seq regclass, beyond bigint)
 *		Restart seq at this node's first value beyond "beyond" (the replay of
 *		a setval: chorus_setval_items). Nothing if seq is not a sequence.
 */
Datum
chorus_restart_sequence(PG_FUNCTION_ARGS)
{
	(void) chorus_sequence_restart(PG_GETARG_OID(0), PG_GETARG_INT64(1));
	PG_RETURN_VOID();
}

/*
 * chorus.spread_sequence(seq regclass, restart_above bigint DEFAULT NULL)
 *		Give seq this node's class: node k of chorus.max_nodes draws start +
 *		(k-1) × increment, stepping by increment × max_nodes; with
 *		restart_above, from the class's first value above it. From the
 *		sequence's increment as it stands (a sequence new, or just set by ALTER
 *		SEQUENCE). ALTER SEQUENCE's rules apply: its owner or a superuser.
 */
Datum
chorus_spread_sequence(PG_FUNCTION_ARGS)
{
	chorus_spread(PG_ARGISNULL(0) ? InvalidOid : PG_GETARG_OID(0), !PG_ARGISNULL(1),
				  PG_ARGISNULL(1) ? 0 : PG_GETARG_INT64(1));
	PG_RETURN_VOID();
}

/*
 * chorus_spread
 *		chorus.spread_sequence's work (restart: restart_above was given); the
 *		event trigger calls it for new sequences.
 */
void
chorus_spread(Oid seq, bool restart, int64 restart_above)
{
	int			k = chorus_node_number,
				m = chorus_max_nodes;
	int64		increment,
				start,
				step,
				first,
				restart_at;
	char	   *name;
	AlterSeqStmt *stmt;

	if (k == 0 || m <= 1 || !OidIsValid(seq) || (name = get_rel_name(seq)) == NULL ||
		get_rel_relkind(seq) != RELKIND_SEQUENCE)
		return;
	if (k > m)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("chorus: chorus.node_number (%d) is larger than chorus.max_nodes (%d)", k, m)));
	if (!sequence_params(seq, &increment, &start))
		return;
	if (pg_mul_s64_overflow(increment, m, &step) || pg_mul_s64_overflow(increment, k - 1, &first) ||
		pg_add_s64_overflow(start, first, &first))
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("chorus: sequence \"%s\" cannot take node %d's class of %d", name, k, m)));
	restart_at = restart ? sequence_beyond(first, step, restart_above, name) : first;
	stmt = makeNode(AlterSeqStmt);
	stmt->sequence = makeRangeVar(get_namespace_name(get_rel_namespace(seq)), name, -1);
	stmt->options = list_make3(makeDefElem("increment", (Node *) makeFloat(psprintf(INT64_FORMAT, step)), -1),
							   makeDefElem("start", (Node *) makeFloat(psprintf(INT64_FORMAT, first)), -1),
							   makeDefElem("restart", (Node *) makeFloat(psprintf(INT64_FORMAT, restart_at)), -1));
	(void) AlterSequence(make_parsestate(NULL), stmt);
	CommandCounterIncrement();
}

/*
 * chorus.alter_sequence(seq regclass, increment bigint, start bigint, restart bigint)
 *		ALTER SEQUENCE seq INCREMENT BY increment START WITH start RESTART WITH
 *		restart, made here rather than as a statement (no event trigger sees
 *		it). Version 0.1 of the extension's spread_sequence() calls it: kept
 *		so that a node still at 0.1 runs with this library until ALTER
 *		EXTENSION chorus UPDATE (0.2 spreads sequences in C and has no such
 *		function). ALTER SEQUENCE's rules apply: its owner or a superuser.
 */
Datum
chorus_alter_sequence(PG_FUNCTION_ARGS)
{
	Oid			seq = PG_GETARG_OID(0);
	char	   *name = get_rel_name(seq);
	AlterSeqStmt *stmt;

	if (name == NULL || get_rel_relkind(seq) != RELKIND_SEQUENCE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("chorus: %u is not a sequence", seq)));
	stmt = makeNode(AlterSeqStmt);
	stmt->sequence = makeRangeVar(get_namespace_name(get_rel_namespace(seq)), name, -1);
	stmt->options = list_make3(makeDefElem("increment", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(1))), -1),
							   makeDefElem("start", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(2))), -1),
							   makeDefElem("restart", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(3))), -1));
	(void) AlterSequence(make_parsestate(NULL), stmt);
	CommandCounterIncrement();
	PG_RETURN_VOID();
}

/*
 * chorus_setval_items
 *		At commit: restart each sequence setval moved, here and, through an
 *		item of the writeset, on every node, beyond the value it reached, each
 *		in its own class.
 */
void
chorus_setval_items(ChorusCapture *cap)
{
	ListCell   *lc;
	char	   *superuser;

	if (cap->sequences == NIL)
		return;
	superuser = GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false);
	foreach(lc, cap->sequences)
	{
		Oid			seq = lfirst_oid(lc);
		int64		increment,
					start,
					position;
		char	   *nsp,
				   *rel;
		MemoryContext old;

		if (get_rel_relkind(seq) != RELKIND_SEQUENCE || !sequence_params(seq, &increment, &start))
			continue;			/* dropped since */
		nsp = get_namespace_name(get_rel_namespace(seq));
		rel = get_rel_name(seq);
		if (nsp == NULL || rel == NULL)
			continue;
		position = sequence_position(seq, increment);
		(void) chorus_sequence_restart(seq, position);
		old = MemoryContextSwitchTo(cap->cxt);
		/* extension code only (the name quoted as a literal): the apply runs it as the superuser */
		chorus_put_schema_item(&cap->rows, 0, NULL, NULL, superuser,
							   psprintf("SELECT chorus.restart_sequence(%s::pg_catalog.regclass, " INT64_FORMAT ")",
										quote_literal_cstr(quote_qualified_identifier(nsp, rel)), position));
		MemoryContextSwitchTo(old);
		cap->nrows++;
		cap->has_schema = true;
	}
	list_free(cap->sequences);
	cap->sequences = NIL;
}
