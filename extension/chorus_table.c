/*
 * chorus_table.c
 *		Describes a replicated table for the writeset, once per transaction (and
 *		again after a schema change): its columns and their flags, its identity
 *		(primary key, replica identity index, or the whole row), its unique keys
 *		and foreign keys for certification, and how each column's values travel
 *		(chorus_values.c). Descriptions are kept across transactions
 *		(chorus_table_cached) until an invalidation says the table changed.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "catalog/index.h"
#include "catalog/pg_class.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_index.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "chorus_table.h"
#include "chorus_values.h"
#include "chorus_wire.h"

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

/*
 * chorus_describe_table
 *		The writeset's description of relation rel, made in cxt (it lives as
 *		long as the transaction's capture) and marked with the capture's
 *		table epoch: columns, identity (primary key, or every column for
 *		REPLICA IDENTITY FULL) and unique keys.
 */
ChorusTable *
chorus_describe_table(Relation rel, MemoryContext cxt, int epoch)
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

	old = MemoryContextSwitchTo(cxt);
	t = palloc0(sizeof(ChorusTable));
	t->relid = relid;
	t->epoch = epoch;
	t->nspname = get_namespace_name(RelationGetNamespace(rel));
	t->relname = pstrdup(RelationGetRelationName(rel));
	t->attnums = palloc(sizeof(AttrNumber) * desc->natts);
	t->attnames = palloc(sizeof(char *) * desc->natts);
	t->typnames = palloc(sizeof(char *) * desc->natts);
	t->colflags = palloc0(sizeof(uint8) * desc->natts);
	t->colkind = palloc0(sizeof(uint8) * desc->natts);
	t->valfn = palloc0(sizeof(FmgrInfo) * desc->natts);
	t->textfn = palloc0(sizeof(FmgrInfo) * desc->natts);
	t->oldsent = palloc0(sizeof(bool) * Max(desc->natts, 1));
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
		t->colkind[i] = chorus_column_io(att->atttypid, t->keycol[i], cxt, &t->valfn[i],
										 &t->textfn[i], &t->canonical, &t->qualify);
	}
	MemoryContextSwitchTo(old);
	return t;
}

/*
 * The descriptions kept across transactions, one per table, each in its own
 * memory context under CacheMemoryContext. Describing a table costs catalog
 * lookups, index opens and function lookups per column: kept, a transaction
 * that writes a known table pays none of them.
 *
 * An invalidation retires descriptions instead of freeing them: the current
 * transaction's capture may hold one (cap->tables). Retired contexts are freed
 * when the capture is forgotten at the end of the transaction
 * (chorus_table_cache_release). What drops a description:
 *	- a relcache invalidation of the table (columns, indexes, constraints,
 *	  replica identity, name, schema, a foreign key made or dropped: each
 *	  invalidates the table's relcache entry), or of every table;
 *	- any relcache invalidation, for the tables with foreign keys: the parent's
 *	  name and key columns are part of their description;
 *	- a change of any schema's or type's catalog row (a schema renamed, a type
 *	  renamed or given other I/O functions): every description is dropped.
 * A description made while an invalidation arrived is used by that
 * transaction only.
 */
typedef struct ChorusTableCacheEntry
{
	Oid			relid;			/* the hash key */
	MemoryContext cxt;
	ChorusTable *table;
} ChorusTableCacheEntry;

static HTAB *chorus_table_cache = NULL;
static List *chorus_table_retired = NIL;	/* contexts, in CacheMemoryContext */
static uint64 chorus_table_invals = 0;

static void
chorus_table_retire(ChorusTableCacheEntry *e)
{
	MemoryContext old = MemoryContextSwitchTo(CacheMemoryContext);

	chorus_table_retired = lappend(chorus_table_retired, e->cxt);
	MemoryContextSwitchTo(old);
	(void) hash_search(chorus_table_cache, &e->relid, HASH_REMOVE, NULL);
}

static void
chorus_table_relcache_inval(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS seq;
	ChorusTableCacheEntry *e;

	chorus_table_invals++;
	hash_seq_init(&seq, chorus_table_cache);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (!OidIsValid(relid) || e->relid == relid || e->table->nfkeys > 0)
			chorus_table_retire(e);	/* (removing the current entry is allowed) */
}

static void
chorus_table_syscache_inval(Datum arg, int cacheid, uint32 hashvalue)
{
	chorus_table_relcache_inval(arg, InvalidOid);
}

/*
 * chorus_table_cached
 *		rel's description with epoch 0, kept across transactions. Only for a
 *		transaction that made no schema change before (its catalog rows are its
 *		own until it commits: chorus_table_for describes tables anew then).
 */
ChorusTable *
chorus_table_cached(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	ChorusTableCacheEntry *e;
	MemoryContext cxt;
	ChorusTable *t;
	uint64		invals;
	bool		found;

	if (chorus_table_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(ChorusTableCacheEntry);
		ctl.hcxt = CacheMemoryContext;
		chorus_table_cache = hash_create("chorus table descriptions", 64, &ctl,
										 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		CacheRegisterRelcacheCallback(chorus_table_relcache_inval, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, chorus_table_syscache_inval, (Datum) 0);
		CacheRegisterSyscacheCallback(TYPEOID, chorus_table_syscache_inval, (Datum) 0);
	}
	e = hash_search(chorus_table_cache, &relid, HASH_FIND, NULL);
	if (e != NULL)
		return e->table;

	cxt = AllocSetContextCreate(CacheMemoryContext, "chorus table description", ALLOCSET_SMALL_SIZES);
	invals = chorus_table_invals;
	PG_TRY();
	{
		t = chorus_describe_table(rel, cxt, 0);
	}
	PG_CATCH();
	{
		MemoryContextDelete(cxt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (invals != chorus_table_invals)
	{
		/* the catalog moved while it was read: this transaction's only */
		MemoryContext old = MemoryContextSwitchTo(CacheMemoryContext);

		chorus_table_retired = lappend(chorus_table_retired, cxt);
		MemoryContextSwitchTo(old);
		return t;
	}
	e = hash_search(chorus_table_cache, &relid, HASH_ENTER, &found);
	Assert(!found);
	e->cxt = cxt;
	e->table = t;
	return t;
}

/*
 * chorus_table_cache_release
 *		Free the retired descriptions: no capture holds them any more (the end
 *		of a transaction).
 */
void
chorus_table_cache_release(void)
{
	ListCell   *lc;

	if (chorus_table_retired == NIL)
		return;
	foreach(lc, chorus_table_retired)
		MemoryContextDelete((MemoryContext) lfirst(lc));
	list_free(chorus_table_retired);
	chorus_table_retired = NIL;
}

/*
 * old_columns_entry
 *		Whether entry (len bytes of a chorus.link_old_columns list, one
 *		"schema.table:column,column") names table t; if so, each column it
 *		lists that t has is marked in t->oldsent. Returns -1 when the entry is
 *		malformed (no schema, table or column).
 */
static int
old_columns_entry(ChorusTable *t, const char *entry, int len)
{
	const char *dot = memchr(entry, '.', len);
	const char *colon = memchr(entry, ':', len);
	const char *p;
	const char *end = entry + len;
	int			matched = 0;

	if (dot == NULL || colon == NULL || dot == entry || colon <= dot + 1 || colon + 1 >= end)
		return -1;
	if (t == NULL || strlen(t->nspname) != (size_t) (dot - entry) ||
		strncmp(t->nspname, entry, dot - entry) != 0 ||
		strlen(t->relname) != (size_t) (colon - dot - 1) || strncmp(t->relname, dot + 1, colon - dot - 1) != 0)
		t = NULL;
	for (p = colon + 1; p < end;)
	{
		const char *comma = memchr(p, ',', end - p);
		const char *stop = comma != NULL ? comma : end;
		int			i;

		if (stop == p)
			return -1;
		for (i = 0; t != NULL && i < t->ncols; i++)
			if (strlen(t->attnames[i]) == (size_t) (stop - p) && strncmp(t->attnames[i], p, stop - p) == 0)
			{
				t->oldsent[i] = true;
				matched++;
			}
		p = comma != NULL ? comma + 1 : end;
	}
	return matched;
}

/*
 * old_columns_walk
 *		Each entry of spec (entries separated by ';', spaces around them
 *		ignored) through old_columns_entry. Returns -1 if one is malformed,
 *		else how many columns of t were marked.
 */
static int
old_columns_walk(ChorusTable *t, const char *spec)
{
	const char *p = spec;
	int			marked = 0;

	while (p != NULL && *p != '\0')
	{
		const char *semi = strchr(p, ';');
		const char *stop = semi != NULL ? semi : p + strlen(p);
		int			n;

		while (p < stop && *p == ' ')
			p++;
		while (stop > p && stop[-1] == ' ')
			stop--;
		if (stop > p)
		{
			if ((n = old_columns_entry(t, p, (int) (stop - p))) < 0)
				return -1;
			marked += n;
		}
		p = semi != NULL ? semi + 1 : NULL;
	}
	return marked;
}

/*
 * chorus_table_old_columns
 *		Set which columns t's old images carry from chorus.link_old_columns
 *		(spec: "schema.table:column,column; ..."): the identity's and the
 *		listed ones, if it lists any of t's (docs/LINKS.md section 7.1: the
 *		delta policy needs the old values of its counters). A table found by
 *		its whole old row carries every column already.
 */
void
chorus_table_old_columns(ChorusTable *t, const char *spec)
{
	int			i;

	if (!t->old_columns && (spec == NULL || spec[0] == '\0'))
		return;
	memset(t->oldsent, 0, sizeof(bool) * Max(t->ncols, 1));
	t->old_columns = !t->full_identity && old_columns_walk(t, spec) > 0;
	for (i = 0; i < t->nidentity; i++)
		t->oldsent[t->identity[i]] = true;
}

/* Whether spec is a well-formed chorus.link_old_columns list (its check hook). */
bool
chorus_old_columns_valid(const char *spec)
{
	return old_columns_walk(NULL, spec) >= 0;
}

/* The owner of relation relid (an error if there is none). */
Oid
chorus_relation_owner(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("chorus: relation %u does not exist", relid)));
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}
