/*
 * chorus_wire.h
 *		Every constant of Chorus's wire formats (docs/PROTOCOL.md): the writeset,
 *		the backend <-> coordinator frames and the verdicts. The coordinator's
 *		Python modules (chorus/wire.py, chorus/commit/backendproto.py) define the same
 *		values; tests/unit/test_wire_constants.py reads this file and checks
 *		them, so the two cannot drift. No PostgreSQL headers: plain defines.
 */
#ifndef CHORUS_WIRE_H
#define CHORUS_WIRE_H

/* ---- writeset (docs/PROTOCOL.md section 2) ---- */
#define CHORUS_WS_MAGIC "CW"
#define CHORUS_WS_VERSION 2
/* magic, version, flags, xid, pid, last_seen, encoding, ntables, nrows, nkeys */
#define CHORUS_WS_HEAD_SIZE (2 + 1 + 1 + 4 + 4 + 8 + 2 + 2 + 4 + 4)

/* header flags */
#define CHORUS_WS_FLAG_DDL 0x01		/* holds schema change items: applied alone, after all before it */
#define CHORUS_WS_FLAG_TOI 0x02		/* a schema change's place in the total order; its content follows */
#define CHORUS_WS_FLAG_CONCURRENT 0x04	/* CREATE/DROP INDEX, REINDEX CONCURRENTLY: each node runs it in a session of its own */
#define CHORUS_WS_FLAGS_KNOWN (CHORUS_WS_FLAG_DDL | CHORUS_WS_FLAG_TOI | CHORUS_WS_FLAG_CONCURRENT)

/* column flags in a table description */
#define CHORUS_COL_IDENTITY 0x01	/* an identity column */
#define CHORUS_COL_GENERATED 0x02	/* generated stored: sent as NULL, never written */
#define CHORUS_COL_FLAGS_KNOWN (CHORUS_COL_IDENTITY | CHORUS_COL_GENERATED)

/* table flags in a table description */
#define CHORUS_TABLE_FULL_IDENTITY 0x01	/* no primary key: rows are found by their whole old image */
#define CHORUS_TABLE_OLD_COLUMNS 0x02	/* an old image has a value per column: the identity's and the
											 * captured ones (chorus.link_old_columns), the others 'u' */
#define CHORUS_TABLE_FLAGS_KNOWN (CHORUS_TABLE_FULL_IDENTITY | CHORUS_TABLE_OLD_COLUMNS)

/* row items */
#define CHORUS_OP_INSERT 'I'
#define CHORUS_OP_UPDATE 'U'
#define CHORUS_OP_DELETE 'D'
#define CHORUS_OP_TRUNCATE 'T'
#define CHORUS_OP_SCHEMA 'S'		/* a schema change statement, in its place among the rows */

/* TRUNCATE flags */
#define CHORUS_TRUNCATE_RESTART 0x01	/* RESTART IDENTITY */
#define CHORUS_TRUNCATE_FLAGS_KNOWN CHORUS_TRUNCATE_RESTART

/* value kinds */
#define CHORUS_VAL_NULL 'n'
#define CHORUS_VAL_TEXT 't'			/* the type's text output, under fixed settings */
#define CHORUS_VAL_BINARY 'b'		/* the type's binary send form */
#define CHORUS_VAL_UNCHANGED 'u'	/* an UPDATE's new value that is the old one, not sent: an
									 * unchanged out-of-line (TOAST) value; the applier keeps its own */

/* certification key modes (docs/ARCHITECTURE.md invariant 2) */
#define CHORUS_KEY_REFERENCE 1
#define CHORUS_KEY_UPDATE 2
#define CHORUS_KEY_EXCLUSIVE 3
#define CHORUS_KEY_MAX_PARTS 4096	/* a key has 1 to this many parts */

/* the table-level key every schema change holds, exclusive: two concurrent ones never both commit */
#define CHORUS_SCHEMA_KEY_NSP "chorus"
#define CHORUS_SCHEMA_KEY_REL "schema changes"

/* ---- backend <-> coordinator frames (docs/PROTOCOL.md section 1) ---- */
#define CHORUS_FRAME_WRITESET 'W'
#define CHORUS_FRAME_VERDICT 'V'
#define CHORUS_FRAME_COMMITTED 'C'
#define CHORUS_FRAME_ABORTED 'A'
#define CHORUS_FRAME_RAN 'R'		/* a schema change ran here: u64 gid, u32 xid, its writeset */
#define CHORUS_FRAME_SYNC 'S'
#define CHORUS_FRAME_INFO 'I'		/* one of the views: its name; answered with a verdict whose message is JSON */
#define CHORUS_FRAME_LENGTH_SIZE 4	/* each frame starts with a big-endian u32: the length of type and body */
#define CHORUS_FRAME_DONE_SIZE (1 + 8 + 4)	/* type, gid, xid: frames C and A */
#define CHORUS_FRAME_RAN_HEAD_SIZE (8 + 4)	/* frame R's body before its writeset: gid, xid */
/* verdict body: type, verdict, gid, wait_for, prev, u16 message length (then the message) */
#define CHORUS_VERDICT_BODY_SIZE (1 + 1 + 8 + 8 + 8 + 2)
/* ... and where each field starts in it (the type byte at 0) */
#define CHORUS_VERDICT_OFF_VERDICT 1
#define CHORUS_VERDICT_OFF_GID 2
#define CHORUS_VERDICT_OFF_WAIT_FOR 10
#define CHORUS_VERDICT_OFF_PREV 18
#define CHORUS_VERDICT_OFF_MSGLEN 26

#define CHORUS_VERDICT_COMMIT 0
#define CHORUS_VERDICT_CONFLICT 1
#define CHORUS_VERDICT_REFUSED 2
#define CHORUS_VERDICT_UNKNOWN 3
#define CHORUS_VERDICT_TOO_LARGE 4
#define CHORUS_VERDICT_UNDONE 5		/* message: the SQLSTATE (5 characters), then why */

/* ---- apply functions (docs/PROTOCOL.md section 4) ---- */
/* SQLSTATE of an apply whose GID is committed on this node already (chorus_shmem.h: ERRCODE_CHORUS_ALREADY_COMMITTED) */
#define CHORUS_SQLSTATE_ALREADY_COMMITTED "CH001"
/* ... and of a run whose first GIDs are (ERRCODE_CHORUS_PARTLY_COMMITTED; DETAIL "committed up to GID n") */
#define CHORUS_SQLSTATE_PARTLY_COMMITTED "CH002"
/* chorus.apply_run: each writeset of the run follows its length, a big-endian u32 of this size */
#define CHORUS_RUN_LENGTH_SIZE 4

#endif							/* CHORUS_WIRE_H */
