/*
 * chorus_wsread.h
 *		The writeset reader (chorus_wsread.c): a cursor over a writeset buffer
 *		that reads it part by part, checking every length against the buffer
 *		and every flag, kind, mode and index against chorus_wire.h, and refusing
 *		what coordinator/chorus/wire.py's decode refuses. No PostgreSQL header:
 *		the apply function and the standalone tools/wsdump use the same code.
 *
 *		A reader is used in the order of the format: chorus_wsr_open (header);
 *		per table chorus_wsr_table, chorus_wsr_column for each column,
 *		chorus_wsr_identity_count, chorus_wsr_identity for each, and
 *		chorus_wsr_table_flags; per item chorus_wsr_item, then for a row
 *		chorus_wsr_tuple and chorus_wsr_value for each value of its images (old,
 *		then new), for a schema change chorus_wsr_setting for each setting and
 *		chorus_wsr_schema_end; per key chorus_wsr_key and chorus_wsr_key_part
 *		for each part; last chorus_wsr_finish. A run of writesets (the argument
 *		of chorus.apply_run) is read with chorus_wsr_run_open and
 *		chorus_wsr_run_next. Each returns 0, or -1 with the
 *		reader's err set (and err_pos, err_value, err_expected where they say
 *		more); a reader that failed stays failed.
 */
#ifndef CHORUS_WSREAD_H
#define CHORUS_WSREAD_H

#include <stddef.h>
#include <stdint.h>

typedef enum ChorusWsrError
{
	CHORUS_WSR_OK = 0,
	CHORUS_WSR_TRUNCATED,		/* a field runs past the end (err_pos: where it starts) */
	CHORUS_WSR_BAD_MAGIC,
	CHORUS_WSR_BAD_VERSION,		/* err_value: the version */
	CHORUS_WSR_UNKNOWN_FLAGS,	/* err_value: the header flags */
	CHORUS_WSR_COUNTS,			/* a count in the header exceeds the length */
	CHORUS_WSR_COLUMN_FLAGS,	/* err_value: the column flags */
	CHORUS_WSR_IDENTITY_RANGE,	/* err_value: the identity column index */
	CHORUS_WSR_TABLE_FLAGS,		/* err_value: the table flags */
	CHORUS_WSR_UNKNOWN_OP,		/* err_value: the op byte */
	CHORUS_WSR_TABLE_RANGE,		/* err_value: the table index, err_expected: the tables */
	CHORUS_WSR_TRUNCATE_FLAGS,	/* err_value: the TRUNCATE flags */
	CHORUS_WSR_WIDTH,			/* err_value: the values, err_expected: the width */
	CHORUS_WSR_VALUE_KIND,		/* err_value: the kind byte */
	CHORUS_WSR_KEY_MODE,		/* err_value: the mode */
	CHORUS_WSR_KEY_PARTS,		/* err_value: the parts */
	CHORUS_WSR_TOI_SHAPE,		/* an ordering request is not one schema change item */
	CHORUS_WSR_CONCURRENT_SHAPE,	/* a concurrent index change is not one schema change item */
	CHORUS_WSR_DDL_FLAG,		/* the DDL flag does not match the schema change items */
	CHORUS_WSR_TRAILING			/* err_value: bytes after the keys */
} ChorusWsrError;

typedef struct ChorusWsReader
{
	const char *buf;
	size_t		len;
	size_t		pos;
	ChorusWsrError err;
	size_t		err_pos;
	uint64_t	err_value;
	uint64_t	err_expected;
	/* from the header, for the checks of later parts */
	uint8_t		flags;
	uint16_t	ntables;
	uint32_t	nrows;
	uint32_t	nschema;		/* schema change items read so far */
} ChorusWsReader;

/* Bytes inside the buffer: a name, a value, a key part (not NUL-terminated). */
typedef struct ChorusWsBytes
{
	const char *data;
	uint32_t	len;
} ChorusWsBytes;

typedef struct ChorusWsHeader
{
	uint8_t		version;
	uint8_t		flags;			/* CHORUS_WS_FLAG_* */
	uint32_t	xid;
	uint32_t	pid;
	uint64_t	last_seen;
	uint16_t	encoding;
	uint16_t	ntables;
	uint32_t	nrows;			/* row and schema change items */
	uint32_t	nkeys;
} ChorusWsHeader;

/* An item: a row change (op I, U, D, T) of table, or a schema change (op S). */
typedef struct ChorusWsItem
{
	char		op;				/* CHORUS_OP_* */
	uint16_t	table;			/* a row's table, checked against the header's count */
	uint8_t		truncate_flags; /* op T: CHORUS_TRUNCATE_* */
	uint16_t	nsettings;		/* op S: the settings that follow */
} ChorusWsItem;

/* One value of a row image: kind CHORUS_VAL_NULL (no bytes), _TEXT or _BINARY. */
typedef struct ChorusWsValue
{
	uint8_t		kind;
	const char *data;
	uint32_t	len;
} ChorusWsValue;

extern int	chorus_wsr_open(ChorusWsReader *r, const void *buf, size_t len, ChorusWsHeader *h);
extern int	chorus_wsr_table(ChorusWsReader *r, ChorusWsBytes *nspname, ChorusWsBytes *relname,
							 uint16_t *ncols);
extern int	chorus_wsr_column(ChorusWsReader *r, ChorusWsBytes *name, ChorusWsBytes *typname,
							  uint8_t *flags);
extern int	chorus_wsr_identity_count(ChorusWsReader *r, uint16_t *nidentity);
extern int	chorus_wsr_identity(ChorusWsReader *r, uint16_t ncols, uint16_t *column);
extern int	chorus_wsr_table_flags(ChorusWsReader *r, uint8_t *flags);
extern int	chorus_wsr_item(ChorusWsReader *r, ChorusWsItem *item);
extern int	chorus_wsr_tuple(ChorusWsReader *r, uint16_t width);
extern int	chorus_wsr_value(ChorusWsReader *r, ChorusWsValue *v);
extern int	chorus_wsr_setting(ChorusWsReader *r, ChorusWsBytes *name, ChorusWsBytes *value);
extern int	chorus_wsr_schema_end(ChorusWsReader *r, ChorusWsBytes *role, ChorusWsBytes *statement);
extern int	chorus_wsr_key(ChorusWsReader *r, uint8_t *mode, uint16_t *nparts);
extern int	chorus_wsr_key_part(ChorusWsReader *r, ChorusWsBytes *part);
extern int	chorus_wsr_finish(ChorusWsReader *r);
extern void chorus_wsr_run_open(ChorusWsReader *r, const void *buf, size_t len);
extern int	chorus_wsr_run_next(ChorusWsReader *r, const char **ws, size_t *len);
extern const char *chorus_wsr_error_text(ChorusWsrError err);

#endif							/* CHORUS_WSREAD_H */
