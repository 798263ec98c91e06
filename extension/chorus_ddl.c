/*
 * chorus_ddl.c
 *		Schema changes in total order (total order isolation, docs/DDL.md).
 *
 *		A replicated statement is not run at once: it is sent to the coordinator
 *		as a writeset with the DDL flag, the statement text, the session's
 *		search_path and role, and an exclusive key on every table it names. Once
 *		it has its GID and every earlier GID has committed here, it runs; the
 *		origin then reports the outcome through the bus and commits at its turn.
 *		Every other node runs the statement at the same point of the order.
 *		Transactions that touched those tables without seeing the change lose
 *		certification instead of diverging.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "chorus.h"

bool		chorus_replicate_ddl = true;
bool		chorus_replicate_roles = true;
int			chorus_node_number = 0;
int			chorus_max_nodes = 16;

/* Depth of replicated schema changes running in this backend (nested DDL is theirs). */
static int	chorus_ddl_depth = 0;

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
} ChorusDdlKeys;

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
		case T_ExplainStmt:
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
			/* never replicated: maintenance, storage, databases, the system (appendix A) */
		case T_VacuumStmt:		/* VACUUM and ANALYZE */
		case T_ReindexStmt:
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
		case T_RefreshMatViewStmt:
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

				chorus_ddl_relation(k, cs->relation, true);
				foreach(lc, cs->inhRelations)
					chorus_ddl_relation(k, lfirst_node(RangeVar, lc), false);
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
			chorus_ddl_relation(k, ((AlterTableStmt *) stmt)->relation, false);
			break;
		case T_IndexStmt:
			if (((IndexStmt *) stmt)->concurrent)
			{
				*why = "CREATE INDEX CONCURRENTLY cannot run in total order";
				return CHORUS_DDL_REFUSE;
			}
			chorus_ddl_relation(k, ((IndexStmt *) stmt)->relation, false);
			break;
		case T_DropStmt:
			{
				DropStmt   *ds = (DropStmt *) stmt;

				if (ds->concurrent)
				{
					*why = "DROP INDEX CONCURRENTLY cannot run in total order";
					return CHORUS_DDL_REFUSE;
				}
				if (ds->removeType == OBJECT_EXTENSION)
				{
					foreach(lc, ds->objects)
						if (strcmp(strVal(lfirst(lc)), "chorus") == 0)
							return CHORUS_DDL_LOCAL;
				}
				if (chorus_is_relation_object(ds->removeType))
					foreach(lc, ds->objects)
						chorus_ddl_relation(k, makeRangeVarFromNameList(lfirst_node(List, lc)), false);
				break;
			}
		case T_RenameStmt:
			chorus_ddl_relation(k, ((RenameStmt *) stmt)->relation, false);
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
		case T_GrantStmt:
			{
				GrantStmt  *gs = (GrantStmt *) stmt;

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
	return CHORUS_DDL_REPLICATE;
}

/*
 * chorus_ddl_writeset
 *		Header (flags = DDL, no tables or rows), keys, then the DDL section.
 */
static void
chorus_ddl_writeset(StringInfo out, ChorusDdlKeys *k, const char *statement)
{
	char	   *role = GetUserNameFromId(GetUserId(), false);
	uint64		committed;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	committed = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);

	appendBinaryStringInfo(out, "CW", 2);
	chorus_put_u8(out, 1);		/* version */
	chorus_put_u8(out, 0x01);	/* FLAG_DDL */
	chorus_put_u32(out, 0);
	chorus_put_u32(out, (uint32) MyProcPid);
	chorus_put_u64(out, committed);
	chorus_put_u16(out, 0);
	chorus_put_u32(out, 0);
	chorus_put_u32(out, k->n);
	appendBinaryStringInfo(out, k->buf.data, k->buf.len);
	chorus_put_blob(out, statement, strlen(statement));
	chorus_put_str(out, namespace_search_path ? namespace_search_path : "");
	chorus_put_str(out, role);
}

/*
 * chorus_ddl_utility
 *		Called for every utility statement before it runs. Returns true if the
 *		statement is a replicated schema change that now holds its turn (the
 *		caller runs it and then calls chorus_ddl_done()).
 */
bool
chorus_ddl_utility(PlannedStmt *pstmt, const char *queryString, ProcessUtilityContext context)
{
	ChorusDdlKeys k;
	ChorusDdlKind kind;
	const char *why = NULL;
	char	   *statement;
	StringInfoData ws;

	if (!chorus_capture_enabled || !chorus_replicate_ddl || chorus_xact.applying ||
		chorus_ddl_depth > 0 || creating_extension || IsBinaryUpgrade)
		return false;

	memset(&k, 0, sizeof(k));
	initStringInfo(&k.buf);
	kind = chorus_ddl_classify(pstmt->utilityStmt, &k, &why);
	if (kind == CHORUS_DDL_LOCAL)
		return false;
	if (kind == CHORUS_DDL_REFUSE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: %s", why),
				 errhint("Use the form without CONCURRENTLY (it is replicated in total order), or "
						 "SET chorus.replicate_ddl = off and run it on every node.")));
	if (context != PROCESS_UTILITY_TOPLEVEL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: schema changes inside functions, procedures or DO blocks are not replicated"),
				 errhint("Run the statement on its own, or SET chorus.replicate_ddl = off to change only this node.")));
	if (IsTransactionBlock() || chorus_xact.ddl || chorus_xact.nrows > 0)
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("chorus: a replicated schema change must run on its own, outside a transaction block"),
				 errdetail("Schema changes run in total order on every node, each as its own transaction."),
				 errhint("Run it without BEGIN (and as the only statement of its query string), or "
						 "SET chorus.replicate_ddl = off to change only this node.")));
	chorus_check_writable();

	if (pstmt->stmt_len > 0)
		statement = pnstrdup(queryString + pstmt->stmt_location, pstmt->stmt_len);
	else
		statement = pstrdup(queryString + Max(pstmt->stmt_location, 0));
	initStringInfo(&ws);
	chorus_ddl_writeset(&ws, &k, statement);
	chorus_ddl_order(&ws);
	pfree(ws.data);
	chorus_ddl_depth++;
	return true;
}

/* The replicated statement finished (or failed): nested DDL is no longer its. */
void
chorus_ddl_done(void)
{
	if (chorus_ddl_depth > 0)
		chorus_ddl_depth--;
}

/* At transaction end (an error may have skipped chorus_ddl_done). */
void
chorus_ddl_reset(void)
{
	chorus_ddl_depth = 0;
}
