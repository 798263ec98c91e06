/*
 * chorus_coord.h
 *		The client of the coordinator's backend socket (chorus_coord.c).
 */
#ifndef CHORUS_COORD_H
#define CHORUS_COORD_H

/* A verdict frame ('V'): the verdict, the GID, what its commit waits for, the previous GID. */
typedef struct ChorusVerdict
{
	uint8		verdict;		/* CHORUS_VERDICT_* */
	uint64		gid;
	uint64		wait_for;		/* the previous certified GID (of its commit lane) */
	uint64		prev;			/* the previous certified GID */
	char	   *msg;			/* the coordinator's message (palloc'd) */
} ChorusVerdict;

extern void chorus_coord_ask(char type, const char *body, int len, ChorusVerdict *v);
extern void chorus_refuse_unless_commit(const ChorusVerdict *v);
extern void chorus_send_done(char kind, uint64 gid, TransactionId xid);

#endif							/* CHORUS_COORD_H */
