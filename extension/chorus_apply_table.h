/*
 * chorus_apply_table.h
 *		A table of a writeset as the apply function applies its rows here
 *		(chorus_apply_table.c): what the writeset says of it (ApplyTable, one per
 *		writeset), and what this node knows of the local table (ApplyRel, kept
 *		across writesets until the table changes).
 */
#ifndef CHORUS_APPLY_TABLE_H
#define CHORUS_APPLY_TABLE_H

#include "access/attnum.h"
#include "executor/spi.h"
#include "fmgr.h"

#include "chorus_wsread.h"

typedef struct ApplyCol
{
	char	   *name;
	uint8		flags;
} ApplyCol;

/*
 * The local table of a writeset's table, resolved by name and kept across
 * writesets in a backend-lifetime cache keyed by its OID. A relcache
 * invalidation of the table (a schema change, a new index, a sinval reset)
 * marks it stale; it is rebuilt at the next writeset that names the table, or
 * when a writeset describes the table with another shape (columns, identity).
 */
typedef struct ApplyRel
{
	Oid			relid;			/* the cache's key */
	bool		valid;			/* false once the table may have changed */
	uint64		generation;		/* which build: a table resolved to an earlier one resolves again */
	MemoryContext cxt;			/* everything below */
	/* the shape of the writeset's table it was built for */
	int			ncols;
	char	  **names;
	uint8	   *flags;
	int			nident;
	int		   *ident;
	bool		full_identity;
	/* the local table */
	Oid			owner;			/* its rows are applied with its owner's rights (chorus_apply.c) */
	const char *why_spi;		/* NULL: rows go through the executor; else why they cannot */
	bool		insert_executor;	/* its INSERTs can, though (no identity needed: no key) */
	Oid			idxoid;			/* the index on the identity columns (executor) */
	AttrNumber *attnum;			/* per writeset column: local attribute, 0 for generated ones */
	SPIPlanPtr	plans[3];		/* the statements for insert, update, delete (SPI), when kept */
	bool	   *always;			/* the local column is GENERATED ALWAYS AS IDENTITY */
	Oid		   *coltypes;		/* local types of the columns, InvalidOid for generated */
	int32	   *coltypmods;
	FmgrInfo   *colinput;		/* their input functions */
	Oid		   *colioparam;
	FmgrInfo   *colrecv;		/* their receive functions, looked up at the first binary value */
	Oid		   *colrecvparam;
	Oid		   *basetypes;		/* a domain's base type (the column's type otherwise) */
	FmgrInfo   *baseinput;		/* ... its input and receive functions (values are read as it) */
	Oid		   *baseioparam;
	FmgrInfo   *baserecv;
	Oid		   *baserecvparam;
} ApplyRel;

/* A table as one writeset describes it. */
typedef struct ApplyTable
{
	char	   *nspname;
	char	   *relname;
	int			ncols;
	ApplyCol   *cols;
	int			nident;
	int		   *ident;
	bool		full_identity;
	bool		old_columns;	/* CHORUS_TABLE_OLD_COLUMNS: an old image has a value per column */
	ApplyRel   *rel;			/* the local table, once a row needs it (locked then) */
	uint64		generation;		/* ... as built then */
	struct ApplyTarget *target; /* its executor state in the current apply (chorus_apply_exec.c) */
} ApplyTable;

extern const char *chorus_apply_table_name(ApplyTable *t);
extern void chorus_apply_resolve(ApplyTable *t);

/* Does t need (again) chorus_apply_resolve before its next row? */
static inline bool
chorus_apply_unresolved(ApplyTable *t)
{
	return t->rel == NULL || t->generation != t->rel->generation;
}
extern SPIPlanPtr chorus_apply_plan(ApplyTable *t, int op, const ChorusWsValue *newv);
extern int	chorus_apply_update_skips(ApplyTable *t, int col);
extern Datum chorus_apply_datum(ApplyTable *t, int col, ChorusWsValue v, bool *isnull);

#endif							/* CHORUS_APPLY_TABLE_H */
