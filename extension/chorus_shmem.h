/*
 * chorus_shmem.h
 *		The node's shared state (chorus_shmem.c): the watermark, the commit
 *		lanes and turns, the ring of recent commits.
 */
#ifndef CHORUS_SHMEM_H
#define CHORUS_SHMEM_H

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "replication/origin.h"
#include "storage/condition_variable.h"
#include "storage/lwlock.h"

#define CHORUS_RING_SIZE 8192
#define CHORUS_ORIGIN_NAME "chorus"
#define CHORUS_LANE_ORIGIN_PREFIX "chorus_lane_"	/* lane k > 0 commits through chorus_lane_k */
#define CHORUS_MAX_LANES 16
#define CHORUS_MAX_ABOVE 4096	/* commits above the watermark kept at once (relaxed order) */

typedef struct ChorusCommit
{
	uint64		gid;
	TransactionId xid;
} ChorusCommit;

/* A commit above the watermark: GID gid, whose certified predecessor is prev. */
typedef struct ChorusAbove
{
	uint64		prev;
	uint64		gid;
} ChorusAbove;

/* Node-wide state in shared memory. */
typedef struct ChorusShared
{
	LWLock	   *lock;
	ConditionVariable commit_cv;
	bool		ready;			/* the coordinator initialised the watermark */
	bool		online;			/* writes allowed (primary component) */
	bool		paused;			/* flow control: new write statements wait */
	uint64		committed_gid;	/* the watermark: last GID committed here */
	uint64		claimed_gid;	/* the last GID a session took its commit turn for */
	uint64		epoch;			/* bumped by each node_init: waits of an older coordinator end */
	uint64		base_gid;		/* watermark at node_init; the ring starts after it */
	uint64		ring_count;		/* entries ever appended since node_init */
	uint64		hold_above;		/* commits of GIDs above this wait (0: no hold) */

	/*
	 * Certified local transactions whose session ended without committing
	 * them (terminated, or ended by the coordinator): each is applied from
	 * its writeset instead, but its row locks were released uncommitted, so
	 * another local transaction may have changed its rows as they were
	 * before it. Certification does not compare writesets of one node (their
	 * sessions order them by row locks), so that transaction is refused at
	 * commit instead (chorus_check_lost): lost_gid is the newest such GID,
	 * lost_unknown says a session ended before it could learn its verdict
	 * (refused until the next node_init), lost_epoch refuses, after it, the
	 * transactions that began writing before that node_init.
	 */
	uint64		lost_gid;
	bool		lost_unknown;
	uint64		lost_epoch;
	TimestampTz hold_until;		/* ... until then at the latest */
	char		offline_reason[256];	/* why writes are refused (set with online) */

	/*
	 * Commit lanes (docs/APPLY.md). With one lane every commit waits for the
	 * one before it and committed_gid is the last GID committed. With n > 1,
	 * GID g commits through lane g % n, after the previous certified GID of
	 * its lane only; each lane's commits are in GID order and recorded by its
	 * own replication origin. committed_gid is then the contiguous watermark:
	 * every certified GID up to it is committed. Commits above it wait in
	 * above[] until the GIDs before them are committed.
	 */
	int			lanes;
	uint64		lane_done[CHORUS_MAX_LANES];	/* last GID committed through each lane */
	uint64		lane_claimed[CHORUS_MAX_LANES];
	int			nabove;
	XLogRecPtr	last_commit_end;	/* the end of the newest commit record through any lane */
	ChorusAbove above[CHORUS_MAX_ABOVE];
	ChorusCommit ring[CHORUS_RING_SIZE];
} ChorusShared;

extern ChorusShared *chorus_shared;

/* SQLSTATE of an apply whose GID this node has committed already (a no-op, not a failure) */
#define ERRCODE_CHORUS_ALREADY_COMMITTED MAKE_SQLSTATE('C','H','0','0','1')
/* a run of GIDs whose first ones are committed here already (by local backends): DETAIL says up to which */
#define ERRCODE_CHORUS_PARTLY_COMMITTED MAKE_SQLSTATE('C','H','0','0','2')

extern Size chorus_shmem_size(void);
extern void chorus_shmem_init(void);
extern uint64 chorus_check_writable(void);
extern void chorus_note_lost(uint64 gid, bool unknown);
extern void chorus_check_lost(uint64 last_seen, uint64 write_epoch);
extern uint64 chorus_visible_gid(void);
extern uint64 chorus_visible_gid_clean(bool *clean);
extern int	chorus_lane_of(uint64 gid);
extern RepOriginId chorus_lane_origin(int lane);
extern uint64 chorus_wait_committed(uint64 gid, int timeout_ms, const char *what);
extern void chorus_wait_for_turn(uint64 wait_for);
extern void chorus_wait_own_turn(uint64 gid, uint64 wait_for);
extern void chorus_claim_turn(uint64 gid, bool *claimed_it);
extern void chorus_unclaim_turn(uint64 gid);
extern bool chorus_gid_committed(uint64 gid, uint64 prev);
extern void chorus_record_commit(uint64 gid, uint64 prev, TransactionId xid);
extern void chorus_flush_prefix(uint64 gid);

#endif							/* CHORUS_SHMEM_H */
