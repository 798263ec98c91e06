/*
 * chorus_table.h
 *		A replicated table as a writeset describes it (chorus_table.c).
 */
#ifndef CHORUS_TABLE_H
#define CHORUS_TABLE_H

#include "fmgr.h"
#include "utils/rel.h"

/* One replicated table as seen by the current transaction. */
typedef struct ChorusUniqueKey
{
	char	   *colnames;		/* "a,b" */
	int			ncols;
	int		   *cols;			/* indexes into ChorusTable.attnums */
	bool		is_identity;	/* the primary key or replica identity index */
} ChorusUniqueKey;

/* A foreign key of the table: its rows reference a unique key of the parent. */
typedef struct ChorusForeignKey
{
	char	   *nspname;		/* the parent */
	char	   *relname;
	char	   *colnames;		/* the parent key's columns, as its own row keys name them */
	int			ncols;
	int		   *cols;			/* the child columns holding them, indexes into attnums */
} ChorusForeignKey;

typedef struct ChorusTable
{
	Oid			relid;
	int			index;			/* position in the current writeset's table list */
	char	   *nspname;
	char	   *relname;
	int			ncols;
	AttrNumber *attnums;
	char	  **attnames;
	char	  **typnames;
	uint8	   *colflags;
	uint8	   *colkind;		/* CHORUS_VAL_BINARY or CHORUS_VAL_TEXT */
	FmgrInfo   *valfn;			/* each column's send or output function, as its kind says */
	FmgrInfo   *textfn;			/* each column's output function (certification keys) */
	bool	   *keycol;			/* its text is part of a certification key */
	bool		canonical;		/* text needs fixed settings (chorus_canonical_enter) */
	bool		qualify;		/* ... and search_path pg_catalog */
	int			epoch;			/* the capture's table_epoch when described */
	int			nidentity;
	int		   *identity;		/* indexes into attnums */
	bool		full_identity;	/* no primary key or identity index: the whole old row */
	int			nunique;
	ChorusUniqueKey *uniques;
	int			nfkeys;
	ChorusForeignKey *fkeys;
	int			nexpr;			/* unique indexes on expressions */
	Oid		   *expr_indexes;
	char	  **expr_names;		/* "(index name)": their keys' column part */
	bool		truncate_key_done;
	bool		old_columns;	/* old images carry the captured columns too (CHORUS_TABLE_OLD_COLUMNS) */
	bool	   *oldsent;		/* with old_columns: the columns an old image holds (identity, captured) */
} ChorusTable;

extern ChorusTable *chorus_describe_table(Relation rel, MemoryContext cxt, int epoch);
extern ChorusTable *chorus_table_cached(Relation rel);
extern void chorus_table_cache_release(void);
extern void chorus_table_old_columns(ChorusTable *t, const char *spec);
extern bool chorus_old_columns_valid(const char *spec);

extern Oid	chorus_relation_owner(Oid relid);

#endif							/* CHORUS_TABLE_H */
