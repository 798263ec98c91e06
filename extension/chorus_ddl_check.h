/*
 * chorus_ddl_check.h
 *		What a replicated schema change may make (chorus_ddl_check.c).
 */
#ifndef CHORUS_DDL_CHECK_H
#define CHORUS_DDL_CHECK_H

#include "c.h"

extern void chorus_ddl_check_made(CommandId since);

#endif							/* CHORUS_DDL_CHECK_H */
