/*-------------------------------------------------------------------------
 *
 * chorus_apply.c
 *		Fast apply: chorus.apply_writeset(gid, wait_for, writeset bytea) applies
 *		the rows and schema changes of a certified writeset inside the caller's
 *		transaction, in one call (docs/PROTOCOL.md section 4). The writeset is
 *		read with chorus_wsread.c, in the wire format of docs/PROTOCOL.md
 *		section 2 (constants in chorus_wire.h); statements are built from
 *		quoted identifiers only and prepared once per table shape; values
 *		reach PostgreSQL through each local column's receive function (binary
 *		values) or input function (text, read under the same fixed settings it
 *		was printed under). A schema
 *		change item runs its statement with the settings and role it ran under
 *		on its origin. The coordinator has validated the writeset already; any
 *		inconsistency is still an ERROR here, never a crash.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "commands/tablespace.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "nodes/makefuncs.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_shmem.h"
#include "chorus_values.h"
#include "chorus_wire.h"
#include "chorus_wsread.h"

PG_FUNCTION_INFO_V1(chorus_apply_writeset);
PG_FUNCTION_INFO_V1(chorus_apply_run);

#define PLAN_KEY_SIZE 2048

typedef struct ApplyCol
{
	char	   *name;
	uint8		flags;
} ApplyCol;

typedef struct ApplyTable
{
	char	   *nspname;
	char	   *relname;
	int			ncols;
	ApplyCol   *cols;
	int			nident;
	int		   *ident;
	bool		full_identity;
	SPIPlanPtr	plans[3];		/* insert, update, delete */
	Oid		   *coltypes;		/* local types of the columns, InvalidOid for generated */
	int32	   *coltypmods;
	FmgrInfo   *colinput;		/* their input functions */
	Oid		   *colioparam;
	FmgrInfo   *colrecv;		/* their receive functions, looked up at the first binary value */
	Oid		   *colrecvparam;
	Oid		   *basetypes;		/* a domain's base type (the column's type otherwise) */
	FmgrInfo   *baseinput;		/* ... its input and receive functions, for old images */
	Oid		   *baseioparam;
	FmgrInfo   *baserecv;
	Oid		   *baserecvparam;
} ApplyTable;

/* plans survive across calls, keyed by their SQL text */
typedef struct PlanEntry
{
	char		key[PLAN_KEY_SIZE];	/* the SQL text and its parameter types */
	SPIPlanPtr	plan;
} PlanEntry;

static HTAB *chorus_plans = NULL;

static const char *
qualified(ApplyTable *t)
{
	return quote_qualified_identifier(t->nspname, t->relname);
}

/* Bytes of the writeset as a palloc'd, NUL-terminated string. */
static char *
ws_text(ChorusWsBytes b)
{
	return pnstrdup(b.data, b.len);
}

/*
 * apply_refuse
 *		The error for a writeset the reader refused (r->err). t: the table whose
 *		description or row is being read, if any; image: "old" or "new", the
 *		row image being read.
 */
static void apply_refuse(const ChorusWsReader *r, ApplyTable *t, const char *image) pg_attribute_noreturn();

static void
apply_refuse(const ChorusWsReader *r, ApplyTable *t, const char *image)
{
	uint8		v = (uint8) r->err_value;

	switch (r->err)
	{
		case CHORUS_WSR_TRUNCATED:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: writeset truncated at byte %d", (int) r->err_pos)));
			break;
		case CHORUS_WSR_BAD_MAGIC:
		case CHORUS_WSR_BAD_VERSION:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: not a version %d writeset", CHORUS_WS_VERSION)));
			break;
		case CHORUS_WSR_UNKNOWN_FLAGS:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: writeset with unknown flags 0x%02x", v)));
			break;
		case CHORUS_WSR_COLUMN_FLAGS:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: column with unknown flags 0x%02x in %s", v, qualified(t))));
			break;
		case CHORUS_WSR_IDENTITY_RANGE:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: identity column out of range in %s", qualified(t))));
			break;
		case CHORUS_WSR_TABLE_FLAGS:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: table %s with unknown flags 0x%02x", qualified(t), v)));
			break;
		case CHORUS_WSR_UNKNOWN_OP:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("chorus: unknown row op 0x%02x", v)));
			break;
		case CHORUS_WSR_TABLE_RANGE:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: row refers to table %u of %u",
								   (unsigned) r->err_value, (unsigned) r->err_expected)));
			break;
		case CHORUS_WSR_TRUNCATE_FLAGS:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("chorus: TRUNCATE with unknown flags 0x%02x", v)));
			break;
		case CHORUS_WSR_WIDTH:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: %s tuple of %s has the wrong width", image, qualified(t))));
			break;
		case CHORUS_WSR_VALUE_KIND:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: writeset value of unknown kind 0x%02x", v)));
			break;
		default:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: %s", chorus_wsr_error_text(r->err))));
			break;
	}
}

/* the local column types, by name: values are parsed for this node's table */
static void
resolve_types(ApplyTable *t)
{
	Oid			relid;
	Oid			typinput;
	int			i;

	relid = RangeVarGetRelid(makeRangeVar(t->nspname, t->relname, -1), RowExclusiveLock, false);
	t->coltypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->coltypmods = palloc0(sizeof(int32) * Max(t->ncols, 1));
	t->colinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->colioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->colrecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->colrecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->basetypes = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->baseinput = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->baseioparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	t->baserecv = palloc0(sizeof(FmgrInfo) * Max(t->ncols, 1));
	t->baserecvparam = palloc0(sizeof(Oid) * Max(t->ncols, 1));
	for (i = 0; i < t->ncols; i++)
	{
		HeapTuple	tup;
		Form_pg_attribute att;

		if (t->cols[i].flags & CHORUS_COL_GENERATED)
			continue;
		tup = SearchSysCacheAttName(relid, t->cols[i].name);
		if (!HeapTupleIsValid(tup))
			ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
							errmsg("chorus: column \"%s\" of %s does not exist here",
								   t->cols[i].name, qualified(t))));
		att = (Form_pg_attribute) GETSTRUCT(tup);
		t->coltypes[i] = att->atttypid;
		t->coltypmods[i] = att->atttypmod;
		ReleaseSysCache(tup);
		getTypeInputInfo(t->coltypes[i], &typinput, &t->colioparam[i]);
		fmgr_info(typinput, &t->colinput[i]);
		t->basetypes[i] = getBaseType(t->coltypes[i]);
	}
}

static SPIPlanPtr
prepare(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	p = SPI_prepare(sql, nargs, argtypes);

	if (p == NULL)
		elog(ERROR, "chorus: preparing \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	return p;
}

static SPIPlanPtr
get_plan(const char *sql, int nargs, Oid *argtypes)
{
	PlanEntry  *e;
	bool		found;
	char		key[PLAN_KEY_SIZE];
	StringInfoData k;
	int			i;

	if (chorus_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = PLAN_KEY_SIZE;
		ctl.entrysize = sizeof(PlanEntry);
		chorus_plans = hash_create("chorus apply plans", 64, &ctl, HASH_ELEM | HASH_STRINGS);
	}
	initStringInfo(&k);
	appendStringInfoString(&k, sql);
	for (i = 0; i < nargs; i++)
		appendStringInfo(&k, " %u", argtypes[i]);
	if (k.len >= PLAN_KEY_SIZE)
		return prepare(sql, nargs, argtypes);	/* very wide tables: prepared per writeset */
	memset(key, 0, sizeof(key));
	memcpy(key, k.data, k.len);
	e = hash_search(chorus_plans, key, HASH_ENTER, &found);
	if (!found)
		e->plan = NULL;
	if (e->plan == NULL)
	{
		SPIPlanPtr	p = prepare(sql, nargs, argtypes);

		if (SPI_keepplan(p) != 0)
			elog(ERROR, "chorus: cannot keep plan");
		e->plan = p;
	}
	return e->plan;
}

/*
 * The statement for op (0 insert, 1 update, 2 delete) on t, with its
 * parameter types: new values of non-generated columns, then the old identity.
 */
static SPIPlanPtr
table_plan(ApplyTable *t, int op)
{
	StringInfoData sql;
	Oid		   *types;
	int			n = 0,
				i;
	bool		first = true;

	if (t->plans[op] != NULL)
		return t->plans[op];
	types = palloc(sizeof(Oid) * (t->ncols + t->nident + 1));
	initStringInfo(&sql);
	if (op == 0)
	{
		StringInfoData vals;

		initStringInfo(&vals);
		appendStringInfo(&sql, "INSERT INTO %s (", qualified(t));
		for (i = 0; i < t->ncols; i++)
		{
			if (t->cols[i].flags & CHORUS_COL_GENERATED)
				continue;
			appendStringInfo(&sql, "%s%s", first ? "" : ", ", quote_identifier(t->cols[i].name));
			appendStringInfo(&vals, "%s$%d", first ? "" : ", ", n + 1);
			types[n++] = t->coltypes[i];
			first = false;
		}
		if (n == 0)				/* no column to set: a row of defaults */
		{
			resetStringInfo(&sql);
			appendStringInfo(&sql, "INSERT INTO %s DEFAULT VALUES", qualified(t));
		}
		else
			appendStringInfo(&sql, ") OVERRIDING SYSTEM VALUE VALUES (%s)", vals.data);
	}
	else
	{
		/*
		 * ONLY: the row is this table's, not one of its inheritance children's
		 * (their rows are captured, and applied, as theirs).
		 */
		if (op == 1)
		{
			StringInfoData set;

			initStringInfo(&set);
			for (i = 0; i < t->ncols; i++)
			{
				if (t->cols[i].flags & CHORUS_COL_GENERATED)
					continue;
				appendStringInfo(&set, "%s%s = $%d", first ? "" : ", ",
								 quote_identifier(t->cols[i].name), n + 1);
				types[n++] = t->coltypes[i];
				first = false;
			}
			if (n == 0)			/* nothing to set: the row must be there all the same */
				appendStringInfo(&sql, "SELECT 1 FROM ONLY %s", qualified(t));
			else
				appendStringInfo(&sql, "UPDATE ONLY %s SET %s", qualified(t), set.data);
		}
		else
			appendStringInfo(&sql, "DELETE FROM ONLY %s", qualified(t));
		appendStringInfoString(&sql, " WHERE ");
		if (t->full_identity)
		{
			/*
			 * No primary key: the row whose every column is identical to the
			 * old image (record image equality, *=: 1.0 and 1.00, or 'a' and
			 * 'A' under a case-insensitive collation, are different rows).
			 * Any one of several identical rows is the same change.
			 */
			StringInfoData img;
			int			m = 0;

			initStringInfo(&img);
			appendStringInfo(&sql, "ctid = (SELECT ctid FROM ONLY %s WHERE pg_catalog.record_image_eq(ROW(", qualified(t));
			for (i = 0; i < t->nident; i++)
			{
				int			c = t->ident[i];

				if (t->cols[c].flags & CHORUS_COL_GENERATED)
					continue;
				/* a domain's old value is compared as its base type: it need not pass the
				 * domain's checks any more (a constraint added NOT VALID) */
				if (t->basetypes[c] != t->coltypes[c])
					appendStringInfo(&sql, "%s%s::%s", m ? ", " : "", quote_identifier(t->cols[c].name),
									 format_type_be_qualified(t->basetypes[c]));
				else
					appendStringInfo(&sql, "%s%s", m ? ", " : "", quote_identifier(t->cols[c].name));
				appendStringInfo(&img, "%s$%d", m ? ", " : "", n + 1);
				types[n++] = t->basetypes[c];
				m++;
			}
			if (m == 0)
				appendStringInfoString(&sql, "), ROW()) LIMIT 1)");
			else
				appendStringInfo(&sql, "), ROW(%s)) LIMIT 1)", img.data);
		}
		else
			for (i = 0; i < t->nident; i++)
			{
				int			c = t->ident[i];

				appendStringInfo(&sql, "%s%s = $%d", i ? " AND " : "", quote_identifier(t->cols[c].name), n + 1);
				types[n++] = t->basetypes[c];
			}
	}
	t->plans[op] = get_plan(sql.data, n, types);
	return t->plans[op];
}

/*
 * to_datum
 *		The datum of value v for column col of t, in this node's column type;
 *		old: a value of an old image, read as the column's base type (a row's
 *		old value need not pass a domain check added NOT VALID since).
 */
static Datum
to_datum(ApplyTable *t, int col, ChorusWsValue v, char *isnull, bool old)
{
	StringInfoData buf;
	char	   *copy;
	bool		base = old && t->basetypes[col] != t->coltypes[col];
	FmgrInfo   *input = base ? &t->baseinput[col] : &t->colinput[col];
	FmgrInfo   *recv = base ? &t->baserecv[col] : &t->colrecv[col];
	Oid		   *ioparam = base ? &t->baseioparam[col] : &t->colioparam[col];
	Oid		   *recvparam = base ? &t->baserecvparam[col] : &t->colrecvparam[col];
	int32		typmod = base ? -1 : t->coltypmods[col];

	if (base && input->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeInputInfo(t->basetypes[col], &fn, ioparam);
		fmgr_info(fn, input);
	}
	*isnull = (v.kind == CHORUS_VAL_NULL) ? 'n' : ' ';
	if (v.kind == CHORUS_VAL_NULL)
		return InputFunctionCall(input, NULL, *ioparam, typmod);
	copy = palloc(v.len + 1);
	memcpy(copy, v.data, v.len);
	copy[v.len] = '\0';
	if (v.kind == CHORUS_VAL_TEXT)
		return InputFunctionCall(input, copy, *ioparam, typmod);
	if (recv->fn_oid == InvalidOid)
	{
		Oid			fn;

		getTypeBinaryInputInfo(base ? t->basetypes[col] : t->coltypes[col], &fn, recvparam);
		fmgr_info(fn, recv);
	}
	buf.data = copy;
	buf.len = (int) v.len;
	buf.maxlen = (int) v.len + 1;
	buf.cursor = 0;
	return ReceiveFunctionCall(recv, &buf, *recvparam, typmod);
}

static void
run_truncate(StringInfo list, bool restart)
{
	int			rc;

	if (list->len == 0)
		return;
	/*
	 * CASCADE: the origin truncated every table that references these (or it
	 * would have failed), but a partitioned one among them has no rows of its
	 * own and so no capture: it comes in here through the foreign key.
	 */
	rc = SPI_execute(psprintf("TRUNCATE ONLY %s%s CASCADE", list->data, restart ? " RESTART IDENTITY" : ""),
					 false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "chorus: TRUNCATE failed: %s", SPI_result_code_string(rc));
	resetStringInfo(list);
}

/* Settings that cannot be set on this node are warned about, not fatal (locales, tablespaces). */
static bool
apply_setting_optional(const char *name)
{
	return strncmp(name, "lc_", 3) == 0 || strcmp(name, "default_tablespace") == 0;
}

/*
 * apply_schema
 *		Run a schema change item's statement in the current apply transaction,
 *		under the settings and role it ran under on its origin, without checking
 *		function bodies (the origin did). A role missing here (created with
 *		chorus.replicate_roles off) runs it as the apply user, with a warning.
 *		r stands after the item's start, which says it has nsettings settings.
 */
static void
apply_schema(ChorusWsReader *r, int nsettings, int64 gid)
{
	int			nest = NewGUCNestLevel();
	Oid			save_uid,
				roleid;
	int			save_sec;
	ChorusWsBytes nameb,
				valueb,
				roleb,
				statementb;
	char	   *role;
	char	   *statement;
	int			rc,
				i;

	for (i = 0; i < nsettings; i++)
	{
		char	   *name;
		char	   *value;

		if (chorus_wsr_setting(r, &nameb, &valueb) != 0)
			apply_refuse(r, NULL, NULL);
		name = ws_text(nameb);
		value = ws_text(valueb);

		if (strcmp(name, "default_tablespace") == 0 && value[0] != '\0' &&
			!OidIsValid(get_tablespace_oid(value, true)))
			value = "";			/* tablespaces are per node: use the default one here */
		(void) set_config_option(name, value, PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true,
								 apply_setting_optional(name) ? WARNING : ERROR, false);
	}
	(void) set_config_option("check_function_bodies", "off", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	if (chorus_wsr_schema_end(r, &roleb, &statementb) != 0)
		apply_refuse(r, NULL, NULL);
	role = ws_text(roleb);
	statement = ws_text(statementb);
	roleid = get_role_oid(role, true);
	GetUserIdAndSecContext(&save_uid, &save_sec);
	if (OidIsValid(roleid))
		SetUserIdAndSecContext(roleid, save_sec);
	else
		ereport(WARNING,
				(errmsg("chorus: GID %lld: role \"%s\" does not exist here; running the schema change as \"%s\"",
						(long long) gid, role, GetUserNameFromId(save_uid, false))));
	rc = SPI_execute(statement, false, 0);
	if (rc < 0)
		elog(ERROR, "chorus: GID %lld: the schema change failed: %s", (long long) gid, SPI_result_code_string(rc));
	SetUserIdAndSecContext(save_uid, save_sec);
	AtEOXact_GUC(true, nest);
}

/*
 * chorus_apply_rows
 *		Apply every row of one writeset (buf, len) in the current transaction,
 *		which has called chorus.apply_begin(). gid names the commit in errors.
 *		Returns the number of rows applied.
 */
static int64
chorus_apply_rows(const char *buf, int len, int64 gid, uint64 prev)
{
	ChorusWsReader r;
	ChorusWsHeader h;
	MemoryContext cxt,
				old;
	ApplyTable *tables;
	uint32		ntables,
				nrows;
	uint8		flags;
	int			encoding;
	StringInfoData truncates;
	bool		truncate_restart = false;
	int64		applied = 0;
	int			nest;
	uint32		i;

	/* the header: magic, version, flags and counts checked */
	if (chorus_wsr_open(&r, buf, len, &h) != 0)
		apply_refuse(&r, NULL, NULL);
	flags = h.flags;
	if (flags & CHORUS_WS_FLAG_TOI)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						errmsg("chorus: a schema change's ordering request is not applied; its content is")));
	if (flags & CHORUS_WS_FLAG_CONCURRENT)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						errmsg("chorus: CREATE/DROP INDEX CONCURRENTLY runs in a session of its own, not in an apply")));
	encoding = h.encoding;
	if (encoding != GetDatabaseEncoding())
		ereport(ERROR, (errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
						errmsg("chorus: GID %lld was written in a database with encoding %s; this one is %s",
							   (long long) gid, pg_encoding_to_char(encoding), GetDatabaseEncodingName()),
						errhint("Every node of a cluster needs a database of the same encoding.")));
	ntables = h.ntables;
	nrows = h.nrows;			/* the keys are for certification only: not read */
	/* a schema change runs after everything before it has committed here, whatever the lanes */
	if (flags & CHORUS_WS_FLAG_DDL)
		chorus_wait_for_turn(prev);

	cxt = AllocSetContextCreate(CurrentMemoryContext, "chorus apply", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);
	tables = palloc0(sizeof(ApplyTable) * Max(ntables, 1));
	for (i = 0; i < ntables; i++)
	{
		ApplyTable *t = &tables[i];
		ChorusWsBytes nsp,
					rel,
					name,
					typname;
		uint16		ncols,
					nident,
					col;
		int			c;
		uint8		tflags;

		if (chorus_wsr_table(&r, &nsp, &rel, &ncols) != 0)
			apply_refuse(&r, NULL, NULL);
		t->nspname = ws_text(nsp);
		t->relname = ws_text(rel);
		t->ncols = ncols;
		t->cols = palloc(sizeof(ApplyCol) * Max(t->ncols, 1));
		for (c = 0; c < t->ncols; c++)
		{
			/* the origin's type name is not used: the local type decides */
			if (chorus_wsr_column(&r, &name, &typname, &t->cols[c].flags) != 0)
				apply_refuse(&r, t, NULL);
			t->cols[c].name = ws_text(name);
		}
		if (chorus_wsr_identity_count(&r, &nident) != 0)
			apply_refuse(&r, t, NULL);
		t->nident = nident;
		t->ident = palloc(sizeof(int) * Max(t->nident, 1));
		for (c = 0; c < t->nident; c++)
		{
			if (chorus_wsr_identity(&r, ncols, &col) != 0)
				apply_refuse(&r, t, NULL);
			t->ident[c] = col;
		}
		if (chorus_wsr_table_flags(&r, &tflags) != 0)
			apply_refuse(&r, t, NULL);
		t->full_identity = (tflags & CHORUS_TABLE_FULL_IDENTITY) != 0;
	}

	/* text values are read under the settings they were printed under (chorus_values.c) */
	nest = chorus_canonical_enter(false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "chorus: SPI_connect failed");
	initStringInfo(&truncates);
	for (i = 0; i < nrows; i++)
	{
		ChorusWsItem item;
		char		op;
		ApplyTable *t;
		Datum	   *values;
		char	   *nulls;
		int			n = 0,
					c,
					k,
					rc;
		ChorusWsValue *oldv = NULL;

		/* its op (known), a row's table (in range), a TRUNCATE's flags (known) */
		if (chorus_wsr_item(&r, &item) != 0)
			apply_refuse(&r, NULL, NULL);
		op = item.op;
		if (op == CHORUS_OP_SCHEMA)
		{
			run_truncate(&truncates, truncate_restart);
			/* the statement runs under its origin's settings, then the fixed ones return */
			chorus_canonical_exit(nest);
			apply_schema(&r, item.nsettings, gid);
			nest = chorus_canonical_enter(false);
			applied++;
			continue;
		}
		t = &tables[item.table];
		if (op == CHORUS_OP_TRUNCATE)
		{
			bool		restart = (item.truncate_flags & CHORUS_TRUNCATE_RESTART) != 0;

			if (restart != truncate_restart)
				run_truncate(&truncates, truncate_restart);
			truncate_restart = restart;
			appendStringInfo(&truncates, "%s%s", truncates.len ? ", " : "", qualified(t));
			applied++;
			continue;
		}
		run_truncate(&truncates, truncate_restart);
		if (t->coltypes == NULL)
			resolve_types(t);
		values = palloc(sizeof(Datum) * (t->ncols + t->nident + 1));
		nulls = palloc(t->ncols + t->nident + 1);
		if (op != CHORUS_OP_INSERT)
		{
			if (chorus_wsr_tuple(&r, (uint16) t->nident) != 0)
				apply_refuse(&r, t, "old");
			oldv = palloc(sizeof(ChorusWsValue) * Max(t->nident, 1));
			for (k = 0; k < t->nident; k++)
				if (chorus_wsr_value(&r, &oldv[k]) != 0)
					apply_refuse(&r, t, "old");
		}
		if (op != CHORUS_OP_DELETE)
		{
			if (chorus_wsr_tuple(&r, (uint16) t->ncols) != 0)
				apply_refuse(&r, t, "new");
			for (c = 0; c < t->ncols; c++)
			{
				ChorusWsValue v;

				if (chorus_wsr_value(&r, &v) != 0)
					apply_refuse(&r, t, "new");
				if (t->cols[c].flags & CHORUS_COL_GENERATED)
					continue;
				values[n] = to_datum(t, c, v, &nulls[n], false);
				n++;
			}
		}
		for (k = 0; oldv != NULL && k < t->nident; k++)
		{
			if (t->full_identity && (t->cols[t->ident[k]].flags & CHORUS_COL_GENERATED))
				continue;		/* not compared: computed from the others */
			values[n] = to_datum(t, t->ident[k], oldv[k], &nulls[n], true);
			n++;
		}
		rc = SPI_execute_plan(table_plan(t, op == CHORUS_OP_INSERT ? 0 : op == CHORUS_OP_UPDATE ? 1 : 2),
							  values, nulls, false, 0);
		if (rc < 0)
			elog(ERROR, "chorus: applying a row of %s: %s", qualified(t), SPI_result_code_string(rc));
		if (op != CHORUS_OP_INSERT && SPI_processed != 1)
		{
			StringInfoData key;

			initStringInfo(&key);
			for (k = 0; k < t->nident; k++)
				appendStringInfo(&key, "%s%s", k ? ", " : "",
								 oldv[k].kind == CHORUS_VAL_NULL ? "NULL" :
								 oldv[k].kind == CHORUS_VAL_BINARY ? "(binary)" : pnstrdup(oldv[k].data, oldv[k].len));
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("chorus: GID %lld: %s of %s (%s) matched %llu rows: this node's data differs from the cluster's",
							(long long) gid, op == CHORUS_OP_UPDATE ? "UPDATE" : "DELETE", qualified(t), key.data,
							(unsigned long long) SPI_processed)));
		}
		applied++;
		pfree(values);
		pfree(nulls);
	}
	run_truncate(&truncates, truncate_restart);
	SPI_finish();
	chorus_canonical_exit(nest);
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return applied;
}

/*
 * chorus_apply_writeset(gid bigint, wait_for bigint, ws bytea, prev bigint) returns bigint
 *		chorus.apply_begin(gid, wait_for, prev), then every row of ws. Returns the
 *		number of rows applied. prev (-1: wait_for) is the previous certified
 *		GID, which differs from wait_for with several commit lanes.
 */
Datum
chorus_apply_writeset(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);
	int64		wait_for = PG_GETARG_INT64(1);
	bytea	   *ws = PG_GETARG_BYTEA_PP(2);
	int64		prev = PG_NARGS() > 3 ? PG_GETARG_INT64(3) : -1;

	chorus_apply_begin_commit(chorus_commit_state(), chorus_capture_state()->nrows > 0, gid, wait_for, prev);
	PG_RETURN_INT64(chorus_apply_rows(VARDATA_ANY(ws), VARSIZE_ANY_EXHDR(ws), gid,
									  (uint64) (prev >= 0 ? prev : wait_for)));
}

/*
 * chorus_apply_run(gid bigint, wait_for bigint, run bytea) returns bigint
 *		A run of consecutive certified writesets, the last one GID gid, applied
 *		as one transaction committed as GID gid after wait_for (the GID certified
 *		before the run): the commit of gid covers the GIDs before it. run holds
 *		the writesets in GID order, each as u32 length and its bytes. If gid is
 *		committed here already the whole run is (ERRCODE_CHORUS_ALREADY_COMMITTED,
 *		as for one writeset); a GID after wait_for committed already means part
 *		of the run is, and is an error. Returns the number of rows applied.
 */
Datum
chorus_apply_run(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);
	int64		wait_for = PG_GETARG_INT64(1);
	bytea	   *run = PG_GETARG_BYTEA_PP(2);
	ChorusWsReader r;
	const char *ws;
	size_t		len;
	int			more;
	uint64		committed;
	int64		applied = 0;

	chorus_apply_begin_commit(chorus_commit_state(), chorus_capture_state()->nrows > 0, gid, wait_for, -1);
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	committed = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	if (committed > (uint64) wait_for)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
						errmsg("chorus: the run of GIDs after %lld up to %lld is partly committed on this node (up to %llu)",
							   (long long) wait_for, (long long) gid, (unsigned long long) committed)));
	chorus_wsr_run_open(&r, VARDATA_ANY(run), VARSIZE_ANY_EXHDR(run));
	while ((more = chorus_wsr_run_next(&r, &ws, &len)) > 0)
		applied += chorus_apply_rows(ws, (int) len, gid, (uint64) wait_for);
	if (more < 0)
		apply_refuse(&r, NULL, NULL);
	PG_RETURN_INT64(applied);
}
