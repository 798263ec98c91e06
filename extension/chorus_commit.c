/*
 * chorus_commit.c
 *		The commit path: at PRE_COMMIT a local transaction sends its writeset to
 *		the coordinator and waits for the verdict; every replicated commit (local
 *		or applied) then waits for its turn in GID order, records its GID in the
 *		commit record through the replication origin "chorus", and advances the
 *		node's watermark (docs/PROTOCOL.md section 1).
 */
#include "postgres.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/origin.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "chorus.h"

#define VERDICT_COMMIT CHORUS_VERDICT_COMMIT
#define VERDICT_CONFLICT CHORUS_VERDICT_CONFLICT
#define VERDICT_REFUSED CHORUS_VERDICT_REFUSED
#define VERDICT_UNKNOWN CHORUS_VERDICT_UNKNOWN
#define VERDICT_TOO_LARGE CHORUS_VERDICT_TOO_LARGE

/*
 * This backend's connection to the coordinator, kept for the session, and the
 * wait event set it sleeps on for a reply (the latch, postmaster death and
 * the socket): made once per connection, not once per wait, which would cost
 * an epoll descriptor and its system calls on every commit.
 */
static pgsocket chorus_sock = PGINVALID_SOCKET;
static WaitEventSet *chorus_wait_set = NULL;

static void
chorus_disconnect(void)
{
	if (chorus_wait_set != NULL)
		FreeWaitEventSet(chorus_wait_set);
	chorus_wait_set = NULL;
	if (chorus_sock != PGINVALID_SOCKET)
		close(chorus_sock);
	chorus_sock = PGINVALID_SOCKET;
}

/*
 * chorus_check_writable
 *		Called at the first captured change of a transaction: refuse the write
 *		right away when this node cannot commit it.
 */
void
chorus_check_writable(void)
{
	bool		ready,
				online;
	char		reason[sizeof(chorus_shared->offline_reason)];

	if (chorus_socket_path == NULL || chorus_socket_path[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 errdetail("chorus.socket_path is not set: no coordinator is configured.")));
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	ready = chorus_shared->ready;
	online = chorus_shared->online;
	memcpy(reason, chorus_shared->offline_reason, sizeof(reason));
	LWLockRelease(chorus_shared->lock);
	reason[sizeof(reason) - 1] = '\0';
	if (!ready)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 errdetail("The Chorus coordinator has not started on this node (or PostgreSQL restarted since)."),
				 errhint("Start it with \"chorus run\"; reads keep working.")));
	if (!online)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: this node does not accept writes"),
				 reason[0] ? errdetail("%s.", reason) :
				 errdetail("The node is not online in the primary component of its cluster (joining, recovering, or partitioned away)."),
				 errhint("See \"chorus status\"; reads keep working.")));
}

/*
 * chorus_connect
 *		Open the coordinator socket if this backend has none.
 */
static void
chorus_connect(void)
{
	struct sockaddr_un addr;
	pgsocket	s;

	if (chorus_sock != PGINVALID_SOCKET)
		return;
	if (strlen(chorus_socket_path) >= sizeof(addr.sun_path))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("chorus: chorus.socket_path is too long")));
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	if (s < 0)
		ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
						errmsg("chorus: could not create a socket: %m")));
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	strlcpy(addr.sun_path, chorus_socket_path, sizeof(addr.sun_path));
	if (connect(s, (struct sockaddr *) &addr, sizeof(addr)) < 0)
	{
		int			save = errno;

		close(s);
		errno = save;
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("chorus: coordinator unreachable; write transactions are refused"),
				 errdetail("Could not connect to \"%s\": %m.", chorus_socket_path),
				 errhint("Start the coordinator (\"chorus run\"); reads keep working.")));
	}
	chorus_sock = s;
	chorus_wait_set = CreateWaitEventSet(TopMemoryContext, 3);
	AddWaitEventToSet(chorus_wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(chorus_wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(chorus_wait_set, WL_SOCKET_READABLE, chorus_sock, NULL, NULL);
}

/*
 * chorus_send_all
 *		Write len bytes; on failure drop the connection and report.
 */
static void
chorus_send_all(const char *data, size_t len, bool report)
{
	while (len > 0)
	{
		ssize_t		n = send(chorus_sock, data, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
		{
			chorus_disconnect();
			if (report)
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("chorus: coordinator unreachable; write transactions are refused"),
						 errdetail("Sending the writeset to \"%s\" failed: %m.", chorus_socket_path)));
			return;
		}
		data += n;
		len -= n;
	}
}

/*
 * chorus_recv_exact
 *		Read len bytes, sleeping on the latch so the backend stays cancellable.
 */
static void
chorus_recv_exact(char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		n = recv(chorus_sock, buf, len, MSG_DONTWAIT);

		if (n > 0)
		{
			buf += n;
			len -= n;
			continue;
		}
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
		{
			chorus_disconnect();
			ereport(ERROR,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("chorus: lost the coordinator while waiting for the commit verdict"),
					 errdetail("The transaction was rolled back here. If the cluster certified it, "
							   "this node applies it when its coordinator recovers.")));
		}
		{
			WaitEvent	event;

			(void) WaitEventSetWait(chorus_wait_set, -1L, &event, 1, PG_WAIT_EXTENSION);
		}
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * chorus_send_frame
 *		Send one frame: u32 length, type byte, body.
 */
static void
chorus_send_frame(char type, const char *body, int len)
{
	StringInfoData frame;

	chorus_connect();
	initStringInfo(&frame);
	chorus_put_u32(&frame, (uint32) len + 1);
	chorus_put_u8(&frame, (uint8) type);
	if (len > 0)
		appendBinaryStringInfo(&frame, body, len);
	chorus_send_all(frame.data, frame.len, true);
	pfree(frame.data);
}

/*
 * chorus_read_verdict
 *		Wait for a verdict frame ('V'). If the wait is interrupted the
 *		connection is closed, so the coordinator knows nobody waits for this
 *		writeset any more (it replays it if certified).
 */
static uint8
chorus_read_verdict(uint64 *gid, uint64 *wait_for, uint64 *prev, char **msg)
{
	char		head[CHORUS_FRAME_LENGTH_SIZE + 1];
	char		body[CHORUS_VERDICT_BODY_SIZE];
	uint32		len;
	uint16		msglen;

	PG_TRY();
	{
		chorus_recv_exact(head, sizeof(head));
		memcpy(&len, head, CHORUS_FRAME_LENGTH_SIZE);
		len = pg_ntoh32(len);
		if (head[CHORUS_FRAME_LENGTH_SIZE] != CHORUS_FRAME_VERDICT ||
			len < sizeof(body) || len > sizeof(body) + PG_UINT16_MAX)
		{
			chorus_disconnect();
			ereport(ERROR, (errcode(ERRCODE_PROTOCOL_VIOLATION),
							errmsg("chorus: malformed reply from the coordinator")));
		}
		/* the type byte is read already: the body after it */
		chorus_recv_exact(body + 1, sizeof(body) - 1);
		memcpy(&msglen, body + CHORUS_VERDICT_OFF_MSGLEN, 2);
		msglen = pg_ntoh16(msglen);
		*msg = palloc(msglen + 1);
		chorus_recv_exact(*msg, msglen);
		(*msg)[msglen] = '\0';
	}
	PG_CATCH();
	{
		chorus_disconnect();
		PG_RE_THROW();
	}
	PG_END_TRY();
	memcpy(gid, body + CHORUS_VERDICT_OFF_GID, 8);
	memcpy(wait_for, body + CHORUS_VERDICT_OFF_WAIT_FOR, 8);
	memcpy(prev, body + CHORUS_VERDICT_OFF_PREV, 8);
	*gid = pg_ntoh64(*gid);
	*wait_for = pg_ntoh64(*wait_for);
	*prev = pg_ntoh64(*prev);
	return (uint8) body[CHORUS_VERDICT_OFF_VERDICT];
}

/*
 * chorus_refuse_unless_commit
 *		End the transaction with the error a verdict other than COMMIT calls for.
 *		UNKNOWN: the node left the primary component after the transaction was
 *		ordered (GID gid) but before a quorum was known to have it; it does not
 *		commit here now, and commits on every node or on none, which this node
 *		learns when it rejoins: SQLSTATE 08007, as for a commit whose connection
 *		broke. REFUSED (and anything else): 25006 with the coordinator's reason.
 */
static void
chorus_refuse_unless_commit(uint8 verdict, uint64 gid, const char *msg)
{
	if (verdict == VERDICT_COMMIT)
		return;
	if (verdict == VERDICT_UNKNOWN)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_RESOLUTION_UNKNOWN),
				 errmsg("chorus: %s", msg),
				 errdetail("The transaction was ordered as GID %llu; the primary component decides whether it committed, "
						   "on every node alike.", (unsigned long long) gid),
				 errhint("Check for the transaction's effect after the node rejoins, or on a node of the primary component.")));
	if (verdict == VERDICT_TOO_LARGE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("chorus: %s", msg)));
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("chorus: %s", msg)));
}

/*
 * chorus_request_verdict
 *		Send the writeset (frame 'W') and wait for the verdict (frame 'V').
 */
static void
chorus_request_verdict(TransactionId xid)
{
	StringInfoData ws;
	uint8		verdict;
	uint64		gid,
				wait_for,
				prev;
	char	   *msg;

	initStringInfo(&ws);
	chorus_serialize_writeset(&ws, xid, 0);
	chorus_send_frame(CHORUS_FRAME_WRITESET, ws.data, ws.len);
	pfree(ws.data);
	verdict = chorus_read_verdict(&gid, &wait_for, &prev, &msg);

	if (verdict == VERDICT_CONFLICT)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("chorus: %s", msg),
				 errdetail("Another node's transaction, ordered first, wrote the same data (this transaction was GID %llu).",
						   (unsigned long long) gid),
				 errhint("Retry the transaction.")));
	chorus_refuse_unless_commit(verdict, gid, msg);
	chorus_xact.certified = true;
	chorus_xact.gid = gid;
	chorus_xact.wait_for = wait_for;
	chorus_xact.prev = prev;
}

/*
 * chorus_ddl_order
 *		Send a schema change (a writeset with the DDL flag) and wait for its
 *		place in the total order; then wait until everything before it has
 *		committed here. The statement runs after this, holding the turn.
 */
void
chorus_ddl_order(StringInfo ws)
{
	uint8		verdict;
	uint64		gid,
				wait_for,
				prev;
	char	   *msg;

	chorus_protect_commit();
	chorus_send_frame(CHORUS_FRAME_WRITESET, ws->data, ws->len);
	verdict = chorus_read_verdict(&gid, &wait_for, &prev, &msg);
	chorus_refuse_unless_commit(verdict, gid, msg);
	chorus_xact.certified = true;
	chorus_xact.ddl = true;
	chorus_xact.gid = gid;
	chorus_xact.wait_for = wait_for;
	chorus_xact.prev = prev;
	/* a schema change runs after everything before it, whatever the lanes */
	chorus_wait_for_turn(prev);
}

/*
 * chorus_ddl_confirm
 *		The schema change ran here: tell the cluster, with its content (the
 *		transaction's writeset: the statement in its replay form and the rows it
 *		produced), which every node applies at its GID; and wait until that
 *		report is in the total order before committing, so no node can end up
 *		with the change while the others skip it.
 */
static void
chorus_ddl_confirm(void)
{
	StringInfoData body;
	uint8		verdict;
	uint64		gid,
				wait_for,
				prev;
	char	   *msg;

	chorus_xact_begin_capture();
	initStringInfo(&body);
	chorus_put_u64(&body, chorus_xact.gid);
	chorus_put_u32(&body, chorus_xact.xid);
	chorus_serialize_writeset(&body, chorus_xact.xid, 0);
	chorus_send_frame(CHORUS_FRAME_RAN, body.data, body.len);
	pfree(body.data);
	verdict = chorus_read_verdict(&gid, &wait_for, &prev, &msg);
	if (verdict != VERDICT_COMMIT)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("chorus: the schema change was not committed: %s", msg)));
}

/*
 * chorus_wait_committed
 *		Sleep until this node has committed GID gid, at most timeout_ms (-1: no
 *		limit). Returns the committed GID: below gid if the time ran out. what
 *		says who waits, for the error if the node is reset meanwhile.
 */
static uint64
chorus_wait_done(int lane, uint64 gid, int timeout_ms, const char *what)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), Max(timeout_ms, 0));
	uint64		committed;
	uint64		epoch;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	epoch = chorus_shared->epoch;
	LWLockRelease(chorus_shared->lock);
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		bool		ready;
		long		left;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		committed = lane < 0 ? chorus_shared->committed_gid : chorus_shared->lane_done[lane];
		ready = chorus_shared->ready && chorus_shared->epoch == epoch;
		LWLockRelease(chorus_shared->lock);
		if (!ready)
		{
			ConditionVariableCancelSleep();
			ereport(ERROR, (errcode(ERRCODE_CONNECTION_FAILURE),
							errmsg("chorus: the node was reset (its coordinator restarted) while %s", what)));
		}
		if (committed >= gid)
			break;
		if (timeout_ms < 0)
		{
			ConditionVariableSleep(&chorus_shared->commit_cv, PG_WAIT_EXTENSION);
			continue;
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return committed;
}

/*
 * chorus_wait_committed
 *		Sleep until this node has committed every certified GID up to gid (the
 *		watermark), at most timeout_ms (-1: no limit). Returns the watermark:
 *		below gid if the time ran out. what says who waits, for the error if the
 *		node is reset meanwhile.
 */
static uint64
chorus_wait_committed(uint64 gid, int timeout_ms, const char *what)
{
	return chorus_wait_done(-1, gid, timeout_ms, what);
}

/*
 * chorus_wait_for_turn
 *		Sleep until every certified writeset before ours has committed here.
 */
void
chorus_wait_for_turn(uint64 wait_for)
{
	(void) chorus_wait_committed(wait_for, -1, "this transaction waited to commit");
}

/*
 * chorus_lane_of
 *		The commit lane of GID gid (0 with one lane).
 */
int
chorus_lane_of(uint64 gid)
{
	int			lanes = chorus_shared->lanes;

	return lanes > 1 ? (int) (gid % (uint64) lanes) : 0;
}

/*
 * chorus_lane_origin
 *		The replication origin that records the commits of a lane: "chorus" for
 *		lane 0, "chorus_lane_<k>" for lane k (made by chorus.set_lanes()).
 */
RepOriginId
chorus_lane_origin(int lane)
{
	char		name[NAMEDATALEN];
	RepOriginId origin;

	if (lane == 0)
		strlcpy(name, CHORUS_ORIGIN_NAME, sizeof(name));
	else
		snprintf(name, sizeof(name), "%s%d", CHORUS_LANE_ORIGIN_PREFIX, lane);
	origin = replorigin_by_name(name, true);
	if (origin == InvalidRepOriginId)
		ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						errmsg("chorus: replication origin \"%s\" of commit lane %d is missing", name, lane),
						errhint(lane == 0 ? "Run CREATE EXTENSION chorus in this database."
								: "The coordinator makes the origins of its commit lanes (chorus.set_lanes).")));
	return origin;
}

/*
 * chorus_wait_own_turn
 *		The wait of a row writeset's commit (local or applied). One lane: every
 *		certified writeset before it has committed. Several lanes: the previous
 *		certified GID of its lane has (the coordinator has dispatched it only
 *		after the earlier writesets it conflicts with committed, and a local
 *		transaction that passed certification conflicts with none that is not
 *		committed).
 */
static void
chorus_wait_own_turn(void)
{
	if (chorus_shared->lanes > 1)
		(void) chorus_wait_done(chorus_lane_of(chorus_xact.gid), chorus_xact.wait_for, -1,
								"this transaction waited to commit");
	else
		chorus_wait_for_turn(chorus_xact.wait_for);
}

/*
 * chorus_wait_hold
 *		While chorus.hold_commits() holds commits above a GID (a cluster-wide
 *		snapshot for verify), the commit of a GID above it waits, until the hold
 *		is released or expires.
 */
static void
chorus_wait_hold(uint64 gid)
{
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		uint64		above;
		TimestampTz until;
		long		left;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		above = chorus_shared->hold_above;
		until = chorus_shared->hold_until;
		LWLockRelease(chorus_shared->lock);
		if (above == 0 || gid <= above)
			break;
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		if (left <= 0)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, Min(left, 100), PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}

/*
 * chorus_note_committed
 *		Several lanes: GID gid, whose certified predecessor is prev, is
 *		committed here. The watermark moves over it if prev is committed, and
 *		then over every commit waiting above it whose predecessor it reaches
 *		(csn-pending-lists: the watermark only passes a contiguous prefix); else
 *		it waits in above[]. The caller holds the lock exclusively.
 */
void
chorus_note_committed(uint64 gid, uint64 prev)
{
	ChorusShared *sh = chorus_shared;
	bool		moved = true;
	int			i;

	if (gid <= sh->committed_gid)
		return;
	if (prev > sh->committed_gid)
	{
		for (i = 0; i < sh->nabove; i++)
			if (sh->above[i].gid == gid)
				return;			/* noted already */
		if (sh->nabove < CHORUS_MAX_ABOVE)
		{
			sh->above[sh->nabove].prev = prev;
			sh->above[sh->nabove].gid = gid;
			sh->nabove++;
		}
		return;
	}
	sh->committed_gid = gid;
	while (moved)
	{
		moved = false;
		for (i = 0; i < sh->nabove; i++)
		{
			if (sh->above[i].gid <= sh->committed_gid || sh->above[i].prev <= sh->committed_gid)
			{
				if (sh->above[i].gid > sh->committed_gid)
				{
					sh->committed_gid = sh->above[i].gid;
					moved = true;
				}
				sh->above[i] = sh->above[--sh->nabove];
				i--;
			}
		}
	}
}

/*
 * chorus_wait_above_room
 *		Several lanes: a commit that may land above the watermark waits until
 *		there is room to note it (the room is far beyond the sessions that can
 *		commit at once; this never waits in practice).
 */
static void
chorus_wait_above_room(void)
{
	ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
	for (;;)
	{
		int			n;

		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		n = chorus_shared->nabove;
		LWLockRelease(chorus_shared->lock);
		if (n < CHORUS_MAX_ABOVE - 1)
			break;
		(void) ConditionVariableTimedSleep(&chorus_shared->commit_cv, 100, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}

/*
 * chorus_claim_turn
 *		After the wait for our turn: take GID chorus_xact.gid. Exactly one
 *		session commits each GID: an apply of a GID committed here already
 *		(a local backend of a restarted coordinator committed it, or a
 *		recovery stream repeats it) fails with ERRCODE_CHORUS_ALREADY_COMMITTED,
 *		which the applier treats as done.
 */
static void
chorus_claim_turn(void)
{
	uint64		gid = chorus_xact.gid;
	uint64		committed,
				claimed;

	chorus_wait_hold(gid);
	if (chorus_shared->lanes > 1)
		chorus_wait_above_room();
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(gid);

		committed = chorus_shared->lane_done[lane];
		claimed = chorus_shared->lane_claimed[lane];
		if (gid > committed && gid > claimed)
		{
			chorus_shared->lane_claimed[lane] = gid;
			chorus_xact.claimed = true;
		}
	}
	else
	{
		committed = chorus_shared->committed_gid;
		claimed = chorus_shared->claimed_gid;
		if (gid > committed && gid > claimed)
		{
			chorus_shared->claimed_gid = gid;
			chorus_xact.claimed = true;
		}
	}
	LWLockRelease(chorus_shared->lock);
	if (gid <= committed)
		ereport(ERROR, (errcode(ERRCODE_CHORUS_ALREADY_COMMITTED),
						errmsg("chorus: GID %llu is already committed on this node",
							   (unsigned long long) gid)));
	if (!chorus_xact.claimed)
		ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						errmsg("chorus: GID %llu is being committed by another session",
							   (unsigned long long) gid)));
}

/*
 * chorus_unclaim_turn
 *		An aborted transaction gives its GID back, so a replay can take it.
 */
static void
chorus_unclaim_turn(void)
{
	if (!chorus_xact.claimed)
		return;
	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(chorus_xact.gid);

		if (chorus_shared->lane_claimed[lane] == chorus_xact.gid)
			chorus_shared->lane_claimed[lane] = chorus_shared->lane_done[lane];
	}
	else if (chorus_shared->claimed_gid == chorus_xact.gid)
		chorus_shared->claimed_gid = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	chorus_xact.claimed = false;
}

/*
 * chorus_sync_wait
 *		Causal reads: ask the coordinator for a marker through the total order
 *		(frame 'S'); its answer is the last GID certified before the marker.
 *		Wait until this node has committed it, at most timeout_ms. Everything
 *		committed anywhere in the cluster before this call is then visible to a
 *		snapshot taken here afterwards.
 */
void
chorus_sync_wait(int timeout_ms)
{
	uint8		verdict;
	uint64		gid,
				wait_for,
				prev;
	char	   *msg;
	uint64		committed;

	chorus_send_frame(CHORUS_FRAME_SYNC, NULL, 0);
	verdict = chorus_read_verdict(&gid, &wait_for, &prev, &msg);
	if (verdict != VERDICT_COMMIT)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("chorus: causal read refused: %s", msg)));
	committed = chorus_wait_committed(gid, timeout_ms, "this session waited for a causal read");
	if (committed < gid)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("chorus: causal read timed out: this node has committed GID %llu, the cluster was at GID %llu",
						(unsigned long long) committed, (unsigned long long) gid),
				 errhint("The node lags behind the cluster; raise chorus.causal_reads_timeout or read elsewhere.")));
}

/*
 * chorus_take_origin
 *		Record our GID in the commit record: the replication origin's progress
 *		is written with the commit and replayed by crash recovery, so the
 *		node's last GID is durable atomically with the commit. Commits happen
 *		one at a time in GID order, so one origin is enough (with several
 *		commit lanes, one per lane: each lane's commits are in order); it is
 *		held only from our turn until our commit.
 */
static void
chorus_take_origin(void)
{
	RepOriginId origin = chorus_lane_origin(chorus_lane_of(chorus_xact.gid));

	replorigin_session_setup(origin);
	chorus_xact.origin_held = true;
	replorigin_session_origin = origin;
	replorigin_session_origin_lsn = (XLogRecPtr) chorus_xact.gid;
	replorigin_session_origin_timestamp = GetCurrentTimestamp();

	/*
	 * Commit without waiting for the WAL flush, so that the next GID can take
	 * its turn as soon as our commit record is in WAL and visible; the COMMIT
	 * callback flushes before the client hears of the commit. Several commits
	 * then share one flush (group commit), in GID order.
	 */
	chorus_xact.saved_sync_commit = synchronous_commit;
	chorus_xact.sync_commit_saved = true;
	synchronous_commit = SYNCHRONOUS_COMMIT_OFF;
}

/*
 * chorus_restore_sync_commit
 *		Undo the per-commit synchronous_commit change; returns the value the
 *		session had (SYNCHRONOUS_COMMIT_OFF if it was not changed).
 */
static int
chorus_restore_sync_commit(void)
{
	if (!chorus_xact.sync_commit_saved)
		return SYNCHRONOUS_COMMIT_OFF;
	synchronous_commit = chorus_xact.saved_sync_commit;
	chorus_xact.sync_commit_saved = false;
	return chorus_xact.saved_sync_commit;
}

static void
chorus_release_origin(void)
{
	if (!chorus_xact.origin_held)
		return;
	replorigin_session_origin = InvalidRepOriginId;
	replorigin_session_origin_lsn = InvalidXLogRecPtr;
	replorigin_session_origin_timestamp = 0;
	replorigin_session_reset();
	chorus_xact.origin_held = false;
}

/*
 * chorus_committed
 *		After our commit: advance the watermark, remember (gid, xid) for
 *		last_seen, wake the next committer.
 */
static void
chorus_committed(void)
{
	ChorusCommit *c;

	LWLockAcquire(chorus_shared->lock, LW_EXCLUSIVE);
	if (chorus_shared->lanes > 1)
	{
		int			lane = chorus_lane_of(chorus_xact.gid);

		if (chorus_xact.gid > chorus_shared->lane_done[lane])
			chorus_shared->lane_done[lane] = chorus_xact.gid;
		chorus_note_committed(chorus_xact.gid, chorus_xact.prev);
		if (XactLastCommitEnd > chorus_shared->last_commit_end)
			chorus_shared->last_commit_end = XactLastCommitEnd;
	}
	else if (chorus_xact.gid > chorus_shared->committed_gid)
		chorus_shared->committed_gid = chorus_xact.gid;
	c = &chorus_shared->ring[chorus_shared->ring_count % CHORUS_RING_SIZE];
	c->gid = chorus_xact.gid;
	c->xid = chorus_xact.xid;
	chorus_shared->ring_count++;
	LWLockRelease(chorus_shared->lock);
	ConditionVariableBroadcast(&chorus_shared->commit_cv);
}

/*
 * chorus_flush_prefix
 *		Several commit lanes: before the client of GID gid is told its commit
 *		happened, every GID before it is committed here too, and flushed with it.
 *		Then the node's durable watermark covers every commit it acknowledged,
 *		as with one lane (a crash of every node at once re-forms the cluster from
 *		the highest watermark, which must hold every acknowledged commit). Runs
 *		after the commit, so it never raises: if the node is reset meanwhile it
 *		stops waiting (the new coordinator re-applies what is missing).
 */
static void
chorus_flush_prefix(uint64 gid)
{
	uint64		epoch;
	XLogRecPtr	upto = XactLastCommitEnd;

	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	epoch = chorus_shared->epoch;
	LWLockRelease(chorus_shared->lock);
	for (;;)
	{
		bool		done;

		/* on the wait list again each time: a broadcast takes us off it */
		ConditionVariablePrepareToSleep(&chorus_shared->commit_cv);
		LWLockAcquire(chorus_shared->lock, LW_SHARED);
		done = chorus_shared->committed_gid >= gid || !chorus_shared->ready || chorus_shared->epoch != epoch;
		upto = Max(upto, chorus_shared->last_commit_end);
		LWLockRelease(chorus_shared->lock);
		if (done)
			break;

		/*
		 * Not ConditionVariableTimedSleep: it exits the process when the
		 * postmaster dies, and exiting inside the commit would PANIC (the
		 * transaction is committed). Prepared to sleep on the condition
		 * variable, we have our latch set by a broadcast all the same.
		 */
		if (WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH, 100,
					  PG_WAIT_EXTENSION) & WL_POSTMASTER_DEATH)
			break;
		ResetLatch(MyLatch);
	}
	ConditionVariableCancelSleep();
	XLogFlush(upto);			/* the commit records of every GID up to ours */
}

static void
chorus_send_done(char kind)
{
	StringInfoData f;

	if (chorus_sock == PGINVALID_SOCKET)
		return;
	initStringInfo(&f);
	chorus_put_u32(&f, CHORUS_FRAME_DONE_SIZE);
	chorus_put_u8(&f, (uint8) kind);
	chorus_put_u64(&f, chorus_xact.gid);
	chorus_put_u32(&f, chorus_xact.xid);
	chorus_send_all(f.data, f.len, false);
	pfree(f.data);
}

static bool chorus_cancel_held = false;

/*
 * chorus_hold_cancel / chorus_resume_cancel
 *		Query cancels wait while a writeset is with the cluster, until the
 *		transaction has ended. Error recovery may have reset the hold count
 *		already.
 */
static void
chorus_hold_cancel(void)
{
	if (!chorus_cancel_held)
	{
		HOLD_CANCEL_INTERRUPTS();
		chorus_cancel_held = true;
	}
}

static void
chorus_resume_cancel(void)
{
	if (chorus_cancel_held)
	{
		chorus_cancel_held = false;
		if (QueryCancelHoldoffCount > 0)
			RESUME_CANCEL_INTERRUPTS();
	}
}

/*
 * chorus_xact_callback
 *		PRE_COMMIT: certify (local) and wait for our turn (local and applied).
 *		COMMIT: advance the watermark. ABORT: a certified local transaction that
 *		did not commit is reported, so the coordinator replays it.
 */
static void
chorus_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			chorus_check_aborted();
			if (chorus_xact.ddl)
			{
				chorus_xact.xid = GetTopTransactionId();
				chorus_ddl_confirm();
				chorus_claim_turn();
				chorus_take_origin();
			}
			else if (chorus_xact.applying)
			{
				chorus_xact.xid = GetTopTransactionId();
				chorus_wait_own_turn();
				chorus_claim_turn();
				chorus_take_origin();
			}
			else if (chorus_xact.nrows > 0)
			{
				chorus_xact.xid = GetTopTransactionId();
				chorus_protect_commit();

				/*
				 * From here the cluster decides: a cancel cannot take back a
				 * writeset that may be certified (like a commit, this wait is
				 * not cancellable until the commit record is written;
				 * terminating the session still works and the coordinator then
				 * commits the writeset itself if certified).
				 */
				chorus_hold_cancel();
				chorus_request_verdict(chorus_xact.xid);
				chorus_wait_own_turn();
				chorus_claim_turn();
				chorus_take_origin();
			}
			break;
		case XACT_EVENT_COMMIT:
			if (chorus_xact.applying || chorus_xact.certified)
			{
				int			sync = chorus_restore_sync_commit();

				chorus_release_origin();
				chorus_committed();
				/* durable before the client is told: one flush for many commits */
				if (sync > SYNCHRONOUS_COMMIT_OFF && chorus_xact.certified && chorus_shared->lanes > 1)
					chorus_flush_prefix(chorus_xact.gid);
				else if (sync > SYNCHRONOUS_COMMIT_OFF)
					XLogFlush(XactLastCommitEnd);
				if (chorus_xact.certified)
					chorus_send_done(CHORUS_FRAME_COMMITTED);
			}
			chorus_resume_cancel();
			chorus_clear_aborted();
			chorus_ddl_reset();
			chorus_xact_reset();
			break;
		case XACT_EVENT_ABORT:
			chorus_unclaim_turn();
			chorus_restore_sync_commit();
			chorus_release_origin();
			if (chorus_xact.certified)
				chorus_send_done(CHORUS_FRAME_ABORTED);
			chorus_resume_cancel();
			chorus_clear_aborted();
			chorus_ddl_reset();
			chorus_xact_reset();
			break;
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			chorus_xact_reset();
			break;
		default:
			break;
	}
}

/*
 * chorus_subxact_callback
 *		Savepoints: rows captured in a rolled-back subtransaction are dropped.
 */
static void
chorus_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	switch (event)
	{
		case SUBXACT_EVENT_START_SUB:
			chorus_subxact_start(mySubid);
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			chorus_subxact_abort(mySubid);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			/* rows stay; forget the savepoint mark */
			if (chorus_xact.nsubs > 0 && chorus_xact.sub_ids[chorus_xact.nsubs - 1] == mySubid)
				chorus_xact.nsubs--;
			break;
		default:
			break;
	}
}

void
chorus_register_callbacks(void)
{
	RegisterXactCallback(chorus_xact_callback, NULL);
	RegisterSubXactCallback(chorus_subxact_callback, NULL);
}
