/*
 * chorus_apply_table.c
 *		How the rows of one table of a writeset are applied on this node. The
 *		local table (ApplyRel) is found by name and kept across writesets: its
 *		columns by name, their types with their input and receive functions,
 *		and whether rows go through the executor (chorus_apply_exec.c: the
 *		table has an index on the writeset's identity columns and no column
 *		the writeset does not set) or through SPI statements (a table without
 *		such an index, a partitioned or foreign table, a shape that differs),
 *		with the INSERT, UPDATE and DELETE statements for its shape prepared
 *		once. Statements are built from quoted identifiers only. Also each
 *		value's datum in the local type.
 */
#include "postgres.h"

#include "fmgr.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

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

/* the local tables, by OID (ApplyRel) */
static HTAB *chorus_apply_rels = NULL;
static uint64 chorus_apply_builds = 0;	/* ApplyRels built in this backend */

/* The table's qualified, quoted name. */
const char *
chorus_apply_table_name(ApplyTable *t)
{
	return quote_qualified_identifier(t->nspname, t->relname);
}

/* A relcache invalidation: the table (every table, for InvalidOid) may have changed. */
static void
apply_rel_invalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS seq;
	ApplyRel   *r;

	if (chorus_apply_rels == NULL)
		return;
	if (OidIsValid(relid))
	{
		r = hash_search(chorus_apply_rels, &relid, HASH_FIND, NULL);
		if (r != NULL)
			r->valid = false;
		return;
	}
	hash_seq_init(&seq, chorus_apply_rels);
	while ((r = hash_seq_search(&seq)) != NULL)
		r->valid = false;
}

/* Was r built for the shape t describes? */
static bool
apply_rel_fits(ApplyRel *r, ApplyTable *t)
{
	int			i;

	if (r->ncols != t->ncols || r->nident != t->nident || r->full_identity != t->full_identity)
		return false;
	for (i = 0; i < t->ncols; i++)
		if (r->flags[i] != t->cols[i].flags || strcmp(r->names[i], t->cols[i].name) != 0)
			return false;
	for (i = 0; i < t->nident; i++)
		if (r->ident[i] != t->ident[i])
			return false;
	return true;
}

/*
 * apply_rel_executor
 *		NULL if rows of r (rel, the local table) can go through the executor,
 *		else why not: the executor finds a row by an index on exactly the
 *		identity columns, and inserts only tables where the writeset gives
 *		every column that is not generated.
 */
static const char *
apply_rel_executor(ApplyRel *r, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	bool	   *given = palloc0(sizeof(bool) * (desc->natts + 1));
	HeapTuple	tup;
	Form_pg_index ind;
	int			i,
				k;

	r->insert_executor = false;
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		return "not a plain table";
	for (i = 0; i < r->ncols; i++)
	{
		if (r->attnum[i] == 0)
			continue;			/* generated on the origin */
		if (TupleDescAttr(desc, r->attnum[i] - 1)->attgenerated != '\0')
			return "a column generated here is not generated on the origin";
		given[r->attnum[i]] = true;
	}
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && att->attgenerated == '\0' && !given[att->attnum])
			return "a column the writeset does not give";
	}
	/* an INSERT needs no identity: a table without a key takes its rows through the executor */
	r->insert_executor = true;
	if (r->full_identity)
		return "no primary key or replica identity index";
	r->idxoid = RelationGetPrimaryKeyIndex(rel);
	if (!OidIsValid(r->idxoid))
		r->idxoid = RelationGetReplicaIndex(rel);
	if (!OidIsValid(r->idxoid))
		return "no primary key or replica identity index here";
	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(r->idxoid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "chorus: cache lookup failed for index %u", r->idxoid);
	ind = (Form_pg_index) GETSTRUCT(tup);
	if (ind->indnkeyatts != r->nident || !ind->indimmediate)
	{
		ReleaseSysCache(tup);
		return "the identity index differs from the origin's";
	}
	for (k = 0; k < r->nident; k++)
	{
		AttrNumber	want = r->attnum[r->ident[k]];
		bool		found = false;

		for (i = 0; i < ind->indnkeyatts; i++)
			if (want != 0 && ind->indkey.values[i] == want)
				found = true;
		if (!found)
		{
			ReleaseSysCache(tup);
			return "the identity index differs from the origin's";
		}
	}
	ReleaseSysCache(tup);
	return NULL;
}

/* Build r for t's shape from the local table relid (locked). */
static void
apply_rel_build(ApplyRel *r, ApplyTable *t)
{
	Relation	rel = table_open(r->relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	MemoryContext old;
	Oid			typinput;
	int			i,
				a;

	if (r->cxt == NULL)
		r->cxt = AllocSetContextCreate(CacheMemoryContext, "chorus apply table", ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(r->cxt);
	old = MemoryContextSwitchTo(r->cxt);
	r->valid = false;			/* until built */
	r->ncols = t->ncols;
	r->nident = t->nident;
	r->full_identity = t->full_identity;
	r->names = palloc(sizeof(char *) * Max(t->ncols, 1));
	r->flags = palloc(sizeof(uint8) * Max(t->ncols, 1));
	r->ident = palloc(sizeof(int) * Max(t->nident, 1));
	for (i = 0; i < t->nident; i++)
		r->ident[i] = t->ident[i];
	memset(r->plans, 0, sizeof(r->plans));
	r->attnum = palloc0(sizeof(AttrNumber) * Max(t->ncols, 1));
	r->always = palloc0(sizeof(bool) * Max(t->ncols, 1));
	r->coltypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	r->coltypmods = palloc0(sizeof(int32) * Max(t->ncols, 1));
	r->colinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	r->colioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	r->colrecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	r->colrecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	r->basetypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	r->baseinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	r->baseioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	r->baserecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	r->baserecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	for (i = 0; i < t->ncols; i++)
	{
		Form_pg_attribute att = NULL;

		r->names[i] = pstrdup(t->cols[i].name);
		r->flags[i] = t->cols[i].flags;
		if (t->cols[i].flags & CHORUS_COL_GENERATED)
			continue;			/* computed here from the others */
		for (a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute cand = TupleDescAttr(desc, a);

			if (!cand->attisdropped && strcmp(NameStr(cand->attname), t->cols[i].name) == 0)
			{
				att = cand;
				break;
			}
		}
		if (att == NULL)
			ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
							errmsg("chorus: column \"%s\" of %s does not exist here",
								   t->cols[i].name, chorus_apply_table_name(t))));
		r->attnum[i] = att->attnum;
		r->always[i] = (att->attidentity == ATTRIBUTE_IDENTITY_ALWAYS);
		r->coltypes[i] = att->atttypid;
		r->coltypmods[i] = att->atttypmod;
		getTypeInputInfo(r->coltypes[i], &typinput, &r->colioparam[i]);
		fmgr_info_cxt(typinput, &r->colinput[i], r->cxt);
		r->basetypes[i] = getBaseType(r->coltypes[i]);
	}
	r->owner = rel->rd_rel->relowner;
	r->why_spi = apply_rel_executor(r, rel);
	table_close(rel, NoLock);
	MemoryContextSwitchTo(old);
	r->generation = ++chorus_apply_builds;
	r->valid = true;
}

/*
 * chorus_apply_resolve
 *		Lock t's local table (RowExclusiveLock, which also takes in the
 *		invalidations other sessions sent) and find what this node knows of
 *		it, building that where the table is new or changed.
 */
void
chorus_apply_resolve(ApplyTable *t)
{
	Oid			relid;
	ApplyRel   *r;
	bool		found;

	if (chorus_apply_rels == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(ApplyRel);
		ctl.hcxt = CacheMemoryContext;
		chorus_apply_rels = hash_create("chorus apply tables", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		CacheRegisterRelcacheCallback(apply_rel_invalidate, (Datum) 0);
	}
	relid = RangeVarGetRelid(makeRangeVar(t->nspname, t->relname, -1), RowExclusiveLock, false);
	r = hash_search(chorus_apply_rels, &relid, HASH_ENTER, &found);
	if (!found)
	{
		r->cxt = NULL;
		r->valid = false;
	}
	if (!r->valid || !apply_rel_fits(r, t))
		apply_rel_build(r, t);
	t->rel = r;
	t->generation = r->generation;
}

static SPIPlanPtr
prepare(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

	if (p == NULL)
		elog(ERROR, "chorus: preparing \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	return p;
}

/*
 * The plan of sql, kept for the session and found again by its text; *kept
 * false for a statement too long for the cache (very wide tables), whose plan
 * lives only until SPI_finish and must not be remembered.
 */
static SPIPlanPtr
get_plan(const char *sql, int nargs, Oid *argtypes, bool *kept)
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
	*kept = k.len < PLAN_KEY_SIZE;
	if (!*kept)
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
 * chorus_apply_update_skips
 *		Whether an UPDATE statement of t leaves column col out of its SET list:
 *		a GENERATED ALWAYS identity column here (which an UPDATE cannot set)
 *		that is one of the identity columns, so the row's old value is known.
 *		Returns its position in the identity, or -1 (set like the others).
 */
int
chorus_apply_update_skips(ApplyTable *t, int col)
{
	int			k;

	if (!t->rel->always[col])
		return -1;
	for (k = 0; k < t->nident; k++)
		if (t->ident[k] == col)
			return k;
	return -1;
}

/*
 * The equality operator of type typid, schema-qualified as OPERATOR(schema.op):
 * the apply statements resolve nothing through search_path.
 */
static char *
apply_eq_operator(Oid typid)
{
	TypeCacheEntry *tc = lookup_type_cache(typid, TYPECACHE_EQ_OPR);
	HeapTuple	tup;
	Form_pg_operator op;
	char	   *result;

	if (!OidIsValid(tc->eq_opr))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("chorus: type %s has no equality operator to find a row by", format_type_be(typid))));
	tup = SearchSysCache1(OPEROID, ObjectIdGetDatum(tc->eq_opr));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "chorus: cache lookup failed for operator %u", tc->eq_opr);
	op = (Form_pg_operator) GETSTRUCT(tup);
	result = psprintf("OPERATOR(%s.%s)", quote_identifier(get_namespace_name(op->oprnamespace)),
					  NameStr(op->oprname));
	ReleaseSysCache(tup);
	return result;
}

/*
 * The statement for op (0 insert, 1 update, 2 delete) on t, with its
 * parameter types: new values of non-generated columns, then the old identity.
 * newv: an UPDATE's new values when some are unchanged TOAST values, which
 * its SET list leaves out (its plan is then kept by its text only).
 */
SPIPlanPtr
chorus_apply_plan(ApplyTable *t, int op, const ChorusWsValue *newv)
{
	ApplyRel   *r = t->rel;
	SPIPlanPtr	plan;
	bool		kept;
	StringInfoData sql;
	Oid		   *types;
	int			n = 0,
				i;
	bool		first = true;

	if (newv == NULL && r->plans[op] != NULL)
		return r->plans[op];
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
			types[n++] = r->coltypes[i];
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
				if ((t->cols[i].flags & CHORUS_COL_GENERATED) || chorus_apply_update_skips(t, i) >= 0 ||
					(newv != NULL && newv[i].kind == CHORUS_VAL_UNCHANGED))
					continue;
				appendStringInfo(&set, "%s%s = $%d", first ? "" : ", ",
								 quote_identifier(t->cols[i].name), n + 1);
				types[n++] = r->coltypes[i];
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
			appendStringInfo(&sql, "ctid OPERATOR(pg_catalog.=) (SELECT ctid FROM ONLY %s WHERE pg_catalog.record_image_eq(ROW(",
							 chorus_apply_table_name(t));
			for (i = 0; i < t->nident; i++)
			{
				int			c = t->ident[i];

				if (t->cols[c].flags & CHORUS_COL_GENERATED)
					continue;
				/* a domain's old value is compared as its base type: it need not pass the
				 * domain's checks any more (a constraint added NOT VALID) */
				if (r->basetypes[c] != r->coltypes[c])
					appendStringInfo(&sql, "%s%s::%s", m ? ", " : "", quote_identifier(t->cols[c].name),
									 format_type_be_qualified(r->basetypes[c]));
				else
					appendStringInfo(&sql, "%s%s", m ? ", " : "", quote_identifier(t->cols[c].name));
				appendStringInfo(&img, "%s$%d", m ? ", " : "", n + 1);
				types[n++] = r->basetypes[c];
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

				appendStringInfo(&sql, "%s%s %s $%d", i ? " AND " : "", quote_identifier(t->cols[c].name),
								 apply_eq_operator(r->basetypes[c]), n + 1);
				types[n++] = r->basetypes[c];
			}
	}
	plan = get_plan(sql.data, n, types, &kept);
	if (newv == NULL && kept)
		r->plans[op] = plan;	/* kept across writesets with the table's ApplyRel */
	return plan;
}

/*
 * chorus_apply_datum
 *		The datum of value v for column col of t, in this node's column type.
 *		A domain's value is read as its base type: the domain's checks are the
 *		origin's to make (they ran there, on the same value, under the same
 *		definition), as CHECK constraints and foreign keys are, so no user code
 *		in a domain's constraint runs here (docs/SECURITY.md); an old image's
 *		value also need not pass a check added NOT VALID since.
 */
Datum
chorus_apply_datum(ApplyTable *t, int col, ChorusWsValue v, bool *isnull)
{
	ApplyRel   *r = t->rel;
	StringInfoData buf;
	char	   *copy;
	bool		base = r->basetypes[col] != r->coltypes[col];
	FmgrInfo   *input = base ? &r->baseinput[col] : &r->colinput[col];
	FmgrInfo   *recv = base ? &r->baserecv[col] : &r->colrecv[col];
	Oid		   *ioparam = base ? &r->baseioparam[col] : &r->colioparam[col];
	Oid		   *recvparam = base ? &r->baserecvparam[col] : &r->colrecvparam[col];
	int32		typmod = base ? -1 : r->coltypmods[col];

	if (base && input->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeInputInfo(r->basetypes[col], &fn, ioparam);
		fmgr_info_cxt(fn, input, r->cxt);
	}
	*isnull = (v.kind == CHORUS_VAL_NULL);
	if (v.kind == CHORUS_VAL_NULL)
		return (Datum) 0;
	copy = palloc(v.len + 1);
	memcpy(copy, v.data, v.len);
	copy[v.len] = '\0';
	if (v.kind == CHORUS_VAL_TEXT)
		return InputFunctionCall(input, copy, *ioparam, typmod);
	if (recv->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeBinaryInputInfo(base ? r->basetypes[col] : r->coltypes[col], &fn, recvparam);
		fmgr_info_cxt(fn, recv, r->cxt);
	}
	buf.data = copy;
	buf.len = (int) v.len;
	buf.maxlen = (int) v.len + 1;
	buf.cursor = 0;
	return ReceiveFunctionCall(recv, &buf, *recvparam, typmod);
}
