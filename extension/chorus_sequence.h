/*
 * chorus_sequence.h
 *		Sequences in node classes, and setval() replicates (chorus_sequence.c).
 */
#ifndef CHORUS_SEQUENCE_H
#define CHORUS_SEQUENCE_H

#include "nodes/parsenodes.h"

#include "chorus_capture.h"

extern int	chorus_setval_defining;

extern bool chorus_setval_stores_query(Node *stmt);
extern void chorus_setval_rewrite(Query *query, const char *text);
extern void chorus_setval_items(ChorusCapture *cap);
extern void chorus_spread(Oid seq, bool restart, int64 restart_above);

#endif							/* CHORUS_SEQUENCE_H */
