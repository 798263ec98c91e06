/*
 * chorus_capture.c
 *		Owns the capture state of the backend's current transaction
 *		(ChorusCapture: its writeset's tables, rows, keys and last_seen, and
 *		its savepoint marks). The AFTER ROW and AFTER TRUNCATE triggers append
 *		each change of a replicated table with its certification keys
 *		(docs/PROTOCOL.md sections 2 and 3); chorus_serialize_writeset writes
 *		the whole writeset at commit.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "storage/buffile.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/rel.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_keys.h"
#include "chorus_settings.h"
#include "chorus_shmem.h"
#include "chorus_values.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

PG_FUNCTION_INFO_V1(chorus_capture);
PG_FUNCTION_INFO_V1(chorus_capture_truncate);

/* The current transaction's capture: only the trigger functions take it from here. */
static ChorusCapture chorus_capture_current;

/*
 * chorus_capture_state
 *		This backend's capture state, for the entry points (triggers, hooks,
 *		callbacks, SQL functions) to pass to the functions that use it.
 */
ChorusCapture *
chorus_capture_state(void)
{
	return &chorus_capture_current;
}

/*
 * chorus_capture_reset
 *		Forget the transaction's writeset (end of transaction).
 */
void
chorus_capture_reset(ChorusCapture *cap)
{
	if (cap->spill != NULL)
		BufFileClose(cap->spill);
	if (cap->cxt != NULL)
		MemoryContextDelete(cap->cxt);
	memset(cap, 0, sizeof(*cap));
	chorus_table_cache_release();	/* descriptions dropped while it held them */
}

/*
 * chorus_capture_begin
 *		Lazily set up the writeset buffers in a context that lives until the end
 *		of the top-level transaction.
 */
void
chorus_capture_begin(ChorusCapture *cap)
{
	MemoryContext old;

	if (cap->cxt != NULL)
		return;
	cap->cxt = AllocSetContextCreate(TopMemoryContext, "chorus writeset",
											ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cap->cxt);
	initStringInfo(&cap->rows);
	initStringInfo(&cap->keys);
	initStringInfo(&cap->rowkeys);
	cap->maxtables = 8;
	cap->tables = palloc0(sizeof(ChorusTable *) * cap->maxtables);
	MemoryContextSwitchTo(old);
}

/*
 * chorus_rows_keep
 *		Keep the first len bytes of the rows: the rest was captured in a
 *		savepoint rolled back. Spilled bytes past len are written over by the
 *		next spill.
 */
static void
chorus_rows_keep(ChorusCapture *cap, uint64 len)
{
	if (len >= cap->spilled)
		cap->rows.len = (int) (len - cap->spilled);
	else
	{
		cap->spilled = len;
		cap->rows.len = 0;
	}
	cap->rows.data[cap->rows.len] = '\0';
}

/*
 * chorus_capture_spill
 *		Past chorus.capture_work_mem, move the rows held in memory to the
 *		transaction's temporary file (made on first use, owned by the top-level
 *		transaction so that a savepoint's end does not close it).
 */
static void
chorus_capture_spill(ChorusCapture *cap)
{
	if ((Size) cap->rows.len < (Size) chorus_capture_work_mem * 1024)
		return;
	if (cap->spill == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(cap->cxt);
		ResourceOwner owner = CurrentResourceOwner;

		CurrentResourceOwner = TopTransactionResourceOwner;
		cap->spill = BufFileCreateTemp(false);
		CurrentResourceOwner = owner;
		MemoryContextSwitchTo(old);
	}
	if (BufFileSeek(cap->spill, 0, (off_t) cap->spilled, SEEK_SET) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("chorus: could not seek in the writeset's temporary file: %m")));
	BufFileWrite(cap->spill, cap->rows.data, cap->rows.len);
	cap->spilled += cap->rows.len;
	resetStringInfo(&cap->rows);
}

/*
 * chorus_subxact_start
 *		Remember where the row buffer stood when a savepoint began.
 */
void
chorus_subxact_start(ChorusCapture *cap, SubTransactionId subid)
{
	MemoryContext old;

	if (cap->cxt == NULL)
		return;					/* nothing captured yet: nothing to roll back */
	old = MemoryContextSwitchTo(cap->cxt);
	if (cap->nsubs == cap->maxsubs)
	{
		int			n = cap->maxsubs ? cap->maxsubs * 2 : 8;

		cap->sub_ids = cap->sub_ids ?
			repalloc(cap->sub_ids, sizeof(SubTransactionId) * n) : palloc(sizeof(SubTransactionId) * n);
		cap->sub_rowlen = cap->sub_rowlen ?
			repalloc(cap->sub_rowlen, sizeof(uint64) * n) : palloc(sizeof(uint64) * n);
		cap->sub_nrows = cap->sub_nrows ?
			repalloc(cap->sub_nrows, sizeof(uint32) * n) : palloc(sizeof(uint32) * n);
		cap->sub_has_schema = cap->sub_has_schema ?
			repalloc(cap->sub_has_schema, sizeof(bool) * n) : palloc(sizeof(bool) * n);
		cap->maxsubs = n;
	}
	cap->sub_ids[cap->nsubs] = subid;
	cap->sub_rowlen[cap->nsubs] = cap->spilled + cap->rows.len;
	cap->sub_nrows[cap->nsubs] = cap->nrows;
	cap->sub_has_schema[cap->nsubs] = cap->has_schema;
	cap->nsubs++;
	MemoryContextSwitchTo(old);
}

/*
 * chorus_subxact_abort
 *		A savepoint was rolled back: drop the rows and schema changes it captured
 *		(PostgreSQL rolled them back). Its keys stay (a key too many can only
 *		cause a false conflict, never a missed one). subid: the aborted
 *		subtransaction.
 */
void
chorus_subxact_abort(ChorusCapture *cap, SubTransactionId subid)
{
	int			i;

	if (cap->cxt == NULL)
		return;
	for (i = cap->nsubs - 1; i >= 0; i--)
	{
		if (cap->sub_ids[i] == subid)
		{
			chorus_rows_keep(cap, cap->sub_rowlen[i]);
			cap->nrows = cap->sub_nrows[i];
			cap->has_schema = cap->sub_has_schema[i];
			cap->nsubs = i;
			return;
		}
	}
	/*
	 * No mark: the savepoint began before the first capture (subtransaction
	 * ids grow), so everything captured so far belongs to it.
	 */
	if (cap->nsubs == 0 || subid < cap->sub_ids[0])
	{
		chorus_rows_keep(cap, 0);
		cap->nrows = 0;
		cap->has_schema = false;
		cap->nsubs = 0;
	}
}

/*
 * chorus_subxact_commit
 *		A savepoint was released: its rows stay; forget its mark.
 */
void
chorus_subxact_commit(ChorusCapture *cap, SubTransactionId subid)
{
	if (cap->nsubs > 0 && cap->sub_ids[cap->nsubs - 1] == subid)
		cap->nsubs--;
}

/*
 * chorus_table_for
 *		The capture's description of relation rel: the one kept across
 *		transactions (chorus_table.c), or, after a schema change in this
 *		transaction, made anew for the transaction after each one.
 */
static ChorusTable *
chorus_table_for(ChorusCapture *cap, Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	ChorusTable *t;
	int			i;

	/* a schema change earlier in the transaction may have changed the table: describe it anew */
	for (i = cap->ntables - 1; i >= 0; i--)
		if (cap->tables[i]->relid == relid && cap->tables[i]->epoch == cap->table_epoch)
			return cap->tables[i];

	if (cap->ntables >= PG_UINT16_MAX)
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("chorus: a transaction may write at most %d tables", PG_UINT16_MAX)));

	if (cap->table_epoch == 0 && !cap->has_schema)
		t = chorus_table_cached(rel);
	else
		t = chorus_describe_table(rel, cap->cxt, cap->table_epoch);
	t->truncate_key_done = false;
	/* once per writeset: every row of the table in it has old images of one width */
	chorus_table_old_columns(t, chorus_link_old_columns);
	if (cap->ntables == cap->maxtables)
	{
		cap->maxtables *= 2;
		cap->tables = repalloc(cap->tables, sizeof(ChorusTable *) * cap->maxtables);
	}
	t->index = cap->ntables;
	cap->tables[cap->ntables++] = t;
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
 * chorus_put_image_value
 *		Column c of an image: NULL, the binary send form, or the text output.
 */
static void
chorus_put_image_value(StringInfo buf, ChorusTable *t, ChorusImage *img, int c)
{
	if (img->isnull[c])
		chorus_put_value(buf, CHORUS_VAL_NULL, NULL, 0);
	else if (t->colkind[c] == CHORUS_VAL_BINARY)
	{
		bytea	   *b = SendFunctionCall(&t->valfn[c], img->values[c]);

		chorus_put_value(buf, CHORUS_VAL_BINARY, VARDATA(b), VARSIZE(b) - VARHDRSZ);
		pfree(b);
	}
	else
	{
		char	   *s = img->text[c] ? img->text[c] : OutputFunctionCall(&t->valfn[c], img->values[c]);

		chorus_put_value(buf, CHORUS_VAL_TEXT, s, strlen(s));
	}
}

/*
 * chorus_unchanged_toast
 *		Is column c of an UPDATE's new image an out-of-line (TOAST) value that
 *		the UPDATE left alone? Then PostgreSQL kept the old value's pointer in
 *		the new row, and the value need not travel (seed 12.7): the writeset
 *		says "unchanged" and the applier keeps the value it has, as logical
 *		replication does.
 */
static bool
chorus_unchanged_toast(TupleDesc desc, ChorusTable *t, ChorusImage *oldi, ChorusImage *newi, int c)
{
	Pointer		o,
				n;

	if (oldi->isnull[c] || newi->isnull[c] || TupleDescAttr(desc, t->attnums[c] - 1)->attlen != -1)
		return false;
	o = DatumGetPointer(oldi->values[c]);
	n = DatumGetPointer(newi->values[c]);
	return VARATT_IS_EXTERNAL_ONDISK(n) && VARATT_IS_EXTERNAL_ONDISK(o) &&
		VARSIZE_EXTERNAL(n) == VARSIZE_EXTERNAL(o) && memcmp(n, o, VARSIZE_EXTERNAL(n)) == 0;
}

/*
 * chorus_note_snapshot
 *		last_seen of the transaction = the minimum over its captures of the
 *		newest GID visible to the snapshot the capture ran under.
 */
void
chorus_note_snapshot(ChorusCapture *cap)
{
	Snapshot	snap = GetActiveSnapshot();
	uint64		seen;

	/*
	 * The rows of one statement share its snapshot: what it sees of the order
	 * was noted at the first. Two snapshots with the same bounds built at the
	 * same count of completed transactions see the same transactions (as
	 * GetSnapshotData's reuse of a snapshot relies on).
	 */
	if (snap != NULL && cap->has_last_seen && snap->snapXactCompletionCount != 0 &&
		snap->snapXactCompletionCount == cap->noted_completions &&
		snap->xmin == cap->noted_xmin && snap->xmax == cap->noted_xmax)
		return;
	seen = chorus_visible_gid();
	if (!cap->has_last_seen || seen < cap->last_seen)
		cap->last_seen = seen;
	cap->has_last_seen = true;
	cap->noted_completions = snap != NULL ? snap->snapXactCompletionCount : 0;
	cap->noted_xmin = snap != NULL ? snap->xmin : InvalidTransactionId;
	cap->noted_xmax = snap != NULL ? snap->xmax : InvalidTransactionId;
}

static void
chorus_check_size(ChorusCapture *cap)
{
	uint64		size = cap->spilled + cap->rows.len + cap->keys.len;

	chorus_capture_spill(cap);
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
 *		to be captured (applying: the transaction applies a certified writeset).
 */
static bool
chorus_capture_start(ChorusCapture *cap, bool applying, Relation rel)
{
	if (!chorus_capture_enabled || applying)
		return false;
	if (rel->rd_rel->relpersistence != RELPERSISTENCE_PERMANENT)
		return false;
	/* once a transaction: a node that stops taking writes later refuses the writeset at commit */
	if (!cap->writable_checked)
		cap->write_epoch = chorus_check_writable();
	chorus_capture_begin(cap);
	cap->writable_checked = true;
	chorus_note_snapshot(cap);
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
chorus_capture_row(ChorusCapture *cap, Relation rel, char op, HeapTuple oldtup, HeapTuple newtup,
				   bool keys)
{
	TupleDesc	desc = RelationGetDescr(rel);
	ChorusTable *t = chorus_table_for(cap, rel);
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
		cap->nkeys += chorus_keylimit_table_key(&cap->keylimit, cap->cxt, &cap->keys, t->nspname, t->relname);
		/* through the limit of row keys per table (chorus_keylimit.c) */
		resetStringInfo(&cap->rowkeys);
		(void) chorus_row_keys(&cap->rowkeys, t, op, oldtup ? oldi.text : NULL, newtup ? newi.text : NULL);
		if (t->nexpr > 0)
			(void) chorus_expr_keys(&cap->rowkeys, rel, t, op, oldtup, newtup);
		cap->nkeys += chorus_keylimit_append(&cap->keylimit, cap->cxt, &cap->keys, cap->rowkeys.data,
											 cap->rowkeys.len, chorus_max_row_keys_per_table);
	}

	chorus_put_row_head(&cap->rows, op, t->index);
	if (oldtup != NULL && t->old_columns)
	{
		/* a value per column: the identity's and the captured ones, the others not sent */
		chorus_put_u16(&cap->rows, (uint16) t->ncols);
		for (i = 0; i < t->ncols; i++)
		{
			if (t->oldsent[i])
				chorus_put_image_value(&cap->rows, t, &oldi, i);
			else
				chorus_put_value(&cap->rows, CHORUS_VAL_UNCHANGED, NULL, 0);
		}
	}
	else if (oldtup != NULL)
	{
		chorus_put_u16(&cap->rows, (uint16) t->nidentity);
		for (i = 0; i < t->nidentity; i++)
			chorus_put_image_value(&cap->rows, t, &oldi, t->identity[i]);
	}
	if (newtup != NULL)
	{
		chorus_put_u16(&cap->rows, (uint16) t->ncols);
		for (i = 0; i < t->ncols; i++)
		{
			/* (a schema change's shipped rows pass one tuple as both: their values must travel) */
			if (oldtup != NULL && oldtup != newtup && chorus_unchanged_toast(desc, t, &oldi, &newi, i))
				chorus_put_value(&cap->rows, CHORUS_VAL_UNCHANGED, NULL, 0);
			else
				chorus_put_image_value(&cap->rows, t, &newi, i);
		}
	}
	cap->nrows++;
	chorus_canonical_exit(nest);
	chorus_check_size(cap);
}

/* The transaction's description of rel (made at its first capture). */
ChorusTable *
chorus_capture_table(ChorusCapture *cap, Relation rel)
{
	chorus_capture_begin(cap);
	return chorus_table_for(cap, rel);
}

/*
 * chorus_capture
 *		AFTER INSERT OR UPDATE OR DELETE ... FOR EACH ROW.
 */
Datum
chorus_capture(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	ChorusCapture *cap = chorus_capture_state();
	Relation	rel;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						errmsg("chorus.capture() must be an AFTER ... FOR EACH ROW trigger")));
	rel = td->tg_relation;
	if (!chorus_capture_start(cap, chorus_commit_state()->applying, rel))
		return PointerGetDatum(NULL);
	if (TRIGGER_FIRED_BY_INSERT(td->tg_event))
		chorus_capture_row(cap, rel, CHORUS_OP_INSERT, NULL, td->tg_trigtuple, true);
	else if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
		chorus_capture_row(cap, rel, CHORUS_OP_UPDATE, td->tg_trigtuple, td->tg_newtuple, true);
	else
		chorus_capture_row(cap, rel, CHORUS_OP_DELETE, td->tg_trigtuple, NULL, true);
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
	ChorusCapture *cap = chorus_capture_state();
	ChorusTable *t;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_TRUNCATE(td->tg_event))
		ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
						errmsg("chorus.capture_truncate() must be an AFTER TRUNCATE trigger")));
	if (!chorus_capture_start(cap, chorus_commit_state()->applying, td->tg_relation))
		return PointerGetDatum(NULL);
	t = chorus_table_for(cap, td->tg_relation);
	if (!t->truncate_key_done)
	{
		chorus_put_table_key(&cap->keys, CHORUS_KEY_EXCLUSIVE, t->nspname, t->relname);
		cap->nkeys++;
		t->truncate_key_done = true;
	}
	chorus_put_truncate(&cap->rows, t->index, chorus_truncate_restart ? CHORUS_TRUNCATE_RESTART : 0);
	cap->nrows++;
	return PointerGetDatum(NULL);
}

/*
 * chorus_serialize_writeset
 *		The transaction's writeset, as captured in cap: its header and table
 *		list are appended to head (after what the caller put there), and body
 *		gets the whole frame body in parts: head, the rows (and schema change
 *		items, in their order; spilled ones from the temporary file), the keys.
 *		Valid until the capture changes.
 */
void
chorus_serialize_writeset(ChorusCapture *cap, StringInfo head, ChorusFrameBody *body,
						  TransactionId xid, uint8 flags)
{
	int			i;

	if (cap->has_schema)
		flags |= CHORUS_WS_FLAG_DDL;
	if (cap->concurrent)
		flags |= CHORUS_WS_FLAG_CONCURRENT;
	cap->nkeys = chorus_keylimit_finish(&cap->keylimit, &cap->keys, cap->nkeys);
	chorus_put_header(head, flags, xid, cap->last_seen, cap->ntables,
					  cap->nrows, cap->nkeys);
	for (i = 0; i < cap->ntables; i++)
	{
		ChorusTable *t = cap->tables[i];

		chorus_put_table(head, t->nspname, t->relname, t->ncols, t->attnames, t->typnames,
						 t->colflags, t->nidentity, t->identity,
						 (t->full_identity ? CHORUS_TABLE_FULL_IDENTITY : 0) |
						 (t->old_columns ? CHORUS_TABLE_OLD_COLUMNS : 0));
	}
	memset(body, 0, sizeof(*body));
	body->head = head->data;
	body->headlen = head->len;
	body->file = cap->spill;
	body->filelen = cap->spilled;
	body->tail[0] = cap->rows.data;
	body->taillen[0] = cap->rows.len;
	body->tail[1] = cap->keys.data;
	body->taillen[1] = cap->keys.len;
}
