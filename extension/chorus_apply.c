/*-------------------------------------------------------------------------
 *
 * chorus_apply.c
 *		Fast apply: chorus.apply_writeset(gid, wait_for, writeset bytea) applies
 *		the rows and schema changes of a certified writeset inside the caller's
 *		transaction, in one call (docs/PROTOCOL.md section 4). The writeset is
 *		read with chorus_wsread.c, in the wire format of docs/PROTOCOL.md
 *		section 2 (constants in chorus_wire.h); rows go through the executor's
 *		replication helpers (chorus_apply_exec.c), or, for a table without an
 *		identity index the executor can use (or with chorus.apply_executor
 *		off), through statements built from quoted identifiers only and
 *		prepared once per table shape (chorus_apply_table.c); values
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

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmgr.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "commands/tablespace.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "storage/fd.h"

#include "chorus_capture.h"
#include "chorus_commit.h"
#include "chorus_shmem.h"
#include "chorus_stamp.h"
#include "chorus_values.h"
#include "chorus_wire.h"
#include "chorus_wsread.h"
#include "chorus_apply_exec.h"
#include "chorus_apply_table.h"
#include "chorus_settings.h"

PG_FUNCTION_INFO_V1(chorus_apply_writeset);
PG_FUNCTION_INFO_V1(chorus_apply_run);
PG_FUNCTION_INFO_V1(chorus_apply_writeset_file);

/*
 * Whose rights a writeset is applied with (docs/SECURITY.md). A table's rows
 * are applied as its owner, in a restricted security context, as PostgreSQL
 * 16's subscriptions apply them with run_as_owner off: a trigger that fires
 * here, a generated column or an index expression runs with no more rights
 * than the table's owner has on the origin, cannot SET ROLE (or RESET ROLE,
 * or SET SESSION AUTHORIZATION) back to the apply session's superuser, and
 * what it changes of the session's settings is undone when the owner's turn
 * ends. Row security does not apply: the origin checked it, as it checked the
 * CHECK constraints and foreign keys (chorus_apply_exec.c). A TRUNCATE runs
 * as the apply session's user, restricted; a schema change as its role,
 * restricted (apply_schema).
 */
typedef struct ApplyUser
{
	Oid			session_uid;	/* the apply session's user and security context */
	int			session_sec;
	Oid			current;		/* whose turn it is: a table's owner, or InvalidOid (the session's user) */
	int			nest;			/* the GUC nest level of the owner's turn */
} ApplyUser;

#define APPLY_RESTRICTED (SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION)

/* The table whose row apply_spi_row is applying, for the executor hook (chorus_apply_spi_start). */
static Oid	apply_spi_relid = InvalidOid;

static void
apply_user_init(ApplyUser *u)
{
	GetUserIdAndSecContext(&u->session_uid, &u->session_sec);
	u->current = InvalidOid;
	u->nest = -1;
}

/*
 * apply_as
 *		Give the turn to owner (InvalidOid: back to the apply session's user).
 *		The AFTER triggers queued in ex so far fire first, as the owner whose
 *		rows queued them.
 */
static void
apply_as(ApplyUser *u, Oid owner, ApplyExec *ex)
{
	if (owner == u->current)
		return;
	if (ex != NULL)
		chorus_apply_exec_fire(ex);
	if (u->nest >= 0)
	{
		AtEOXact_GUC(false, u->nest);	/* what the owner's code set goes with its turn */
		u->nest = -1;
	}
	if (OidIsValid(owner))
	{
		SetUserIdAndSecContext(owner, u->session_sec | APPLY_RESTRICTED | SECURITY_NOFORCE_RLS);
		u->nest = NewGUCNestLevel();
	}
	else
		SetUserIdAndSecContext(u->session_uid, u->session_sec);
	u->current = owner;
}

/*
 * apply_rows_end
 *		The rows so far are done: their executor state ends (its AFTER
 *		triggers fire, as their tables' owner) and the turn returns to the
 *		apply session's user.
 */
static void
apply_rows_end(ApplyExec **ex, ApplyUser *u)
{
	if (*ex != NULL)
	{
		chorus_apply_exec_end(*ex);
		*ex = NULL;
	}
	apply_as(u, InvalidOid, NULL);
}

/*
 * chorus_apply_spi_start
 *		Called by the executor hook before and after ExecutorStart: a row that
 *		apply_spi_row applies through SPI is checked as a row the executor path
 *		applies is, that is not for privileges (the origin checked them; the
 *		table's owner might have revoked its own) nor against the CHECK
 *		constraints (chorus_apply_skip_checks). Only the statement apply_spi_row
 *		runs: the first to start after it set apply_spi_relid, for that table;
 *		queries of a trigger it fires are checked as usual. before: *relid is
 *		set to the table (InvalidOid if the statement is not one of these).
 */
void
chorus_apply_spi_start(QueryDesc *qd, bool before, Oid *relid)
{
	ListCell   *lc;

	if (before)
	{
		*relid = apply_spi_relid;
		apply_spi_relid = InvalidOid;
		if (!OidIsValid(*relid))
			return;
		foreach(lc, qd->plannedstmt->rtable)
		{
			RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);

			if (rte->rtekind == RTE_RELATION && rte->relid == *relid)
				rte->requiredPerms = 0;
		}
		return;
	}
	if (!OidIsValid(*relid) || qd->estate == NULL)
		return;
	foreach(lc, qd->estate->es_opened_result_relations)
	{
		ResultRelInfo *rri = lfirst(lc);

		if (RelationGetRelid(rri->ri_RelationDesc) == *relid)
			chorus_apply_skip_checks(rri, qd->estate);
	}
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
							errmsg("chorus: column with unknown flags 0x%02x in %s", v, chorus_apply_table_name(t))));
			break;
		case CHORUS_WSR_IDENTITY_RANGE:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: identity column out of range in %s", chorus_apply_table_name(t))));
			break;
		case CHORUS_WSR_TABLE_FLAGS:
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
							errmsg("chorus: table %s with unknown flags 0x%02x", chorus_apply_table_name(t), v)));
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
							errmsg("chorus: %s tuple of %s has the wrong width", image, chorus_apply_table_name(t))));
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

/*
 * The SPI connection of one writeset's apply, made at the first statement
 * that needs it (a TRUNCATE, a schema change, a row of a table the executor
 * does not take) and ended with the writeset.
 */
static void
apply_spi_connect(bool *connected, MemoryContext cxt)
{
	if (*connected)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "chorus: SPI_connect failed");
	MemoryContextSwitchTo(cxt);	/* allocations stay the apply's (SPI_finish returns to it too) */
	*connected = true;
}

/*
 * apply_truncate
 *		Run the TRUNCATEs gathered in list, if any: after the rows before them,
 *		whose executor state (ex) ends first (a TRUNCATE needs its tables
 *		closed). As the apply session's user (the tables may have several
 *		owners, and CASCADE reaches further), restricted.
 */
static void
apply_truncate(StringInfo list, bool restart, ApplyExec **ex, ApplyUser *u, bool *spi, MemoryContext cxt)
{
	int			rc;

	if (list->len == 0)
		return;
	apply_rows_end(ex, u);
	apply_spi_connect(spi, cxt);
	SetUserIdAndSecContext(u->session_uid, u->session_sec | APPLY_RESTRICTED);
	/*
	 * CASCADE: the origin truncated every table that references these (or it
	 * would have failed), but a partitioned one among them has no rows of its
	 * own and so no capture: it comes in here through the foreign key.
	 */
	rc = SPI_execute(psprintf("TRUNCATE ONLY %s%s CASCADE", list->data, restart ? " RESTART IDENTITY" : ""),
					 false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "chorus: TRUNCATE failed: %s", SPI_result_code_string(rc));
	SetUserIdAndSecContext(u->session_uid, u->session_sec);
	resetStringInfo(list);
}

/* The error for an "unchanged" value where there is no value to keep (a damaged writeset). */
static void apply_unchanged_refused(ApplyTable *t, const char *where) pg_attribute_noreturn();

static void
apply_unchanged_refused(ApplyTable *t, const char *where)
{
	ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED),
					errmsg("chorus: an unchanged value in %s of %s", where, chorus_apply_table_name(t))));
}

/* The error for a row to update or delete that is not here (or is here more than once). */
static void apply_missing_row(ApplyTable *t, ApplyRow *row, int64 gid, uint64 matched) pg_attribute_noreturn();

static void
apply_missing_row(ApplyTable *t, ApplyRow *row, int64 gid, uint64 matched)
{
	StringInfoData key;
	int			k;

	initStringInfo(&key);
	for (k = 0; k < t->nident; k++)
		appendStringInfo(&key, "%s%s", k ? ", " : "",
						 row->oldv[k].kind == CHORUS_VAL_NULL ? "NULL" :
						 row->oldv[k].kind == CHORUS_VAL_BINARY ? "(binary)" :
						 pnstrdup(row->oldv[k].data, row->oldv[k].len));
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("chorus: GID %lld: %s of %s (%s) matched %llu rows: this node's data differs from the cluster's",
					(long long) gid, row->op == CHORUS_OP_UPDATE ? "UPDATE" : "DELETE", chorus_apply_table_name(t),
					key.data, (unsigned long long) matched)));
}

/*
 * apply_spi_row
 *		Apply one row of t with its prepared statement: the new values of the
 *		columns that are not generated, then the old identity.
 */
static void
apply_spi_row(ApplyTable *t, ApplyRow *row, int64 gid)
{
	Datum	   *values = palloc(sizeof(Datum) * (t->ncols + t->nident + 1));
	char	   *nulls = palloc(t->ncols + t->nident + 1);
	bool		isnull;
	SPIPlanPtr	plan;
	int			n = 0,
				c,
				k,
				rc;

	for (c = 0; row->op != CHORUS_OP_DELETE && c < t->ncols; c++)
	{
		if ((t->cols[c].flags & CHORUS_COL_GENERATED) || row->newv[c].kind == CHORUS_VAL_UNCHANGED)
			continue;			/* computed here; kept as it is here */
		if (row->op == CHORUS_OP_UPDATE && (k = chorus_apply_update_skips(t, c)) >= 0)
		{
			ChorusWsValue o = row->oldv[k],
						v = row->newv[c];

			/* left out of the statement: it must not have changed */
			if (o.kind != v.kind || o.len != v.len || (o.len > 0 && memcmp(o.data, v.data, o.len) != 0))
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("chorus: GID %lld: an UPDATE of %s sets its GENERATED ALWAYS identity column \"%s\", which a statement cannot",
								(long long) gid, chorus_apply_table_name(t), t->cols[c].name),
						 errhint("Rows of a table with a primary key are applied through the executor, which can (chorus.apply_executor).")));
			continue;
		}
		values[n] = chorus_apply_datum(t, c, row->newv[c], &isnull);
		nulls[n++] = isnull ? 'n' : ' ';
	}
	for (k = 0; row->op != CHORUS_OP_INSERT && k < t->nident; k++)
	{
		if (t->full_identity && (t->cols[t->ident[k]].flags & CHORUS_COL_GENERATED))
			continue;			/* not compared: computed from the others */
		values[n] = chorus_apply_datum(t, t->ident[k], row->oldv[k], &isnull);
		nulls[n++] = isnull ? 'n' : ' ';
	}
	plan = chorus_apply_plan(t, row->op == CHORUS_OP_INSERT ? 0 : row->op == CHORUS_OP_UPDATE ? 1 : 2,
							 row->unchanged ? row->newv : NULL);
	apply_spi_relid = t->rel->relid;	/* chorus_apply_spi_start */
	rc = SPI_execute_plan(plan, values, nulls, false, 0);
	apply_spi_relid = InvalidOid;
	if (rc < 0)
		elog(ERROR, "chorus: applying a row of %s: %s", chorus_apply_table_name(t), SPI_result_code_string(rc));
	if (row->op != CHORUS_OP_INSERT && SPI_processed != 1)
		apply_missing_row(t, row, gid, SPI_processed);
	pfree(values);
	pfree(nulls);
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
 *		function bodies (the origin did). The role's rights, in a restricted
 *		security context: the statement, and whatever user code it runs (a
 *		function a CHECK constraint calls, an index expression, a materialized
 *		view's query), can do no more here than the role could on the origin,
 *		and cannot SET ROLE to the apply session's superuser; what it changes of
 *		the session's settings is undone with the item. A role this node lacks
 *		(created with chorus.replicate_roles off) is an error, never a reason to
 *		run the statement as someone else. r stands after the item's start,
 *		which says it has nsettings settings.
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
	if (!OidIsValid(roleid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("chorus: GID %lld: role \"%s\" does not exist on this node", (long long) gid, role),
				 errdetail("The schema change ran as this role on its origin; it runs as no one else here."),
				 errhint("Create the role on every node (roles replicate unless chorus.replicate_roles is off).")));
	GetUserIdAndSecContext(&save_uid, &save_sec);
	SetUserIdAndSecContext(roleid, save_sec | APPLY_RESTRICTED);
	rc = SPI_execute(statement, false, 0);
	if (rc < 0)
		elog(ERROR, "chorus: GID %lld: the schema change failed: %s", (long long) gid, SPI_result_code_string(rc));
	SetUserIdAndSecContext(save_uid, save_sec);
	AtEOXact_GUC(false, nest);
}

/*
 * chorus_apply_rows
 *		Apply every row of one writeset (buf, len) in the current transaction,
 *		which has called chorus.apply_begin() (chorus_apply_begin_commit: a
 *		schema change waits for the previous certified GID it recorded). gid
 *		names the commit in errors. Returns the number of rows applied.
 */
static int64
chorus_apply_rows(const char *buf, size_t len, int64 gid)
{
	ChorusWsReader r;
	ChorusWsHeader h;
	MemoryContext cxt,
				rowcxt,
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
	ApplyExec  *ex = NULL;		/* the executor state of the rows since the last statement */
	ApplyUser	user;			/* whose turn it is */
	bool		spi = false;	/* connected to SPI */
	int			width = 1;		/* the widest table */
	ChorusWsValue *allold,
			   *oldv,
			   *newv;
	/* the origin's commit time for the stamps: read before any row runs code */
	int64		commit_time = chorus_apply_commit_time();

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
		chorus_wait_for_turn(chorus_commit_state()->prev);

	cxt = AllocSetContextCreate(CurrentMemoryContext, "chorus apply", ALLOCSET_DEFAULT_SIZES);
	/* what one row applied through SPI needs (its datums): freed after each row */
	rowcxt = AllocSetContextCreate(cxt, "chorus apply row", ALLOCSET_DEFAULT_SIZES);
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
		t->old_columns = (tflags & CHORUS_TABLE_OLD_COLUMNS) != 0;
	}

	for (i = 0; i < ntables; i++)
		width = Max(width, Max(tables[i].ncols, tables[i].nident));
	oldv = palloc(sizeof(ChorusWsValue) * width);
	newv = palloc(sizeof(ChorusWsValue) * width);
	allold = palloc(sizeof(ChorusWsValue) * width);

	/* text values are read under the settings they were printed under (chorus_values.c) */
	nest = chorus_canonical_enter(false);
	apply_user_init(&user);
	apply_spi_relid = InvalidOid;
	initStringInfo(&truncates);
	for (i = 0; i < nrows; i++)
	{
		ChorusWsItem item;
		ApplyTable *t;
		ApplyRow	row;
		int			c,
					k;

		/* its op (known), a row's table (in range), a TRUNCATE's flags (known) */
		if (chorus_wsr_item(&r, &item) != 0)
			apply_refuse(&r, NULL, NULL);
		row.op = item.op;
		row.oldv = oldv;
		row.newv = newv;
		if (row.op == CHORUS_OP_SCHEMA)
		{
			apply_truncate(&truncates, truncate_restart, &ex, &user, &spi, cxt);
			apply_rows_end(&ex, &user);
			apply_spi_connect(&spi, cxt);
			/* the statement runs under its origin's settings, then the fixed ones return */
			chorus_canonical_exit(nest);
			apply_schema(&r, item.nsettings, gid);
			nest = chorus_canonical_enter(false);
			/* it may have changed the tables: each is found again at its next row */
			for (c = 0; c < (int) ntables; c++)
				tables[c].rel = NULL;
			applied++;
			continue;
		}
		t = &tables[item.table];
		if (row.op == CHORUS_OP_TRUNCATE)
		{
			bool		restart = (item.truncate_flags & CHORUS_TRUNCATE_RESTART) != 0;

			if (restart != truncate_restart)
				apply_truncate(&truncates, truncate_restart, &ex, &user, &spi, cxt);
			truncate_restart = restart;
			appendStringInfo(&truncates, "%s%s", truncates.len ? ", " : "", chorus_apply_table_name(t));
			applied++;
			continue;
		}
		apply_truncate(&truncates, truncate_restart, &ex, &user, &spi, cxt);
		if (chorus_apply_unresolved(t))
			chorus_apply_resolve(t);
		apply_as(&user, t->rel->owner, ex);
		row.unchanged = false;
		if (row.op != CHORUS_OP_INSERT)
		{
			/* with captured old values (a link's delta columns), only the identity's are used */
			if (chorus_wsr_tuple(&r, (uint16) (t->old_columns ? t->ncols : t->nident)) != 0)
				apply_refuse(&r, t, "old");
			for (c = 0; t->old_columns && c < t->ncols; c++)
				if (chorus_wsr_value(&r, &allold[c]) != 0)
					apply_refuse(&r, t, "old");
			for (k = 0; k < t->nident; k++)
			{
				if (t->old_columns)
					oldv[k] = allold[t->ident[k]];
				else if (chorus_wsr_value(&r, &oldv[k]) != 0)
					apply_refuse(&r, t, "old");
				if (oldv[k].kind == CHORUS_VAL_UNCHANGED)
					apply_unchanged_refused(t, "an old image");
			}
		}
		if (row.op != CHORUS_OP_DELETE)
		{
			if (chorus_wsr_tuple(&r, (uint16) t->ncols) != 0)
				apply_refuse(&r, t, "new");
			for (c = 0; c < t->ncols; c++)
			{
				if (chorus_wsr_value(&r, &newv[c]) != 0)
					apply_refuse(&r, t, "new");
				if (newv[c].kind == CHORUS_VAL_UNCHANGED)
				{
					if (row.op != CHORUS_OP_UPDATE)
						apply_unchanged_refused(t, "an inserted row");
					row.unchanged = true;
				}
			}
		}
		if (chorus_apply_executor &&
			(t->rel->why_spi == NULL || (row.op == CHORUS_OP_INSERT && t->rel->insert_executor)))
		{
			if (ex == NULL)
				ex = chorus_apply_exec_begin(tables, (int) ntables);
			if (!chorus_apply_exec_row(ex, t, &row))
				apply_missing_row(t, &row, gid, 0);
		}
		else
		{
			if (ex != NULL)
				chorus_apply_exec_fire(ex);	/* AFTER triggers stay in row order across both paths */
			apply_spi_connect(&spi, cxt);
			MemoryContextSwitchTo(rowcxt);
			apply_spi_row(t, &row, gid);
			MemoryContextSwitchTo(cxt);
			MemoryContextReset(rowcxt);
		}
		applied++;
	}
	apply_truncate(&truncates, truncate_restart, &ex, &user, &spi, cxt);
	apply_rows_end(&ex, &user);
	if (spi)
		SPI_finish();
	/* the keys follow the items: a site with links stamps the rows with this GID */
	if (!(flags & CHORUS_WS_FLAG_DDL))
		chorus_stamp_keys(&r, h.nkeys, (uint64) gid, commit_time);
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
	PG_RETURN_INT64(chorus_apply_rows(VARDATA_ANY(ws), VARSIZE_ANY_EXHDR(ws), gid));
}

/*
 * chorus_apply_writeset_file(gid bigint, wait_for bigint, path text, prev bigint,
 *							   off bigint, len bigint) returns bigint
 *		As chorus_apply_writeset, the writeset read from the file at path, len
 *		bytes from offset off (-1: to the end): the coordinator's spool of a
 *		large writeset (a bus message, whose head precedes the writeset). The file is mapped, not read
 *		into memory, so a writeset of any size takes this backend no more memory
 *		than its rows' values, one at a time (and the file's pages, which the
 *		kernel may drop). The file must be a regular file of the server's user,
 *		private to it, as the coordinator (run as that user) makes it.
 */
Datum
chorus_apply_writeset_file(PG_FUNCTION_ARGS)
{
	int64		gid = PG_GETARG_INT64(0);
	int64		wait_for = PG_GETARG_INT64(1);
	char	   *path = text_to_cstring(PG_GETARG_TEXT_PP(2));
	int64		prev = PG_GETARG_INT64(3);
	int64		off = PG_GETARG_INT64(4);
	int64		len = PG_GETARG_INT64(5);
	int			fd;
	struct stat st;
	void	   *map;
	int64		applied = 0;

	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY);
	if (fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("chorus: could not open the spooled writeset of GID %lld \"%s\": %m", (long long) gid, path)));
	if (fstat(fd, &st) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("chorus: could not stat \"%s\": %m", path)));
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("chorus: \"%s\" is not a writeset spool file", path),
				 errdetail("A spool file is a regular file of the server's user, readable by it alone.")));
	if (len < 0)
		len = st.st_size - off;
	if (off < 0 || len <= 0 || off + len > st.st_size)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("chorus: the spooled writeset of GID %lld \"%s\" (%lld bytes) holds no writeset at [%lld, %lld)",
						(long long) gid, path, (long long) st.st_size, (long long) off, (long long) (off + len))));
	map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("chorus: could not map \"%s\": %m", path)));
	CloseTransientFile(fd);
	(void) posix_madvise(map, (size_t) st.st_size, POSIX_MADV_SEQUENTIAL);
	PG_TRY();
	{
		/* the file is checked first: a file the server cannot use leaves nothing begun */
		chorus_apply_begin_commit(chorus_commit_state(), chorus_capture_state()->nrows > 0, gid, wait_for, prev);
		applied = chorus_apply_rows((const char *) map + off, (size_t) len, gid);
	}
	PG_FINALLY();
	{
		munmap(map, (size_t) st.st_size);
	}
	PG_END_TRY();
	PG_RETURN_INT64(applied);
}

/*
 * chorus_apply_run(gid bigint, wait_for bigint, run bytea) returns bigint
 *		A run of consecutive certified writesets, the last one GID gid, applied
 *		as one transaction committed as GID gid after wait_for (the GID certified
 *		before the run): the commit of gid covers the GIDs before it. run holds
 *		the writesets in GID order, each as u32 length and its bytes. If gid is
 *		committed here already the whole run is (ERRCODE_CHORUS_ALREADY_COMMITTED,
 *		as for one writeset); a GID after wait_for committed already means part
 *		of the run is (local backends of a coordinator that stopped committed
 *		their certified GIDs meanwhile): ERRCODE_CHORUS_PARTLY_COMMITTED, and the
 *		coordinator applies the rest. Returns the number of rows applied.
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
	int			nws = 0;

	chorus_apply_begin_commit(chorus_commit_state(), chorus_capture_state()->nrows > 0, gid, wait_for, -1);
	LWLockAcquire(chorus_shared->lock, LW_SHARED);
	committed = chorus_shared->committed_gid;
	LWLockRelease(chorus_shared->lock);
	if (committed > (uint64) wait_for)
		ereport(ERROR, (errcode(ERRCODE_CHORUS_PARTLY_COMMITTED),
						errmsg("chorus: the run of GIDs after %lld up to %lld is partly committed on this node (up to %llu)",
							   (long long) wait_for, (long long) gid, (unsigned long long) committed),
						errdetail("committed up to GID %llu", (unsigned long long) committed),
						errhint("The coordinator applies the rest of the run.")));
	chorus_wsr_run_open(&r, VARDATA_ANY(run), VARSIZE_ANY_EXHDR(run));
	while ((more = chorus_wsr_run_next(&r, &ws, &len)) > 0)
	{
		/* a run commits its writesets under its last GID: each row stamp needs its own */
		if (++nws > 1 && chorus_stamping())
			ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							errmsg("chorus: a run of writesets is not applied where chorus.link_site is set"),
							errhint("The coordinator applies one writeset at a time on a site with links.")));
		applied += chorus_apply_rows(ws, len, gid);
	}
	if (more < 0)
		apply_refuse(&r, NULL, NULL);
	PG_RETURN_INT64(applied);
}
