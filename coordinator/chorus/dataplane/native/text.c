/*
 * text.c
 *		The words of a certification key, as wire.Key.describe gives them
 *		(docs/NATIVE.md section 4.5): each part decoded as UTF-8 with CPython's
 *		"replace" (one U+FFFD per maximal invalid subpart), the schema and
 *		table quoted as quote_ident does, the rest as "(column)=(v1, v2)"; a
 *		key of one part is the repr of its parts' tuple. Held to Key.describe
 *		by tests/unit/test_dataplane_scan.py. The first step of the reasons in
 *		C (the conflict's text is still worded by dataplane/native.py).
 */
#include <string.h>

#include "ch_mem.h"

typedef struct text_out
{
	char	   *buf;
	size_t		cap;
	size_t		len;			/* what the whole text needs, written or not */
} text_out;

static void
put(text_out *t, const void *data, size_t n)
{
	if (t->len < t->cap)
		memcpy(t->buf + t->len, data, t->len + n <= t->cap ? n : t->cap - t->len);
	t->len += n;
}

static void
put_char(text_out *t, char c)
{
	put(t, &c, 1);
}

static inline bool
cont(uint8_t c)
{
	return (c & 0xC0) == 0x80;
}

/* bytes decoded as UTF-8 with errors="replace", written as UTF-8; quote: '"' doubled, or 0 */
static void
put_utf8(text_out *t, const uint8_t *s, size_t n, char quote)
{
	static const char fffd[3] = {(char) 0xEF, (char) 0xBF, (char) 0xBD};
	size_t		i = 0;

	while (i < n)
	{
		uint8_t		c = s[i];
		size_t		good = 0;	/* a whole sequence of this many bytes */
		size_t		bad = 1;	/* else one U+FFFD for this many */

		if (c < 0x80)
			good = 1;
		else if (c >= 0xC2 && c <= 0xDF)
			good = i + 1 < n && cont(s[i + 1]) ? 2 : 0;
		else if (c >= 0xE0 && c <= 0xEF)
		{
			uint8_t		lo = c == 0xE0 ? 0xA0 : 0x80,
						hi = c == 0xED ? 0x9F : 0xBF;

			if (i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi)
			{
				if (i + 2 < n && cont(s[i + 2]))
					good = 3;
				else
					bad = 2;
			}
		}
		else if (c >= 0xF0 && c <= 0xF4)
		{
			uint8_t		lo = c == 0xF0 ? 0x90 : 0x80,
						hi = c == 0xF4 ? 0x8F : 0xBF;

			if (i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi)
			{
				if (i + 2 < n && cont(s[i + 2]))
				{
					if (i + 3 < n && cont(s[i + 3]))
						good = 4;
					else
						bad = 3;
				}
				else
					bad = 2;
			}
		}
		if (good > 0)
		{
			if (quote != 0 && c == (uint8_t) quote)
				put_char(t, quote);
			put(t, s + i, good);
			i += good;
		}
		else
		{
			put(t, fffd, 3);
			i += bad;
		}
	}
}

/* repr() of a bytes value */
static void
put_bytes_repr(text_out *t, const uint8_t *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	char		quote = '\'';

	if (memchr(s, '\'', n) != NULL && memchr(s, '"', n) == NULL)
		quote = '"';
	put_char(t, 'b');
	put_char(t, quote);
	for (size_t i = 0; i < n; i++)
	{
		uint8_t		c = s[i];

		if (c == (uint8_t) quote || c == '\\')
		{
			put_char(t, '\\');
			put_char(t, (char) c);
		}
		else if (c == '\t')
			put(t, "\\t", 2);
		else if (c == '\n')
			put(t, "\\n", 2);
		else if (c == '\r')
			put(t, "\\r", 2);
		else if (c < 0x20 || c >= 0x7F)
		{
			char		x[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};

			put(t, x, 4);
		}
		else
			put_char(t, (char) c);
	}
	put_char(t, quote);
}

static uint32_t
be32(const uint8_t *p)
{
	return ((uint32_t) p[0] << 24) | ((uint32_t) p[1] << 16) | ((uint32_t) p[2] << 8) | p[3];
}

/*
 * ch_key_describe
 *		Key.describe of the key whose nparts parts are encoded (each a u32
 *		length and its bytes, as a writeset holds them) in the len bytes at
 *		parts: written as UTF-8 into out, at most cap bytes. Returns the
 *		length of the whole text (more than cap: it was cut), or 0 if the
 *		parts do not fill exactly len bytes.
 */
size_t
ch_key_describe(const uint8_t *parts, size_t len, uint32_t nparts, char *out, size_t cap)
{
	text_out	t = {out, cap, 0};
	const uint8_t *p[3];
	size_t		plen[3];
	size_t		pos = 0;

	for (uint32_t i = 0; i < nparts; i++)
	{
		size_t		n;

		if (len - pos < 4 || (n = be32(parts + pos)) > len - pos - 4)
			return 0;
		if (i < 3)
		{
			p[i] = parts + pos + 4;
			plen[i] = n;
		}
		pos += 4 + n;
	}
	if (pos != len || nparts == 0)
		return 0;
	if (nparts == 1)
	{
		put_char(&t, '(');
		put_bytes_repr(&t, p[0], plen[0]);
		put(&t, ",)", 2);
		return t.len;
	}
	put_char(&t, '"');
	put_utf8(&t, p[0], plen[0], '"');
	put(&t, "\".\"", 3);
	put_utf8(&t, p[1], plen[1], '"');
	put_char(&t, '"');
	if (nparts == 2)
	{
		put(&t, " (table)", 8);
		return t.len;
	}
	put(&t, " (", 2);
	put_utf8(&t, p[2], plen[2], 0);
	put(&t, ")=(", 3);
	pos = 4 + plen[0] + 4 + plen[1] + 4 + plen[2];
	for (uint32_t i = 3; i < nparts; i++)
	{
		size_t		n = be32(parts + pos);

		if (i > 3)
			put(&t, ", ", 2);
		put_utf8(&t, parts + pos + 4, n, 0);
		pos += 4 + n;
	}
	put_char(&t, ')');
	return t.len;
}
