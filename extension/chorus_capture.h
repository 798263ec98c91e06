/*
 * chorus_capture.h
 *		The capture state of the current transaction and what adds to it
 *		(chorus_capture.c).
 */
#ifndef CHORUS_CAPTURE_H
#define CHORUS_CAPTURE_H

#include "access/htup.h"
#include "lib/stringinfo.h"
#include "utils/rel.h"

#include "chorus_coord.h"
#include "chorus_keylimit.h"
#include "chorus_table.h"

/* The current top-level transaction's capture: what its writeset will hold. */
typedef struct ChorusCapture
{
	MemoryContext cxt;
	int			ntables;
	int			maxtables;
	ChorusTable **tables;
	/*
	 * The rows (and schema change items), in order: the first spilled bytes in
	 * the temporary file spill, the rest in rows. Past chorus.capture_work_mem
	 * the rows in memory go to the file, so a transaction of any size holds
	 * about that much of its writeset in memory.
	 */
	StringInfoData rows;
	BufFile    *spill;
	uint64		spilled;
	uint32		nrows;
	List	   *sequences;		/* OIDs of the sequences setval moved (chorus_sequence.c) */
	StringInfoData keys;
	uint32		nkeys;
	StringInfoData rowkeys;		/* one row change's keys, before the limit per table */
	ChorusKeyLimit keylimit;	/* row keys per table, and the tables past chorus.max_row_keys_per_table */
	uint64		last_seen;
	bool		has_last_seen;
	/* the snapshot last_seen was last taken under: the same one need not be looked at again */
	uint64		noted_completions;	/* its snapXactCompletionCount, 0: none */
	TransactionId noted_xmin;
	TransactionId noted_xmax;
	bool		writable_checked;	/* the node took writes at its first capture */
	uint64		write_epoch;	/* the coordinator's epoch then (chorus_check_lost) */
	bool		has_schema;		/* holds schema change items (CHORUS_WS_FLAG_DDL) */
	bool		schema_key_done;	/* the cluster-wide schema change key is in keys */
	bool		concurrent;		/* CREATE/DROP INDEX CONCURRENTLY's first step (CHORUS_WS_FLAG_CONCURRENT) */
	int			table_epoch;	/* bumped by each schema change: table descriptions are made anew */
	/* savepoints: length of the rows (spilled and in memory) at each open subtransaction's start */
	int			nsubs;
	int			maxsubs;
	SubTransactionId *sub_ids;
	uint64	   *sub_rowlen;
	uint32	   *sub_nrows;
	bool	   *sub_has_schema;
} ChorusCapture;

/* Set by the utility hook while a TRUNCATE ... RESTART IDENTITY runs. */
extern bool chorus_truncate_restart;

extern ChorusCapture *chorus_capture_state(void);
extern void chorus_capture_reset(ChorusCapture *cap);
extern void chorus_capture_begin(ChorusCapture *cap);
extern void chorus_subxact_start(ChorusCapture *cap, SubTransactionId subid);
extern void chorus_subxact_abort(ChorusCapture *cap, SubTransactionId subid);
extern void chorus_subxact_commit(ChorusCapture *cap, SubTransactionId subid);
extern void chorus_note_snapshot(ChorusCapture *cap);
extern ChorusTable *chorus_capture_table(ChorusCapture *cap, Relation rel);
extern void chorus_capture_row(ChorusCapture *cap, Relation rel, char op, HeapTuple oldtup,
							   HeapTuple newtup, bool keys);
extern void chorus_serialize_writeset(ChorusCapture *cap, StringInfo head, ChorusFrameBody *body,
									  TransactionId xid, uint8 flags);

#endif							/* CHORUS_CAPTURE_H */
