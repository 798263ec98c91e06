/*
 * chorus_wswrite.h
 *		The writeset writer (chorus_wswrite.c).
 */
#ifndef CHORUS_WSWRITE_H
#define CHORUS_WSWRITE_H

#include "lib/stringinfo.h"

extern void chorus_put_u8(StringInfo buf, uint8 v);
extern void chorus_put_u16(StringInfo buf, uint16 v);
extern void chorus_put_u32(StringInfo buf, uint32 v);
extern void chorus_put_u64(StringInfo buf, uint64 v);
extern void chorus_put_blob(StringInfo buf, const char *data, uint32 len);
extern void chorus_put_header(StringInfo out, uint8 flags, TransactionId xid, uint64 last_seen,
							  int ntables, uint32 nrows, uint32 nkeys);
extern void chorus_put_table(StringInfo out, const char *nspname, const char *relname, int ncols,
							 char *const *attnames, char *const *typnames, const uint8 *colflags,
							 int nidentity, const int *identity, uint8 flags);
extern void chorus_put_row_head(StringInfo out, char op, int table);
extern void chorus_put_truncate(StringInfo out, int table, uint8 flags);
extern void chorus_put_value(StringInfo out, uint8 kind, const char *data, uint32 len);
extern void chorus_put_schema_item(StringInfo out, int nsettings, const char *const *names,
								   const char *const *values, const char *role, const char *statement);
extern void chorus_put_key_head(StringInfo out, uint8 mode, int nparts);
extern void chorus_put_table_key(StringInfo out, uint8 mode, const char *nspname, const char *relname);

#endif							/* CHORUS_WSWRITE_H */
