/*
 * chorus_attach.c
 *		The capture triggers of replicated tables (issue 35): which tables
 *		Chorus replicates by itself (chorus.replicable), attaching and
 *		detaching their capture (chorus.attach, chorus.detach), and keeping
 *		users from switching it off.
 *
 *		A replicated table carries two *internal* triggers, as PostgreSQL's own
 *		foreign keys do: an AFTER ROW trigger on chorus.capture() and an AFTER
 *		TRUNCATE trigger on chorus.capture_truncate(), both firing whatever
 *		session_replication_role says (ENABLE ALWAYS). Internal triggers are
 *		left out by psql's \d, by information_schema.triggers and by pg_dump,
 *		so a node's tables look, and dump, as on a plain PostgreSQL; their
 *		names (chorus_capture_<oid>, chorus_capture_truncate_<oid>) are
 *		PostgreSQL's for internal triggers, so they never clash with a user's.
 *		They are recognised by their function, not by their name.
 *
 *		PostgreSQL lets a superuser enable or disable internal triggers with
 *		ALTER TABLE ... ENABLE/DISABLE TRIGGER ALL, and refuses that statement
 *		to anyone else on a table that has one. Neither suits capture: a table
 *		owner's DISABLE TRIGGER ALL must work as on a plain PostgreSQL (on his
 *		triggers and, for a superuser, the foreign keys'), and no one's may
 *		stop replication, which a data-only pg_restore --disable-triggers would
 *		otherwise do. So chorus_capture_guard rewrites ALL into USER plus each
 *		other internal trigger by name, and refuses statements that name a
 *		capture trigger (enable, disable, drop, rename, depends on extension).
 *		The one switch is a superuser's, and explicit: chorus.detach(table), or
 *		SET chorus.capture = off for a session (docs/DDL.md).
 *
 *		New tables are attached, and new sequences given this node's class, by
 *		the event trigger chorus.on_ddl_end, also here: C, so that no function
 *		of the extension is SECURITY DEFINER (the regression suite's
 *		opr_sanity lists every one), running what it changes as the bootstrap
 *		superuser in a restricted context.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/catalog.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_trigger.h"
#include "commands/event_trigger.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "executor/instrument.h"
#include "nodes/execnodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "chorus_attach.h"
#include "chorus_sequence.h"
#include "chorus_settings.h"

PG_FUNCTION_INFO_V1(chorus_replicable);
PG_FUNCTION_INFO_V1(chorus_attach);
PG_FUNCTION_INFO_V1(chorus_detach);
PG_FUNCTION_INFO_V1(chorus_on_ddl_end);

#define CHORUS_CAPTURE_NAME "chorus_capture"
#define CHORUS_CAPTURE_TRUNCATE_NAME "chorus_capture_truncate"

/*
 * chorus_table_replicable
 *		Whether Chorus replicates table relid by itself: a permanent plain
 *		table (partitions included; not a partitioned table itself, whose rows
 *		live in its partitions, which capture them) outside the system schemas
 *		and chorus.exclude_schemas. Read from the catalogs, not by a query: no
 *		search_path is involved.
 */
bool
chorus_table_replicable(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Form_pg_class c;
	bool		ok;
	char	   *nsp;

	if (!HeapTupleIsValid(tup))
		return false;
	c = (Form_pg_class) GETSTRUCT(tup);
	ok = c->relkind == RELKIND_RELATION && c->relpersistence == RELPERSISTENCE_PERMANENT &&
		!IsCatalogNamespace(c->relnamespace) && !IsToastNamespace(c->relnamespace) &&
		!isAnyTempNamespace(c->relnamespace);
	nsp = ok ? get_namespace_name(c->relnamespace) : NULL;
	ReleaseSysCache(tup);
	if (nsp == NULL || strcmp(nsp, "information_schema") == 0 || strcmp(nsp, "chorus") == 0 ||
		strncmp(nsp, "pg_toast", 8) == 0 || strncmp(nsp, "pg_temp", 7) == 0)
		return false;
	if (chorus_exclude_schemas != NULL && chorus_exclude_schemas[0] != '\0')
	{
		/* comma-separated, spaces left out (as the setting's documentation says) */
		StringInfoData names;
		char	   *p,
				   *name;

		initStringInfo(&names);
		for (p = chorus_exclude_schemas; *p; p++)
			if (*p != ' ')
				appendStringInfoChar(&names, *p);
		for (name = strtok(names.data, ","); name != NULL; name = strtok(NULL, ","))
			if (strcmp(name, nsp) == 0)
				return false;
	}
	return true;
}

/*
 * chorus.replicable(rel regclass) returns boolean
 *		Is rel a table Chorus replicates by itself (chorus_table_replicable)?
 */
Datum
chorus_replicable(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(chorus_table_replicable(PG_GETARG_OID(0)));
}

/*
 * chorus_capture_function
 *		The OID of chorus.capture() (truncate: chorus.capture_truncate()), or
 *		InvalidOid when the extension is not there. Looked up in the catalog,
 *		not by name resolution.
 */
static Oid
chorus_capture_function(bool truncate)
{
	Oid			nsp = get_namespace_oid("chorus", true);

	if (!OidIsValid(nsp))
		return InvalidOid;
	return GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
						   CStringGetDatum(truncate ? "capture_truncate" : "capture"),
						   PointerGetDatum(buildoidvector(NULL, 0)), ObjectIdGetDatum(nsp));
}

/* What a table's capture triggers are (chorus_capture_triggers). */
typedef struct ChorusCaptureTriggers
{
	Oid			row;			/* the internal AFTER ROW trigger, or InvalidOid */
	Oid			truncate;		/* the internal AFTER TRUNCATE trigger, or InvalidOid */
	bool		row_always;		/* each fires ALWAYS */
	bool		truncate_always;
	List	   *stale;			/* OIDs of capture triggers to remove: 0.1's visible ones, duplicates */
	List	   *others;			/* names of the table's other internal triggers (foreign keys') */
} ChorusCaptureTriggers;

/*
 * chorus_capture_triggers
 *		Scan relid's triggers: its internal capture triggers, the visible ones
 *		version 0.1 of the extension made (named chorus_capture and
 *		chorus_capture_truncate), and its other internal triggers.
 */
static void
chorus_capture_triggers(Oid relid, ChorusCaptureTriggers *ct)
{
	Oid			rowfn = chorus_capture_function(false);
	Oid			truncfn = chorus_capture_function(true);
	Relation	tgrel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;

	memset(ct, 0, sizeof(*ct));
	tgrel = table_open(TriggerRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_trigger_tgrelid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(tgrel, TriggerRelidNameIndexId, true, NULL, 1, &key);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		Form_pg_trigger t = (Form_pg_trigger) GETSTRUCT(tup);
		bool		is_row = OidIsValid(rowfn) && t->tgfoid == rowfn;
		bool		is_trunc = OidIsValid(truncfn) && t->tgfoid == truncfn;

		if (t->tgisinternal && is_row && !OidIsValid(ct->row))
		{
			ct->row = t->oid;
			ct->row_always = t->tgenabled == TRIGGER_FIRES_ALWAYS;
		}
		else if (t->tgisinternal && is_trunc && !OidIsValid(ct->truncate))
		{
			ct->truncate = t->oid;
			ct->truncate_always = t->tgenabled == TRIGGER_FIRES_ALWAYS;
		}
		else if ((is_row || is_trunc) &&
				 (t->tgisinternal || strcmp(NameStr(t->tgname), CHORUS_CAPTURE_NAME) == 0 ||
				  strcmp(NameStr(t->tgname), CHORUS_CAPTURE_TRUNCATE_NAME) == 0))
			ct->stale = lappend_oid(ct->stale, t->oid);
		else if (t->tgisinternal)
			ct->others = lappend(ct->others, pstrdup(NameStr(t->tgname)));
	}
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
}

/* Is trigger name of relid one of its internal capture triggers? */
static bool
chorus_names_capture(Oid relid, const char *name)
{
	ChorusCaptureTriggers ct;
	Oid			trig;

	if (!OidIsValid(relid) || name == NULL)
		return false;
	trig = get_trigger_oid(relid, name, true);
	if (!OidIsValid(trig))
		return false;
	chorus_capture_triggers(relid, &ct);
	return trig == ct.row || trig == ct.truncate;
}

static void chorus_detach_locked(Oid relid, LOCKMODE lockmode);

/*
 * Drop trigger trig (an internal one too: PERFORM_DELETION_INTERNAL, which
 * also keeps it out of pg_event_trigger_dropped_objects()).
 */
static void
chorus_drop_trigger(Oid trig)
{
	ObjectAddress obj;

	ObjectAddressSet(obj, TriggerRelationId, trig);
	performDeletion(&obj, DROP_RESTRICT, PERFORM_DELETION_INTERNAL);
}

/* Create one internal capture trigger on relid, firing whatever session_replication_role says. */
static void
chorus_create_capture_trigger(Oid relid, bool truncate)
{
	CreateTrigStmt *stmt = makeNode(CreateTrigStmt);
	Oid			fn = chorus_capture_function(truncate);

	if (!OidIsValid(fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("chorus: the extension's capture functions are missing"),
				 errhint("CREATE EXTENSION chorus in this database.")));
	stmt->trigname = truncate ? CHORUS_CAPTURE_TRUNCATE_NAME : CHORUS_CAPTURE_NAME;
	stmt->funcname = list_make2(makeString("chorus"), makeString(truncate ? "capture_truncate" : "capture"));
	stmt->row = !truncate;
	stmt->timing = TRIGGER_TYPE_AFTER;
	stmt->events = truncate ? TRIGGER_TYPE_TRUNCATE
		: (TRIGGER_TYPE_INSERT | TRIGGER_TYPE_UPDATE | TRIGGER_TYPE_DELETE);
	/* internal: PostgreSQL names it <trigname>_<oid> and keeps it out of \d and pg_dump */
	(void) CreateTriggerFiringOn(stmt, "chorus.attach()", relid, InvalidOid, InvalidOid, InvalidOid,
								 fn, InvalidOid, NULL, true, false, TRIGGER_FIRES_ALWAYS);
	CommandCounterIncrement();
}

/*
 * chorus_attach_relation
 *		Give relid its two internal capture triggers, firing ALWAYS; the
 *		visible ones of version 0.1 are replaced (the upgrade to 0.2 runs
 *		this on every table that has them). Idempotent. The caller has the
 *		rights (the event trigger and chorus_attach_table run it as the
 *		bootstrap superuser).
 */
void
chorus_attach_relation(Oid relid)
{
	Relation	rel = table_open(relid, ShareRowExclusiveLock);
	ChorusCaptureTriggers ct;
	ListCell   *lc;

	chorus_capture_triggers(relid, &ct);
	foreach(lc, ct.stale)
		chorus_drop_trigger(lfirst_oid(lc));
	/* one fired otherwise than ALWAYS (a catalog edited by hand) is made again */
	if (OidIsValid(ct.row) && !ct.row_always)
	{
		chorus_drop_trigger(ct.row);
		ct.row = InvalidOid;
	}
	if (OidIsValid(ct.truncate) && !ct.truncate_always)
	{
		chorus_drop_trigger(ct.truncate);
		ct.truncate = InvalidOid;
	}
	if (!OidIsValid(ct.row))
		chorus_create_capture_trigger(relid, false);
	if (!OidIsValid(ct.truncate))
		chorus_create_capture_trigger(relid, true);
	table_close(rel, NoLock);
}

/*
 * chorus_detach_relation
 *		Remove relid's capture triggers (the internal ones, and 0.1's): its row
 *		changes stay on the node that makes them from now on.
 */
void
chorus_detach_relation(Oid relid)
{
	chorus_detach_locked(relid, ShareRowExclusiveLock);
}

/* chorus_detach_relation under lockmode (a DROP's: taken at once, not upgraded later). */
static void
chorus_detach_locked(Oid relid, LOCKMODE lockmode)
{
	Relation	rel = table_open(relid, lockmode);
	ChorusCaptureTriggers ct;
	ListCell   *lc;

	chorus_capture_triggers(relid, &ct);
	if (OidIsValid(ct.row))
		chorus_drop_trigger(ct.row);
	if (OidIsValid(ct.truncate))
		chorus_drop_trigger(ct.truncate);
	foreach(lc, ct.stale)
		chorus_drop_trigger(lfirst_oid(lc));
	table_close(rel, NoLock);
}

/*
 * chorus_as_superuser_begin / _end
 *		Run what follows as the bootstrap superuser, in a restricted security
 *		context (no user code may raise its rights through it).
 */
static void
chorus_as_superuser_begin(Oid *save_uid, int *save_sec)
{
	GetUserIdAndSecContext(save_uid, save_sec);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID,
						   *save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
}

/*
 * chorus_attach_table
 *		Capture rows of a new table from now on, if it is replicable (the event
 *		trigger does this for CREATE TABLE and CREATE TABLE AS; EXPLAIN ANALYZE
 *		CREATE TABLE AS runs no event trigger). The triggers are made in C as
 *		the bootstrap superuser (an application role need not have the TRIGGER
 *		right on what it creates, nor any right on schema chorus), in a
 *		restricted security context; no query runs and no user code.
 */
void
chorus_attach_table(Oid relid)
{
	Oid			save_uid;
	int			save_sec;

	if (!chorus_table_replicable(relid))
		return;
	chorus_as_superuser_begin(&save_uid, &save_sec);
	PG_TRY();
	{
		chorus_attach_relation(relid);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_uid, save_sec);
	}
	PG_END_TRY();
}

/* One command of the statement that fired chorus.on_ddl_end. */
typedef struct ChorusDdlCommand
{
	Oid			objid;
	bool		table;			/* else a sequence to spread */
} ChorusDdlCommand;

/*
 * chorus.on_ddl_end() (event trigger, ddl_command_end)
 *		New tables are replicated as soon as they are created, on every node
 *		(the trigger fires in apply sessions too); so is a table that becomes
 *		replicable (ALTER TABLE ... SET LOGGED, a partition attached); new
 *		sequences get this node's residue class (not those an extension
 *		script makes). An application role that may create tables needs no
 *		other right: what changes is changed in C as the bootstrap superuser,
 *		so no event trigger of the user's runs under it.
 */
Datum
chorus_on_ddl_end(PG_FUNCTION_ARGS)
{
	List	   *todo = NIL;
	ListCell   *lc;
	uint64		i;
	Oid			save_uid;
	int			save_sec;
	MemoryContext cxt = CurrentMemoryContext;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("chorus.on_ddl_end() must be an event trigger")));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "chorus: SPI_connect failed");
	if (SPI_execute("SELECT c.objid, c.object_type = 'table' FROM pg_catalog.pg_event_trigger_ddl_commands() c "
					"WHERE c.object_type OPERATOR(pg_catalog.=) 'table' OR (c.object_type OPERATOR(pg_catalog.=) 'sequence' "
					"AND c.command_tag OPERATOR(pg_catalog.=) ANY ('{CREATE SEQUENCE,CREATE SCHEMA}'::pg_catalog.text[]) "
					"AND NOT c.in_extension)", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "chorus: could not read the statement's commands");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		MemoryContext old = MemoryContextSwitchTo(cxt);
		ChorusDdlCommand *c = palloc(sizeof(ChorusDdlCommand));

		MemoryContextSwitchTo(old);
		c->objid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		c->table = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
		old = MemoryContextSwitchTo(cxt);
		todo = lappend(todo, c);
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	foreach(lc, todo)
	{
		ChorusDdlCommand *c = lfirst(lc);

		if (c->table)
			chorus_attach_table(c->objid);
		else
		{
			chorus_as_superuser_begin(&save_uid, &save_sec);
			PG_TRY();
			{
				chorus_spread(c->objid, false, 0);
			}
			PG_FINALLY();
			{
				SetUserIdAndSecContext(save_uid, save_sec);
			}
			PG_END_TRY();
		}
	}
	PG_RETURN_NULL();
}

/*
 * chorus_no_triggers_left
 *		relid has no trigger left: clear pg_class.relhastriggers (PostgreSQL
 *		leaves it set until VACUUM; turning a table into a view needs it clear).
 */
static void
chorus_no_triggers_left(Oid relid)
{
	Relation	tgrel = table_open(TriggerRelationId, AccessShareLock);
	Relation	classrel;
	ScanKeyData key;
	SysScanDesc scan;
	bool		any;
	HeapTuple	tup;

	ScanKeyInit(&key, Anum_pg_trigger_tgrelid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(tgrel, TriggerRelidNameIndexId, true, NULL, 1, &key);
	any = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(tgrel, AccessShareLock);
	if (any)
		return;
	classrel = table_open(RelationRelationId, RowExclusiveLock);
	tup = SearchSysCacheCopy1(RELOID, ObjectIdGetDatum(relid));
	if (HeapTupleIsValid(tup) && ((Form_pg_class) GETSTRUCT(tup))->relhastriggers)
	{
		((Form_pg_class) GETSTRUCT(tup))->relhastriggers = false;
		CatalogTupleUpdate(classrel, &tup->t_self, tup);
		CommandCounterIncrement();
	}
	table_close(classrel, RowExclusiveLock);
}

/*
 * chorus_view_conversion
 *		CREATE RULE "_RETURN" AS ON SELECT turns an empty table into a view:
 *		PostgreSQL refuses a table with triggers, so the table's capture goes
 *		first (a view has no rows to capture), on every node that runs it.
 */
static void
chorus_view_conversion(RuleStmt *rs)
{
	Oid			relid;
	ChorusCaptureTriggers ct;

	if (rs->event != CMD_SELECT || strcmp(rs->rulename, "_RETURN") != 0)
		return;
	relid = RangeVarGetRelid(rs->relation, AccessExclusiveLock, true);
	if (!OidIsValid(relid) || get_rel_relkind(relid) != RELKIND_RELATION)
		return;
	chorus_capture_triggers(relid, &ct);
	if (!OidIsValid(ct.row) && !OidIsValid(ct.truncate))
		return;
	chorus_detach_locked(relid, AccessExclusiveLock);
	chorus_no_triggers_left(relid);
}

/* Detach relid if it is captured, and (with_inheritors) its partitions or, all its inheritors. */
static void
chorus_detach_dropped(Oid relid, bool cascade)
{
	char		kind = get_rel_relkind(relid);
	List	   *rels;
	ListCell   *lc;

	if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
		return;
	/* a partitioned table's partitions go with it; other inheritors only with CASCADE */
	rels = (kind == RELKIND_PARTITIONED_TABLE || cascade)
		? find_all_inheritors(relid, AccessExclusiveLock, NULL) : list_make1_oid(relid);
	foreach(lc, rels)
	{
		Oid			r = lfirst_oid(lc);
		ChorusCaptureTriggers ct;

		if (get_rel_relkind(r) != RELKIND_RELATION)
			continue;
		chorus_capture_triggers(r, &ct);
		if (OidIsValid(ct.row) || OidIsValid(ct.truncate))
			chorus_detach_locked(r, AccessExclusiveLock);
	}
}

/*
 * chorus_capture_before
 *		Right before a utility statement runs (its turn in the total order
 *		taken), on its origin and in a replay alike: the capture of tables it
 *		turns into views, or drops, goes first, so that PostgreSQL's own
 *		checks (a table with triggers is no view) and a sql_drop event
 *		trigger's pg_event_trigger_dropped_objects() see the tables as on a
 *		plain PostgreSQL. Nothing if the statement then fails: the
 *		transaction's rollback puts the capture back.
 */
void
chorus_capture_before(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, RuleStmt))
		chorus_view_conversion((RuleStmt *) stmt);
	else if (IsA(stmt, DropStmt) && ((DropStmt *) stmt)->removeType == OBJECT_TABLE)
	{
		DropStmt   *ds = (DropStmt *) stmt;

		foreach(lc, ds->objects)
		{
			Oid			relid = RangeVarGetRelid(makeRangeVarFromNameList(lfirst_node(List, lc)), NoLock, true);

			if (OidIsValid(relid) && pg_class_ownercheck(relid, GetUserId()))
				chorus_detach_dropped(relid, ds->behavior == DROP_CASCADE);
		}
	}
	else if (IsA(stmt, DropStmt) && ((DropStmt *) stmt)->removeType == OBJECT_SCHEMA)
	{
		DropStmt   *ds = (DropStmt *) stmt;

		foreach(lc, ds->objects)
		{
			Oid			nsp = get_namespace_oid(strVal(lfirst(lc)), true);
			Relation	classrel;
			ScanKeyData key;
			SysScanDesc scan;
			HeapTuple	tup;
			List	   *rels = NIL;
			ListCell   *rc;

			if (!OidIsValid(nsp) || !pg_namespace_ownercheck(nsp, GetUserId()))
				continue;
			classrel = table_open(RelationRelationId, AccessShareLock);
			ScanKeyInit(&key, Anum_pg_class_relnamespace, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(nsp));
			scan = systable_beginscan(classrel, ClassNameNspIndexId, true, NULL, 1, &key);
			while (HeapTupleIsValid(tup = systable_getnext(scan)))
				if (((Form_pg_class) GETSTRUCT(tup))->relkind == RELKIND_RELATION)
					rels = lappend_oid(rels, ((Form_pg_class) GETSTRUCT(tup))->oid);
			systable_endscan(scan);
			table_close(classrel, AccessShareLock);
			foreach(rc, rels)
				chorus_detach_dropped(lfirst_oid(rc), false);
		}
	}
}

/*
 * chorus_hide_capture
 *		After a statement's AFTER triggers fired, under EXPLAIN ANALYZE (or
 *		auto_explain): the capture triggers' counts are cleared, so that the
 *		plan lists the user's triggers only, as on a plain PostgreSQL (a
 *		trigger never invoked is not listed). Their time stays in the total.
 */
void
chorus_hide_capture(EState *estate)
{
	List	   *lists[3] = {estate->es_opened_result_relations, estate->es_tuple_routing_result_relations,
	estate->es_trig_target_relations};
	Oid			rowfn = InvalidOid,
				truncfn = InvalidOid;
	bool		looked = false;
	int			l,
				i;
	ListCell   *lc;

	for (l = 0; l < 3; l++)
		foreach(lc, lists[l])
		{
			ResultRelInfo *r = (ResultRelInfo *) lfirst(lc);

			if (r->ri_TrigDesc == NULL || r->ri_TrigInstrument == NULL)
				continue;
			if (!looked)
			{
				rowfn = chorus_capture_function(false);
				truncfn = chorus_capture_function(true);
				looked = true;
			}
			for (i = 0; i < r->ri_TrigDesc->numtriggers; i++)
			{
				Trigger    *t = &r->ri_TrigDesc->triggers[i];

				if (t->tgisinternal && OidIsValid(t->tgfoid) && (t->tgfoid == rowfn || t->tgfoid == truncfn))
					memset(&r->ri_TrigInstrument[i], 0, sizeof(Instrumentation));
			}
		}
}

/*
 * chorus.attach(rel regclass)
 *		Capture the table's row changes: its internal capture triggers, made
 *		here and not by CREATE TRIGGER statements, so no event trigger sees
 *		them and no search_path resolves anything. Idempotent. Revoked from
 *		PUBLIC.
 */
Datum
chorus_attach(PG_FUNCTION_ARGS)
{
	chorus_attach_relation(PG_GETARG_OID(0));
	PG_RETURN_VOID();
}

/*
 * chorus.detach(rel regclass)
 *		Stop capturing the table's row changes on this node (a superuser's
 *		explicit switch: docs/DDL.md). Revoked from PUBLIC.
 */
Datum
chorus_detach(PG_FUNCTION_ARGS)
{
	chorus_detach_relation(PG_GETARG_OID(0));
	PG_RETURN_VOID();
}

/* The error for a statement that would switch a table's capture off. */
static void
chorus_refuse_capture_change(const char *what, const char *table)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("chorus: cannot %s Chorus's capture trigger of table \"%s\"", what, table),
			 errdetail("It replicates the table's rows to the other nodes."),
			 errhint("A superuser stops replicating a table with SELECT chorus.detach('table'), "
					 "or a session's writes with SET chorus.capture = off (docs/DDL.md).")));
}

/*
 * chorus_trigger_all
 *		ALTER TABLE ... ENABLE/DISABLE TRIGGER ALL as PostgreSQL does it, less
 *		the capture triggers: the user's triggers (TRIGGER USER) and each other
 *		internal trigger by name, which PostgreSQL allows a superuser only, as
 *		ALL does.
 */
static List *
chorus_trigger_all(AlterTableCmd *cmd, ChorusCaptureTriggers *ct)
{
	AlterTableCmd *user = copyObject(cmd);
	List	   *cmds;
	ListCell   *lc;

	user->subtype = cmd->subtype == AT_EnableTrigAll ? AT_EnableTrigUser : AT_DisableTrigUser;
	cmds = list_make1(user);
	foreach(lc, ct->others)
	{
		AlterTableCmd *one = copyObject(cmd);

		one->subtype = cmd->subtype == AT_EnableTrigAll ? AT_EnableTrig : AT_DisableTrig;
		one->name = (char *) lfirst(lc);
		cmds = lappend(cmds, one);
	}
	return cmds;
}

/*
 * chorus_guard_alter_table
 *		ALTER TABLE's trigger subcommands: ALL leaves the capture triggers
 *		alone (returns the rewritten subcommands, or NIL when there is nothing
 *		to rewrite); naming a capture trigger is refused.
 */
static List *
chorus_guard_alter_table(AlterTableStmt *ats)
{
	Oid			relid = InvalidOid;
	bool		looked = false;
	bool		rewrite = false;
	ChorusCaptureTriggers ct;
	List	   *cmds = NIL;
	ListCell   *lc;

	foreach(lc, ats->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

		switch (cmd->subtype)
		{
			case AT_EnableTrig:
			case AT_EnableAlwaysTrig:
			case AT_EnableReplicaTrig:
			case AT_DisableTrig:
			case AT_EnableTrigAll:
			case AT_DisableTrigAll:
				if (!looked)
				{
					relid = RangeVarGetRelid(ats->relation, NoLock, true);
					looked = true;
					if (OidIsValid(relid))
						chorus_capture_triggers(relid, &ct);
				}
				break;
			default:
				break;
		}
		if (!OidIsValid(relid) || !looked)
			continue;
		if (cmd->subtype == AT_EnableTrigAll || cmd->subtype == AT_DisableTrigAll)
		{
			if (OidIsValid(ct.row) || OidIsValid(ct.truncate))
				rewrite = true;
		}
		else if ((cmd->subtype == AT_EnableTrig || cmd->subtype == AT_EnableAlwaysTrig ||
				  cmd->subtype == AT_EnableReplicaTrig || cmd->subtype == AT_DisableTrig) &&
				 chorus_names_capture(relid, cmd->name))
			chorus_refuse_capture_change(cmd->subtype == AT_DisableTrig ? "disable" : "change",
										 ats->relation->relname);
	}
	if (!rewrite)
		return NIL;
	foreach(lc, ats->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

		if (cmd->subtype == AT_EnableTrigAll || cmd->subtype == AT_DisableTrigAll)
			cmds = list_concat(cmds, chorus_trigger_all(cmd, &ct));
		else
			cmds = lappend(cmds, cmd);
	}
	return cmds;
}

/* The table of a trigger named [schema., table, trigger], as DROP TRIGGER lists it. */
static Oid
chorus_trigger_table(List *names, char **trigname)
{
	List	   *table = list_truncate(list_copy(names), list_length(names) - 1);

	*trigname = strVal(llast(names));
	if (table == NIL)
		return InvalidOid;
	return RangeVarGetRelid(makeRangeVarFromNameList(table), NoLock, true);
}

/*
 * chorus_capture_guard
 *		Before a utility statement runs (on its origin and in a replay alike):
 *		ALTER TABLE ... ENABLE/DISABLE TRIGGER ALL is rewritten so that it
 *		leaves the capture triggers alone; a statement that names one
 *		(ENABLE/DISABLE TRIGGER, DROP TRIGGER, ALTER TRIGGER ... RENAME or
 *		DEPENDS ON EXTENSION) is refused. Returns the statement to run: pstmt,
 *		or a rewritten copy of it.
 */
PlannedStmt *
chorus_capture_guard(PlannedStmt *pstmt)
{
	Node	   *stmt = pstmt->utilityStmt;

	if (IsA(stmt, AlterTableStmt))
	{
		List	   *cmds = chorus_guard_alter_table((AlterTableStmt *) stmt);

		if (cmds != NIL)
		{
			PlannedStmt *copy = copyObject(pstmt);

			((AlterTableStmt *) copy->utilityStmt)->cmds = copyObject(cmds);
			return copy;
		}
	}
	else if (IsA(stmt, DropStmt) && ((DropStmt *) stmt)->removeType == OBJECT_TRIGGER)
	{
		ListCell   *lc;

		foreach(lc, ((DropStmt *) stmt)->objects)
		{
			char	   *name;
			Oid			relid = chorus_trigger_table(lfirst_node(List, lc), &name);

			if (chorus_names_capture(relid, name))
				chorus_refuse_capture_change("drop", get_rel_name(relid));
		}
	}
	else if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_TRIGGER)
	{
		RenameStmt *rs = (RenameStmt *) stmt;
		Oid			relid = RangeVarGetRelid(rs->relation, NoLock, true);

		if (chorus_names_capture(relid, rs->subname))
			chorus_refuse_capture_change("rename", rs->relation->relname);
	}
	else if (IsA(stmt, AlterObjectDependsStmt) &&
			 ((AlterObjectDependsStmt *) stmt)->objectType == OBJECT_TRIGGER)
	{
		AlterObjectDependsStmt *ds = (AlterObjectDependsStmt *) stmt;
		char	   *name;
		Oid			relid = ds->relation != NULL
			? RangeVarGetRelid(ds->relation, NoLock, true)
			: chorus_trigger_table(castNode(List, ds->object), &name);

		if (ds->relation != NULL)
			name = strVal(llast(castNode(List, ds->object)));
		if (chorus_names_capture(relid, name))
			chorus_refuse_capture_change("make an extension own", get_rel_name(relid));
	}
	return pstmt;
}
