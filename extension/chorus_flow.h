/*
 * chorus_flow.h
 *		Flow control and causal reads (chorus_flow.c).
 */
#ifndef CHORUS_FLOW_H
#define CHORUS_FLOW_H

#include "executor/execdesc.h"

extern void chorus_flow_wait(void);
extern void chorus_causal_read(QueryDesc *queryDesc, int eflags);
extern void chorus_sync_wait(int timeout_ms);

#endif							/* CHORUS_FLOW_H */
