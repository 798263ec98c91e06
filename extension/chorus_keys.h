/*
 * chorus_keys.h
 *		The certification keys of a row change (chorus_keys.c).
 */
#ifndef CHORUS_KEYS_H
#define CHORUS_KEYS_H

#include "access/htup.h"
#include "lib/stringinfo.h"
#include "utils/rel.h"

#include "chorus_table.h"

extern uint32 chorus_row_keys(StringInfo keys, ChorusTable *t, char op, char **oldv, char **newv);
extern uint32 chorus_expr_keys(StringInfo keys, Relation rel, ChorusTable *t, char op,
							   HeapTuple oldtup, HeapTuple newtup);

#endif							/* CHORUS_KEYS_H */
