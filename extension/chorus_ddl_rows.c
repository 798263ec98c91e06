/*
 * chorus_ddl_rows.c
 *		The rows a schema change ships with its statement, where replaying the
 *		statement would not give the same rows on every node: CREATE TABLE AS
 *		(the structure as a CREATE TABLE, the rows as data), an ALTER TABLE
 *		whose new column values are not fixed (volatile defaults, sequences,
 *		USING with functions), SET LOGGED.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/tablespace.h"
#include "nodes/parsenodes.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/formatting.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/ruleutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus_capture.h"
#include "chorus_ddl_rows.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

/*
 * chorus_ddl_create_text
 *		A CREATE TABLE statement for relid as it stands: the structure a CREATE
 *		TABLE AS made (columns with their types and collations, persistence,
 *		access method, storage options, tablespace), without its query, which
 *		need not give the same rows elsewhere.
 */
char *
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
void
chorus_ddl_ship_rows(ChorusCapture *cap, Relation rel, bool replace)
{
	MemoryContext rowcxt = AllocSetContextCreate(CurrentMemoryContext, "chorus ddl rows", ALLOCSET_DEFAULT_SIZES);
	TableScanDesc scan;
	HeapTuple	tuple;
	ChorusTable *t;

	CommandCounterIncrement();
	PushCopiedSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	t = chorus_capture_table(cap, rel);
	if (t->full_identity)
		replace = true;			/* an old image would not match a changed row elsewhere */
	if (replace)
	{
		chorus_put_truncate(&cap->rows, t->index, 0);
		cap->nrows++;
	}
	scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(rowcxt);

		if (replace)
			chorus_capture_row(cap, rel, CHORUS_OP_INSERT, NULL, tuple, false);
		else
			chorus_capture_row(cap, rel, CHORUS_OP_UPDATE, tuple, tuple, false);
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
int
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

