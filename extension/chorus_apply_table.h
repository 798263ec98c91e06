/*
 * chorus_apply_table.h
 *		A table of a writeset as the apply function applies its rows here
 *		(chorus_apply_table.c).
 */
#ifndef CHORUS_APPLY_TABLE_H
#define CHORUS_APPLY_TABLE_H

#include "executor/spi.h"
#include "fmgr.h"

#include "chorus_wsread.h"

typedef struct ApplyCol
{
	char	   *name;
	uint8		flags;
} ApplyCol;

typedef struct ApplyTable
{
	char	   *nspname;
	char	   *relname;
	int			ncols;
	ApplyCol   *cols;
	int			nident;
	int		   *ident;
	bool		full_identity;
	SPIPlanPtr	plans[3];		/* insert, update, delete */
	Oid		   *coltypes;		/* local types of the columns, InvalidOid for generated */
	int32	   *coltypmods;
	FmgrInfo   *colinput;		/* their input functions */
	Oid		   *colioparam;
	FmgrInfo   *colrecv;		/* their receive functions, looked up at the first binary value */
	Oid		   *colrecvparam;
	Oid		   *basetypes;		/* a domain's base type (the column's type otherwise) */
	FmgrInfo   *baseinput;		/* ... its input and receive functions, for old images */
	Oid		   *baseioparam;
	FmgrInfo   *baserecv;
	Oid		   *baserecvparam;
} ApplyTable;

extern const char *chorus_apply_table_name(ApplyTable *t);
extern void chorus_apply_resolve_types(ApplyTable *t);
extern SPIPlanPtr chorus_apply_plan(ApplyTable *t, int op);
extern Datum chorus_apply_datum(ApplyTable *t, int col, ChorusWsValue v, char *isnull, bool old);

#endif							/* CHORUS_APPLY_TABLE_H */
