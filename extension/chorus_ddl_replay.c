/*
 * chorus_ddl_replay.c
 *		The node-local parts of a replayed schema change (in an apply session,
 *		or a session with chorus.replaying on): tablespaces are per node, so a
 *		tablespace this node lacks is left out and the default one used.
 */
#include "postgres.h"

#include "commands/tablespace.h"
#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "nodes/plannodes.h"

#include "chorus_ddl_replay.h"

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
