/*
 * chorus_commit.h
 *		The commit state of the current transaction and the steps of its
 *		commit (chorus_commit.c).
 */
#ifndef CHORUS_COMMIT_H
#define CHORUS_COMMIT_H

#include "lib/stringinfo.h"

#include "chorus_coord.h"

/* The current top-level transaction's commit: what it applies or was certified as. */
typedef struct ChorusCommitState
{
	bool		applying;		/* chorus.apply_begin() was called */
	bool		certified;		/* the coordinator said COMMIT */
	bool		ddl;			/* a schema change ordered by chorus_ddl_order() */
	bool		origin_held;
	bool		claimed;		/* this transaction claimed its GID's commit turn */
	bool		sync_commit_saved;	/* synchronous_commit changed for this commit */
	int			saved_sync_commit;
	uint64		gid;
	uint64		wait_for;		/* what the commit waits for: the previous certified GID (of its lane) */
	uint64		prev;			/* the previous certified GID */
	int64		commit_time;	/* its origin commit time, µs since the Unix epoch (the COMMIT verdict's; 0: unknown) */
	TransactionId xid;
} ChorusCommitState;

extern ChorusCommitState *chorus_commit_state(void);
extern void chorus_commit_reset(ChorusCommitState *cs);
extern void chorus_apply_begin_commit(ChorusCommitState *cs, bool captured, int64 gid,
									  int64 wait_for, int64 prev);
extern void chorus_certify(ChorusCommitState *cs, const ChorusFrameBody *ws);
extern void chorus_ddl_order(ChorusCommitState *cs, StringInfo ws);
extern void chorus_take_origin(ChorusCommitState *cs);
extern int	chorus_restore_sync_commit(ChorusCommitState *cs);
extern void chorus_release_origin(ChorusCommitState *cs);

#endif							/* CHORUS_COMMIT_H */
