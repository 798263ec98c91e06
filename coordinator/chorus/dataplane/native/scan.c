/*
 * scan.c
 *		A writeset read as certification needs it (wire.scan's "scanned"
 *		reading, docs/NATIVE.md section 3.2): the header's fields and flags,
 *		and per key its mode, its parts' place in the buffer and its digest
 *		(wire.key_hash: BLAKE2b-128 of the encoded parts). The whole writeset
 *		is checked with the extension's reader (extension/chorus_wsread.c,
 *		compiled into this library, not copied), so what it refuses is what
 *		the apply function and wsdump refuse, as a ChorusWsrError in
 *		info->err.
 *
 *		Two places where the Python reference (wire.read_python) checks in
 *		another order than chorus_wsread.c are checked here first, so that
 *		both name the same rule: a buffer that does not begin with the magic
 *		is BAD_MAGIC however short it is, and a table's identity columns are
 *		all read (TRUNCATED) before any is range-checked (IDENTITY_RANGE).
 *
 *		Nothing is allocated. Keys go into the caller's array; when it is too
 *		small the writeset is still checked to its end, and CH_EFULL says how
 *		many keys it has (info->nkeys), for a second call.
 */
#include <string.h>

#include "ch_mem.h"
#include "chorus_wire.h"
#include "chorus_wsread.h"

extern void ch_blake2b(const uint8_t *data, size_t len, uint8_t *out, size_t outlen);

#define SCAN_WIDTHS 64			/* tables whose widths are remembered; the rest are found again */

typedef struct scan_widths
{
	uint16_t	ncols;
	uint16_t	nold;			/* an old image's: the identity's, or ncols (CHORUS_TABLE_OLD_COLUMNS) */
} scan_widths;

static int
scan_fail(ch_scan_info *info, const ChorusWsReader *r)
{
	info->err = (int) r->err;
	info->err_pos = r->err_pos;
	info->err_value = r->err_value;
	info->err_expected = r->err_expected;
	return CH_EWIRE;
}

static int
scan_fail_at(ch_scan_info *info, int err, size_t pos)
{
	info->err = err;
	info->err_pos = pos;
	info->err_value = 0;
	info->err_expected = 0;
	return CH_EWIRE;
}

static inline uint16_t
be16(const uint8_t *p)
{
	return (uint16_t) ((p[0] << 8) | p[1]);
}

/*
 * The widths of table i of a writeset whose table descriptions, which start
 * at from, were all read and checked: walked again, without checks.
 */
static scan_widths
widths_again(const uint8_t *buf, size_t from, uint16_t i)
{
	size_t		pos = from;
	scan_widths w = {0, 0};

	for (uint32_t t = 0; t <= i; t++)
	{
		pos += 2 + be16(buf + pos);
		pos += 2 + be16(buf + pos);
		w.ncols = be16(buf + pos);
		pos += 2;
		for (uint32_t c = 0; c < w.ncols; c++)
		{
			pos += 2 + be16(buf + pos);
			pos += 2 + be16(buf + pos);
			pos += 1;
		}
		w.nold = be16(buf + pos);
		pos += 2 + 2 * (size_t) w.nold;
		if (buf[pos] & CHORUS_TABLE_OLD_COLUMNS)
			w.nold = w.ncols;
		pos += 1;
	}
	return w;
}

/* One row image of width values. */
static int
scan_tuple(ChorusWsReader *r, uint16_t width)
{
	ChorusWsValue v;

	if (chorus_wsr_tuple(r, width) != 0)
		return -1;
	for (uint32_t i = 0; i < width; i++)
		if (chorus_wsr_value(r, &v) != 0)
			return -1;
	return 0;
}

/*
 * ch_scan
 *		Read and check the writeset of len bytes at buf. CH_OK: *info holds
 *		its header and the first min(nkeys, cap) keys are in keys. CH_EWIRE:
 *		it is malformed, info->err says how (the rest of *info is not to be
 *		read). CH_EFULL: it is good but has more than cap keys (info->nkeys).
 */
int
ch_scan(const uint8_t *buf, size_t len, ch_scan_info *info, ch_scan_key *keys, size_t cap)
{
	ChorusWsReader r;
	ChorusWsHeader h;
	scan_widths widths[SCAN_WIDTHS];
	size_t		tables_at;

	memset(info, 0, sizeof(*info));
	if (len < 2 || memcmp(buf, CHORUS_WS_MAGIC, 2) != 0)
		return scan_fail_at(info, CHORUS_WSR_BAD_MAGIC, 0);
	if (chorus_wsr_open(&r, buf, len, &h) != 0)
		return scan_fail(info, &r);
	info->flags = h.flags;
	info->xid = h.xid;
	info->pid = h.pid;
	info->last_seen = h.last_seen;
	info->encoding = h.encoding;
	info->ntables = h.ntables;
	info->nrows = h.nrows;
	info->nkeys = h.nkeys;

	tables_at = r.pos;
	for (uint32_t t = 0; t < h.ntables; t++)
	{
		ChorusWsBytes nsp,
					rel,
					name,
					typ;
		uint16_t	ncols,
					nident,
					col;
		uint8_t		flags;

		if (chorus_wsr_table(&r, &nsp, &rel, &ncols) != 0)
			return scan_fail(info, &r);
		for (uint32_t c = 0; c < ncols; c++)
			if (chorus_wsr_column(&r, &name, &typ, &flags) != 0)
				return scan_fail(info, &r);
		if (chorus_wsr_identity_count(&r, &nident) != 0)
			return scan_fail(info, &r);
		if (r.len - r.pos < 2 * (size_t) nident)
			return scan_fail_at(info, CHORUS_WSR_TRUNCATED, r.pos);
		for (uint32_t i = 0; i < nident; i++)
			if (chorus_wsr_identity(&r, ncols, &col) != 0)
				return scan_fail(info, &r);
		if (chorus_wsr_table_flags(&r, &flags) != 0)
			return scan_fail(info, &r);
		if (t < SCAN_WIDTHS)
			widths[t] = (scan_widths) {ncols, (flags & CHORUS_TABLE_OLD_COLUMNS) ? ncols : nident};
	}

	for (uint32_t i = 0; i < h.nrows; i++)
	{
		ChorusWsItem item;
		scan_widths w;

		if (chorus_wsr_item(&r, &item) != 0)
			return scan_fail(info, &r);
		if (item.op == CHORUS_OP_SCHEMA)
		{
			ChorusWsBytes name,
						value;

			info->nschema++;
			for (uint32_t s = 0; s < item.nsettings; s++)
				if (chorus_wsr_setting(&r, &name, &value) != 0)
					return scan_fail(info, &r);
			if (chorus_wsr_schema_end(&r, &name, &value) != 0)
				return scan_fail(info, &r);
			continue;
		}
		if (item.op == CHORUS_OP_TRUNCATE)
			continue;
		w = item.table < SCAN_WIDTHS ? widths[item.table] : widths_again(buf, tables_at, item.table);
		if ((item.op == CHORUS_OP_UPDATE || item.op == CHORUS_OP_DELETE) && scan_tuple(&r, w.nold) != 0)
			return scan_fail(info, &r);
		if ((item.op == CHORUS_OP_INSERT || item.op == CHORUS_OP_UPDATE) && scan_tuple(&r, w.ncols) != 0)
			return scan_fail(info, &r);
	}

	for (uint32_t k = 0; k < h.nkeys; k++)
	{
		uint8_t		mode;
		uint16_t	nparts;
		size_t		start;
		ChorusWsBytes part;

		if (chorus_wsr_key(&r, &mode, &nparts) != 0)
			return scan_fail(info, &r);
		start = r.pos;
		for (uint32_t p = 0; p < nparts; p++)
			if (chorus_wsr_key_part(&r, &part) != 0)
				return scan_fail(info, &r);
		if (k < cap)
		{
			ch_scan_key *key = &keys[k];

			key->mode = mode;
			key->nparts = nparts;
			key->off = start;
			key->len = r.pos - start;
			ch_blake2b(buf + start, r.pos - start, key->digest, 16);
		}
	}
	if (chorus_wsr_finish(&r) != 0)
		return scan_fail(info, &r);
	return h.nkeys > cap ? CH_EFULL : CH_OK;
}
