/*
 * chorus_apply_exec.c
 *		Applying a writeset's rows through the executor's replication helpers,
 *		as PostgreSQL's logical replication worker does: a row is inserted with
 *		ExecSimpleRelationInsert, and an updated or deleted row is found by
 *		RelationFindReplTupleByIndex on the table's identity index (locked as
 *		an UPDATE locks it) and changed with ExecSimpleRelationUpdate or
 *		ExecSimpleRelationDelete. Constraints, indexes, stored generated
 *		columns, partition checks and the triggers that fire in replica mode
 *		behave as they do in logical replication, except CHECK constraints,
 *		which are the origin's to check (chorus_apply_skip_checks); AFTER ROW
 *		triggers fire at the end of the writeset (or before a TRUNCATE or
 *		schema change in it, or before rows of a table of another owner).
 *
 *		One executor state serves one writeset (ApplyExec): each of its tables
 *		is opened, with its indexes and slots, at its first row (ApplyTarget).
 *		What does not change between writesets (column mapping, functions,
 *		the index) is kept in the table's ApplyRel (chorus_apply_table.c).
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "chorus_apply_exec.h"
#include "chorus_wire.h"

/* One table of the writeset, open for the executor. */
typedef struct ApplyTarget
{
	Relation	rel;
	ResultRelInfo *rri;
	TupleTableSlot *newslot;	/* the row to write */
	TupleTableSlot *searchslot; /* the identity to find */
	TupleTableSlot *localslot;	/* the row found, locked */
	EPQState	epq;
} ApplyTarget;

struct ApplyExec
{
	EState	   *estate;
	ApplyTable *tables;
	int			ntables;
	ApplyTarget *targets;		/* per table, rel NULL until its first row */
	int			queued;			/* rows since the AFTER triggers last fired */
};

#define CHORUS_APPLY_TRIGGER_BATCH 10000

/*
 * chorus_apply_exec_begin
 *		An executor state for the rows of one writeset's tables (resolved or
 *		not yet), with its own level of AFTER triggers and a snapshot taken now.
 */
ApplyExec *
chorus_apply_exec_begin(ApplyTable *tables, int ntables)
{
	ApplyExec  *ex = palloc0(sizeof(ApplyExec));
	List	   *rtable = NIL;
	int			i;

	ex->tables = tables;
	ex->ntables = ntables;
	ex->targets = palloc0(sizeof(ApplyTarget) * Max(ntables, 1));
	ex->estate = CreateExecutorState();
	for (i = 0; i < ntables; i++)
	{
		RangeTblEntry *rte = makeNode(RangeTblEntry);

		rte->rtekind = RTE_RELATION;
		rte->relkind = RELKIND_RELATION;
		rte->rellockmode = RowExclusiveLock;
		rtable = lappend(rtable, rte);	/* its relid at the table's first row */
	}
	ExecInitRangeTable(ex->estate, rtable);
	PushActiveSnapshot(GetTransactionSnapshot());
	ex->estate->es_snapshot = GetActiveSnapshot();	/* its command ID follows each row's */
	ex->estate->es_output_cid = GetCurrentCommandId(true);
	AfterTriggerBeginQuery();
	return ex;
}

/*
 * chorus_apply_skip_checks
 *		A result relation's CHECK constraints are not evaluated in an apply:
 *		they are the origin's to check, as foreign keys are (apply sessions run
 *		in replica mode). The origin checked the same row under the same
 *		definition (certification fails a writeset that did not see a schema
 *		change of its tables), so checking again could only find a difference
 *		that user code makes between nodes (a CHECK that reads the node's
 *		settings or the clock), and let that code decide which node leaves
 *		(docs/SECURITY.md). The executor builds a relation's check expressions
 *		once, at its first row, and takes a missing one as passed (ExecCheck):
 *		so they are given here as missing. NOT NULL and partition constraints
 *		are still checked.
 */
void
chorus_apply_skip_checks(ResultRelInfo *rri, EState *estate)
{
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;

	if (constr != NULL && constr->num_check > 0 && rri->ri_ConstraintExprs == NULL)
		rri->ri_ConstraintExprs = MemoryContextAllocZero(estate->es_query_cxt,
														 sizeof(ExprState *) * constr->num_check);
}

/* Open table i of the writeset (resolved: t->rel) for the executor. */
static ApplyTarget *
apply_exec_open(ApplyExec *ex, int i)
{
	ApplyTable *t = &ex->tables[i];
	ApplyTarget *g = &ex->targets[i];
	EState	   *estate = ex->estate;
	RangeTblEntry *rte = list_nth_node(RangeTblEntry, estate->es_range_table, i);
	int			c;

	rte->relid = t->rel->relid;
	/* every column the writeset gives is updated: the generated ones that depend on them follow */
	rte->updatedCols = NULL;
	for (c = 0; c < t->ncols; c++)
		if (t->rel->attnum[c] != 0)
			rte->updatedCols = bms_add_member(rte->updatedCols,
											  t->rel->attnum[c] - FirstLowInvalidHeapAttributeNumber);
	g->rel = table_open(t->rel->relid, NoLock);	/* locked by chorus_apply_resolve */
	g->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(g->rri, g->rel, i + 1, NULL, 0);
	chorus_apply_skip_checks(g->rri, estate);
	/* where ExecGetTriggerResultRel finds it when the AFTER triggers fire */
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, g->rri);
	ExecOpenIndices(g->rri, false);
	g->newslot = ExecInitExtraTupleSlot(estate, RelationGetDescr(g->rel), &TTSOpsVirtual);
	g->searchslot = ExecInitExtraTupleSlot(estate, RelationGetDescr(g->rel), &TTSOpsVirtual);
	g->localslot = table_slot_create(g->rel, &estate->es_tupleTable);
	EvalPlanQualInit(&g->epq, estate, NULL, NIL, -1);
	t->target = g;
	return g;
}

/* The row's identity in the search slot: the old image's values at their local columns. */
static void
apply_exec_identity(ApplyTable *t, ApplyTarget *g, ChorusWsValue *oldv)
{
	TupleTableSlot *s = g->searchslot;
	int			natts = s->tts_tupleDescriptor->natts;
	int			k;

	ExecClearTuple(s);
	memset(s->tts_isnull, true, sizeof(bool) * natts);
	for (k = 0; k < t->nident; k++)
	{
		int			c = t->ident[k];
		AttrNumber	a = t->rel->attnum[c];

		s->tts_values[a - 1] = chorus_apply_datum(t, c, oldv[k], &s->tts_isnull[a - 1]);
	}
	ExecStoreVirtualTuple(s);
}

/*
 * The new row in the new slot: the writeset's values at their local columns;
 * from (the row found, for an update) the columns it does not give: dropped
 * ones, generated ones (computed again from the others) and unchanged TOAST
 * values.
 */
static void
apply_exec_new(ApplyTable *t, ApplyTarget *g, ChorusWsValue *newv, TupleTableSlot *from)
{
	TupleTableSlot *s = g->newslot;
	int			natts = s->tts_tupleDescriptor->natts;
	int			c;

	ExecClearTuple(s);
	if (from != NULL)
	{
		slot_getallattrs(from);
		memcpy(s->tts_values, from->tts_values, sizeof(Datum) * natts);
		memcpy(s->tts_isnull, from->tts_isnull, sizeof(bool) * natts);
	}
	else
		memset(s->tts_isnull, true, sizeof(bool) * natts);
	for (c = 0; c < t->ncols; c++)
	{
		AttrNumber	a = t->rel->attnum[c];

		if (a == 0 || newv[c].kind == CHORUS_VAL_UNCHANGED)
			continue;			/* generated; or an unchanged TOAST value: the row found holds it */
		s->tts_values[a - 1] = chorus_apply_datum(t, c, newv[c], &s->tts_isnull[a - 1]);
	}
	ExecStoreVirtualTuple(s);
}

/*
 * chorus_apply_exec_row
 *		Apply one row of table t (resolved; not t->rel->why_spi, or an INSERT and
 *		t->rel->insert_executor). False if
 *		the row to update or delete is not there: the caller says so, as an
 *		error that stops the node.
 */
bool
chorus_apply_exec_row(ApplyExec *ex, ApplyTable *t, ApplyRow *row)
{
	EState	   *estate = ex->estate;
	ApplyTarget *g = t->target;
	MemoryContext old;
	bool		found = true;

	if (g == NULL || g->rel == NULL)
		g = apply_exec_open(ex, (int) (t - ex->tables));
	old = MemoryContextSwitchTo(GetPerTupleMemoryContext(estate));
	if (row->op == CHORUS_OP_INSERT)
	{
		apply_exec_new(t, g, row->newv, NULL);
		ExecSimpleRelationInsert(g->rri, estate, g->newslot);
	}
	else
	{
		apply_exec_identity(t, g, row->oldv);
		found = RelationFindReplTupleByIndex(g->rel, t->rel->idxoid, LockTupleExclusive,
											 g->searchslot, g->localslot);
		if (found && row->op == CHORUS_OP_UPDATE)
		{
			apply_exec_new(t, g, row->newv, g->localslot);
			EvalPlanQualSetSlot(&g->epq, g->newslot);
			ExecSimpleRelationUpdate(g->rri, estate, &g->epq, g->localslot, g->newslot);
		}
		else if (found)
			ExecSimpleRelationDelete(g->rri, estate, &g->epq, g->localslot);
		ExecClearTuple(g->localslot);
	}
	MemoryContextSwitchTo(old);
	ResetPerTupleExprContext(estate);
	/*
	 * The AFTER ROW triggers that fire in an apply (ENABLE ALWAYS or REPLICA,
	 * among them Chorus's capture trigger, which does nothing here) are queued
	 * until the end of the query: fired every so many rows, so that a large
	 * writeset's queue stays small.
	 */
	if (++ex->queued >= CHORUS_APPLY_TRIGGER_BATCH)
		chorus_apply_exec_fire(ex);
	/* the next row sees this one (the same row may change twice in one writeset) */
	CommandCounterIncrement();
	UpdateActiveSnapshotCommandId();
	estate->es_output_cid = GetCurrentCommandId(true);	/* a BEFORE trigger locks the row with it */
	return found;
}

/*
 * chorus_apply_exec_fire
 *		Fire the AFTER triggers the rows so far queued, and go on.
 */
void
chorus_apply_exec_fire(ApplyExec *ex)
{
	if (ex->queued == 0)
		return;
	AfterTriggerEndQuery(ex->estate);
	AfterTriggerBeginQuery();
	ex->queued = 0;
}

/*
 * chorus_apply_exec_end
 *		Fire the queued AFTER triggers, close the tables and free the state.
 */
void
chorus_apply_exec_end(ApplyExec *ex)
{
	int			i;

	AfterTriggerEndQuery(ex->estate);
	for (i = 0; i < ex->ntables; i++)
	{
		ApplyTarget *g = &ex->targets[i];

		ex->tables[i].target = NULL;
		if (g->rel == NULL)
			continue;
		EvalPlanQualEnd(&g->epq);
		ExecCloseIndices(g->rri);
		table_close(g->rel, NoLock);
	}
	ExecResetTupleTable(ex->estate->es_tupleTable, false);
	FreeExecutorState(ex->estate);
	PopActiveSnapshot();
	pfree(ex->targets);
	pfree(ex);
}
