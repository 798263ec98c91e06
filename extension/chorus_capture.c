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

#define COL_IDENTITY 0x01
#define COL_GENERATED 0x02

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
static void
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
		chorus_xact.maxsubs = n;
	}
	chorus_xact.sub_ids[chorus_xact.nsubs] = subid;
	chorus_xact.sub_rowlen[chorus_xact.nsubs] = chorus_xact.rows.len;
	chorus_xact.sub_nrows[chorus_xact.nsubs] = chorus_xact.nrows;
	chorus_xact.nsubs++;
	MemoryContextSwitchTo(old);
}

/*
 * chorus_subxact_abort
 *		A savepoint was rolled back: drop the rows it captured. Its keys stay (a
 *		key too many can only cause a false conflict, never a missed one).
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
	Oid			pkoid;
	int			i,
				n;
	int		   *colof;

	for (i = 0; i < chorus_xact.ntables; i++)
		if (chorus_xact.tables[i]->relid == relid)
			return chorus_xact.tables[i];

	if (chorus_xact.ntables >= PG_UINT16_MAX)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("chorus: a transaction may write at most %d tables", PG_UINT16_MAX)));

	old = MemoryContextSwitchTo(chorus_xact.cxt);
	t = palloc0(sizeof(ChorusTable));
	t->relid = relid;
	t->nspname = get_namespace_name(RelationGetNamespace(rel));
	t->relname = pstrdup(RelationGetRelationName(rel));
	t->attnums = palloc(sizeof(AttrNumber) * desc->natts);
	t->attnames = palloc(sizeof(char *) * desc->natts);
	t->typnames = palloc(sizeof(char *) * desc->natts);
	t->colflags = palloc0(sizeof(uint8) * desc->natts);
	t->typoutput = palloc(sizeof(Oid) * desc->natts);
	colof = palloc(sizeof(int) * (desc->natts + 1));
	n = 0;
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		bool		varlena;

		colof[i + 1] = -1;
		if (att->attisdropped)
			continue;
		t->attnums[n] = att->attnum;
		t->attnames[n] = pstrdup(NameStr(att->attname));
		t->typnames[n] = format_type_be(att->atttypid);
		if (att->attidentity != '\0')
			t->colflags[n] |= COL_IDENTITY;
		if (att->attgenerated == ATTRIBUTE_GENERATED_STORED)
			t->colflags[n] |= COL_GENERATED;
		getTypeOutputInfo(att->atttypid, &t->typoutput[n], &varlena);
		colof[i + 1] = n;
		n++;
	}
	t->ncols = n;

	/* unique keys, primary key first */
	pkoid = RelationGetPrimaryKeyIndex(rel);
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

				/* keep the primary key at position 0 */
				if (indexoid == pkoid && t->nunique > 0)
				{
					t->uniques[t->nunique] = t->uniques[0];
					u = &t->uniques[0];
				}
				else
					u = &t->uniques[t->nunique];
				t->nunique++;
				u->is_pk = (indexoid == pkoid);
				u->ncols = ind->indnkeyatts;
				u->cols = palloc(sizeof(int) * u->ncols);
				initStringInfo(&names);
				for (k = 0; k < ind->indnkeyatts; k++)
				{
					u->cols[k] = colof[ind->indkey.values[k]];
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

	t->has_pk = (t->nunique > 0 && t->uniques[0].is_pk);
	if (t->has_pk)
	{
		t->nidentity = t->uniques[0].ncols;
		t->identity = t->uniques[0].cols;
	}
	else if (rel->rd_rel->relreplident == REPLICA_IDENTITY_FULL)
	{
		t->nidentity = t->ncols;
		t->identity = palloc(sizeof(int) * t->ncols);
		for (i = 0; i < t->ncols; i++)
			t->identity[i] = i;
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
 * chorus_values
 *		Text output of every column of tuple, NULL as NULL pointer.
 */
static char **
chorus_values(ChorusTable *t, HeapTuple tuple, TupleDesc desc)
{
	char	  **vals = palloc(sizeof(char *) * t->ncols);
	int			i;

	for (i = 0; i < t->ncols; i++)
	{
		bool		isnull;
		Datum		d;

		if (t->colflags[i] & COL_GENERATED)
		{
			vals[i] = NULL;
			continue;
		}
		d = heap_getattr(tuple, t->attnums[i], desc, &isnull);
		vals[i] = isnull ? NULL : OidOutputFunctionCall(t->typoutput[i], d);
	}
	return vals;
}

static void
chorus_put_value(StringInfo buf, const char *v)
{
	if (v == NULL)
		chorus_put_u8(buf, 'n');
	else
	{
		chorus_put_u8(buf, 't');
		chorus_put_blob(buf, v, strlen(v));
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
 *		Keys of one row change (docs/PROTOCOL.md section 3).
 */
static void
chorus_row_keys(ChorusTable *t, char op, char **oldv, char **newv)
{
	int			i;

	for (i = 0; i < t->nunique; i++)
	{
		ChorusUniqueKey *u = &t->uniques[i];

		if (op == 'I' || op == 'D')
		{
			char	  **v = (op == 'I') ? newv : oldv;

			if (chorus_key_complete(u, v))
				chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, v);
		}
		else if (chorus_key_equal(u, oldv, newv))
		{
			if (u->is_pk && chorus_key_complete(u, newv))
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
	for (i = 0; i < t->nfkeys && op != 'D'; i++)
	{
		ChorusForeignKey *f = &t->fkeys[i];
		ChorusUniqueKey fk = {f->colnames, f->ncols, f->cols, false};

		if (!chorus_key_complete(&fk, newv))
			continue;
		if (op == 'U' && chorus_key_equal(&fk, oldv, newv))
			continue;
		chorus_add_key_of(f->nspname, f->relname, CHORUS_KEY_REFERENCE, f->colnames, f->ncols,
						  f->cols, newv);
	}
	if (!t->has_pk && t->nidentity > 0 && op != 'I')
	{
		/* REPLICA IDENTITY FULL: the old row's full image identifies it */
		StringInfo	buf = &chorus_xact.keys;
		int			k;

		chorus_put_u8(buf, op == 'U' ? CHORUS_KEY_UPDATE : CHORUS_KEY_EXCLUSIVE);
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
		if (op == 'U' && oldv && newv)
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
static void
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
chorus_capture_start(Relation rel, ChorusTable **tp)
{
	if (!chorus_capture_enabled || chorus_xact.applying)
		return false;
	if (rel->rd_rel->relpersistence != RELPERSISTENCE_PERMANENT)
		return false;
	chorus_check_writable();
	chorus_xact_begin_capture();
	*tp = chorus_table_for(rel);
	chorus_note_snapshot();
	return true;
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
	TupleDesc	desc;
	ChorusTable *t;
	char		op;
	char	  **oldv = NULL;
	char	  **newv = NULL;
	int			i;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						errmsg("chorus.capture() must be an AFTER ... FOR EACH ROW trigger")));
	rel = td->tg_relation;
	if (TRIGGER_FIRED_BY_INSERT(td->tg_event))
		op = 'I';
	else if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
		op = 'U';
	else
		op = 'D';

	if (!chorus_capture_start(rel, &t))
		return PointerGetDatum(NULL);

	if (op != 'I' && t->nidentity == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("chorus: cannot replicate %s on table \"%s\".\"%s\" without a primary key",
						op == 'U' ? "UPDATE" : "DELETE", t->nspname, t->relname),
				 errdetail("Other nodes could not tell which row to change."),
				 errhint("Add a primary key, or run ALTER TABLE ... REPLICA IDENTITY FULL.")));

	/* values live in the trigger's per-call memory; only the buffers grow */
	desc = RelationGetDescr(rel);
	if (op != 'I')
		oldv = chorus_values(t, td->tg_trigtuple, desc);
	if (op == 'I')
		newv = chorus_values(t, td->tg_trigtuple, desc);
	else if (op == 'U')
		newv = chorus_values(t, td->tg_newtuple, desc);

	if (!t->table_key_done)
	{
		chorus_add_key(t, CHORUS_KEY_REFERENCE, NULL, 0, NULL, NULL);
		t->table_key_done = true;
	}
	chorus_row_keys(t, op, oldv, newv);
	if (t->nexpr > 0)
		chorus_expr_keys(rel, t, op, op != 'I' ? td->tg_trigtuple : NULL,
						 op == 'I' ? td->tg_trigtuple : op == 'U' ? td->tg_newtuple : NULL);

	chorus_put_u8(&chorus_xact.rows, (uint8) op);
	chorus_put_u16(&chorus_xact.rows, (uint16) t->index);
	if (oldv)
	{
		chorus_put_u16(&chorus_xact.rows, (uint16) t->nidentity);
		for (i = 0; i < t->nidentity; i++)
			chorus_put_value(&chorus_xact.rows, oldv[t->identity[i]]);
	}
	if (newv)
	{
		chorus_put_u16(&chorus_xact.rows, (uint16) t->ncols);
		for (i = 0; i < t->ncols; i++)
			chorus_put_value(&chorus_xact.rows, newv[i]);
	}
	chorus_xact.nrows++;

	if (oldv)
		pfree(oldv);
	if (newv)
		pfree(newv);
	chorus_check_size();
	return PointerGetDatum(NULL);
}

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
	if (!chorus_capture_start(td->tg_relation, &t))
		return PointerGetDatum(NULL);
	if (!t->truncate_key_done)
	{
		chorus_add_key(t, CHORUS_KEY_EXCLUSIVE, NULL, 0, NULL, NULL);
		t->truncate_key_done = true;
	}
	chorus_put_u8(&chorus_xact.rows, 'T');
	chorus_put_u16(&chorus_xact.rows, (uint16) t->index);
	chorus_xact.nrows++;
	return PointerGetDatum(NULL);
}
