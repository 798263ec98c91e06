/*
 * chorus_keys.c
 *		The certification keys of a row change (docs/PROTOCOL.md section 3):
 *		from the text of its unique key, foreign key and identity columns, and
 *		the values of its unique indexes on expressions, appended to the
 *		writeset's key list. Each function returns how many keys it appended.
 */
#include "postgres.h"

#include "access/genam.h"
#include "catalog/index.h"
#include "executor/executor.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "chorus_keys.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

/*
 * chorus_add_key_of / chorus_add_key
 *		Append one key to keys and count it in *nkeys: [nspname, relname,
 *		colnames, values...] or the table key when colnames is NULL.
 */
static void
chorus_add_key_of(StringInfo keys, uint32 *nkeys, const char *nspname, const char *relname,
				  uint8 mode, const char *colnames, int ncols, const int *cols, char **vals)
{
	StringInfo	buf = keys;
	int			k;

	chorus_put_key_head(buf, mode, colnames ? 3 + ncols : 2);
	chorus_put_blob(buf, nspname, strlen(nspname));
	chorus_put_blob(buf, relname, strlen(relname));
	if (colnames)
	{
		chorus_put_blob(buf, colnames, strlen(colnames));
		for (k = 0; k < ncols; k++)
			chorus_put_blob(buf, vals[cols[k]], strlen(vals[cols[k]]));
	}
	(*nkeys)++;
}

static void
chorus_add_key(StringInfo keys, uint32 *nkeys, ChorusTable *t, uint8 mode, const char *colnames,
			   int ncols, const int *cols, char **vals)
{
	chorus_add_key_of(keys, nkeys, t->nspname, t->relname, mode, colnames, ncols, cols, vals);
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
 *		the key columns of its images, appended to keys. Returns how many.
 */
uint32
chorus_row_keys(StringInfo keys, ChorusTable *t, char op, char **oldv, char **newv)
{
	uint32		n = 0;
	int			i;

	for (i = 0; i < t->nunique; i++)
	{
		ChorusUniqueKey *u = &t->uniques[i];

		if (op == CHORUS_OP_INSERT || op == CHORUS_OP_DELETE)
		{
			char	  **v = (op == CHORUS_OP_INSERT) ? newv : oldv;

			if (chorus_key_complete(u, v))
				chorus_add_key(keys, &n, t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, v);
		}
		else if (chorus_key_equal(u, oldv, newv))
		{
			if (u->is_identity && chorus_key_complete(u, newv))
				chorus_add_key(keys, &n, t, CHORUS_KEY_UPDATE, u->colnames, u->ncols, u->cols, newv);
		}
		else
		{
			if (chorus_key_complete(u, oldv))
				chorus_add_key(keys, &n, t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, oldv);
			if (chorus_key_complete(u, newv))
				chorus_add_key(keys, &n, t, CHORUS_KEY_EXCLUSIVE, u->colnames, u->ncols, u->cols, newv);
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
		chorus_add_key_of(keys, &n, f->nspname, f->relname, CHORUS_KEY_REFERENCE, f->colnames, f->ncols,
						  f->cols, newv);
	}
	if (t->full_identity && op != CHORUS_OP_INSERT)
	{
		/* no primary key: the old row's full image identifies it */
		StringInfo	buf = keys;
		int			k;

		chorus_put_key_head(buf, op == CHORUS_OP_UPDATE ? CHORUS_KEY_UPDATE : CHORUS_KEY_EXCLUSIVE,
							3 + t->ncols);
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
		n++;
	}
	return n;
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
 *		changes them; appended to keys. Returns how many.
 */
uint32
chorus_expr_keys(StringInfo keys, Relation rel, ChorusTable *t, char op, HeapTuple oldtup,
				 HeapTuple newtup)
{
	EState	   *estate = CreateExecutorState();
	TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);
	uint32		added = 0;
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
			chorus_add_key(keys, &added, t, CHORUS_KEY_EXCLUSIVE, t->expr_names[i], n, cols, oldv);
		if (newv)
			chorus_add_key(keys, &added, t, CHORUS_KEY_EXCLUSIVE, t->expr_names[i], n, cols, newv);
		index_close(idx, AccessShareLock);
	}
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
	return added;
}
