/*
 * chorus.h
 *		Shared declarations of the Chorus extension: shared memory, GUCs, the
 *		per-transaction writeset, and the entry points of each file.
 */
#ifndef CHORUS_H
#define CHORUS_H

#include "postgres.h"

#include "access/htup.h"
#include "access/xlogdefs.h"
#include "lib/stringinfo.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/lwlock.h"
#include "datatype/timestamp.h"
#include "utils/rel.h"
#include "nodes/plannodes.h"
#include "replication/origin.h"
#include "tcop/utility.h"
#include "fmgr.h"

#include "chorus_wire.h"

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

/*
 * Per PGPROC slot: set by chorus.abort_local() when the coordinator aborts the
 * backend's transaction (by local transaction id, lxid) because the certified remote writeset gid needs a
 * lock it holds (DESIGN.md invariant 6). gid 0: no request. The backend sets
 * CHORUS_ABORT_PROTECTED (by compare-and-swap, so exactly one of the two wins)
 * before it sends its writeset: from then on the transaction may be certified
 * and nothing but the cluster's verdict decides its fate.
 */
#define CHORUS_ABORT_PROTECTED PG_UINT64_MAX

/* SQLSTATE of an apply whose GID this node has committed already (a no-op, not a failure) */
#define ERRCODE_CHORUS_ALREADY_COMMITTED MAKE_SQLSTATE('C','H','0','0','1')

typedef struct ChorusAbortSlot
{
	pg_atomic_uint64 gid;
	pg_atomic_uint32 xid;		/* the local transaction id (PGPROC.lxid) */
} ChorusAbortSlot;

extern ChorusAbortSlot *chorus_abort_slots;
extern int	chorus_abort_nslots;
extern void chorus_check_aborted(void);
extern void chorus_clear_aborted(void);
extern void chorus_protect_commit(void);
extern void chorus_sync_wait(int timeout_ms);
extern bool chorus_causal_reads;
extern int	chorus_causal_reads_timeout;

/* GUCs */
extern char *chorus_socket_path;
extern bool chorus_capture_enabled;
extern bool chorus_replaying;
extern int	chorus_max_writeset_mb;
extern char *chorus_exclude_schemas;

/* One replicated table as seen by the current transaction. */
typedef struct ChorusUniqueKey
{
	char	   *colnames;		/* "a,b" */
	int			ncols;
	int		   *cols;			/* indexes into ChorusTable.attnums */
	bool		is_identity;	/* the primary key or replica identity index */
} ChorusUniqueKey;

/* A foreign key of the table: its rows reference a unique key of the parent. */
typedef struct ChorusForeignKey
{
	char	   *nspname;		/* the parent */
	char	   *relname;
	char	   *colnames;		/* the parent key's columns, as its own row keys name them */
	int			ncols;
	int		   *cols;			/* the child columns holding them, indexes into attnums */
} ChorusForeignKey;

typedef struct ChorusTable
{
	Oid			relid;
	int			index;			/* position in the writeset's table list */
	char	   *nspname;
	char	   *relname;
	int			ncols;
	AttrNumber *attnums;
	char	  **attnames;
	char	  **typnames;
	uint8	   *colflags;
	uint8	   *colkind;		/* CHORUS_VAL_BINARY or CHORUS_VAL_TEXT */
	FmgrInfo   *valfn;			/* each column's send or output function, as its kind says */
	FmgrInfo   *textfn;			/* each column's output function (certification keys) */
	bool	   *keycol;			/* its text is part of a certification key */
	bool		canonical;		/* text needs fixed settings (chorus_canonical_enter) */
	bool		qualify;		/* ... and search_path pg_catalog */
	int			epoch;			/* chorus_xact.table_epoch when described */
	int			nidentity;
	int		   *identity;		/* indexes into attnums */
	bool		full_identity;	/* no primary key or identity index: the whole old row */
	int			nunique;
	ChorusUniqueKey *uniques;
	int			nfkeys;
	ChorusForeignKey *fkeys;
	int			nexpr;			/* unique indexes on expressions */
	Oid		   *expr_indexes;
	char	  **expr_names;		/* "(index name)": their keys' column part */
	bool		table_key_done;
	bool		truncate_key_done;
} ChorusTable;

/* The current top-level transaction's replication state. */
typedef struct ChorusXact
{
	MemoryContext cxt;
	int			ntables;
	int			maxtables;
	ChorusTable **tables;
	StringInfoData rows;
	uint32		nrows;
	StringInfoData keys;
	uint32		nkeys;
	uint64		last_seen;
	bool		has_last_seen;
	bool		has_schema;		/* holds schema change items (CHORUS_WS_FLAG_DDL) */
	bool		schema_key_done;	/* the cluster-wide schema change key is in keys */
	bool		concurrent;		/* CREATE/DROP INDEX CONCURRENTLY's first step (CHORUS_WS_FLAG_CONCURRENT) */
	int			table_epoch;	/* bumped by each schema change: table descriptions are made anew */
	/* savepoints: row buffer length at each open subtransaction's start */
	int			nsubs;
	int			maxsubs;
	SubTransactionId *sub_ids;
	int		   *sub_rowlen;
	uint32	   *sub_nrows;
	bool	   *sub_has_schema;
	/* commit path */
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
	TransactionId xid;
} ChorusXact;

extern ChorusXact chorus_xact;

/* chorus_values.c */
extern uint8 chorus_column_io(Oid typid, bool as_key, MemoryContext cxt, FmgrInfo *value_fn,
							  FmgrInfo *text_fn, bool *canonical, bool *qualify);
extern int	chorus_canonical_enter(bool qualify);
extern void chorus_check_replicable_type(Oid typid, const char *column, const char *table);
extern void chorus_canonical_exit(int nest);

/* chorus_capture.c */
extern void chorus_xact_reset(void);
extern void chorus_xact_begin_capture(void);
extern void chorus_capture_row(Relation rel, char op, HeapTuple oldtup, HeapTuple newtup, bool keys);
extern void chorus_capture_table_key(Relation rel, uint8 mode);
extern void chorus_note_snapshot(void);
extern ChorusTable *chorus_capture_table(Relation rel);
extern bool chorus_truncate_restart;
extern void chorus_subxact_start(SubTransactionId subid);
extern void chorus_subxact_abort(SubTransactionId subid);
extern uint64 chorus_visible_gid(void);
extern uint64 chorus_visible_gid_clean(bool *clean);

/* chorus_writeset.c */
extern void chorus_put_u8(StringInfo buf, uint8 v);
extern void chorus_put_u16(StringInfo buf, uint16 v);
extern void chorus_put_u32(StringInfo buf, uint32 v);
extern void chorus_put_u64(StringInfo buf, uint64 v);
extern void chorus_put_str(StringInfo buf, const char *s);
extern void chorus_put_blob(StringInfo buf, const char *data, uint32 len);
extern void chorus_put_header(StringInfo out, uint8 flags, TransactionId xid, uint64 last_seen,
							  int ntables, uint32 nrows, uint32 nkeys);
extern void chorus_put_schema_item(StringInfo out, int nsettings, const char *const *names,
								   const char *const *values, const char *role, const char *statement);
extern void chorus_serialize_writeset(StringInfo out, TransactionId xid, uint8 flags);

/* chorus_commit.c */
extern void chorus_register_callbacks(void);
extern int	chorus_lane_of(uint64 gid);
extern RepOriginId chorus_lane_origin(int lane);
extern void chorus_note_committed(uint64 gid, uint64 prev);
extern void chorus_wait_for_turn(uint64 wait_for);
extern void chorus_check_writable(void);
extern void chorus_ddl_order(StringInfo ws);

/* chorus_ddl.c */
extern bool chorus_replicate_ddl;
extern bool chorus_replicate_roles;
extern int	chorus_node_number;
extern int	chorus_max_nodes;
extern void chorus_define_ddl_gucs(void);
extern bool chorus_ddl_utility(PlannedStmt *pstmt, const char *queryString,
							   ProcessUtilityContext context, ParamListInfo params);
extern void chorus_ddl_record(PlannedStmt *pstmt);
extern void chorus_ddl_done(void);
extern PlannedStmt *chorus_ddl_replay_fixups(PlannedStmt *pstmt);
extern void chorus_ddl_reset(void);

#endif							/* CHORUS_H */
