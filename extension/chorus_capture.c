/*
 * chorus_capture.c
 *		Row capture: AFTER ROW and AFTER TRUNCATE triggers append each change of a
 *		replicated table to the transaction's writeset, with its certification
 *		keys (docs/PROTOCOL.md sections 2 and 3) and the transaction's last_seen.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "chorus.h"

PG_FUNCTION_INFO_V1(chorus_capture);
PG_FUNCTION_INFO_V1(chorus_capture_truncate);

ChorusXact	chorus_xact;

/*
 * chorus_xact_reset
 *		Forget the transaction's writeset and commit state (end of transaction).
 */
void
chorus_xact_reset(void)
{
	if (chorus_xact.cxt != NULL)
		MemoryContextDelete(chorus_xact.cxt);
	memset(&chorus_xact, 0, sizeof(chorus_xact));
}

/*
 * chorus_xact_begin_capture
 *		Lazily set up the writeset buffers in a context that lives until the end
 *		of the top-level transaction.
 */
void
chorus_xact_begin_capture(void)
{
	MemoryContext old;

	if (chorus_xact.cxt != NULL)
		return;
	chorus_xact.cxt = AllocSetContextCreate(TopMemoryContext, "chorus writeset",
											ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(chorus_xact.cxt);
	initStringInfo(&chorus_xact.rows);
	initStringInfo(&chorus_xact.keys);
	chorus_xact.maxtables = 8;
	chorus_xact.tables = palloc0(sizeof(ChorusTable *) * chorus_xact.maxtables);
	MemoryContextSwitchTo(old);
}

/*
 * chorus_subxact_start
 *		Remember where the row buffer stood when a savepoint began.
 */
void
chorus_subxact_start(SubTransactionId subid)
{
	MemoryContext old;

	if (chorus_xact.cxt == NULL)
		return;					/* nothing captured yet: nothing to roll back */
	old = MemoryContextSwitchTo(chorus_xact.cxt);
	if (chorus_xact.nsubs == chorus_xact.maxsubs)
	{
		int			n = chorus_xact.maxsubs ? chorus_xact.maxsubs * 2 : 8;

		chorus_xact.sub_ids = chorus_xact.sub_ids ?
			repalloc(chorus_xact.sub_ids, sizeof(SubTransactionId) * n) : palloc(sizeof(SubTransactionId) * n);
		chorus_xact.sub_rowlen = chorus_xact.sub_rowlen ?
			repalloc(chorus_xact.sub_rowlen, sizeof(int) * n) : palloc(sizeof(int) * n);
		chorus_xact.sub_nrows = chorus_xact.sub_nrows ?
			repalloc(chorus_xact.sub_nrows, sizeof(uint32) * n) : palloc(sizeof(uint32) * n);
		chorus_xact.sub_has_schema = chorus_xact.sub_has_schema ?
			repalloc(chorus_xact.sub_has_schema, sizeof(bool) * n) : palloc(sizeof(bool) * n);
		chorus_xact.maxsubs = n;
	}
	chorus_xact.sub_ids[chorus_xact.nsubs] = subid;
	chorus_xact.sub_rowlen[chorus_xact.nsubs] = chorus_xact.rows.len;
	chorus_xact.sub_nrows[chorus_xact.nsubs] = chorus_xact.nrows;
	chorus_xact.sub_has_schema[chorus_xact.nsubs] = chorus_xact.has_schema;
	chorus_xact.nsubs++;
	MemoryContextSwitchTo(old);
}

/*
 * chorus_subxact_abort
 *		A savepoint was rolled back: drop the rows and schema changes it captured
 *		(PostgreSQL rolled them back). Its keys stay (a key too many can only
 *		cause a false conflict, never a missed one).
 *		Called with subid of the aborted subtransaction; subid 0 means "released"
 *		(commit of the subtransaction): just pop.
 */
void
chorus_subxact_abort(SubTransactionId subid)
{
	int			i;

	if (chorus_xact.cxt == NULL)
		return;
	for (i = chorus_xact.nsubs - 1; i >= 0; i--)
	{
		if (chorus_xact.sub_ids[i] == subid)
		{
			chorus_xact.rows.len = chorus_xact.sub_rowlen[i];
			chorus_xact.rows.data[chorus_xact.rows.len] = '\0';
			chorus_xact.nrows = chorus_xact.sub_nrows[i];
			chorus_xact.has_schema = chorus_xact.sub_has_schema[i];
			chorus_xact.nsubs = i;
			return;
		}
	}
	/*
	 * No mark: the savepoint began before the first capture (subtransaction
	 * ids grow), so everything captured so far belongs to it.
	 */
	if (chorus_xact.nsubs == 0 || subid < chorus_xact.sub_ids[0])
	{
		chorus_xact.rows.len = 0;
		chorus_xact.rows.data[0] = '\0';
		chorus_xact.nrows = 0;
		chorus_xact.has_schema = false;
		chorus_xact.nsubs = 0;
	}
}

/*
 * chorus_visible_gid_clean
 *		The newest GID such that it and every certified GID before it are
 *		visible to the active snapshot: the transaction's last_seen. With one
 *		commit lane commits happen in GID order, so visibility is a prefix of
 *		the ring and this is the newest visible GID. With several lanes it is
 *		the watermark, lowered below the lowest GID the snapshot does not see.
 *		*clean: no GID above the result is visible either (the snapshot is a
 *		prefix of the order, as a donor's must be).
 */
uint64
chorus_visible_gid_clean(bool *clean)
{
	Snapshot	snap = GetActiveSnapshot();
	uint64		result;
	uint64		i,
				n,
				oldest;

	*clean = true;
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	n = chorus_shared->ring_count;
	oldest = n > CHORUS_RING_SIZE ? n - CHORUS_RING_SIZE : 0;
	if (chorus_shared->lanes <= 1)
	{
		result = (n > CHORUS_RING_SIZE) ? 0 : chorus_shared->base_gid;
		for (i = n; i > oldest; i--)
		{
			ChorusCommit *c = &chorus_shared->ring[(i - 1) % CHORUS_RING_SIZE];

			if (snap == NULL || !XidInMVCCSnapshot(c->xid, snap))
			{
				result = c->gid;
				break;
			}
		}
	}
	else
	{
		uint64		lowest_unseen = PG_UINT64_MAX;
		uint64		highest_seen = 0;

		result = chorus_shared->committed_gid;
		for (i = n; i > oldest; i--)
		{
			ChorusCommit *c = &chorus_shared->ring[(i - 1) % CHORUS_RING_SIZE];

			if (snap != NULL && XidInMVCCSnapshot(c->xid, snap))
				lowest_unseen = Min(lowest_unseen, c->gid);
			else
				highest_seen = Max(highest_seen, c->gid);
		}
		if (n > CHORUS_RING_SIZE && lowest_unseen != PG_UINT64_MAX &&
			snap != NULL &&
			XidInMVCCSnapshot(chorus_shared->ring[oldest % CHORUS_RING_SIZE].xid, snap))
			result = 0;			/* older than the ring: cannot tell */
		else if (lowest_unseen != PG_UINT64_MAX)
			result = Min(result, lowest_unseen - 1);
		*clean = highest_seen <= result;
	}
	LWLockRelease(chorus_shared->lock);
	return result;
}

uint64
chorus_visible_gid(void)
{
	bool		clean;

	return chorus_visible_gid_clean(&clean);
}

/*
 * chorus_table_for
 *		The writeset's description of relation rel, built at its first capture in
 *		this transaction: columns, identity (primary key, or every column for
 *		REPLICA IDENTITY FULL) and unique keys.
 */
/*
 * chorus_foreign_keys
 *		The table's foreign keys, each as the parent's unique key (in the parent
 *		index's column order, so the reference key equals the key the parent's
 *		own row changes carry) and the child columns that hold it.
 */
static void
chorus_foreign_keys(Relation rel, ChorusTable *t, const int *colof)
{
	List	   *fks = RelationGetFKeyList(rel);
	ListCell   *lc;

	t->fkeys = palloc0(sizeof(ChorusForeignKey) * Max(list_length(fks), 1));
	foreach(lc, fks)
	{
		ForeignKeyCacheInfo *fk = lfirst_node(ForeignKeyCacheInfo, lc);
		HeapTuple	ctup = SearchSysCache1(CONSTROID, ObjectIdGetDatum(fk->conoid));
		Oid			indid;
		Relation	idx;
		Form_pg_index ind;
		ChorusForeignKey *f = &t->fkeys[t->nfkeys];
		StringInfoData names;
		bool		ok = true;
		int			k,
					j;

		if (!HeapTupleIsValid(ctup))
			continue;
		indid = ((Form_pg_constraint) GETSTRUCT(ctup))->conindid;
		ReleaseSysCache(ctup);
		if (!OidIsValid(indid))
			continue;
		idx = index_open(indid, AccessShareLock);
		ind = idx->rd_index;
		f->ncols = ind->indnkeyatts;
		f->cols = palloc(sizeof(int) * f->ncols);
		initStringInfo(&names);
		for (k = 0; k < ind->indnkeyatts && ok; k++)
		{
			AttrNumber	pa = ind->indkey.values[k];

			for (j = 0; j < fk->nkeys && fk->confkey[j] != pa; j++)
				;
			if (pa <= 0 || j == fk->nkeys || colof[fk->conkey[j]] < 0)
			{
				ok = false;
				break;
			}
			f->cols[k] = colof[fk->conkey[j]];
			appendStringInfo(&names, "%s%s", k ? "," : "", get_attname(fk->confrelid, pa, false));
		}
		index_close(idx, AccessShareLock);
		if (!ok)
			continue;
		f->colnames = names.data;
		f->nspname = get_namespace_name(get_rel_namespace(fk->confrelid));
		f->relname = get_rel_name(fk->confrelid);
		t->nfkeys++;
	}
}

static ChorusTable *
chorus_table_for(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	TupleDesc	desc = RelationGetDescr(rel);
	ChorusTable *t;
	MemoryContext old;
	List	   *indexes;
	ListCell   *lc;
	Oid			pkoid,
				identoid;
	int			i,
				n;
	int		   *colof;

	/* a schema change earlier in the transaction may have changed the table: describe it anew */
	for (i = chorus_xact.ntables - 1; i >= 0; i--)
		if (chorus_xact.tables[i]->relid == relid && chorus_xact.tables[i]->epoch == chorus_xact.table_epoch)
			return chorus_xact.tables[i];

	if (chorus_xact.ntables >= PG_UINT16_MAX)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("chorus: a transaction may write at most %d tables", PG_UINT16_MAX)));

	old = MemoryContextSwitchTo(chorus_xact.cxt);
	t = palloc0(sizeof(ChorusTable));
	t->relid = relid;
	t->epoch = chorus_xact.table_epoch;
	t->nspname = get_namespace_name(RelationGetNamespace(rel));
	t->relname = pstrdup(RelationGetRelationName(rel));
	t->attnums = palloc(sizeof(AttrNumber) * desc->natts);
	t->attnames = palloc(sizeof(char *) * desc->natts);
	t->typnames = palloc(sizeof(char *) * desc->natts);
	t->colflags = palloc0(sizeof(uint8) * desc->natts);
	t->colkind = palloc0(sizeof(uint8) * desc->natts);
	t->valfn = palloc0(sizeof(FmgrInfo) * desc->natts);
	t->textfn = palloc0(sizeof(FmgrInfo) * desc->natts);
	t->keycol = palloc0(sizeof(bool) * desc->natts);
	colof = palloc(sizeof(int) * (desc->natts + 1));
	n = 0;
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		colof[i + 1] = -1;
		if (att->attisdropped)
			continue;
		t->attnums[n] = att->attnum;
		t->attnames[n] = pstrdup(NameStr(att->attname));
		t->typnames[n] = format_type_be(att->atttypid);
		if (att->attidentity != '\0')
			t->colflags[n] |= CHORUS_COL_IDENTITY;
		if (att->attgenerated == ATTRIBUTE_GENERATED_STORED)
			t->colflags[n] |= CHORUS_COL_GENERATED;
		colof[i + 1] = n;
		n++;
	}
	t->ncols = n;

	/* unique keys, the identity (primary key, else replica identity index) first */
	pkoid = RelationGetPrimaryKeyIndex(rel);
	identoid = OidIsValid(pkoid) ? pkoid : RelationGetReplicaIndex(rel);
	indexes = RelationGetIndexList(rel);
	t->uniques = palloc0(sizeof(ChorusUniqueKey) * (list_length(indexes) + 1));
	t->expr_indexes = palloc0(sizeof(Oid) * (list_length(indexes) + 1));
	t->expr_names = palloc0(sizeof(char *) * (list_length(indexes) + 1));
	foreach(lc, indexes)
	{
		Oid			indexoid = lfirst_oid(lc);
		Relation	idx = index_open(indexoid, AccessShareLock);
		Form_pg_index ind = idx->rd_index;
		bool		plain = true;
		int			k;

		if (ind->indisunique && ind->indisvalid)
		{
			for (k = 0; k < ind->indnkeyatts; k++)
				if (ind->indkey.values[k] <= 0 || colof[ind->indkey.values[k]] < 0)
					plain = false;
			if (plain)
			{
				ChorusUniqueKey *u;
				StringInfoData names;

				/* keep the identity at position 0 */
				if (indexoid == identoid && t->nunique > 0)
				{
					t->uniques[t->nunique] = t->uniques[0];
					u = &t->uniques[0];
				}
				else
					u = &t->uniques[t->nunique];
				t->nunique++;
				u->is_identity = (indexoid == identoid);
				u->ncols = ind->indnkeyatts;
				u->cols = palloc(sizeof(int) * u->ncols);
				initStringInfo(&names);
				for (k = 0; k < ind->indnkeyatts; k++)
				{
					u->cols[k] = colof[ind->indkey.values[k]];
					t->keycol[u->cols[k]] = true;
					appendStringInfo(&names, "%s%s", k ? "," : "", t->attnames[u->cols[k]]);
				}
				u->colnames = names.data;
			}
			else
			{
				/* not plain: some key column is an expression */
				t->expr_indexes[t->nexpr] = indexoid;
				t->expr_names[t->nexpr] = psprintf("(%s)", RelationGetRelationName(idx));
				t->nexpr++;
			}
		}
		index_close(idx, AccessShareLock);
	}
	list_free(indexes);

	chorus_foreign_keys(rel, t, colof);
	for (i = 0; i < t->nfkeys; i++)
		for (n = 0; n < t->fkeys[i].ncols; n++)
			t->keycol[t->fkeys[i].cols[n]] = true;

	if (t->nunique > 0 && t->uniques[0].is_identity)
	{
		t->nidentity = t->uniques[0].ncols;
		t->identity = t->uniques[0].cols;
	}
	else
	{
		/*
		 * No primary key and no identity index: the whole old row identifies a
		 * row, as with REPLICA IDENTITY FULL (docs/PROTOCOL.md section 3).
		 */
		t->full_identity = true;
		t->nidentity = t->ncols;
		t->identity = palloc(sizeof(int) * Max(t->ncols, 1));
		for (i = 0; i < t->ncols; i++)
		{
			t->identity[i] = i;
			t->keycol[i] = true;
		}
	}

	/* unique indexes on expressions: their key text may depend on settings */
	if (t->nexpr > 0)
		t->canonical = true;

	/* how each column's values travel (chorus_values.c) */
	for (i = 0; i < t->ncols; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, t->attnums[i] - 1);

		chorus_check_replicable_type(att->atttypid, t->attnames[i], quote_qualified_identifier(t->nspname, t->relname));
		t->colkind[i] = chorus_column_io(att->atttypid, t->keycol[i], chorus_xact.cxt, &t->valfn[i],
										 &t->textfn[i], &t->canonical, &t->qualify);
	}

	if (chorus_xact.ntables == chorus_xact.maxtables)
	{
		chorus_xact.maxtables *= 2;
		chorus_xact.tables = repalloc(chorus_xact.tables, sizeof(ChorusTable *) * chorus_xact.maxtables);
	}
	t->index = chorus_xact.ntables;
	chorus_xact.tables[chorus_xact.ntables++] = t;
	MemoryContextSwitchTo(old);
	return t;
}

/*
 * ChorusImage
 *		One row image: every column's datum, and the text of the columns that
 *		make up certification keys (NULL where not needed or SQL NULL).
 */
typedef struct ChorusImage
{
	Datum	   *values;
	bool	   *isnull;
	char	  **text;
} ChorusImage;

static void
chorus_image(ChorusTable *t, HeapTuple tuple, TupleDesc desc, bool all_text, ChorusImage *img)
{
	Datum	   *dv = palloc(sizeof(Datum) * desc->natts);
	bool	   *dn = palloc(sizeof(bool) * desc->natts);
	int			i;

	heap_deform_tuple(tuple, desc, dv, dn);
	img->values = palloc(sizeof(Datum) * Max(t->ncols, 1));
	img->isnull = palloc(sizeof(bool) * Max(t->ncols, 1));
	img->text = palloc0(sizeof(char *) * Max(t->ncols, 1));
	for (i = 0; i < t->ncols; i++)
	{
		int			a = t->attnums[i] - 1;

		img->values[i] = dv[a];
		img->isnull[i] = dn[a] || (t->colflags[i] & CHORUS_COL_GENERATED);
		if (!img->isnull[i] && (t->keycol[i] || all_text))
			img->text[i] = OutputFunctionCall(&t->textfn[i], dv[a]);
	}
	pfree(dv);
	pfree(dn);
}

/*
 * chorus_put_value
 *		One value: NULL, the binary send form, or the text output.
 */
static void
chorus_put_value(StringInfo buf, ChorusTable *t, ChorusImage *img, int c)
{
	if (img->isnull[c])
		chorus_put_u8(buf, CHORUS_VAL_NULL);
	else if (t->colkind[c] == CHORUS_VAL_BINARY)
	{
		bytea	   *b = SendFunctionCall(&t->valfn[c], img->values[c]);

		chorus_put_u8(buf, CHORUS_VAL_BINARY);
		chorus_put_blob(buf, VARDATA(b), VARSIZE(b) - VARHDRSZ);
		pfree(b);
	}
	else
	{
		char	   *s = img->text[c] ? img->text[c] : OutputFunctionCall(&t->valfn[c], img->values[c]);

		chorus_put_u8(buf, CHORUS_VAL_TEXT);
		chorus_put_blob(buf, s, strlen(s));
	}
}

/*
 * chorus_add_key
 *		Append one key: [nspname, relname, colnames, values...] or the table key
 *		when colnames is NULL.
 */
static void
chorus_add_key_of(const char *nspname, const char *relname, uint8 mode, const char *colnames,
				  int ncols, const int *cols, char **vals)
{
	StringInfo	buf = &chorus_xact.keys;
	int			k;

	chorus_put_u8(buf, mode);
	chorus_put_u16(buf, (uint16) (colnames ? 3 + ncols : 2));
	chorus_put_blob(buf, nspname, strlen(nspname));
	chorus_put_blob(buf, relname, strlen(relname));
	if (colnames)
	{
		chorus_put_blob(buf, colnames, strlen(colnames));
		for (k = 0; k < ncols; k++)
			chorus_put_blob(buf, vals[cols[k]], strlen(vals[cols[k]]));
	}
	chorus_xact.nkeys++;
}

static void
chorus_add_key(ChorusTable *t, uint8 mode, const char *colnames, int ncols,
			   const int *cols, char **vals)
{
	chorus_add_key_of(t->nspname, t->relname, mode, colnames, ncols, cols, vals);
}

static bool
chorus_key_complete(const ChorusUniqueKey *u, char **vals)
{
	int			k;

	for (k = 0; k < u->ncols; k++)
		if (vals[u->cols[k]] == NULL)
			return false;
	return true;
}

static bool
chorus_key_equal(const ChorusUniqueKey *u, char **a, char **b)
{
	int			k;

	for (k = 0; k < u->ncols; k++)
	{
		const char *x = a[u->cols[k]],
				   *y = b[u->cols[k]];

		if ((x == NULL) != (y == NULL) || (x && strcmp(x, y) != 0))
			return false;
	}
	return true;
}

/*
 * chorus_row_keys
 *		Keys of one row change (docs/PROTOCOL.md section 3), from the text of
 *		the key columns of its images.
 */
static void
chorus_row_keys(ChorusTable *t, char op, char **oldv, char **newv)
{
	int			i;

	for (i = 0; i < t->nunique; i++)
	{
		ChorusUniqueKey *u = &t->uniques[i];

		if (op == CHORUS_OP_INSERT || op == CHORUS_OP_DELETE)
		{
			char	  **v = (op == CHORUS_OP_INSERT) ? newv : oldv;

			if (chorus_key_complete(u, v))
				chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, v);
		}
		else if (chorus_key_equal(u, oldv, newv))
		{
			if (u->is_identity && chorus_key_complete(u, newv))
				chorus_add_key(t, CHORUS_KEY_UPDATE, u->colnames, u->ncols, u->cols, newv);
		}
		else
		{
			if (chorus_key_complete(u, oldv))
				chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, oldv);
			if (chorus_key_complete(u, newv))
				chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, newv);
		}
	}
	/* a new or re-pointed reference to a parent row: it must still exist (invariant 2) */
	for (i = 0; i < t->nfkeys && op != CHORUS_OP_DELETE; i++)
	{
		ChorusForeignKey *f = &t->fkeys[i];
		ChorusUniqueKey fk = {f->colnames, f->ncols, f->cols, false};

		if (!chorus_key_complete(&fk, newv))
			continue;
		if (op == CHORUS_OP_UPDATE && chorus_key_equal(&fk, oldv, newv))
			continue;
		chorus_add_key_of(f->nspname, f->relname, CHORUS_KEY_REFERENCE, f->colnames, f->ncols,
						  f->cols, newv);
	}
	if (t->full_identity && op != CHORUS_OP_INSERT)
	{
		/* no primary key: the old row's full image identifies it */
		StringInfo	buf = &chorus_xact.keys;
		int			k;

		chorus_put_u8(buf, op == CHORUS_OP_UPDATE ? CHORUS_KEY_UPDATE : CHORUS_KEY_EXCLUSIVE);
		chorus_put_u16(buf, (uint16) (3 + t->ncols));
		chorus_put_blob(buf, t->nspname, strlen(t->nspname));
		chorus_put_blob(buf, t->relname, strlen(t->relname));
		chorus_put_blob(buf, "*", 1);
		for (k = 0; k < t->ncols; k++)
		{
			if (oldv[k] == NULL)
				chorus_put_blob(buf, "\\N", 2);
			else
				chorus_put_blob(buf, oldv[k], strlen(oldv[k]));
		}
		chorus_xact.nkeys++;
	}
}

/*
 * chorus_expr_values
 *		The values a unique index on expressions holds for tuple, as text
 *		(palloc'd), or NULL when the index does not constrain it (a NULL part,
 *		unless the index treats NULLs as equal).
 */
static char **
chorus_expr_values(Relation idx, IndexInfo *ii, EState *estate, TupleTableSlot *slot, HeapTuple tuple)
{
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];
	char	  **out;
	int			k;

	ExecStoreHeapTuple(tuple, slot, false);
	GetPerTupleExprContext(estate)->ecxt_scantuple = slot;
	FormIndexDatum(ii, slot, estate, values, isnull);
	out = palloc(sizeof(char *) * ii->ii_NumIndexKeyAttrs);
	for (k = 0; k < ii->ii_NumIndexKeyAttrs; k++)
	{
		Oid			typoutput;
		bool		varlena;

		if (isnull[k])
		{
			if (!ii->ii_NullsNotDistinct)
				return NULL;
			out[k] = "\\N";
			continue;
		}
		getTypeOutputInfo(TupleDescAttr(RelationGetDescr(idx), k)->atttypid, &typoutput, &varlena);
		out[k] = OidOutputFunctionCall(typoutput, values[k]);
	}
	ResetPerTupleExprContext(estate);
	return out;
}

/*
 * chorus_expr_keys
 *		Keys of one row change for the table's unique indexes on expressions
 *		(e.g. UNIQUE (lower(email))): the computed index values, exclusive, for
 *		the inserted or deleted row, and for both images of an update that
 *		changes them.
 */
static void
chorus_expr_keys(Relation rel, ChorusTable *t, char op, HeapTuple oldtup, HeapTuple newtup)
{
	EState	   *estate = CreateExecutorState();
	TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);
	int			i;

	for (i = 0; i < t->nexpr; i++)
	{
		Relation	idx = index_open(t->expr_indexes[i], AccessShareLock);
		IndexInfo  *ii = BuildIndexInfo(idx);
		int			n = ii->ii_NumIndexKeyAttrs;
		int			cols[INDEX_MAX_KEYS];
		char	  **oldv = oldtup ? chorus_expr_values(idx, ii, estate, slot, oldtup) : NULL;
		char	  **newv = newtup ? chorus_expr_values(idx, ii, estate, slot, newtup) : NULL;
		int			k;

		for (k = 0; k < n; k++)
			cols[k] = k;
		if (op == CHORUS_OP_UPDATE && oldv && newv)
		{
			for (k = 0; k < n && strcmp(oldv[k], newv[k]) == 0; k++)
				;
			if (k == n)
				oldv = newv = NULL;		/* unchanged: no conflict to find */
		}
		if (oldv)
			chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, t->expr_names[i], n, cols, oldv);
		if (newv)
			chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, t->expr_names[i], n, cols, newv);
		index_close(idx, AccessShareLock);
	}
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
}

/*
 * chorus_note_snapshot
 *		last_seen of the transaction = the minimum over its captures of the
 *		newest GID visible to the snapshot the capture ran under.
 */
void
chorus_note_snapshot(void)
{
	uint64		seen = chorus_visible_gid();

	if (!chorus_xact.has_last_seen || seen < chorus_xact.last_seen)
		chorus_xact.last_seen = seen;
	chorus_xact.has_last_seen = true;
}

static void
chorus_check_size(void)
{
	uint64		size = (uint64) chorus_xact.rows.len + chorus_xact.keys.len;

	if (size > (uint64) chorus_max_writeset_mb * 1024 * 1024)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("chorus: transaction too large to replicate"),
				 errdetail("Its writeset exceeds chorus.max_writeset_size (%d MB).", chorus_max_writeset_mb),
				 errhint("Split the transaction, or raise chorus.max_writeset_size.")));
}

/*
 * chorus_capture_start
 *		Common checks of both triggers. Returns false when this change is not
 *		to be captured.
 */
static bool
chorus_capture_start(Relation rel)
{
	if (!chorus_capture_enabled || chorus_xact.applying)
		return false;
	if (rel->rd_rel->relpersistence != RELPERSISTENCE_PERMANENT)
		return false;
	chorus_check_writable();
	chorus_xact_begin_capture();
	chorus_note_snapshot();
	return true;
}

/*
 * chorus_capture_row
 *		Append one row change of rel to the writeset: op is CHORUS_OP_INSERT
 *		(newtup), CHORUS_OP_UPDATE (both) or CHORUS_OP_DELETE (oldtup). keys:
 *		with its certification keys (rows a schema change produced are covered
 *		by its table keys instead).
 */
void
chorus_capture_row(Relation rel, char op, HeapTuple oldtup, HeapTuple newtup, bool keys)
{
	TupleDesc	desc = RelationGetDescr(rel);
	ChorusTable *t = chorus_table_for(rel);
	ChorusImage oldi,
				newi;
	int			nest = t->canonical ? chorus_canonical_enter(t->qualify) : -1;
	int			i;

	if (oldtup != NULL)
		chorus_image(t, oldtup, desc, false, &oldi);
	if (newtup != NULL)
		chorus_image(t, newtup, desc, false, &newi);
	if (keys)
	{
		if (!t->table_key_done)
		{
			chorus_add_key(t, CHORUS_KEY_REFERENCE, NULL, 0, NULL, NULL);
			t->table_key_done = true;
		}
		chorus_row_keys(t, op, oldtup ? oldi.text : NULL, newtup ? newi.text : NULL);
		if (t->nexpr > 0)
			chorus_expr_keys(rel, t, op, oldtup, newtup);
	}

	chorus_put_u8(&chorus_xact.rows, (uint8) op);
	chorus_put_u16(&chorus_xact.rows, (uint16) t->index);
	if (oldtup != NULL)
	{
		chorus_put_u16(&chorus_xact.rows, (uint16) t->nidentity);
		for (i = 0; i < t->nidentity; i++)
			chorus_put_value(&chorus_xact.rows, t, &oldi, t->identity[i]);
	}
	if (newtup != NULL)
	{
		chorus_put_u16(&chorus_xact.rows, (uint16) t->ncols);
		for (i = 0; i < t->ncols; i++)
			chorus_put_value(&chorus_xact.rows, t, &newi, i);
	}
	chorus_xact.nrows++;
	chorus_canonical_exit(nest);
	chorus_check_size();
}

/* The transaction's description of rel (made at its first capture). */
ChorusTable *
chorus_capture_table(Relation rel)
{
	chorus_xact_begin_capture();
	return chorus_table_for(rel);
}

/*
 * chorus_capture_table_key
 *		A table-level key of rel in mode (a schema change's exclusive key on a
 *		table it changes).
 */
void
chorus_capture_table_key(Relation rel, uint8 mode)
{
	chorus_xact_begin_capture();
	chorus_add_key(chorus_table_for(rel), mode, NULL, 0, NULL, NULL);
}

/*
 * chorus_capture
 *		AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW.
 */
Datum
chorus_capture(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	Relation	rel;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						errmsg("chorus.capture() must be an AFTER ... FOR EACH ROW trigger")));
	rel = td->tg_relation;
	if (!chorus_capture_start(rel))
		return PointerGetDatum(NULL);
	if (TRIGGER_FIRED_BY_INSERT(td->tg_event))
		chorus_capture_row(rel, CHORUS_OP_INSERT, NULL, td->tg_trigtuple, true);
	else if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
		chorus_capture_row(rel, CHORUS_OP_UPDATE, td->tg_trigtuple, td->tg_newtuple, true);
	else
		chorus_capture_row(rel, CHORUS_OP_DELETE, td->tg_trigtuple, NULL, true);
	return PointerGetDatum(NULL);
}

/* Set by the utility hook while a TRUNCATE ... RESTART IDENTITY runs. */
bool		chorus_truncate_restart = false;

/*
 * chorus_capture_truncate
 *		AFTER TRUNCATE ... FOR EACH STATEMENT: a 'T' row and the table key in
 *		exclusive mode.
 */
Datum
chorus_capture_truncate(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	ChorusTable *t;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_TRUNCATE(td->tg_event))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						errmsg("chorus.capture_truncate() must be an AFTER TRUNCATE trigger")));
	if (!chorus_capture_start(td->tg_relation))
		return PointerGetDatum(NULL);
	t = chorus_table_for(td->tg_relation);
	if (!t->truncate_key_done)
	{
		chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, NULL, 0, NULL, NULL);
		t->truncate_key_done = true;
	}
	chorus_put_u8(&chorus_xact.rows, CHORUS_OP_TRUNCATE);
	chorus_put_u16(&chorus_xact.rows, (uint16) t->index);
	chorus_put_u8(&chorus_xact.rows, chorus_truncate_restart ? CHORUS_TRUNCATE_RESTART : 0);
	chorus_xact.nrows++;
	return PointerGetDatum(NULL);
}
