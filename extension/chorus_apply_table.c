/*
 * chorus_apply_table.c
 *		How the rows of one table of a writeset are applied on this node: its
 *		local column types and their input and receive functions (looked up by
 *		column name), the INSERT, UPDATE and DELETE statements for its shape,
 *		prepared once and kept across calls, and each value's datum in the
 *		local type. Statements are built from quoted identifiers only.
 */
#include "postgres.h"

#include "fmgr.h"
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "chorus_apply_table.h"
#include "chorus_wire.h"

#define PLAN_KEY_SIZE 2048

/* plans survive across calls, keyed by their SQL text */
typedef struct PlanEntry
{
	char		key[PLAN_KEY_SIZE];	/* the SQL text and its parameter types */
	SPIPlanPtr	plan;
} PlanEntry;

static HTAB *chorus_plans = NULL;

/* The table's qualified, quoted name. */
const char *
chorus_apply_table_name(ApplyTable *t)
{
	return quote_qualified_identifier(t->nspname, t->relname);
}

/* the local column types, by name: values are parsed for this node's table */
void
chorus_apply_resolve_types(ApplyTable *t)
{
	Oid			relid;
	Oid			typinput;
	int			i;

	relid = RangeVarGetRelid(makeRangeVar(t->nspname, t->relname, -1), RowExclusiveLock, false);
	t->coltypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->coltypmods = palloc0(sizeof(int32) * Max(t->ncols, 1));
	t->colinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->colioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->colrecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->colrecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->basetypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->baseinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->baseioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->baserecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->baserecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	for (i = 0; i < t->ncols; i++)
	{
		HeapTuple	tup;
		Form_pg_attribute att;

		if (t->cols[i].flags & CHORUS_COL_GENERATED)
			continue;
		tup = SearchSysCacheAttName(relid, t->cols[i].name);
		if (!HeapTupleIsValid(tup))
			ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
							errmsg("chorus: column \"%s\" of %s does not exist here",
								   t->cols[i].name, chorus_apply_table_name(t))));
		att = (Form_pg_attribute) GETSTRUCT(tup);
		t->coltypes[i] = att->atttypid;
		t->coltypmods[i] = att->atttypmod;
		ReleaseSysCache(tup);
		getTypeInputInfo(t->coltypes[i], &typinput, &t->colioparam[i]);
		fmgr_info(typinput, &t->colinput[i]);
		t->basetypes[i] = getBaseType(t->coltypes[i]);
	}
}

static SPIPlanPtr
prepare(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

	if (p == NULL)
		elog(ERROR, "chorus: preparing \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	return p;
}

static SPIPlanPtr
get_plan(const char *sql, int nargs, Oid *argtypes)
{
	PlanEntry  *e;
	bool		found;
	char		key[PLAN_KEY_SIZE];
	StringInfoData k;
	int			i;

	if (chorus_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = PLAN_KEY_SIZE;
		ctl.entrysize = sizeof(PlanEntry);
		chorus_plans = hash_create("chorus apply plans", 64, &ctl, HASH_ELEM | HASH_STRINGS);
	}
	initStringInfo(&k);
	appendStringInfoString(&k, sql);
	for (i = 0; i < nargs; i++)
		appendStringInfo(&k, " %u", argtypes[i]);
	if (k.len >= PLAN_KEY_SIZE)
		return prepare(sql, nargs, argtypes);	/* very wide tables: prepared per writeset */
	memset(key, 0, sizeof(key));
	memcpy(key, k.data, k.len);
	e = hash_search(chorus_plans, key, HASH_ENTER, &found);
	if (!found)
		e->plan = NULL;
	if (e->plan == NULL)
	{
		SPIPlanPtr	p = prepare(sql, nargs, argtypes);

		if (SPI_keepplan(p) != 0)
			elog(ERROR, "chorus: cannot keep plan");
		e->plan = p;
	}
	return e->plan;
}

/*
 * The statement for op (0 insert, 1 update, 2 delete) on t, with its
 * parameter types: new values of non-generated columns, then the old identity.
 */
SPIPlanPtr
chorus_apply_plan(ApplyTable *t, int op)
{
	StringInfoData sql;
	Oid		   *types;
	int			n = 0,
				i;
	bool		first = true;

	if (t->plans[op] != NULL)
		return t->plans[op];
	types = palloc(sizeof(Oid) * (t->ncols + t->nident + 1));
	initStringInfo(&sql);
	if (op == 0)
	{
		StringInfoData vals;

		initStringInfo(&vals);
		appendStringInfo(&sql, "INSERT INTO %s (", chorus_apply_table_name(t));
		for (i = 0; i < t->ncols; i++)
		{
			if (t->cols[i].flags & CHORUS_COL_GENERATED)
				continue;
			appendStringInfo(&sql, "%s%s", first ? "" : ", ", quote_identifier(t->cols[i].name));
			appendStringInfo(&vals, "%s$%d", first ? "" : ", ", n + 1);
			types[n++] = t->coltypes[i];
			first = false;
		}
		if (n == 0)				/* no column to set: a row of defaults */
		{
			resetStringInfo(&sql);
			appendStringInfo(&sql, "INSERT INTO %s DEFAULT VALUES", chorus_apply_table_name(t));
		}
		else
			appendStringInfo(&sql, ") OVERRIDING SYSTEM VALUE VALUES (%s)", vals.data);
	}
	else
	{
		/*
		 * ONLY: the row is this table's, not one of its inheritance children's
		 * (their rows are captured, and applied, as theirs).
		 */
		if (op == 1)
		{
			StringInfoData set;

			initStringInfo(&set);
			for (i = 0; i < t->ncols; i++)
			{
				if (t->cols[i].flags & CHORUS_COL_GENERATED)
					continue;
				appendStringInfo(&set, "%s%s = $%d", first ? "" : ", ",
								 quote_identifier(t->cols[i].name), n + 1);
				types[n++] = t->coltypes[i];
				first = false;
			}
			if (n == 0)			/* nothing to set: the row must be there all the same */
				appendStringInfo(&sql, "SELECT 1 FROM ONLY %s", chorus_apply_table_name(t));
			else
				appendStringInfo(&sql, "UPDATE ONLY %s SET %s", chorus_apply_table_name(t), set.data);
		}
		else
			appendStringInfo(&sql, "DELETE FROM ONLY %s", chorus_apply_table_name(t));
		appendStringInfoString(&sql, " WHERE ");
		if (t->full_identity)
		{
			/*
			 * No primary key: the row whose every column is identical to the
			 * old image (record image equality, *=: 1.0 and 1.00, or 'a' and
			 * 'A' under a case-insensitive collation, are different rows).
			 * Any one of several identical rows is the same change.
			 */
			StringInfoData img;
			int			m = 0;

			initStringInfo(&img);
			appendStringInfo(&sql, "ctid = (SELECT ctid FROM ONLY %s WHERE pg_catalog.record_image_eq(ROW(", chorus_apply_table_name(t));
			for (i = 0; i < t->nident; i++)
			{
				int			c = t->ident[i];

				if (t->cols[c].flags & CHORUS_COL_GENERATED)
					continue;
				/* a domain's old value is compared as its base type: it need not pass the
				 * domain's checks any more (a constraint added NOT VALID) */
				if (t->basetypes[c] != t->coltypes[c])
					appendStringInfo(&sql, "%s%s::%s", m ? ", " : "", quote_identifier(t->cols[c].name),
									 format_type_be_qualified(t->basetypes[c]));
				else
					appendStringInfo(&sql, "%s%s", m ? ", " : "", quote_identifier(t->cols[c].name));
				appendStringInfo(&img, "%s$%d", m ? ", " : "", n + 1);
				types[n++] = t->basetypes[c];
				m++;
			}
			if (m == 0)
				appendStringInfoString(&sql, "), ROW()) LIMIT 1)");
			else
				appendStringInfo(&sql, "), ROW(%s)) LIMIT 1)", img.data);
		}
		else
			for (i = 0; i < t->nident; i++)
			{
				int			c = t->ident[i];

				appendStringInfo(&sql, "%s%s = $%d", i ? " AND " : "", quote_identifier(t->cols[c].name), n + 1);
				types[n++] = t->basetypes[c];
			}
	}
	t->plans[op] = get_plan(sql.data, n, types);
	return t->plans[op];
}

/*
 * chorus_apply_datum
 *		The datum of value v for column col of t, in this node's column type;
 *		old: a value of an old image, read as the column's base type (a row's
 *		old value need not pass a domain check added NOT VALID since).
 */
Datum
chorus_apply_datum(ApplyTable *t, int col, ChorusWsValue v, char *isnull, bool old)
{
	StringInfoData buf;
	char	   *copy;
	bool		base = old && t->basetypes[col] != t->coltypes[col];
	FmgrInfo   *input = base ? &t->baseinput[col] : &t->colinput[col];
	FmgrInfo   *recv = base ? &t->baserecv[col] : &t->colrecv[col];
	Oid		   *ioparam = base ? &t->baseioparam[col] : &t->colioparam[col];
	Oid		   *recvparam = base ? &t->baserecvparam[col] : &t->colrecvparam[col];
	int32		typmod = base ? -1 : t->coltypmods[col];

	if (base && input->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeInputInfo(t->basetypes[col], &fn, ioparam);
		fmgr_info(fn, input);
	}
	*isnull = (v.kind == CHORUS_VAL_NULL) ? 'n' : ' ';
	if (v.kind == CHORUS_VAL_NULL)
		return InputFunctionCall(input, NULL, *ioparam, typmod);
	copy = palloc(v.len + 1);
	memcpy(copy, v.data, v.len);
	copy[v.len] = '\0';
	if (v.kind == CHORUS_VAL_TEXT)
		return InputFunctionCall(input, copy, *ioparam, typmod);
	if (recv->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeBinaryInputInfo(base ? t->basetypes[col] : t->coltypes[col], &fn, recvparam);
		fmgr_info(fn, recv);
	}
	buf.data = copy;
	buf.len = (int) v.len;
	buf.maxlen = (int) v.len + 1;
	buf.cursor = 0;
	return ReceiveFunctionCall(recv, &buf, *recvparam, typmod);
}
