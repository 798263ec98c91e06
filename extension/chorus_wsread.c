/*
 * chorus_wsread.c
 *		The writeset reader: the one parser of the writeset wire format in C
 *		(docs/PROTOCOL.md section 2; constants in chorus_wire.h), used by the
 *		apply function (chorus_apply.c) and the standalone tools/wsdump. It
 *		reads a buffer part by part in place, checks every length against the
 *		buffer before reading, and refuses exactly what the coordinator's
 *		reader (coordinator/chorus/wire.py, decode) refuses: a wrong magic, an
 *		unknown version, flag, op, value kind or key mode, an index out of
 *		range, a count that does not match, trailing bytes. It includes no
 *		PostgreSQL header and allocates nothing.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "chorus_wire.h"
#include "chorus_wsread.h"

/* a run's writesets follow their lengths, read as u32 (chorus_wsr_run_next) */
typedef char chorus_run_length_is_u32[CHORUS_RUN_LENGTH_SIZE == sizeof(uint32_t) ? 1 : -1];

/* Fail with err at byte pos (the first failure stays). */
static int
wsr_fail(ChorusWsReader *r, ChorusWsrError err, size_t pos, uint64_t value, uint64_t expected)
{
	if (r->err == CHORUS_WSR_OK)
	{
		r->err = err;
		r->err_pos = pos;
		r->err_value = value;
		r->err_expected = expected;
	}
	return -1;
}

/* Whether n more bytes are there; else the reader fails as truncated. */
static int
wsr_need(ChorusWsReader *r, size_t n)
{
	if (r->err != CHORUS_WSR_OK)
		return -1;
	if (r->len - r->pos < n)
		return wsr_fail(r, CHORUS_WSR_TRUNCATED, r->pos, 0, 0);
	return 0;
}

static int
wsr_u8(ChorusWsReader *r, uint8_t *v)
{
	if (wsr_need(r, 1) != 0)
		return -1;
	*v = (uint8_t) r->buf[r->pos++];
	return 0;
}

static int
wsr_u16(ChorusWsReader *r, uint16_t *v)
{
	const unsigned char *p;

	if (wsr_need(r, 2) != 0)
		return -1;
	p = (const unsigned char *) r->buf + r->pos;
	*v = (uint16_t) ((p[0] << 8) | p[1]);
	r->pos += 2;
	return 0;
}

static int
wsr_u32(ChorusWsReader *r, uint32_t *v)
{
	const unsigned char *p;

	if (wsr_need(r, 4) != 0)
		return -1;
	p = (const unsigned char *) r->buf + r->pos;
	*v = ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) | ((uint32_t) p[2] << 8) | p[3];
	r->pos += 4;
	return 0;
}

static int
wsr_u64(ChorusWsReader *r, uint64_t *v)
{
	uint32_t	hi,
				lo;

	if (wsr_u32(r, &hi) != 0 || wsr_u32(r, &lo) != 0)
		return -1;
	*v = ((uint64_t) hi << 32) | lo;
	return 0;
}

/* n bytes in place */
static int
wsr_bytes(ChorusWsReader *r, uint32_t n, ChorusWsBytes *b)
{
	if (wsr_need(r, n) != 0)
		return -1;
	b->data = r->buf + r->pos;
	b->len = n;
	r->pos += n;
	return 0;
}

/* a string: u16 length and bytes */
static int
wsr_str(ChorusWsReader *r, ChorusWsBytes *b)
{
	uint16_t	n;

	if (wsr_u16(r, &n) != 0)
		return -1;
	return wsr_bytes(r, n, b);
}

/* a blob: u32 length and bytes */
static int
wsr_blob(ChorusWsReader *r, ChorusWsBytes *b)
{
	uint32_t	n;

	if (wsr_u32(r, &n) != 0)
		return -1;
	return wsr_bytes(r, n, b);
}

/*
 * chorus_wsr_open
 *		Start reading the writeset in buf (len bytes): its header into *h,
 *		checked (magic, version, flags, counts against the length).
 */
int
chorus_wsr_open(ChorusWsReader *r, const void *buf, size_t len, ChorusWsHeader *h)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->len = len;
	if (wsr_need(r, CHORUS_WS_HEAD_SIZE) != 0)
		return -1;
	if (memcmp(r->buf, CHORUS_WS_MAGIC, 2) != 0)
		return wsr_fail(r, CHORUS_WSR_BAD_MAGIC, 0, 0, 0);
	r->pos = 2;
	if (wsr_u8(r, &h->version) != 0 || wsr_u8(r, &h->flags) != 0 || wsr_u32(r, &h->xid) != 0 ||
		wsr_u32(r, &h->pid) != 0 || wsr_u64(r, &h->last_seen) != 0 ||
		wsr_u16(r, &h->encoding) != 0 || wsr_u16(r, &h->ntables) != 0 ||
		wsr_u32(r, &h->nrows) != 0 || wsr_u32(r, &h->nkeys) != 0)
		return -1;
	if (h->version != CHORUS_WS_VERSION)
		return wsr_fail(r, CHORUS_WSR_BAD_VERSION, 2, h->version, CHORUS_WS_VERSION);
	if ((h->flags & ~CHORUS_WS_FLAGS_KNOWN) != 0)
		return wsr_fail(r, CHORUS_WSR_UNKNOWN_FLAGS, 3, h->flags, 0);
	if (h->ntables > len || h->nrows > len || h->nkeys > len)
		return wsr_fail(r, CHORUS_WSR_COUNTS, 0, 0, 0);
	r->flags = h->flags;
	r->ntables = h->ntables;
	r->nrows = h->nrows;
	return 0;
}

/* A table description's names and column count. */
int
chorus_wsr_table(ChorusWsReader *r, ChorusWsBytes *nspname, ChorusWsBytes *relname, uint16_t *ncols)
{
	if (wsr_str(r, nspname) != 0 || wsr_str(r, relname) != 0)
		return -1;
	return wsr_u16(r, ncols);
}

/* One column of a table description: name, type name, flags (checked). */
int
chorus_wsr_column(ChorusWsReader *r, ChorusWsBytes *name, ChorusWsBytes *typname, uint8_t *flags)
{
	size_t		at;

	if (wsr_str(r, name) != 0 || wsr_str(r, typname) != 0)
		return -1;
	at = r->pos;
	if (wsr_u8(r, flags) != 0)
		return -1;
	if ((*flags & ~CHORUS_COL_FLAGS_KNOWN) != 0)
		return wsr_fail(r, CHORUS_WSR_COLUMN_FLAGS, at, *flags, 0);
	return 0;
}

/* How many identity columns a table description lists. */
int
chorus_wsr_identity_count(ChorusWsReader *r, uint16_t *nidentity)
{
	return wsr_u16(r, nidentity);
}

/* One identity column: an index into the table's ncols columns. */
int
chorus_wsr_identity(ChorusWsReader *r, uint16_t ncols, uint16_t *column)
{
	size_t		at = r->pos;

	if (wsr_u16(r, column) != 0)
		return -1;
	if (*column >= ncols)
		return wsr_fail(r, CHORUS_WSR_IDENTITY_RANGE, at, *column, ncols);
	return 0;
}

/* The flags that end a table description (checked). */
int
chorus_wsr_table_flags(ChorusWsReader *r, uint8_t *flags)
{
	size_t		at = r->pos;

	if (wsr_u8(r, flags) != 0)
		return -1;
	if ((*flags & ~CHORUS_TABLE_FLAGS_KNOWN) != 0)
		return wsr_fail(r, CHORUS_WSR_TABLE_FLAGS, at, *flags, 0);
	return 0;
}

/*
 * chorus_wsr_item
 *		The start of an item: its op; a row's table (in range) and a
 *		TRUNCATE's flags (known); a schema change's count of settings.
 */
int
chorus_wsr_item(ChorusWsReader *r, ChorusWsItem *item)
{
	size_t		at = r->pos;
	uint8_t		op;

	memset(item, 0, sizeof(*item));
	if (wsr_u8(r, &op) != 0)
		return -1;
	item->op = (char) op;
	if (item->op == CHORUS_OP_SCHEMA)
	{
		r->nschema++;
		return wsr_u16(r, &item->nsettings);
	}
	if (item->op != CHORUS_OP_INSERT && item->op != CHORUS_OP_UPDATE &&
		item->op != CHORUS_OP_DELETE && item->op != CHORUS_OP_TRUNCATE)
		return wsr_fail(r, CHORUS_WSR_UNKNOWN_OP, at, op, 0);
	at = r->pos;
	if (wsr_u16(r, &item->table) != 0)
		return -1;
	if (item->table >= r->ntables)
		return wsr_fail(r, CHORUS_WSR_TABLE_RANGE, at, item->table, r->ntables);
	if (item->op != CHORUS_OP_TRUNCATE)
		return 0;
	at = r->pos;
	if (wsr_u8(r, &item->truncate_flags) != 0)
		return -1;
	if ((item->truncate_flags & ~CHORUS_TRUNCATE_FLAGS_KNOWN) != 0)
		return wsr_fail(r, CHORUS_WSR_TRUNCATE_FLAGS, at, item->truncate_flags, 0);
	return 0;
}

/*
 * chorus_wsr_tuple
 *		The start of a row image: its count of values, which must be width (the
 *		identity's for an old image, the table's columns for a new one).
 */
int
chorus_wsr_tuple(ChorusWsReader *r, uint16_t width)
{
	size_t		at = r->pos;
	uint16_t	n;

	if (wsr_u16(r, &n) != 0)
		return -1;
	if (n != width)
		return wsr_fail(r, CHORUS_WSR_WIDTH, at, n, width);
	return 0;
}

/* One value of a row image: its kind (known) and, unless NULL, its bytes. */
int
chorus_wsr_value(ChorusWsReader *r, ChorusWsValue *v)
{
	size_t		at = r->pos;
	ChorusWsBytes b;

	v->data = NULL;
	v->len = 0;
	if (wsr_u8(r, &v->kind) != 0)
		return -1;
	if (v->kind == CHORUS_VAL_NULL || v->kind == CHORUS_VAL_UNCHANGED)
		return 0;
	if (v->kind != CHORUS_VAL_TEXT && v->kind != CHORUS_VAL_BINARY)
		return wsr_fail(r, CHORUS_WSR_VALUE_KIND, at, v->kind, 0);
	if (wsr_blob(r, &b) != 0)
		return -1;
	v->data = b.data;
	v->len = b.len;
	return 0;
}

/* One setting of a schema change item: name and value. */
int
chorus_wsr_setting(ChorusWsReader *r, ChorusWsBytes *name, ChorusWsBytes *value)
{
	if (wsr_str(r, name) != 0)
		return -1;
	return wsr_str(r, value);
}

/* The end of a schema change item: the role that ran it and the statement. */
int
chorus_wsr_schema_end(ChorusWsReader *r, ChorusWsBytes *role, ChorusWsBytes *statement)
{
	if (wsr_str(r, role) != 0)
		return -1;
	return wsr_blob(r, statement);
}

/* The start of a certification key: its mode (known) and count of parts (1 to the maximum). */
int
chorus_wsr_key(ChorusWsReader *r, uint8_t *mode, uint16_t *nparts)
{
	size_t		at = r->pos;

	if (wsr_u8(r, mode) != 0 || wsr_u16(r, nparts) != 0)
		return -1;
	if (*mode != CHORUS_KEY_REFERENCE && *mode != CHORUS_KEY_UPDATE && *mode != CHORUS_KEY_EXCLUSIVE)
		return wsr_fail(r, CHORUS_WSR_KEY_MODE, at, *mode, 0);
	if (*nparts == 0 || *nparts > CHORUS_KEY_MAX_PARTS)
		return wsr_fail(r, CHORUS_WSR_KEY_PARTS, at, *nparts, 0);
	return 0;
}

/* One part of a key. */
int
chorus_wsr_key_part(ChorusWsReader *r, ChorusWsBytes *part)
{
	return wsr_blob(r, part);
}

/*
 * chorus_wsr_finish
 *		After the keys: the header's flags agree with the items (an ordering
 *		request or a concurrent index change is exactly one schema change item;
 *		the DDL flag is set exactly when there are schema change items), and no
 *		byte is left over.
 */
int
chorus_wsr_finish(ChorusWsReader *r)
{
	if (r->err != CHORUS_WSR_OK)
		return -1;
	if ((r->flags & CHORUS_WS_FLAG_TOI) && (r->ntables != 0 || r->nrows != 1 || r->nschema != 1))
		return wsr_fail(r, CHORUS_WSR_TOI_SHAPE, r->pos, 0, 0);
	if ((r->flags & CHORUS_WS_FLAG_CONCURRENT) &&
		((r->flags & CHORUS_WS_FLAG_TOI) || !(r->flags & CHORUS_WS_FLAG_DDL) ||
		 r->ntables != 0 || r->nrows != 1))
		return wsr_fail(r, CHORUS_WSR_CONCURRENT_SHAPE, r->pos, 0, 0);
	if (((r->flags & CHORUS_WS_FLAG_DDL) != 0) != (r->nschema > 0))
		return wsr_fail(r, CHORUS_WSR_DDL_FLAG, r->pos, 0, 0);
	if (r->pos != r->len)
		return wsr_fail(r, CHORUS_WSR_TRAILING, r->pos, r->len - r->pos, 0);
	return 0;
}

/*
 * chorus_wsr_run_next
 *		A run of writesets (chorus.apply_run): each follows its length, a
 *		u32 of CHORUS_RUN_LENGTH_SIZE bytes. r reads the run: start it with
 *		chorus_wsr_run_open. Returns 1 with the next writeset in *ws and *len,
 *		0 at the end of the run, -1 if it is truncated.
 */
int
chorus_wsr_run_next(ChorusWsReader *r, const char **ws, size_t *len)
{
	ChorusWsBytes b;

	if (r->err != CHORUS_WSR_OK)
		return -1;
	if (r->pos == r->len)
		return 0;
	if (wsr_blob(r, &b) != 0)
		return -1;
	*ws = b.data;
	*len = b.len;
	return 1;
}

/* Start reading a run of writesets in buf (len bytes). */
void
chorus_wsr_run_open(ChorusWsReader *r, const void *buf, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->len = len;
}

/* What a failure is, in words (the caller adds where and the values). */
const char *
chorus_wsr_error_text(ChorusWsrError err)
{
	switch (err)
	{
		case CHORUS_WSR_OK:
			return "no error";
		case CHORUS_WSR_TRUNCATED:
			return "writeset truncated";
		case CHORUS_WSR_BAD_MAGIC:
			return "not a writeset (bad magic)";
		case CHORUS_WSR_BAD_VERSION:
			return "unsupported writeset version";
		case CHORUS_WSR_UNKNOWN_FLAGS:
			return "unknown writeset flags";
		case CHORUS_WSR_COUNTS:
			return "writeset counts exceed its length";
		case CHORUS_WSR_COLUMN_FLAGS:
			return "column with unknown flags";
		case CHORUS_WSR_IDENTITY_RANGE:
			return "identity column out of range";
		case CHORUS_WSR_TABLE_FLAGS:
			return "table with unknown flags";
		case CHORUS_WSR_UNKNOWN_OP:
			return "unknown row op";
		case CHORUS_WSR_TABLE_RANGE:
			return "row refers to a table out of range";
		case CHORUS_WSR_TRUNCATE_FLAGS:
			return "TRUNCATE with unknown flags";
		case CHORUS_WSR_WIDTH:
			return "row image of the wrong width";
		case CHORUS_WSR_VALUE_KIND:
			return "value of unknown kind";
		case CHORUS_WSR_KEY_MODE:
			return "unknown key mode";
		case CHORUS_WSR_KEY_PARTS:
			return "key with a wrong number of parts";
		case CHORUS_WSR_TOI_SHAPE:
			return "a schema change's ordering request holds exactly one schema change item";
		case CHORUS_WSR_CONCURRENT_SHAPE:
			return "a concurrent index change holds exactly one schema change item";
		case CHORUS_WSR_DDL_FLAG:
			return "the DDL flag does not match the schema change items";
		case CHORUS_WSR_TRAILING:
			return "trailing bytes after writeset";
	}
	return "unknown error";
}
