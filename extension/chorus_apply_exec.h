/*
 * chorus_apply_exec.h
 *		Applying rows through the executor's replication helpers, as
 *		PostgreSQL's logical replication worker does (chorus_apply_exec.c).
 */
#ifndef CHORUS_APPLY_EXEC_H
#define CHORUS_APPLY_EXEC_H

#include "executor/execdesc.h"
#include "nodes/execnodes.h"

#include "chorus_apply_table.h"

typedef struct ApplyExec ApplyExec;

/* What one row asks of its table: its op, and the values of its images. */
typedef struct ApplyRow
{
	char		op;				/* CHORUS_OP_INSERT, _UPDATE or _DELETE */
	ChorusWsValue *oldv;		/* the old image's identity values (update, delete) */
	ChorusWsValue *newv;		/* the new image, every column (insert, update) */
	bool		unchanged;		/* some of its new values are CHORUS_VAL_UNCHANGED (update) */
} ApplyRow;

extern ApplyExec *chorus_apply_exec_begin(ApplyTable *tables, int ntables);
extern bool chorus_apply_exec_row(ApplyExec *ex, ApplyTable *t, ApplyRow *row);
extern void chorus_apply_exec_fire(ApplyExec *ex);
extern void chorus_apply_exec_end(ApplyExec *ex);
extern void chorus_apply_skip_checks(ResultRelInfo *rri, EState *estate);

/* chorus_apply.c */
extern void chorus_apply_spi_start(QueryDesc *qd, bool before, Oid *relid);

#endif							/* CHORUS_APPLY_EXEC_H */
