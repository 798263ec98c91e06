/*
 * chorus_wswrite.c
 *		The writeset writer: every byte of the writeset wire format the
 *		extension produces is laid out here (docs/PROTOCOL.md section 2;
 *		constants in chorus_wire.h): big-endian integers, u16-length strings,
 *		u32-length blobs. Capture (chorus_capture.c, chorus_keys.c) and schema
 *		changes (chorus_ddl.c) decide what goes in; the coordinator reads it with
 *		coordinator/chorus/wire.py, the apply function with chorus_wsread.c.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"

#include "chorus_wire.h"
#include "chorus_wswrite.h"

void
chorus_put_u8(StringInfo buf, uint8 v)
{
	appendStringInfoCharMacro(buf, (char) v);
}

void
chorus_put_u16(StringInfo buf, uint16 v)
{
	uint16		n = pg_hton16(v);

	appendBinaryStringInfo(buf, (char *) &n, 2);
}

void
chorus_put_u32(StringInfo buf, uint32 v)
{
	uint32		n = pg_hton32(v);

	appendBinaryStringInfo(buf, (char *) &n, 4);
}

void
chorus_put_u64(StringInfo buf, uint64 v)
{
	uint64		n = pg_hton64(v);

	appendBinaryStringInfo(buf, (char *) &n, 8);
}

/*
 * chorus_put_str
 *		u16 length + bytes; names longer than 65535 bytes cannot occur
 *		(identifiers are at most NAMEDATALEN).
 */
static void
chorus_put_str(StringInfo buf, const char *s)
{
	size_t		len = strlen(s);

	if (len > PG_UINT16_MAX)
		elog(ERROR, "chorus: string too long for the writeset format");
	chorus_put_u16(buf, (uint16) len);
	appendBinaryStringInfo(buf, s, (int) len);
}

void
chorus_put_blob(StringInfo buf, const char *data, uint32 len)
{
	chorus_put_u32(buf, len);
	appendBinaryStringInfo(buf, data, (int) len);
}

/*
 * chorus_put_header
 *		The writeset header: the database's encoding tells the reader how the
 *		text it holds is encoded (nodes of different encodings refuse to join).
 */
void
chorus_put_header(StringInfo out, uint8 flags, TransactionId xid, uint64 last_seen,
				  int ntables, uint32 nrows, uint32 nkeys)
{
	appendBinaryStringInfo(out, CHORUS_WS_MAGIC, 2);
	chorus_put_u8(out, CHORUS_WS_VERSION);
	chorus_put_u8(out, flags);
	chorus_put_u32(out, xid);
	chorus_put_u32(out, (uint32) MyProcPid);
	chorus_put_u64(out, last_seen);
	chorus_put_u16(out, (uint16) GetDatabaseEncoding());
	chorus_put_u16(out, (uint16) ntables);
	chorus_put_u32(out, nrows);
	chorus_put_u32(out, nkeys);
}

/*
 * chorus_put_schema_item
 *		A schema change item (CHORUS_OP_SCHEMA): the settings it is replayed
 *		under (name, value pairs), the role that ran it, and the statement.
 */
void
chorus_put_schema_item(StringInfo out, int nsettings, const char *const *names,
					   const char *const *values, const char *role, const char *statement)
{
	int			i;

	chorus_put_u8(out, CHORUS_OP_SCHEMA);
	chorus_put_u16(out, (uint16) nsettings);
	for (i = 0; i < nsettings; i++)
	{
		chorus_put_str(out, names[i]);
		chorus_put_str(out, values[i]);
	}
	chorus_put_str(out, role);
	chorus_put_blob(out, statement, strlen(statement));
}

/*
 * chorus_put_table
 *		A table description: its name, its columns (name, type name, flags),
 *		the indexes of its identity columns and its table flags
 *		(CHORUS_TABLE_*).
 */
void
chorus_put_table(StringInfo out, const char *nspname, const char *relname, int ncols,
				 char *const *attnames, char *const *typnames, const uint8 *colflags,
				 int nidentity, const int *identity, uint8 flags)
{
	int			k;

	chorus_put_str(out, nspname);
	chorus_put_str(out, relname);
	chorus_put_u16(out, (uint16) ncols);
	for (k = 0; k < ncols; k++)
	{
		chorus_put_str(out, attnames[k]);
		chorus_put_str(out, typnames[k]);
		chorus_put_u8(out, colflags[k]);
	}
	chorus_put_u16(out, (uint16) nidentity);
	for (k = 0; k < nidentity; k++)
		chorus_put_u16(out, (uint16) identity[k]);
	chorus_put_u8(out, flags);
}

/*
 * chorus_put_row_head
 *		The start of a row item: its op and the index of its table in the
 *		writeset's table list. Its values follow (chorus_put_value), each image
 *		after its width (chorus_put_u16).
 */
void
chorus_put_row_head(StringInfo out, char op, int table)
{
	chorus_put_u8(out, (uint8) op);
	chorus_put_u16(out, (uint16) table);
}

/*
 * chorus_put_truncate
 *		A TRUNCATE item of table (the index of its description) with its
 *		TRUNCATE flags.
 */
void
chorus_put_truncate(StringInfo out, int table, uint8 flags)
{
	chorus_put_row_head(out, CHORUS_OP_TRUNCATE, table);
	chorus_put_u8(out, flags);
}

/*
 * chorus_put_value
 *		One value of a row image: kind CHORUS_VAL_NULL alone, or
 *		CHORUS_VAL_TEXT / CHORUS_VAL_BINARY with len bytes of data.
 */
void
chorus_put_value(StringInfo out, uint8 kind, const char *data, uint32 len)
{
	chorus_put_u8(out, kind);
	if (kind != CHORUS_VAL_NULL && kind != CHORUS_VAL_UNCHANGED)
		chorus_put_blob(out, data, len);
}

/*
 * chorus_put_key_head
 *		The start of a certification key: its mode and how many parts follow
 *		(each a blob: schema, table, then column names and values).
 */
void
chorus_put_key_head(StringInfo out, uint8 mode, int nparts)
{
	chorus_put_u8(out, mode);
	chorus_put_u16(out, (uint16) nparts);
}

/*
 * chorus_put_table_key
 *		A table-level certification key: [nspname, relname] in mode.
 */
void
chorus_put_table_key(StringInfo out, uint8 mode, const char *nspname, const char *relname)
{
	chorus_put_key_head(out, mode, 2);
	chorus_put_blob(out, nspname, strlen(nspname));
	chorus_put_blob(out, relname, strlen(relname));
}
