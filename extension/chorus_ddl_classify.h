/*
 * chorus_ddl_classify.h
 *		Which utility statements replicate, and the tables they name
 *		(chorus_ddl_classify.c).
 */
#ifndef CHORUS_DDL_CLASSIFY_H
#define CHORUS_DDL_CLASSIFY_H

#include "lib/stringinfo.h"
#include "nodes/parsenodes.h"

typedef enum ChorusDdlKind
{
	CHORUS_DDL_LOCAL,			/* runs on this node only */
	CHORUS_DDL_REPLICATE,		/* ordered and run on every node */
	CHORUS_DDL_REFUSE			/* cannot be replicated safely: error */
} ChorusDdlKind;

/* The tables a statement names, as exclusive certification keys. */
typedef struct ChorusDdlKeys
{
	StringInfoData buf;
	uint32		n;
	bool		any_temp;
	bool		any_persistent;
	bool		has_target;		/* the statement makes or changes one relation */
	bool		target_temp;	/* ... which is temporary */
	bool		concurrent;		/* CREATE/DROP INDEX CONCURRENTLY: runs beside the total order */
	char	   *replay;			/* the statement the other nodes run instead of the original */
	bool		evaluated_bound;	/* a partition bound with expressions: ship its value */
} ChorusDdlKeys;

extern ChorusDdlKind chorus_ddl_classify(Node *stmt, ChorusDdlKeys *k, const char **why);
extern CreateTableAsStmt *chorus_ctas_of(Node *stmt);
extern char *chorus_bound_replay(const char *statement, int offset, Oid partition);
extern PartitionBoundSpec *chorus_bound_of(Node *stmt, RangeVar **partition);

#endif							/* CHORUS_DDL_CLASSIFY_H */
