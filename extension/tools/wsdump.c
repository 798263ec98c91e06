/*
 * wsdump.c
 *		Prints a writeset as one line of JSON, read with the extension's own
 *		reader (chorus_wsread.c): for tests that compare it with the
 *		coordinator's reader, and for looking into a writeset by hand. Not part
 *		of the PostgreSQL module; built with "make wsdump".
 *
 *		wsdump [FILE...]  (standard input without FILE)
 *
 *		Names, values and key parts are printed as hex (they are bytes in the
 *		database's encoding); a value as null, "t:<hex>" (text) or "b:<hex>"
 *		(binary). One line per file; a writeset the reader refuses prints
 *		{"error": ..., "at": ...} instead. The exit status is 0 if every file
 *		was read, 1 if a writeset was refused, 2 if a file could not be read.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../chorus_wire.h"
#include "../chorus_wsread.h"

static FILE *js;					/* where the description goes */

/* data as a JSON string of hex digits, after prefix ("t:", "b:" or "") */
static void
put_hex(const char *prefix, const char *data, uint32_t len)
{
	uint32_t	i;

	fprintf(js, "\"%s", prefix);
	for (i = 0; i < len; i++)
		fprintf(js, "%02x", (unsigned char) data[i]);
	fputc('"', js);
}

static void
put_bytes(ChorusWsBytes b)
{
	put_hex("", b.data, b.len);
}

/* A row image of width values; 0, or -1 if the reader failed. */
static int
put_image(ChorusWsReader *r, uint16_t width)
{
	uint16_t	i;

	if (chorus_wsr_tuple(r, width) != 0)
		return -1;
	fputc('[', js);
	for (i = 0; i < width; i++)
	{
		ChorusWsValue v;

		if (chorus_wsr_value(r, &v) != 0)
			return -1;
		if (i > 0)
			fputc(',', js);
		if (v.kind == CHORUS_VAL_NULL)
		{
			fputs("null", js);
			continue;
		}
		if (v.kind == CHORUS_VAL_UNCHANGED)
		{
			fputs("\"u\"", js);
			continue;
		}
		put_hex(v.kind == CHORUS_VAL_TEXT ? "t:" : "b:", v.data, v.len);
	}
	fputc(']', js);
	return 0;
}

/*
 * dump
 *		Print the writeset in buf as JSON; 0, or -1 if the reader refused it
 *		(the output so far is then discarded by the caller's error line).
 */
static int
dump(ChorusWsReader *r, const char *buf, size_t len, uint16_t *widths, uint16_t *nidents)
{
	ChorusWsHeader h;
	uint32_t	i;

	if (chorus_wsr_open(r, buf, len, &h) != 0)
		return -1;
	fprintf(js, "{\"version\":%u,\"flags\":%u,\"xid\":%lu,\"pid\":%lu,\"last_seen\":%llu,\"encoding\":%u,\"tables\":[",
		   h.version, h.flags, (unsigned long) h.xid, (unsigned long) h.pid,
		   (unsigned long long) h.last_seen, h.encoding);
	for (i = 0; i < h.ntables; i++)
	{
		ChorusWsBytes nsp,
					rel;
		uint16_t	ncols,
					nident,
					c;
		uint8_t		flags;

		if (chorus_wsr_table(r, &nsp, &rel, &ncols) != 0)
			return -1;
		fprintf(js, "%s{\"nspname\":", i ? "," : "");
		put_bytes(nsp);
		fputs(",\"relname\":", js);
		put_bytes(rel);
		fputs(",\"columns\":[", js);
		for (c = 0; c < ncols; c++)
		{
			ChorusWsBytes name,
						typname;

			if (chorus_wsr_column(r, &name, &typname, &flags) != 0)
				return -1;
			fprintf(js, "%s{\"name\":", c ? "," : "");
			put_bytes(name);
			fputs(",\"type\":", js);
			put_bytes(typname);
			fprintf(js, ",\"flags\":%u}", flags);
		}
		fputs("],\"identity\":[", js);
		if (chorus_wsr_identity_count(r, &nident) != 0)
			return -1;
		for (c = 0; c < nident; c++)
		{
			uint16_t	col;

			if (chorus_wsr_identity(r, ncols, &col) != 0)
				return -1;
			fprintf(js, "%s%u", c ? "," : "", col);
		}
		if (chorus_wsr_table_flags(r, &flags) != 0)
			return -1;
		fprintf(js, "],\"flags\":%u}", flags);
		widths[i] = ncols;
		/* an old image's width: the identity's, or every column's with captured old values */
		nidents[i] = (flags & CHORUS_TABLE_OLD_COLUMNS) ? ncols : nident;
	}
	fputs("],\"items\":[", js);
	for (i = 0; i < h.nrows; i++)
	{
		ChorusWsItem it;

		if (chorus_wsr_item(r, &it) != 0)
			return -1;
		fprintf(js, "%s{\"op\":\"%c\"", i ? "," : "", it.op);
		if (it.op == CHORUS_OP_SCHEMA)
		{
			ChorusWsBytes name,
						value,
						role,
						statement;
			uint16_t	s;

			fputs(",\"settings\":[", js);
			for (s = 0; s < it.nsettings; s++)
			{
				if (chorus_wsr_setting(r, &name, &value) != 0)
					return -1;
				fputs(s ? ",[" : "[", js);
				put_bytes(name);
				fputc(',', js);
				put_bytes(value);
				fputc(']', js);
			}
			if (chorus_wsr_schema_end(r, &role, &statement) != 0)
				return -1;
			fputs("],\"role\":", js);
			put_bytes(role);
			fputs(",\"statement\":", js);
			put_bytes(statement);
			fputc('}', js);
			continue;
		}
		fprintf(js, ",\"table\":%u", it.table);
		if (it.op == CHORUS_OP_TRUNCATE)
			fprintf(js, ",\"flags\":%u", it.truncate_flags);
		if (it.op == CHORUS_OP_UPDATE || it.op == CHORUS_OP_DELETE)
		{
			fputs(",\"old\":", js);
			if (put_image(r, nidents[it.table]) != 0)
				return -1;
		}
		if (it.op == CHORUS_OP_INSERT || it.op == CHORUS_OP_UPDATE)
		{
			fputs(",\"new\":", js);
			if (put_image(r, widths[it.table]) != 0)
				return -1;
		}
		fputc('}', js);
	}
	fputs("],\"keys\":[", js);
	for (i = 0; i < h.nkeys; i++)
	{
		uint8_t		mode;
		uint16_t	nparts,
					p;

		if (chorus_wsr_key(r, &mode, &nparts) != 0)
			return -1;
		fprintf(js, "%s{\"mode\":%u,\"parts\":[", i ? "," : "", mode);
		for (p = 0; p < nparts; p++)
		{
			ChorusWsBytes part;

			if (chorus_wsr_key_part(r, &part) != 0)
				return -1;
			if (p > 0)
				fputc(',', js);
			put_bytes(part);
		}
		fputs("]}", js);
	}
	fputs("]}\n", js);
	return chorus_wsr_finish(r);
}

/*
 * dump_file
 *		Print the description of the writeset in file path (NULL: standard
 *		input), or its error line. Returns 0, 1 if the reader refused it, 2 if
 *		the file could not be read.
 */
static int
dump_file(const char *path)
{
	FILE	   *f = path ? fopen(path, "rb") : stdin;
	char	   *buf = NULL;
	size_t		len = 0,
				cap = 0;
	static uint16_t widths[UINT16_MAX],
				nidents[UINT16_MAX];
	ChorusWsReader r;
	char	   *out = NULL;
	size_t		outlen = 0;
	int			rc;

	if (f == NULL)
	{
		perror(path);
		return 2;
	}
	for (;;)
	{
		size_t		n;

		if (len == cap)
		{
			cap = cap ? cap * 2 : 65536;
			buf = realloc(buf, cap);
			if (buf == NULL)
				return 2;
		}
		n = fread(buf + len, 1, cap - len, f);
		if (n == 0)
			break;
		len += n;
	}
	rc = ferror(f) ? 2 : 0;
	if (path)
		fclose(f);
	if (rc != 0)
	{
		perror(path ? path : "stdin");
		free(buf);
		return rc;
	}

	/* the description goes to memory first: a refusal halfway prints only the error */
	js = open_memstream(&out, &outlen);
	if (js == NULL)
		return 2;
	rc = dump(&r, buf, len, widths, nidents);
	fclose(js);
	if (rc != 0)
		printf("{\"error\":\"%s\",\"at\":%lu}\n", chorus_wsr_error_text(r.err), (unsigned long) r.err_pos);
	else
		fwrite(out, 1, outlen, stdout);
	free(out);
	free(buf);
	return rc != 0 ? 1 : 0;
}

int
main(int argc, char **argv)
{
	int			worst = 0;
	int			i;

	if (argc < 2)
		return dump_file(NULL);
	for (i = 1; i < argc; i++)
	{
		int			rc = dump_file(argv[i]);

		worst = rc > worst ? rc : worst;
	}
	return worst;
}
