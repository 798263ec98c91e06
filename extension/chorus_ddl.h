/*
 * chorus_ddl.h
 *		Replicated schema changes (chorus_ddl.c).
 */
#ifndef CHORUS_DDL_H
#define CHORUS_DDL_H

#include "executor/execdesc.h"
#include "nodes/params.h"
#include "nodes/plannodes.h"
#include "tcop/utility.h"

#include "chorus_capture.h"
#include "chorus_commit.h"

extern bool chorus_ddl_utility(ChorusCapture *cap, ChorusCommitState *cs, PlannedStmt *pstmt,
							   const char *queryString, ProcessUtilityContext context,
							   ParamListInfo params);
extern void chorus_ddl_record(ChorusCapture *cap, PlannedStmt *pstmt);
extern void chorus_ddl_done(void);
extern void chorus_ddl_reset(void);
extern void chorus_ddl_confirm(ChorusCapture *cap, ChorusCommitState *cs);
extern bool chorus_table_replicable(Oid relid);
extern void chorus_ddl_replay_enter(Node *stmt, ProcessUtilityContext context);
extern void chorus_ddl_replay_leave(void);
extern void chorus_ddl_nested(Node *stmt, ProcessUtilityContext context);
extern void chorus_ddl_check_write(QueryDesc *qd);

#endif							/* CHORUS_DDL_H */
