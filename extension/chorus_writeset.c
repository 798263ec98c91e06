/*
 * chorus_writeset.c
 *		The writeset wire format (docs/PROTOCOL.md section 2; constants in
 *		chorus_wire.h): big-endian integers, u16-length strings, u32-length
 *		blobs. The coordinator reads it with coordinator/chorus/wire.py, the
 *		apply function with chorus_apply.c.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"

#include "chorus.h"

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
void
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
 * chorus_serialize_writeset
 *		Write the current transaction's writeset into out: header, table list,
 *		rows (and schema change items, in their order), keys.
 */
void
chorus_serialize_writeset(StringInfo out, TransactionId xid, uint8 flags)
{
	int			i,
				k;

	if (chorus_xact.has_schema)
		flags |= CHORUS_WS_FLAG_DDL;
	if (chorus_xact.concurrent)
		flags |= CHORUS_WS_FLAG_CONCURRENT;
	chorus_put_header(out, flags, xid, chorus_xact.last_seen, chorus_xact.ntables,
					  chorus_xact.nrows, chorus_xact.nkeys);
	for (i = 0; i < chorus_xact.ntables; i++)
	{
		ChorusTable *t = chorus_xact.tables[i];

		chorus_put_str(out, t->nspname);
		chorus_put_str(out, t->relname);
		chorus_put_u16(out, (uint16) t->ncols);
		for (k = 0; k < t->ncols; k++)
		{
			chorus_put_str(out, t->attnames[k]);
			chorus_put_str(out, t->typnames[k]);
			chorus_put_u8(out, t->colflags[k]);
		}
		chorus_put_u16(out, (uint16) t->nidentity);
		for (k = 0; k < t->nidentity; k++)
			chorus_put_u16(out, (uint16) t->identity[k]);
		chorus_put_u8(out, t->full_identity ? CHORUS_TABLE_FULL_IDENTITY : 0);
	}
	appendBinaryStringInfo(out, chorus_xact.rows.data, chorus_xact.rows.len);
	appendBinaryStringInfo(out, chorus_xact.keys.data, chorus_xact.keys.len);
}
