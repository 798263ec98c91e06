/*
 * chorus_setval.h
 *		setval() replicates (chorus_setval.c).
 */
#ifndef CHORUS_SETVAL_H
#define CHORUS_SETVAL_H

#include "nodes/parsenodes.h"

#include "chorus_capture.h"

extern int	chorus_setval_defining;

extern bool chorus_setval_stores_query(Node *stmt);
extern void chorus_setval_rewrite(Query *query);
extern void chorus_setval_items(ChorusCapture *cap);

#endif							/* CHORUS_SETVAL_H */
