/*
 * chorus_writeset.c
 *		The writeset wire format, version 1 (docs/PROTOCOL.md section 2): big-endian
 *		integers, u16-length strings, u32-length blobs. The coordinator reads it
 *		with coordinator/chorus/wire.py.
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "miscadmin.h"

#include "chorus.h"

#define CHORUS_WIRE_VERSION 1

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
 * chorus_serialize_writeset
 *		Write the current transaction's writeset into out: header, table list,
 *		rows, keys.
 */
void
chorus_serialize_writeset(StringInfo out, TransactionId xid)
{
	int			i,
				k;

	appendBinaryStringInfo(out, "CW", 2);
	chorus_put_u8(out, CHORUS_WIRE_VERSION);
	chorus_put_u8(out, 0);
	chorus_put_u32(out, xid);
	chorus_put_u32(out, (uint32) MyProcPid);
	chorus_put_u64(out, chorus_xact.last_seen);
	chorus_put_u16(out, (uint16) chorus_xact.ntables);
	chorus_put_u32(out, chorus_xact.nrows);
	chorus_put_u32(out, chorus_xact.nkeys);
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
	}
	appendBinaryStringInfo(out, chorus_xact.rows.data, chorus_xact.rows.len);
	appendBinaryStringInfo(out, chorus_xact.keys.data, chorus_xact.keys.len);
}
