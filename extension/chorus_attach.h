/*
 * chorus_attach.h
 *		The capture triggers of replicated tables: internal triggers, attached
 *		and detached in C, that users neither see nor switch off
 *		(chorus_attach.c).
 */
#ifndef CHORUS_ATTACH_H
#define CHORUS_ATTACH_H

#include "nodes/execnodes.h"
#include "nodes/plannodes.h"

extern bool chorus_table_replicable(Oid relid);
extern void chorus_attach_relation(Oid relid);
extern void chorus_attach_table(Oid relid);
extern void chorus_detach_relation(Oid relid);
extern PlannedStmt *chorus_capture_guard(PlannedStmt *pstmt);
extern void chorus_capture_before(Node *stmt);
extern void chorus_hide_capture(EState *estate);

#endif							/* CHORUS_ATTACH_H */
