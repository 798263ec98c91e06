/*
 * chorus_ddl.c
 *		Replicated schema changes (docs/DDL.md), in one of two ways.
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
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/index.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "commands/tablespace.h"
#include "commands/trigger.h"
#include "parser/parse_node.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/formatting.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/ruleutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus.h"

bool		chorus_replicate_ddl = true;
bool		chorus_replaying = false;
bool		chorus_replicate_roles = true;
int			chorus_node_number = 0;
int			chorus_max_nodes = 16;

/* Depth of replicated schema changes running in this backend (nested DDL is theirs). */
static int	chorus_ddl_depth = 0;

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

typedef enum ChorusDdlKind
{
	CHORUS_DDL_LOCAL,			/* runs on this node only */
	CHORUS_DDL_REPLICATE,		/* ordered and run on every node */
	CHORUS_DDL_REFUSE			/* cannot be replicated safely: error */
} ChorusDdlKind;

/* The tables a statement names, as exclusive certification keys. */
typedef struct ChorusDdlKeys
{
	StringInfoData buf;
	uint32		n;
	bool		any_temp;
	bool		any_persistent;
	bool		concurrent;		/* CREATE/DROP INDEX CONCURRENTLY: runs beside the total order */
} ChorusDdlKeys;

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

static void chorus_ddl_concurrent(ChorusDdlRun *run);

void
chorus_define_ddl_gucs(void)
{
	DefineCustomBoolVariable("chorus.replicate_ddl",
							 "Replicate this session's schema changes to every node, in total order.",
							 "Off: schema changes stay on this node (for changes made on every node by hand).",
							 &chorus_replicate_ddl, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.replicate_roles",
							 "Replicate CREATE/ALTER/DROP ROLE and role membership changes.",
							 NULL, &chorus_replicate_roles, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.node_number",
							"This node's number (1..chorus.max_nodes): its residue class for sequences.",
							"0: sequences are left as created (they may collide between nodes).",
							&chorus_node_number, 0, 0, 1024, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.max_nodes",
							"Sequences step by this many values so each node draws its own residue class.",
							"Must be the same on every node; see docs/DDL.md to change it.",
							&chorus_max_nodes, 16, 1, 1024, PGC_SIGHUP, 0, NULL, NULL, NULL);
}

static void
chorus_ddl_key(ChorusDdlKeys *k, const char *nsp, const char *rel)
{
	chorus_put_u8(&k->buf, CHORUS_KEY_EXCLUSIVE);
	chorus_put_u16(&k->buf, 2);
	chorus_put_blob(&k->buf, nsp, strlen(nsp));
	chorus_put_blob(&k->buf, rel, strlen(rel));
	k->n++;
}

/*
 * chorus_ddl_relation
 *		Key the table rv names (an index stands for its table). creating: the
 *		relation does not exist yet; key the name it will have.
 */
static void
chorus_ddl_relation(ChorusDdlKeys *k, RangeVar *rv, bool creating)
{
	Oid			relid;

	if (rv == NULL)
		return;
	if (creating)
	{
		Oid			nspid;

		if (rv->relpersistence == RELPERSISTENCE_TEMP)
		{
			k->any_temp = true;
			return;
		}
		nspid = RangeVarGetCreationNamespace(rv);
		if (isAnyTempNamespace(nspid))
		{
			k->any_temp = true;
			return;
		}
		k->any_persistent = true;
		chorus_ddl_key(k, get_namespace_name(nspid), rv->relname);
		return;
	}
	relid = RangeVarGetRelid(rv, NoLock, true);
	if (!OidIsValid(relid))
		return;
	if (get_rel_relkind(relid) == RELKIND_INDEX || get_rel_relkind(relid) == RELKIND_PARTITIONED_INDEX)
		relid = IndexGetRelation(relid, true);
	if (!OidIsValid(relid))
		return;
	if (get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
	{
		k->any_temp = true;
		return;
	}
	k->any_persistent = true;
	chorus_ddl_key(k, get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

static bool
chorus_is_relation_object(ObjectType t)
{
	return t == OBJECT_TABLE || t == OBJECT_VIEW || t == OBJECT_MATVIEW || t == OBJECT_SEQUENCE ||
		t == OBJECT_FOREIGN_TABLE || t == OBJECT_INDEX;
}

/* Objects that belong to a table (a rule, a trigger, a policy, a constraint): named [..., table, name]. */
static bool
chorus_is_table_part(ObjectType t)
{
	return t == OBJECT_RULE || t == OBJECT_TRIGGER || t == OBJECT_POLICY || t == OBJECT_TABCONSTRAINT;
}

/* The table of such an object, from its name list. */
static RangeVar *
chorus_table_of_part(List *names)
{
	return makeRangeVarFromNameList(list_truncate(list_copy(names), list_length(names) - 1));
}

/* Objects that exist on one node only: statements about them stay local. */
static bool
chorus_is_node_object(ObjectType t)
{
	return t == OBJECT_DATABASE || t == OBJECT_TABLESPACE || t == OBJECT_PUBLICATION ||
		t == OBJECT_PUBLICATION_NAMESPACE || t == OBJECT_PUBLICATION_REL || t == OBJECT_SUBSCRIPTION ||
		t == OBJECT_LARGEOBJECT;	/* large objects are not replicated */
}

/*
 * chorus_constant_datum / chorus_constant_bound
 *		Whether a partition bound, as written, is made of constants (a literal,
 *		a cast literal, MINVALUE or MAXVALUE). A bound such as current_timestamp
 *		is evaluated when the statement runs: replayed later on another node it
 *		would give that node another bound, and rows would go to other
 *		partitions there.
 */
static bool
chorus_constant_datum(Node *n)
{
	while (n != NULL && IsA(n, TypeCast))
		n = ((TypeCast *) n)->arg;
	return n == NULL || IsA(n, A_Const) || IsA(n, ColumnRef);
}

static bool
chorus_constant_bound(PartitionBoundSpec *b)
{
	ListCell   *lc;

	if (b == NULL)
		return true;
	foreach(lc, b->listdatums)
		if (!chorus_constant_datum(lfirst(lc)))
			return false;
	foreach(lc, b->lowerdatums)
		if (!chorus_constant_datum(lfirst(lc)))
			return false;
	foreach(lc, b->upperdatums)
		if (!chorus_constant_datum(lfirst(lc)))
			return false;
	return true;
}

/* A schema-qualified name list that names the session's temporary schema. */
static bool
chorus_names_temp_schema(List *names)
{
	char	   *schema;
	char	   *obj;

	DeconstructQualifiedName(names, &schema, &obj);
	return schema != NULL && (strcmp(schema, "pg_temp") == 0 ||
							  isAnyTempNamespace(get_namespace_oid(schema, true)));
}

/* The CREATE TABLE AS statement inside an EXPLAIN ANALYZE, which creates the table. */
static CreateTableAsStmt *
chorus_explain_ctas(ExplainStmt *es)
{
	Query	   *q = (Query *) es->query;
	ListCell   *lc;
	bool		analyze = false;

	if (q == NULL || !IsA(q, Query) || q->commandType != CMD_UTILITY ||
		!IsA(q->utilityStmt, CreateTableAsStmt))
		return NULL;
	foreach(lc, es->options)
	{
		DefElem    *opt = lfirst_node(DefElem, lc);

		if (strcmp(opt->defname, "analyze") == 0)
			analyze = defGetBoolean(opt);
	}
	return analyze ? (CreateTableAsStmt *) q->utilityStmt : NULL;
}

/* The table a CREATE TABLE AS family statement makes, or NULL. */
static CreateTableAsStmt *
chorus_ctas_of(Node *stmt)
{
	if (IsA(stmt, CreateTableAsStmt))
		return (CreateTableAsStmt *) stmt;
	if (IsA(stmt, ExplainStmt))
		return chorus_explain_ctas((ExplainStmt *) stmt);
	return NULL;
}

/*
 * chorus_ddl_classify
 *		Which statements replicate (docs/DDL.md; seed section 10.2 and appendix A),
 *		and the tables they touch.
 */
static ChorusDdlKind
chorus_ddl_classify(Node *stmt, ChorusDdlKeys *k, const char **why)
{
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
			/* not schema changes, or handled as row changes (TRUNCATE, COPY) */
		case T_TransactionStmt:
		case T_VariableSetStmt:
		case T_VariableShowStmt:
		case T_DiscardStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeallocateStmt:
		case T_DeclareCursorStmt:
		case T_ClosePortalStmt:
		case T_FetchStmt:
		case T_CopyStmt:
		case T_LockStmt:
		case T_ConstraintsSetStmt:
		case T_CallStmt:
		case T_DoStmt:
		case T_TruncateStmt:
		case T_NotifyStmt:
		case T_ListenStmt:
		case T_UnlistenStmt:
		case T_CheckPointStmt:
		case T_LoadStmt:
			return CHORUS_DDL_LOCAL;
		case T_ExplainStmt:
			{
				/* EXPLAIN ANALYZE CREATE TABLE AS creates the table: it replicates as one */
				CreateTableAsStmt *ctas = chorus_explain_ctas((ExplainStmt *) stmt);

				if (ctas == NULL)
					return CHORUS_DDL_LOCAL;
				return chorus_ddl_classify((Node *) ctas, k, why);
			}
		case T_ReindexStmt:
			{
				ReindexStmt *rs = (ReindexStmt *) stmt;
				bool		concurrently = false;
				bool		tablespace = false;
				Oid			nsp;

				foreach(lc, rs->params)
				{
					DefElem    *opt = lfirst_node(DefElem, lc);

					if (strcmp(opt->defname, "concurrently") == 0)
						concurrently = defGetBoolean(opt);
					else if (strcmp(opt->defname, "tablespace") == 0)
						tablespace = true;
				}
				/* moving indexes to a tablespace is this node's storage, as tablespaces are */
				if (tablespace)
					return CHORUS_DDL_LOCAL;
				/* a temporary schema is one session's */
				if (rs->kind == REINDEX_OBJECT_SCHEMA &&
					OidIsValid(nsp = get_namespace_oid(rs->name, true)) && isAnyTempNamespace(nsp))
					return CHORUS_DDL_LOCAL;

				/*
				 * REINDEX CONCURRENTLY of an index, a table or a schema rebuilds
				 * it on every node, beside the total order (how a live cluster's
				 * bloated indexes are rebuilt); a plain REINDEX repairs one node's
				 * storage, and a database's or the system catalogs' are that
				 * node's own: they run where they are issued.
				 */
				if (!concurrently || rs->kind == REINDEX_OBJECT_DATABASE || rs->kind == REINDEX_OBJECT_SYSTEM)
					return CHORUS_DDL_LOCAL;
				k->concurrent = true;
				chorus_ddl_relation(k, rs->relation, false);
				break;
			}
			/* never replicated: maintenance, storage, databases, the system (appendix A) */
		case T_VacuumStmt:		/* VACUUM and ANALYZE */
		case T_ClusterStmt:
		case T_CreateTableSpaceStmt:
		case T_DropTableSpaceStmt:
		case T_AlterTableSpaceOptionsStmt:
		case T_AlterTableMoveAllStmt:
		case T_CreatedbStmt:
		case T_DropdbStmt:
		case T_AlterDatabaseStmt:
		case T_AlterDatabaseSetStmt:
		case T_AlterDatabaseRefreshCollStmt:
		case T_AlterSystemStmt:
		case T_CreateSubscriptionStmt:
		case T_AlterSubscriptionStmt:
		case T_DropSubscriptionStmt:
		case T_CreatePublicationStmt:
		case T_AlterPublicationStmt:
			return CHORUS_DDL_LOCAL;
		case T_CreateRoleStmt:
		case T_AlterRoleStmt:
		case T_AlterRoleSetStmt:
		case T_DropRoleStmt:
		case T_GrantRoleStmt:
			return chorus_replicate_roles ? CHORUS_DDL_REPLICATE : CHORUS_DDL_LOCAL;
		case T_CreateExtensionStmt:
			return strcmp(((CreateExtensionStmt *) stmt)->extname, "chorus") == 0
				? CHORUS_DDL_LOCAL : CHORUS_DDL_REPLICATE;
		case T_AlterExtensionStmt:
			return strcmp(((AlterExtensionStmt *) stmt)->extname, "chorus") == 0
				? CHORUS_DDL_LOCAL : CHORUS_DDL_REPLICATE;
		case T_CreateStmt:
			{
				CreateStmt *cs = (CreateStmt *) stmt;

				if (!chorus_constant_bound(cs->partbound))
				{
					*why = "a partition bound that is not a constant (it would be evaluated again, to another value, on each node)";
					return CHORUS_DDL_REFUSE;
				}
				chorus_ddl_relation(k, cs->relation, true);
				foreach(lc, cs->inhRelations)
					chorus_ddl_relation(k, lfirst_node(RangeVar, lc), false);
				foreach(lc, cs->tableElts)
					if (IsA(lfirst(lc), TableLikeClause))	/* LIKE another table: it must exist elsewhere */
						chorus_ddl_relation(k, ((TableLikeClause *) lfirst(lc))->relation, false);
				break;
			}
		case T_CreateTableAsStmt:
			chorus_ddl_relation(k, ((CreateTableAsStmt *) stmt)->into->rel, true);
			break;
		case T_ViewStmt:
			chorus_ddl_relation(k, ((ViewStmt *) stmt)->view, true);
			break;
		case T_CreateSeqStmt:
			chorus_ddl_relation(k, ((CreateSeqStmt *) stmt)->sequence, true);
			break;
		case T_AlterSeqStmt:
			chorus_ddl_relation(k, ((AlterSeqStmt *) stmt)->sequence, false);
			break;
		case T_AlterTableStmt:
			foreach(lc, ((AlterTableStmt *) stmt)->cmds)
			{
				AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

				if (cmd->subtype == AT_AttachPartition &&
					!chorus_constant_bound(((PartitionCmd *) cmd->def)->bound))
				{
					*why = "a partition bound that is not a constant (it would be evaluated again, to another value, on each node)";
					return CHORUS_DDL_REFUSE;
				}
				/* DETACH PARTITION ... CONCURRENTLY commits in steps, like CREATE INDEX CONCURRENTLY */
				if (cmd->subtype == AT_DetachPartition && ((PartitionCmd *) cmd->def)->concurrent)
					k->concurrent = true;
			}
			chorus_ddl_relation(k, ((AlterTableStmt *) stmt)->relation, false);
			break;
		case T_RefreshMatViewStmt:
			/* every node refreshes at the same point of the order, from the same rows */
			chorus_ddl_relation(k, ((RefreshMatViewStmt *) stmt)->relation, false);
			break;
		case T_IndexStmt:
			k->concurrent = ((IndexStmt *) stmt)->concurrent;
			chorus_ddl_relation(k, ((IndexStmt *) stmt)->relation, false);
			break;
		case T_DropStmt:
			{
				DropStmt   *ds = (DropStmt *) stmt;

				k->concurrent = ds->concurrent;
				if (chorus_is_node_object(ds->removeType))
					return CHORUS_DDL_LOCAL;
				if (ds->removeType == OBJECT_EXTENSION)
				{
					foreach(lc, ds->objects)
						if (strcmp(strVal(lfirst(lc)), "chorus") == 0)
							return CHORUS_DDL_LOCAL;
				}
				if (chorus_is_relation_object(ds->removeType))
					foreach(lc, ds->objects)
						chorus_ddl_relation(k, makeRangeVarFromNameList(lfirst_node(List, lc)), false);
				else if (chorus_is_table_part(ds->removeType))
					foreach(lc, ds->objects)
						chorus_ddl_relation(k, chorus_table_of_part(lfirst_node(List, lc)), false);
				break;
			}
		case T_RenameStmt:
			if (chorus_is_node_object(((RenameStmt *) stmt)->renameType))
				return CHORUS_DDL_LOCAL;
			chorus_ddl_relation(k, ((RenameStmt *) stmt)->relation, false);
			break;
		case T_AlterOwnerStmt:
			if (chorus_is_node_object(((AlterOwnerStmt *) stmt)->objectType))
				return CHORUS_DDL_LOCAL;
			chorus_ddl_relation(k, ((AlterOwnerStmt *) stmt)->relation, false);
			break;
		case T_CommentStmt:
			{
				CommentStmt *cs = (CommentStmt *) stmt;

				if (chorus_is_node_object(cs->objtype))
					return CHORUS_DDL_LOCAL;
				if (chorus_is_relation_object(cs->objtype))
					chorus_ddl_relation(k, makeRangeVarFromNameList(castNode(List, cs->object)), false);
				else if (cs->objtype == OBJECT_COLUMN || chorus_is_table_part(cs->objtype))
					chorus_ddl_relation(k, chorus_table_of_part(castNode(List, cs->object)), false);
				break;
			}
		case T_SecLabelStmt:
			if (chorus_is_node_object(((SecLabelStmt *) stmt)->objtype))
				return CHORUS_DDL_LOCAL;
			break;
		case T_AlterObjectSchemaStmt:
			chorus_ddl_relation(k, ((AlterObjectSchemaStmt *) stmt)->relation, false);
			break;
		case T_CreateTrigStmt:
			chorus_ddl_relation(k, ((CreateTrigStmt *) stmt)->relation, false);
			break;
		case T_RuleStmt:
			chorus_ddl_relation(k, ((RuleStmt *) stmt)->relation, false);
			break;
		case T_CreatePolicyStmt:
			chorus_ddl_relation(k, ((CreatePolicyStmt *) stmt)->table, false);
			break;
		case T_AlterPolicyStmt:
			chorus_ddl_relation(k, ((AlterPolicyStmt *) stmt)->table, false);
			break;
		case T_CreateFunctionStmt:
			/* a function in the session's temporary schema lives and dies with the session */
			if (chorus_names_temp_schema(((CreateFunctionStmt *) stmt)->funcname))
				return CHORUS_DDL_LOCAL;
			break;
		case T_GrantStmt:
			{
				GrantStmt  *gs = (GrantStmt *) stmt;

				if (chorus_is_node_object(gs->objtype))
					return CHORUS_DDL_LOCAL;
				if (gs->targtype == ACL_TARGET_OBJECT && gs->objtype == OBJECT_TABLE)
					foreach(lc, gs->objects)
						chorus_ddl_relation(k, lfirst_node(RangeVar, lc), false);
				break;
			}
		default:
			break;
	}
	/* a statement about temporary objects only is local to this session */
	if (k->any_temp && !k->any_persistent)
		return CHORUS_DDL_LOCAL;
	if (k->any_temp)
	{
		*why = "this statement names both temporary and permanent objects";
		return CHORUS_DDL_REFUSE;
	}
	return CHORUS_DDL_REPLICATE;
}

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
chorus_ddl_utility(PlannedStmt *pstmt, const char *queryString, ProcessUtilityContext context,
				   ParamListInfo params)
{
	ChorusDdlRun *run;
	ChorusDdlKind kind;
	const char *why = NULL;
	StringInfoData ws;
	CreateTableAsStmt *ctas;
	MemoryContext old;

	if (!chorus_capture_enabled || !chorus_replicate_ddl || chorus_xact.applying ||
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
	run->toi = context == PROCESS_UTILITY_TOPLEVEL && !IsTransactionBlock() && !chorus_xact.ddl &&
		!chorus_xact.has_schema && chorus_xact.nrows == 0;
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
		chorus_ddl_concurrent(run);
		return false;
	}
	if (run->toi)
	{
		initStringInfo(&ws);
		chorus_ddl_order_writeset(&ws, run);
		chorus_ddl_order(&ws);
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
chorus_ddl_item(ChorusDdlRun *run, const char *statement)
{
	chorus_put_schema_item(&chorus_xact.rows, CHORUS_NSETTINGS, chorus_ddl_settings, run->values,
						   run->role, statement);
	chorus_xact.nrows++;
	chorus_xact.has_schema = true;
}

/*
 * chorus_ddl_schema_key
 *		The cluster-wide key every schema change holds, exclusive: two
 *		concurrent ones never both commit.
 */
static void
chorus_ddl_schema_key(void)
{
	MemoryContext old;

	if (chorus_xact.schema_key_done)
		return;
	old = MemoryContextSwitchTo(chorus_xact.cxt);
	chorus_put_u8(&chorus_xact.keys, CHORUS_KEY_EXCLUSIVE);
	chorus_put_u16(&chorus_xact.keys, 2);
	chorus_put_blob(&chorus_xact.keys, CHORUS_SCHEMA_KEY_NSP, strlen(CHORUS_SCHEMA_KEY_NSP));
	chorus_put_blob(&chorus_xact.keys, CHORUS_SCHEMA_KEY_REL, strlen(CHORUS_SCHEMA_KEY_REL));
	chorus_xact.nkeys++;
	chorus_xact.schema_key_done = true;
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
chorus_ddl_concurrent(ChorusDdlRun *run)
{
	chorus_xact_begin_capture();
	chorus_note_snapshot();
	chorus_ddl_schema_key();
	chorus_ddl_item(run, run->statement);
	chorus_xact.concurrent = true;
}

/*
 * chorus_ddl_create_text
 *		A CREATE TABLE statement for relid as it stands: the structure a CREATE
 *		TABLE AS made (columns with their types and collations, persistence,
 *		access method, storage options, tablespace), without its query, which
 *		need not give the same rows elsewhere.
 */
static char *
chorus_ddl_create_text(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	StringInfoData s;
	HeapTuple	tup;
	bool		isnull;
	Datum		opts;
	int			i,
				n = 0;

	initStringInfo(&s);
	appendStringInfo(&s, "CREATE %sTABLE %s (",
					 rel->rd_rel->relpersistence == RELPERSISTENCE_UNLOGGED ? "UNLOGGED " : "",
					 quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
												RelationGetRelationName(rel)));
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		appendStringInfo(&s, "%s%s %s", n++ ? ", " : "", quote_identifier(NameStr(att->attname)),
						 format_type_extended(att->atttypid, att->atttypmod,
											  FORMAT_TYPE_TYPEMOD_GIVEN | FORMAT_TYPE_FORCE_QUALIFY));
		if (OidIsValid(att->attcollation) && att->attcollation != get_typcollation(att->atttypid))
			appendStringInfo(&s, " COLLATE %s", generate_collation_name(att->attcollation));
	}
	appendStringInfoChar(&s, ')');
	if (OidIsValid(rel->rd_rel->relam))
		appendStringInfo(&s, " USING %s", quote_identifier(get_am_name(rel->rd_rel->relam)));
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(RelationGetRelid(rel)));
	if (HeapTupleIsValid(tup))
	{
		opts = SysCacheGetAttr(RELOID, tup, Anum_pg_class_reloptions, &isnull);
		if (!isnull)
		{
			Datum	   *items;
			int			nitems;

			deconstruct_array(DatumGetArrayTypeP(opts), TEXTOID, -1, false, TYPALIGN_INT,
							  &items, NULL, &nitems);
			appendStringInfoString(&s, " WITH (");
			for (i = 0; i < nitems; i++)
			{
				char	   *opt = TextDatumGetCString(items[i]);
				char	   *eq = strchr(opt, '=');

				if (eq == NULL)
					continue;
				*eq = '\0';
				appendStringInfo(&s, "%s%s = %s", i ? ", " : "", quote_identifier(opt),
								 quote_literal_cstr(eq + 1));
			}
			appendStringInfoChar(&s, ')');
		}
		ReleaseSysCache(tup);
	}
	if (OidIsValid(rel->rd_rel->reltablespace))
		appendStringInfo(&s, " TABLESPACE %s",
						 quote_identifier(get_tablespace_name(rel->rd_rel->reltablespace)));
	return s.data;
}

/*
 * chorus_ddl_ship_rows
 *		Add every row of rel, as this transaction sees it now, to the writeset:
 *		as inserts after a TRUNCATE (replace), or as updates by the table's
 *		identity (the other nodes overwrite what their own replay computed).
 *		Without keys: the statement's exclusive table key covers them.
 */
static void
chorus_ddl_ship_rows(Relation rel, bool replace)
{
	MemoryContext rowcxt = AllocSetContextCreate(CurrentMemoryContext, "chorus ddl rows", ALLOCSET_DEFAULT_SIZES);
	TableScanDesc scan;
	HeapTuple	tuple;
	ChorusTable *t;

	CommandCounterIncrement();
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	t = chorus_capture_table(rel);
	if (t->full_identity)
		replace = true;			/* an old image would not match a changed row elsewhere */
	if (replace)
	{
		chorus_put_u8(&chorus_xact.rows, CHORUS_OP_TRUNCATE);
		chorus_put_u16(&chorus_xact.rows, (uint16) t->index);
		chorus_put_u8(&chorus_xact.rows, 0);
		chorus_xact.nrows++;
	}
	scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(rowcxt);

		if (replace)
			chorus_capture_row(rel, CHORUS_OP_INSERT, NULL, tuple, false);
		else
			chorus_capture_row(rel, CHORUS_OP_UPDATE, tuple, tuple, false);
		MemoryContextSwitchTo(old);
		MemoryContextReset(rowcxt);
	}
	table_endscan(scan);
	PopActiveSnapshot();
	MemoryContextDelete(rowcxt);
}

/*
 * chorus_expr_is_fixed
 *		Whether a (raw) expression gives the same value on every node: literals
 *		(not the time words 'now', 'today', ...), columns, casts and operators
 *		over them. Function calls, CURRENT_TIMESTAMP and subqueries are taken
 *		not to (a stable or volatile function's value depends on when and where
 *		it runs; immutable ones are rare enough in defaults to pay the rows).
 */
static bool
chorus_expr_is_fixed(Node *n)
{
	if (n == NULL)
		return true;
	switch (nodeTag(n))
	{
		case T_A_Const:
			{
				A_Const    *c = (A_Const *) n;

				if (!c->isnull && IsA(&c->val, String))
				{
					char	   *v = asc_tolower(strVal(&c->val), strlen(strVal(&c->val)));

					return strstr(v, "now") == NULL && strstr(v, "today") == NULL &&
						strstr(v, "tomorrow") == NULL && strstr(v, "yesterday") == NULL &&
						strstr(v, "allballs") == NULL;
				}
				return true;
			}
		case T_TypeCast:
			return chorus_expr_is_fixed(((TypeCast *) n)->arg);
		case T_ColumnRef:
			return true;
		case T_A_Expr:
			return chorus_expr_is_fixed(((A_Expr *) n)->lexpr) && chorus_expr_is_fixed(((A_Expr *) n)->rexpr);
		case T_BoolExpr:
			{
				ListCell   *lc;

				foreach(lc, ((BoolExpr *) n)->args)
					if (!chorus_expr_is_fixed(lfirst(lc)))
						return false;
				return true;
			}
		case T_NullTest:
			return chorus_expr_is_fixed((Node *) ((NullTest *) n)->arg);
		case T_CollateClause:
			return chorus_expr_is_fixed(((CollateClause *) n)->arg);
		default:
			return false;
	}
}

static bool
chorus_serial_type(TypeName *tn)
{
	char	   *name;

	if (tn == NULL || list_length(tn->names) != 1)
		return false;
	name = strVal(linitial(tn->names));
	return strcmp(name, "serial") == 0 || strcmp(name, "bigserial") == 0 ||
		strcmp(name, "smallserial") == 0 || strcmp(name, "serial2") == 0 ||
		strcmp(name, "serial4") == 0 || strcmp(name, "serial8") == 0;
}

/*
 * chorus_column_is_fixed
 *		Whether an added column gets the same value in every row on every node:
 *		no default from a function or sequence, no identity, not serial.
 */
static bool
chorus_column_is_fixed(ColumnDef *def)
{
	ListCell   *lc;

	if (chorus_serial_type(def->typeName) || def->identity || !chorus_expr_is_fixed(def->raw_default))
		return false;
	foreach(lc, def->constraints)
	{
		Constraint *c = lfirst_node(Constraint, lc);

		if (c->contype == CONSTR_IDENTITY)
			return false;
		if (c->contype == CONSTR_DEFAULT && !chorus_expr_is_fixed(c->raw_expr))
			return false;
	}
	return true;
}

/*
 * chorus_alter_rows
 *		What rows an ALTER TABLE must ship: 0 none; 1 every row, as updates (a
 *		column whose values its replay would compute differently: a volatile
 *		default, a sequence, a USING expression with functions); 2 every row,
 *		replacing the table's (SET LOGGED: an unlogged table's rows are each
 *		node's own until then).
 */
static int
chorus_alter_rows(AlterTableStmt *ats)
{
	ListCell   *lc;
	int			ship = 0;

	foreach(lc, ats->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

		if (cmd->subtype == AT_SetLogged)
			ship = 2;
		else if (cmd->subtype == AT_AddColumn && !chorus_column_is_fixed(castNode(ColumnDef, cmd->def)))
			ship = Max(ship, 1);
		else if (cmd->subtype == AT_AlterColumnType &&
				 !chorus_expr_is_fixed(castNode(ColumnDef, cmd->def)->raw_default))
			ship = Max(ship, 1);
	}
	return ship;
}

/*
 * chorus_attach_table
 *		Capture rows of a new table from now on (the event trigger does this for
 *		CREATE TABLE and CREATE TABLE AS; EXPLAIN ANALYZE CREATE TABLE AS runs
 *		no event trigger). As the extension's owner: chorus.attach() is not for
 *		every role.
 */
static void
chorus_attach_table(Oid relid)
{
	Oid			save_uid;
	int			save_sec;
	char	   *q = psprintf("SELECT chorus.attach(%u::regclass) WHERE chorus.replicable(%u::regclass)",
							 relid, relid);

	GetUserIdAndSecContext(&save_uid, &save_sec);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "chorus: SPI_connect failed");
	if (SPI_execute(q, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "chorus: attaching the capture triggers failed");
	SPI_finish();
	SetUserIdAndSecContext(save_uid, save_sec);
}

/* The schema of type typid (InvalidOid if there is none). */
static Oid
chorus_type_namespace(Oid typid)
{
	HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	Oid			nsp = InvalidOid;

	if (HeapTupleIsValid(tup))
	{
		nsp = ((Form_pg_type) GETSTRUCT(tup))->typnamespace;
		ReleaseSysCache(tup);
	}
	return nsp;
}

/*
 * chorus_temp_dependency
 *		Whether the statement made an object depend on a temporary object (a
 *		function whose SQL body reads a temporary table): that object would
 *		not replay on the other nodes, and would vanish here with the session.
 *		Looks at the dependencies the statement recorded (this transaction,
 *		command since).
 */
static bool
chorus_temp_dependency(CommandId since)
{
	Relation	dep = table_open(DependRelationId, AccessShareLock);
	SysScanDesc scan = systable_beginscan(dep, InvalidOid, false, NULL, 0, NULL);
	HeapTuple	tup;
	bool		found = false;

	while (!found && (tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_depend d = (Form_pg_depend) GETSTRUCT(tup);
		Oid			nsp = InvalidOid;

		if (!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetRawXmin(tup->t_data)) ||
			HeapTupleHeaderGetRawCommandId(tup->t_data) < since)
			continue;
		if (d->refclassid == RelationRelationId)
			nsp = get_rel_namespace(d->refobjid);
		else if (d->refclassid == TypeRelationId)
			nsp = chorus_type_namespace(d->refobjid);
		else if (d->refclassid == ProcedureRelationId)
			nsp = get_func_namespace(d->refobjid);
		found = OidIsValid(nsp) && isAnyTempNamespace(nsp);
	}
	systable_endscan(scan);
	table_close(dep, AccessShareLock);
	return found;
}

/*
 * chorus_ddl_record
 *		The replicated statement ran here: add its content to the transaction's
 *		writeset (the schema change item in its replay form, and rows where the
 *		replay would not reproduce them), with its table keys.
 */
void
chorus_ddl_record(PlannedStmt *pstmt)
{
	ChorusDdlRun *run = chorus_ddl_run;
	Node	   *stmt = pstmt->utilityStmt;
	CreateTableAsStmt *ctas = chorus_ctas_of(stmt);
	MemoryContext old;

	if (run == NULL)
		return;
	chorus_ddl_run = NULL;
	chorus_xact_begin_capture();
	if (!run->toi)
		chorus_note_snapshot();	/* certified at commit, against what its snapshot saw */
	old = MemoryContextSwitchTo(chorus_xact.cxt);
	appendBinaryStringInfo(&chorus_xact.keys, run->keys.buf.data, run->keys.buf.len);
	chorus_xact.nkeys += run->keys.n;
	MemoryContextSwitchTo(old);
	chorus_ddl_schema_key();

	if (IsA(stmt, ViewStmt))
	{
		/* a view over a temporary table is made temporary: it stays in this session */
		Oid			relid;

		CommandCounterIncrement();
		relid = RangeVarGetRelid(((ViewStmt *) stmt)->view, NoLock, true);
		if (OidIsValid(relid) && get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
			return;
	}
	if (chorus_temp_dependency(run->cid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: this schema change makes a permanent object depend on a temporary one"),
				 errdetail("The other nodes do not have this session's temporary objects."),
				 errhint("Create the object in pg_temp, or SET chorus.replicate_ddl = off.")));

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
		chorus_ddl_item(run, chorus_ddl_create_text(rel));
		chorus_xact.table_epoch++;
		if (rel->rd_rel->relpersistence == RELPERSISTENCE_PERMANENT)
			chorus_ddl_ship_rows(rel, false);
		table_close(rel, AccessShareLock);
		return;
	}
	chorus_ddl_item(run, run->statement);
	chorus_xact.table_epoch++;
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
					chorus_ddl_ship_rows(rel, ship == 2);
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
	chorus_ddl_depth = 0;
	chorus_ddl_run = NULL;
}

/*
 * chorus_missing_tablespace
 *		A tablespace a replayed statement names that this node lacks: its
 *		objects go to the default tablespace here (tablespaces are per node).
 */
static char *
chorus_missing_tablespace(char *name, const char *what)
{
	if (name == NULL || OidIsValid(get_tablespace_oid(name, true)))
		return name;
	ereport(WARNING,
			(errmsg("chorus: tablespace \"%s\" does not exist on this node; %s goes to the default tablespace",
					name, what)));
	return NULL;
}

static void
chorus_fix_constraints(List *elts)
{
	ListCell   *lc;

	foreach(lc, elts)
	{
		Node	   *n = lfirst(lc);

		if (IsA(n, Constraint))
			((Constraint *) n)->indexspace = chorus_missing_tablespace(((Constraint *) n)->indexspace, "the index");
		else if (IsA(n, ColumnDef))
			chorus_fix_constraints(((ColumnDef *) n)->constraints);
	}
}

/*
 * chorus_ddl_replay_fixups
 *		A replayed statement (in an apply session) that names a tablespace this
 *		node lacks uses the default one instead; ALTER ... SET TABLESPACE to it
 *		is skipped. Returns the statement to run (a copy if changed), or NULL
 *		when nothing is left to run.
 */
PlannedStmt *
chorus_ddl_replay_fixups(PlannedStmt *pstmt)
{
	Node	   *stmt = pstmt->utilityStmt;
	PlannedStmt *copy;
	ListCell   *lc;

	switch (nodeTag(stmt))
	{
		case T_CreateStmt:
		case T_IndexStmt:
		case T_CreateTableAsStmt:
		case T_AlterTableStmt:
			break;
		default:
			return pstmt;
	}
	copy = copyObject(pstmt);
	stmt = copy->utilityStmt;
	switch (nodeTag(stmt))
	{
		case T_CreateStmt:
			{
				CreateStmt *cs = (CreateStmt *) stmt;

				cs->tablespacename = chorus_missing_tablespace(cs->tablespacename, "the table");
				chorus_fix_constraints(cs->tableElts);
				chorus_fix_constraints(cs->constraints);
				break;
			}
		case T_IndexStmt:
			((IndexStmt *) stmt)->tableSpace = chorus_missing_tablespace(((IndexStmt *) stmt)->tableSpace, "the index");
			break;
		case T_CreateTableAsStmt:
			{
				IntoClause *into = ((CreateTableAsStmt *) stmt)->into;

				into->tableSpaceName = chorus_missing_tablespace(into->tableSpaceName, "the table");
				break;
			}
		case T_AlterTableStmt:
			{
				AlterTableStmt *ats = (AlterTableStmt *) stmt;
				List	   *keep = NIL;

				foreach(lc, ats->cmds)
				{
					AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

					if (cmd->subtype == AT_SetTableSpace &&
						chorus_missing_tablespace(cmd->name, "the relation") == NULL)
						continue;
					if (cmd->subtype == AT_AddConstraint && cmd->def && IsA(cmd->def, Constraint))
						chorus_fix_constraints(list_make1(cmd->def));
					if (cmd->subtype == AT_AddIndex && cmd->def && IsA(cmd->def, IndexStmt))
						((IndexStmt *) cmd->def)->tableSpace =
							chorus_missing_tablespace(((IndexStmt *) cmd->def)->tableSpace, "the index");
					keep = lappend(keep, cmd);
				}
				if (keep == NIL)
					return NULL;
				ats->cmds = keep;
				break;
			}
		default:
			break;
	}
	return copy;
}

PG_FUNCTION_INFO_V1(chorus_attach);
PG_FUNCTION_INFO_V1(chorus_alter_sequence);

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
	Oid			relid = PG_GETARG_OID(0);
	Relation	rel = table_open(relid, ShareRowExclusiveLock);

	if (!OidIsValid(get_trigger_oid(relid, "chorus_capture", true)))
		chorus_create_capture_trigger(relid, false);
	if (!OidIsValid(get_trigger_oid(relid, "chorus_capture_truncate", true)))
		chorus_create_capture_trigger(relid, true);
	table_close(rel, NoLock);
	PG_RETURN_VOID();
}

/*
 * chorus.alter_sequence(seq regclass, increment bigint, start bigint, restart bigint)
 *		ALTER SEQUENCE seq INCREMENT BY increment START WITH start RESTART WITH
 *		restart, made here rather than as a statement (no event trigger sees it).
 */
Datum
chorus_alter_sequence(PG_FUNCTION_ARGS)
{
	Oid			seq = PG_GETARG_OID(0);
	AlterSeqStmt *stmt = makeNode(AlterSeqStmt);

	stmt->sequence = makeRangeVar(get_namespace_name(get_rel_namespace(seq)), get_rel_name(seq), -1);
	stmt->options = list_make3(makeDefElem("increment", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(1))), -1),
							   makeDefElem("start", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(2))), -1),
							   makeDefElem("restart", (Node *) makeFloat(psprintf(INT64_FORMAT, PG_GETARG_INT64(3))), -1));
	(void) AlterSequence(make_parsestate(NULL), stmt);
	CommandCounterIncrement();
	PG_RETURN_VOID();
}
