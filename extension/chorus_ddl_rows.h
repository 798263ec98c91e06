/*
 * chorus_ddl_rows.h
 *		The rows a schema change ships (chorus_ddl_rows.c).
 */
#ifndef CHORUS_DDL_ROWS_H
#define CHORUS_DDL_ROWS_H

#include "nodes/parsenodes.h"
#include "utils/rel.h"

#include "chorus_capture.h"

extern char *chorus_ddl_create_text(Relation rel);
extern void chorus_ddl_ship_rows(ChorusCapture *cap, Relation rel, bool replace);
extern int	chorus_alter_rows(AlterTableStmt *ats);

#endif							/* CHORUS_DDL_ROWS_H */
