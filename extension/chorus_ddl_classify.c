/*
 * chorus_ddl_classify.c
 *		Which utility statements are replicated schema changes, which stay on
 *		this node and which are refused (docs/DDL.md; seed section 10.2 and
 *		appendix A), and the tables each one names, as exclusive certification
 *		keys. Looks at the parse tree and the catalogs; changes nothing.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "parser/parse_type.h"
#include "parser/scanner.h"
#include "utils/fmgrprotos.h"
#include "utils/syscache.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "chorus_ddl_classify.h"
#include "chorus_settings.h"
#include "chorus_values.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

/* An exclusive key on table nsp.rel. */
static void
chorus_ddl_key(ChorusDdlKeys *k, const char *nsp, const char *rel)
{
	chorus_put_table_key(&k->buf, CHORUS_KEY_EXCLUSIVE, nsp, rel);
	k->n++;
}

/*
 * chorus_ddl_relation
 *		Key the table rv names (an index stands for its table). creating: the
 *		relation does not exist yet; key the name it will have. Returns
 *		whether it is (or will be) temporary.
 */
static bool
chorus_ddl_relation(ChorusDdlKeys *k, RangeVar *rv, bool creating)
{
	Oid			relid;

	if (rv == NULL)
		return false;
	if (creating)
	{
		Oid			nspid;

		if (rv->relpersistence == RELPERSISTENCE_TEMP)
		{
			k->any_temp = true;
			return true;
		}
		nspid = RangeVarGetCreationNamespace(rv);
		if (isAnyTempNamespace(nspid))
		{
			k->any_temp = true;
			return true;
		}
		k->any_persistent = true;
		chorus_ddl_key(k, get_namespace_name(nspid), rv->relname);
		return false;
	}
	relid = RangeVarGetRelid(rv, NoLock, true);
	if (!OidIsValid(relid))
		return false;
	if (get_rel_relkind(relid) == RELKIND_INDEX || get_rel_relkind(relid) == RELKIND_PARTITIONED_INDEX)
		relid = IndexGetRelation(relid, true);
	if (!OidIsValid(relid))
		return false;
	if (get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
	{
		k->any_temp = true;
		return true;
	}
	k->any_persistent = true;
	chorus_ddl_key(k, get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
	return false;
}

/*
 * chorus_ddl_target
 *		Key the relation the statement makes (creating) or changes, and note
 *		whether it is temporary: a temporary object made from permanent ones
 *		(CREATE TEMP TABLE ... (LIKE t), ... INHERITS (t), a temporary view or
 *		an index of a temporary table) is this session's alone, whatever it
 *		reads to be made.
 */
static void
chorus_ddl_target(ChorusDdlKeys *k, RangeVar *rv, bool creating)
{
	k->has_target = rv != NULL;
	if (chorus_ddl_relation(k, rv, creating))
		k->target_temp = true;
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
 *		partitions there. So any other bound is replayed as the value it took
 *		on the origin (chorus_bound_replay).
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

/*
 * chorus_bound_of
 *		The partition bound a statement gives (CREATE TABLE ... PARTITION OF,
 *		ALTER TABLE ... ATTACH PARTITION), and the partition it bounds; NULL if
 *		none.
 */
PartitionBoundSpec *
chorus_bound_of(Node *stmt, RangeVar **partition)
{
	ListCell   *lc;

	if (IsA(stmt, CreateStmt) && ((CreateStmt *) stmt)->partbound != NULL)
	{
		*partition = ((CreateStmt *) stmt)->relation;
		return ((CreateStmt *) stmt)->partbound;
	}
	if (IsA(stmt, AlterTableStmt))
		foreach(lc, ((AlterTableStmt *) stmt)->cmds)
		{
			AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

			if (cmd->subtype == AT_AttachPartition)
			{
				*partition = ((PartitionCmd *) cmd->def)->name;
				return ((PartitionCmd *) cmd->def)->bound;
			}
		}
	return NULL;
}

/*
 * chorus_bound_replay
 *		statement, its partition bound (which starts with its IN, FROM or WITH
 *		at byte offset) replaced by the bound the partition took here, as
 *		PostgreSQL prints it under fixed settings (ISO dates in UTC: an 'IST'
 *		printed under another DateStyle reads back as another zone):
 *		constants, read back the same under any settings the statement
 *		replays with. NULL if the bound cannot be found in the text.
 */
char *
chorus_bound_replay(const char *statement, int offset, Oid partition)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(partition));
	Datum		bound;
	bool		isnull;
	char	   *value;
	core_yy_extra_type extra;
	core_yyscan_t scanner;
	core_YYSTYPE yylval;
	YYLTYPE		yylloc;
	int			nest,
				groups,
				depth = 0,
				tok,
				end = -1;
	StringInfoData out;

	if (!HeapTupleIsValid(tup))
		return NULL;
	bound = SysCacheGetAttr(RELOID, tup, Anum_pg_class_relpartbound, &isnull);
	if (isnull)
	{
		ReleaseSysCache(tup);
		return NULL;
	}
	/* printed in ISO, UTC, ...: read back the same whatever settings the replay has */
	nest = chorus_canonical_enter(false);
	value = TextDatumGetCString(DirectFunctionCall2(pg_get_expr, bound, ObjectIdGetDatum(partition)));
	chorus_canonical_exit(nest);
	ReleaseSysCache(tup);
	if (offset < 0 || offset >= (int) strlen(statement) || strncmp(value, "FOR VALUES ", 11) != 0)
		return NULL;
	/* IN (...) and WITH (...) are one parenthesised group, FROM (...) TO (...) two */
	groups = pg_strncasecmp(statement + offset, "FROM", 4) == 0 ? 2 : 1;
	scanner = scanner_init(statement + offset, &extra, &ScanKeywords, ScanKeywordTokens);
	while ((tok = core_yylex(&yylval, &yylloc, scanner)) != 0)
	{
		if (tok == '(')
			depth++;
		else if (tok == ')' && --depth == 0 && --groups == 0)
		{
			end = offset + yylloc + 1;
			break;
		}
	}
	scanner_finish(scanner);
	if (end < 0)
		return NULL;
	initStringInfo(&out);
	appendBinaryStringInfo(&out, statement, offset);
	appendStringInfoString(&out, value + 11);
	appendStringInfoString(&out, statement + end);
	return out.data;
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

/* Does type name tn name a type of a temporary schema (a temporary table's row type, say)? */
static bool
chorus_temp_type(TypeName *tn)
{
	Type		typ;
	bool		temp;

	if (tn == NULL || tn->pct_type)
		return false;			/* (a %TYPE reference: looking it up says NOTICEs of its own) */
	typ = LookupTypeName(NULL, tn, NULL, true);
	if (typ == NULL)
		return false;
	temp = isAnyTempNamespace(((Form_pg_type) GETSTRUCT(typ))->typnamespace);
	ReleaseSysCache(typ);
	return temp;
}

/*
 * chorus_drops_temp_only
 *		A DROP of functions, operators, aggregates, types or domains every one
 *		of which is named in the session's temporary schema (DROP FUNCTION
 *		pg_temp.f()): the session's own objects, as their creation was.
 */
static bool
chorus_drops_temp_only(DropStmt *ds)
{
	ListCell   *lc;

	switch (ds->removeType)
	{
		case OBJECT_FUNCTION:
		case OBJECT_PROCEDURE:
		case OBJECT_ROUTINE:
		case OBJECT_AGGREGATE:
		case OBJECT_OPERATOR:
			foreach(lc, ds->objects)
				if (!chorus_names_temp_schema(lfirst_node(ObjectWithArgs, lc)->objname))
					return false;
			return ds->objects != NIL;
		case OBJECT_TYPE:
		case OBJECT_DOMAIN:
			foreach(lc, ds->objects)
				if (!chorus_names_temp_schema(lfirst_node(TypeName, lc)->names))
					return false;
			return ds->objects != NIL;
		default:
			return false;
	}
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
CreateTableAsStmt *
chorus_ctas_of(Node *stmt)
{
	if (IsA(stmt, CreateTableAsStmt))
		return (CreateTableAsStmt *) stmt;
	if (IsA(stmt, ExplainStmt))
		return chorus_explain_ctas((ExplainStmt *) stmt);
	return NULL;
}

/*
 * chorus_drop_permanent
 *		DROP of relations some temporary, some permanent (DROP TABLE scratch,
 *		kept): this node drops them all; the other nodes, which have only the
 *		permanent ones, run a DROP of those (with the statement's IF EXISTS and
 *		CASCADE). NULL if there is no such statement to make.
 */
static char *
chorus_drop_permanent(DropStmt *ds)
{
	StringInfoData out;
	const char *what;
	ListCell   *lc;
	bool		any = false;

	switch (ds->removeType)
	{
		case OBJECT_TABLE:
			what = "TABLE";
			break;
		case OBJECT_VIEW:
			what = "VIEW";
			break;
		case OBJECT_MATVIEW:
			what = "MATERIALIZED VIEW";
			break;
		case OBJECT_SEQUENCE:
			what = "SEQUENCE";
			break;
		case OBJECT_INDEX:
			what = "INDEX";
			break;
		case OBJECT_FOREIGN_TABLE:
			what = "FOREIGN TABLE";
			break;
		default:
			return NULL;
	}
	if (ds->concurrent)
		return NULL;
	initStringInfo(&out);
	appendStringInfo(&out, "DROP %s %s", what, ds->missing_ok ? "IF EXISTS " : "");
	foreach(lc, ds->objects)
	{
		Oid			relid = RangeVarGetRelid(makeRangeVarFromNameList(lfirst_node(List, lc)), NoLock, true);

		if (!OidIsValid(relid) || get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
			continue;
		appendStringInfo(&out, "%s%s", any ? ", " : "",
						 quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid)));
		any = true;
	}
	if (ds->behavior == DROP_CASCADE)
		appendStringInfoString(&out, " CASCADE");
	return any ? out.data : NULL;
}

/*
 * chorus_ddl_classify
 *		Which statements replicate (docs/DDL.md; seed section 10.2 and appendix A),
 *		and the tables they touch.
 */
ChorusDdlKind
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
					k->evaluated_bound = true;	/* replayed as the value it takes here */
				chorus_ddl_target(k, cs->relation, true);
				foreach(lc, cs->inhRelations)
				{
					/*
					 * A permanent table cannot inherit from a temporary one:
					 * PostgreSQL says so itself, and nothing runs anywhere else.
					 */
					if (chorus_ddl_relation(k, lfirst_node(RangeVar, lc), false) && !k->target_temp)
						return CHORUS_DDL_LOCAL;
				}
				foreach(lc, cs->tableElts)
					if (IsA(lfirst(lc), TableLikeClause))	/* LIKE another table: it must exist elsewhere */
						chorus_ddl_relation(k, ((TableLikeClause *) lfirst(lc))->relation, false);
				break;
			}
		case T_CreateTableAsStmt:
			chorus_ddl_target(k, ((CreateTableAsStmt *) stmt)->into->rel, true);
			break;
		case T_ViewStmt:
			chorus_ddl_target(k, ((ViewStmt *) stmt)->view, true);
			break;
		case T_CreateSeqStmt:
			chorus_ddl_target(k, ((CreateSeqStmt *) stmt)->sequence, true);
			break;
		case T_AlterSeqStmt:
			chorus_ddl_target(k, ((AlterSeqStmt *) stmt)->sequence, false);
			break;
		case T_AlterTableStmt:
			foreach(lc, ((AlterTableStmt *) stmt)->cmds)
			{
				AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

				if (cmd->subtype == AT_AttachPartition &&
					!chorus_constant_bound(((PartitionCmd *) cmd->def)->bound))
					k->evaluated_bound = true;	/* replayed as the value it takes here */
				/* DETACH PARTITION ... CONCURRENTLY commits in steps, like CREATE INDEX CONCURRENTLY */
				if (cmd->subtype == AT_DetachPartition && ((PartitionCmd *) cmd->def)->concurrent)
					k->concurrent = true;
			}
			chorus_ddl_target(k, ((AlterTableStmt *) stmt)->relation, false);
			break;
		case T_RefreshMatViewStmt:
			/* every node refreshes at the same point of the order, from the same rows */
			chorus_ddl_relation(k, ((RefreshMatViewStmt *) stmt)->relation, false);
			break;
		case T_IndexStmt:
			k->concurrent = ((IndexStmt *) stmt)->concurrent;
			chorus_ddl_target(k, ((IndexStmt *) stmt)->relation, false);
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
				if (chorus_drops_temp_only(ds))
					return CHORUS_DDL_LOCAL;
				if (chorus_is_relation_object(ds->removeType))
				{
					foreach(lc, ds->objects)
						chorus_ddl_relation(k, makeRangeVarFromNameList(lfirst_node(List, lc)), false);
					if (k->any_temp && k->any_persistent)
						k->replay = chorus_drop_permanent(ds);
				}
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
			chorus_ddl_target(k, ((CreateTrigStmt *) stmt)->relation, false);
			break;
		case T_RuleStmt:
			chorus_ddl_target(k, ((RuleStmt *) stmt)->relation, false);
			break;
		case T_CreatePolicyStmt:
			chorus_ddl_target(k, ((CreatePolicyStmt *) stmt)->table, false);
			break;
		case T_AlterPolicyStmt:
			chorus_ddl_target(k, ((AlterPolicyStmt *) stmt)->table, false);
			break;
		case T_CreateFunctionStmt:
			{
				CreateFunctionStmt *cf = (CreateFunctionStmt *) stmt;

				/* a function in the session's temporary schema lives and dies with the session */
				if (chorus_names_temp_schema(cf->funcname))
					return CHORUS_DDL_LOCAL;
				/* so does one of a temporary type: PostgreSQL drops it with the type */
				if (chorus_temp_type(cf->returnType))
					return CHORUS_DDL_LOCAL;
				foreach(lc, cf->parameters)
					if (chorus_temp_type(lfirst_node(FunctionParameter, lc)->argType))
						return CHORUS_DDL_LOCAL;
				break;
			}
		case T_CreateDomainStmt:
			if (chorus_names_temp_schema(((CreateDomainStmt *) stmt)->domainname))
				return CHORUS_DDL_LOCAL;
			break;
		case T_DefineStmt:
			if (chorus_names_temp_schema(((DefineStmt *) stmt)->defnames))
				return CHORUS_DDL_LOCAL;
			break;
		case T_CreateEnumStmt:
			if (chorus_names_temp_schema(((CreateEnumStmt *) stmt)->typeName))
				return CHORUS_DDL_LOCAL;
			break;
		case T_CreateRangeStmt:
			if (chorus_names_temp_schema(((CreateRangeStmt *) stmt)->typeName))
				return CHORUS_DDL_LOCAL;
			break;
		case T_CompositeTypeStmt:
			{
				RangeVar   *tv = ((CompositeTypeStmt *) stmt)->typevar;

				if (tv->schemaname != NULL &&
					chorus_names_temp_schema(list_make2(makeString(tv->schemaname), makeString(tv->relname))))
					return CHORUS_DDL_LOCAL;
				break;
			}
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
	/*
	 * A statement about temporary objects only, or one that makes or changes
	 * a temporary object from permanent ones, is local to this session. One
	 * that makes or changes a permanent object from temporary ones could not
	 * be replayed elsewhere (nor one that names both kinds to drop or grant).
	 */
	if (k->any_temp && (!k->any_persistent || k->target_temp))
		return CHORUS_DDL_LOCAL;
	if (k->replay != NULL)
		return CHORUS_DDL_REPLICATE;	/* a DROP of both kinds: the others drop the permanent ones */
	if (k->any_temp)
	{
		*why = k->has_target
			? "this statement makes or changes a permanent object from temporary ones, which the other nodes do not have"
			: "this statement names both temporary and permanent objects";
		return CHORUS_DDL_REFUSE;
	}
	return CHORUS_DDL_REPLICATE;
}

