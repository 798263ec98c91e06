/*
 * chorus_keylimit.h
 *		A bound on the certification keys one writeset holds per table
 *		(chorus_keylimit.c).
 */
#ifndef CHORUS_KEYLIMIT_H
#define CHORUS_KEYLIMIT_H

#include "lib/stringinfo.h"
#include "utils/hsearch.h"

/*
 * The row keys counted per table so far, and the tables past the limit. The
 * counters are in the capture's context, in the order their tables came;
 * found by a walk of that list while the writeset has few tables, by name in
 * a hash table past that (made then: most writesets never need one).
 */
typedef struct ChorusKeyLimit
{
	struct KeyCount **counts;	/* every table's counter */
	int			ncounts;
	int			maxcounts;
	HTAB	   *tables;			/* by name, once there are more than a few tables */
	int			nescalated;		/* tables whose row keys became one table key */
} ChorusKeyLimit;

extern uint32 chorus_keylimit_append(ChorusKeyLimit *kl, MemoryContext cxt, StringInfo keys,
									 const char *src, int len, int limit);
extern uint32 chorus_keylimit_table_key(ChorusKeyLimit *kl, MemoryContext cxt, StringInfo keys,
										const char *nsp, const char *rel);
extern uint32 chorus_keylimit_finish(ChorusKeyLimit *kl, StringInfo keys, uint32 nkeys);

#endif							/* CHORUS_KEYLIMIT_H */
