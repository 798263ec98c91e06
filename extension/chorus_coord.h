/*
 * chorus_coord.h
 *		The client of the coordinator's backend socket (chorus_coord.c).
 */
#ifndef CHORUS_COORD_H
#define CHORUS_COORD_H

#include "storage/buffile.h"

/* A verdict frame ('V'): the verdict, the GID, what its commit waits for, the previous GID. */
typedef struct ChorusVerdict
{
	uint8		verdict;		/* CHORUS_VERDICT_* */
	uint64		gid;
	uint64		wait_for;		/* the previous certified GID (of its commit lane) */
	uint64		prev;			/* the previous certified GID */
	char	   *msg;			/* the coordinator's message (palloc'd) */
} ChorusVerdict;

/*
 * A frame body in parts, sent in this order: head, the first filelen bytes of
 * file (a writeset's rows spilled to a temporary file), then the tails. A
 * writeset travels this way, never joined in memory.
 */
typedef struct ChorusFrameBody
{
	const char *head;
	size_t		headlen;
	BufFile    *file;			/* NULL: none */
	uint64		filelen;
	const char *tail[2];
	size_t		taillen[2];
} ChorusFrameBody;

extern void chorus_coord_ask(char type, const char *body, int len, ChorusVerdict *v);
extern void chorus_coord_ask_parts(char type, const ChorusFrameBody *body, ChorusVerdict *v);
extern void chorus_coord_certify(const ChorusFrameBody *ws, ChorusVerdict *v);
extern void chorus_certification_ended(void);
extern void chorus_refuse_unless_commit(const ChorusVerdict *v);
extern int64 chorus_verdict_commit_time(const ChorusVerdict *v);
extern void chorus_send_done(char kind, uint64 gid, TransactionId xid);

#endif							/* CHORUS_COORD_H */
