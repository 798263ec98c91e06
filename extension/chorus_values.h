/*
 * chorus_values.h
 *		How column values travel: binary send form or text under fixed
 *		settings (chorus_values.c).
 */
#ifndef CHORUS_VALUES_H
#define CHORUS_VALUES_H

#include "fmgr.h"

extern uint8 chorus_column_io(Oid typid, bool as_key, MemoryContext cxt, FmgrInfo *value_fn,
							  FmgrInfo *text_fn, bool *canonical, bool *qualify);
extern void chorus_check_replicable_type(Oid typid, const char *column, const char *table);
extern bool chorus_raw_type(Oid typid);
extern int	chorus_canonical_enter(bool qualify);
extern void chorus_canonical_exit(int nest);

#endif							/* CHORUS_VALUES_H */
