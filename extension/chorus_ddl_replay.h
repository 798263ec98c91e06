/*
 * chorus_ddl_replay.h
 *		The node-local parts of a replayed schema change (chorus_ddl_replay.c).
 */
#ifndef CHORUS_DDL_REPLAY_H
#define CHORUS_DDL_REPLAY_H

#include "nodes/plannodes.h"

extern PlannedStmt *chorus_ddl_replay_fixups(PlannedStmt *pstmt);

#endif							/* CHORUS_DDL_REPLAY_H */
