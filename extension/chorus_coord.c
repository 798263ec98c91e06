/*
 * chorus_coord.c
 *		The client of the coordinator's backend socket (docs/PROTOCOL.md
 *		section 1): the session's connection, sending frames, reading verdict
 *		frames, and the errors a verdict other than COMMIT ends a transaction
 *		with. What a frame means to the transaction is its callers' business
 *		(chorus_commit.c, chorus_ddl.c, chorus_flow.c).
 */
#include "postgres.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "port/pg_bswap.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "chorus_coord.h"
#include "chorus_settings.h"
#include "chorus_shmem.h"
#include "chorus_wire.h"
#include "chorus_wswrite.h"

/*
 * This backend's connection to the coordinator, kept for the session, and the
 * wait event set it sleeps on for a reply (the latch, postmaster death and
 * the socket): made once per connection, not once per wait, which would cost
 * an epoll descriptor and its system calls on every commit.
 */
static pgsocket chorus_sock = PGINVALID_SOCKET;
static WaitEventSet *chorus_wait_set = NULL;

/*
 * While a plain writeset waits for its verdict: bytes of the reply read so
 * far (chorus_salvage_verdict needs a reply not yet begun).
 */
static bool chorus_awaiting_certification = false;
static size_t chorus_reply_read = 0;

/* how long an interrupted wait still waits for the verdict (ms) */
#define CHORUS_SALVAGE_MS 10000

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
			chorus_reply_read += n;
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

#define CHORUS_SEND_CHUNK (1024 * 1024)	/* what is read of a spilled writeset at a time */

/*
 * chorus_send_frame
 *		Send one frame: u32 length, type byte, body (its parts in order).
 */
static void
chorus_send_frame(char type, const ChorusFrameBody *b)
{
	StringInfoData frame;
	uint64		total = b->headlen + b->filelen + b->taillen[0] + b->taillen[1];
	int			i;

	if (total + 1 > PG_UINT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("chorus: a frame of %llu bytes is larger than the coordinator protocol carries",
						(unsigned long long) total),
				 errhint("Split the transaction, or lower chorus.max_writeset_size.")));
	chorus_connect();
	initStringInfo(&frame);
	chorus_put_u32(&frame, (uint32) total + 1);
	chorus_put_u8(&frame, (uint8) type);
	if (b->headlen > 0)
		appendBinaryStringInfo(&frame, b->head, (int) b->headlen);
	chorus_send_all(frame.data, frame.len, true);
	pfree(frame.data);
	if (b->filelen > 0)
	{
		char	   *chunk = palloc(CHORUS_SEND_CHUNK);
		uint64		left = b->filelen;

		if (BufFileSeek(b->file, 0, 0, SEEK_SET) != 0)
		{
			chorus_disconnect();	/* the coordinator must not take what follows for this frame */
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("chorus: could not seek in the writeset's temporary file: %m")));
		}
		while (left > 0)
		{
			size_t		n = (size_t) Min(left, (uint64) CHORUS_SEND_CHUNK);

			if (BufFileRead(b->file, chunk, n) != n)
			{
				chorus_disconnect();
				ereport(ERROR,
						(errcode_for_file_access(),
						 errmsg("chorus: could not read the writeset's temporary file: %m")));
			}
			chorus_send_all(chunk, n, true);
			left -= n;
		}
		pfree(chunk);
	}
	for (i = 0; i < 2; i++)
		if (b->taillen[i] > 0)
			chorus_send_all(b->tail[i], b->taillen[i], true);
}

/*
 * chorus_salvage_verdict
 *		The wait for a plain writeset's verdict was interrupted (an error, or
 *		the session is terminated: a FATAL error reaches no PG_CATCH, only the
 *		abort): at the transaction's abort, before it releases its row locks,
 *		learn whether it was certified, waiting a bounded time without
 *		interrupts. Certified: it is applied from its writeset, so it is noted
 *		as lost (chorus_note_lost), and a local transaction that takes its rows
 *		next is refused at commit. Not known (the coordinator gone, no answer
 *		in time, a reply begun): noted as unknown, so commits are refused until
 *		the next coordinator's node_init and, after it, those of transactions
 *		that began writing before (its successor applies the writeset if it was
 *		certified, before the node takes writes again).
 */
static void
chorus_salvage_verdict(void)
{
	char		frame[CHORUS_FRAME_LENGTH_SIZE + 1 + CHORUS_VERDICT_BODY_SIZE];
	size_t		got = 0;
	TimestampTz deadline = GetCurrentTimestamp() + CHORUS_SALVAGE_MS * INT64CONST(1000);

	if (chorus_reply_read > 0 || chorus_sock == PGINVALID_SOCKET)
	{
		chorus_note_lost(0, true);
		return;
	}
	while (got < sizeof(frame) - 1)
	{
		struct pollfd pfd = {.fd = chorus_sock, .events = POLLIN};
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		ssize_t		n;

		if (left <= 0 || (poll(&pfd, 1, (int) left) < 0 && errno != EINTR))
		{
			chorus_note_lost(0, true);
			return;
		}
		n = recv(chorus_sock, frame + got, sizeof(frame) - 1 - got, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			continue;
		if (n <= 0)
		{
			chorus_note_lost(0, true);	/* the coordinator is gone */
			return;
		}
		got += n;
	}
	/* length, type, then the body after its first byte (as chorus_read_verdict reads it) */
	if (frame[CHORUS_FRAME_LENGTH_SIZE] != CHORUS_FRAME_VERDICT)
	{
		chorus_note_lost(0, true);
		return;
	}
	{
		const char *body = frame + CHORUS_FRAME_LENGTH_SIZE;
		uint64		gid;

		if ((uint8) body[CHORUS_VERDICT_OFF_VERDICT] != CHORUS_VERDICT_COMMIT)
			return;
		memcpy(&gid, body + CHORUS_VERDICT_OFF_GID, 8);
		chorus_note_lost(pg_ntoh64(gid), false);
	}
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

	chorus_reply_read = 0;
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
		/* a writeset's verdict is salvaged at the abort (chorus_certification_ended) */
		if (!chorus_awaiting_certification)
			chorus_disconnect();
		PG_RE_THROW();
	}
	PG_END_TRY();
	chorus_awaiting_certification = false;
	memcpy(gid, body + CHORUS_VERDICT_OFF_GID, 8);
	memcpy(wait_for, body + CHORUS_VERDICT_OFF_WAIT_FOR, 8);
	memcpy(prev, body + CHORUS_VERDICT_OFF_PREV, 8);
	*gid = pg_ntoh64(*gid);
	*wait_for = pg_ntoh64(*wait_for);
	*prev = pg_ntoh64(*prev);
	return (uint8) body[CHORUS_VERDICT_OFF_VERDICT];
}

/*
 * chorus_coord_ask
 *		Send one frame (type, body) and wait for the coordinator's verdict.
 */
void
chorus_coord_ask(char type, const char *body, int len, ChorusVerdict *v)
{
	ChorusFrameBody b = {0};

	b.head = body;
	b.headlen = len;
	chorus_coord_ask_parts(type, &b, v);
}

/*
 * chorus_coord_ask_parts
 *		The same, with the body in parts (a writeset, whose rows may be in a
 *		temporary file).
 */
void
chorus_coord_ask_parts(char type, const ChorusFrameBody *body, ChorusVerdict *v)
{
	chorus_send_frame(type, body);
	v->verdict = chorus_read_verdict(&v->gid, &v->wait_for, &v->prev, &v->msg);
}

/*
 * chorus_certification_ended
 *		At a transaction's abort: if it was waiting for its writeset's verdict,
 *		salvage the verdict (chorus_salvage_verdict) and close the connection, so
 *		the coordinator knows nobody waits for that writeset any more (it
 *		replays it if certified).
 */
void
chorus_certification_ended(void)
{
	if (!chorus_awaiting_certification)
		return;
	chorus_awaiting_certification = false;
	chorus_salvage_verdict();
	chorus_disconnect();
}

/*
 * chorus_coord_certify
 *		Send a plain writeset and wait for its verdict; a wait interrupted
 *		then salvages the verdict (chorus_salvage_verdict).
 */
void
chorus_coord_certify(const ChorusFrameBody *ws, ChorusVerdict *v)
{
	chorus_send_frame(CHORUS_FRAME_WRITESET, ws);
	chorus_awaiting_certification = true;
	v->verdict = chorus_read_verdict(&v->gid, &v->wait_for, &v->prev, &v->msg);
}

/*
 * chorus_refuse_unless_commit
 *		End the transaction with the error a verdict v other than COMMIT calls for.
 *		UNKNOWN: the node left the primary component after the transaction was
 *		ordered (GID gid) but before a quorum was known to have it; it does not
 *		commit here now, and commits on every node or on none, which this node
 *		learns when it rejoins: SQLSTATE 08007, as for a commit whose connection
 *		broke. UNDONE: a schema change another node could not apply, undone
 *		everywhere: that node's error, with its SQLSTATE. REFUSED (and anything
 *		else): 25006 with the coordinator's reason.
 */
void
chorus_refuse_unless_commit(const ChorusVerdict *v)
{
	if (v->verdict == CHORUS_VERDICT_COMMIT)
		return;
	if (v->verdict == CHORUS_VERDICT_UNKNOWN)
		ereport(ERROR,
				(errcode(ERRCODE_TRANSACTION_RESOLUTION_UNKNOWN),
				 errmsg("chorus: %s", v->msg),
				 errdetail("The transaction was ordered as GID %llu; the primary component decides whether it committed, "
						   "on every node alike.", (unsigned long long) v->gid),
				 errhint("Check for the transaction's effect after the node rejoins, or on a node of the primary component.")));
	if (v->verdict == CHORUS_VERDICT_TOO_LARGE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("chorus: %s", v->msg)));
	if (v->verdict == CHORUS_VERDICT_UNDONE)
	{
		const char *m = v->msg;
		int			code = ERRCODE_INTERNAL_ERROR;

		if (strlen(m) >= 5 && strspn(m, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") >= 5)
		{
			code = MAKE_SQLSTATE(m[0], m[1], m[2], m[3], m[4]);
			m += 5;
		}
		ereport(ERROR,
				(errcode(code),
				 errmsg("chorus: the schema change failed on node %s", m),
				 errdetail("Every node applies a schema change before it commits anywhere; it failed on that node, "
						   "so it was undone on every node (GID %llu commits empty). No node left the cluster.",
						   (unsigned long long) v->gid)));
	}
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("chorus: %s", v->msg)));
}

/*
 * chorus_verdict_commit_time
 *		The origin commit time a COMMIT verdict for a writeset carries: its
 *		message, the decimal µs since the Unix epoch its bus message gave every
 *		node (docs/PROTOCOL.md section 1). 0 when the message is empty (a
 *		coordinator of a release before, or a cluster whose bus does not carry
 *		times yet) or not a number: the stamps then say the time is unknown.
 */
int64
chorus_verdict_commit_time(const ChorusVerdict *v)
{
	char	   *end;
	long long	t;

	if (v->verdict != CHORUS_VERDICT_COMMIT || v->msg == NULL || v->msg[0] < '1' || v->msg[0] > '9')
		return 0;
	errno = 0;
	t = strtoll(v->msg, &end, 10);
	return (errno != 0 || *end != '\0') ? 0 : (int64) t;
}

/*
 * chorus_send_done
 *		Tell the coordinator that the transaction xid of certified GID gid
 *		committed (kind CHORUS_FRAME_COMMITTED) or aborted (CHORUS_FRAME_ABORTED).
 *		The transaction has ended: a failed send is not reported (the
 *		connection is dropped).
 */
void
chorus_send_done(char kind, uint64 gid, TransactionId xid)
{
	StringInfoData f;

	if (chorus_sock == PGINVALID_SOCKET)
		return;
	initStringInfo(&f);
	chorus_put_u32(&f, CHORUS_FRAME_DONE_SIZE);
	chorus_put_u8(&f, (uint8) kind);
	chorus_put_u64(&f, gid);
	chorus_put_u32(&f, xid);
	chorus_send_all(f.data, f.len, false);
	pfree(f.data);
}
