/*
 * chorus_ddl_check.c
 *		What a replicated schema change may make, checked on its origin once it
 *		has run and before it is sent (docs/DDL.md, docs/SECURITY.md):
 *
 *		- nothing permanent that depends on a temporary object: the other
 *		  nodes do not have this session's temporary objects, and this node
 *		  would drop the object with the session;
 *
 *		- no user code that runs where rows are applied unless it is trusted.
 *		  Every node applies every other node's rows, and some code runs
 *		  there: index expressions and predicates, exclusion operators, stored
 *		  generated columns, partition keys, the difference function of a range
 *		  type (GiST), triggers and rules enabled ALWAYS or REPLICA, and a
 *		  domain's CHECK constraints (wherever a value of the domain is read,
 *		  as an array element, say). If such code could behave differently on
 *		  one node (read the port, the clock, a node-local table), the
 *		  apply would fail there alone and inconsistency voting would stop that
 *		  node: the code's author would choose which node leaves. So a function
 *		  such code calls must be built in or owned by a superuser (an
 *		  administrator who has reviewed a function takes it over with ALTER
 *		  FUNCTION ... OWNER TO); a domain's CHECK must be immutable; a trigger
 *		  that fires on apply may not be deferred (it would fire at commit,
 *		  outside the owner's restricted context).
 *
 *		Table CHECK constraints, foreign keys and row security are not
 *		evaluated on apply at all (the origin's to check), so they need
 *		nothing here; what a schema change's replay evaluates is settled by
 *		every node reporting its outcome (a failure anywhere undoes it
 *		everywhere).
 *
 *		The objects are found by what the statement wrote to the catalogs:
 *		the rows of pg_depend, pg_constraint, pg_trigger and pg_rewrite that
 *		this transaction wrote since the statement began.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_attrdef.h"
#include "catalog/pg_class.h"
#include "catalog/pg_constraint.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_rewrite.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteDefine.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "chorus_ddl_check.h"

/* Did this transaction write tup since command since? */
static bool
written_since(HeapTuple tup, CommandId since)
{
	return TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetRawXmin(tup->t_data)) &&
		HeapTupleHeaderGetRawCommandId(tup->t_data) >= since;
}

/* The schema of type typid (InvalidOid if there is none). */
static Oid
type_namespace(Oid typid)
{
	HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	Oid			nsp = InvalidOid;

	if (HeapTupleIsValid(tup))
	{
		nsp = ((Form_pg_type) GETSTRUCT(tup))->typnamespace;
		ReleaseSysCache(tup);
	}
	return nsp;
}

/* The relation a row of catalog classid (its OID index: oidindex) with OID objid belongs to. */
static Oid
owning_relation(Oid classid, Oid oidindex, AttrNumber oidcol, AttrNumber relcol, Oid objid)
{
	Relation	rel = table_open(classid, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	Oid			relid = InvalidOid;

	ScanKeyInit(&key, oidcol, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(objid));
	scan = systable_beginscan(rel, oidindex, true, NULL, 1, &key);
	if ((tup = systable_getnext(scan)) != NULL)
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, relcol, RelationGetDescr(rel), &isnull);

		if (!isnull)
			relid = DatumGetObjectId(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return relid;
}

/*
 * Is object (classid, objid) temporary: a table, type or function in a
 * temporary schema, or a part of a temporary table (its constraint, default,
 * trigger or rule)?
 */
static bool
object_is_temporary(Oid classid, Oid objid)
{
	Oid			nsp = InvalidOid;

	if (classid == ConstraintRelationId)
	{
		HeapTuple	tup = SearchSysCache1(CONSTROID, ObjectIdGetDatum(objid));

		if (HeapTupleIsValid(tup))
		{
			nsp = ((Form_pg_constraint) GETSTRUCT(tup))->connamespace;
			ReleaseSysCache(tup);
		}
	}
	else if (classid == AttrDefaultRelationId)
		return object_is_temporary(RelationRelationId, GetAttrDefaultColumnAddress(objid).objectId);
	else if (classid == TriggerRelationId)
		return object_is_temporary(RelationRelationId,
								   owning_relation(TriggerRelationId, TriggerOidIndexId, Anum_pg_trigger_oid,
												   Anum_pg_trigger_tgrelid, objid));
	else if (classid == RewriteRelationId)
		return object_is_temporary(RelationRelationId,
								   owning_relation(RewriteRelationId, RewriteOidIndexId, Anum_pg_rewrite_oid,
												   Anum_pg_rewrite_ev_class, objid));
	else if (classid == RelationRelationId)
		nsp = get_rel_namespace(objid);
	else if (classid == TypeRelationId)
		nsp = type_namespace(objid);
	else if (classid == ProcedureRelationId)
		nsp = get_func_namespace(objid);
	return OidIsValid(nsp) && isAnyTempNamespace(nsp);
}

/*
 * Does the dependency d make a permanent object depend on a temporary one?
 * (A temporary object's own dependencies, a temporary table's type on the
 * table, say, are the session's.)
 */
static bool
permanent_on_temporary(Form_pg_depend d)
{
	return object_is_temporary(d->refclassid, d->refobjid) && !object_is_temporary(d->classid, d->objid);
}

/*
 * What runs on apply (a phrase for messages), if the object (classid, objid,
 * objsubid) is code that runs where rows are applied whatever its state;
 * NULL if not (or only once enabled so: triggers and rules, checked apart).
 */
static const char *
runs_on_apply(Oid classid, Oid objid, int32 objsubid)
{
	if (classid == RelationRelationId)
	{
		char		kind = get_rel_relkind(objid);

		if (kind == RELKIND_INDEX || kind == RELKIND_PARTITIONED_INDEX)
			return "an index expression or predicate";
		if (kind == RELKIND_RELATION || kind == RELKIND_PARTITIONED_TABLE)
			return "a partition key";
		return NULL;
	}
	if (classid == AttrDefaultRelationId)
	{
		/* a stored generated column is computed where the row is applied; a default is not */
		ObjectAddress col = GetAttrDefaultColumnAddress(objid);

		if (OidIsValid(col.objectId) && get_attgenerated(col.objectId, (AttrNumber) col.objectSubId) != '\0')
			return "a generated column";
		return NULL;
	}
	if (classid == ConstraintRelationId)
	{
		HeapTuple	tup = SearchSysCache1(CONSTROID, ObjectIdGetDatum(objid));
		const char *what = NULL;

		if (HeapTupleIsValid(tup))
		{
			Form_pg_constraint con = (Form_pg_constraint) GETSTRUCT(tup);

			if (con->contype == CONSTRAINT_EXCLUSION)
				what = "an exclusion constraint";
			else if (OidIsValid(con->contypid))
				what = "a domain's constraint";
			ReleaseSysCache(tup);
		}
		return what;
	}
	if (classid == TypeRelationId && get_typtype(objid) == TYPTYPE_RANGE)
		return "a range type's function";
	return NULL;
}

/*
 * The function an object refers to, d (a function, or an operator's
 * function); InvalidOid if it refers to neither.
 */
static Oid
referenced_function(Oid refclassid, Oid refobjid)
{
	if (refclassid == ProcedureRelationId)
		return refobjid;
	if (refclassid == OperatorRelationId)
		return get_opcode(refobjid);
	return InvalidOid;
}

/*
 * require_trusted
 *		Refuse the schema change if function fn, which what (on which) runs
 *		where rows are applied, is not built in nor owned by a superuser.
 */
static void
require_trusted(Oid fn, const char *what, const char *which)
{
	HeapTuple	tup;
	Oid			owner;

	if (!OidIsValid(fn) || fn < FirstNormalObjectId)
		return;					/* built in */
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		return;
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);
	if (superuser_arg(owner))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("chorus: function %s, which %s%s calls, is owned by \"%s\", who is not a superuser",
					format_procedure_qualified(fn), what, which, GetUserNameFromId(owner, false)),
			 errdetail("It would run on every node where rows are applied, as code the schema change "
					   "makes there; such code must be built in or owned by a superuser, so that no "
					   "role can make a node fail where the others succeed (docs/SECURITY.md)."),
			 errhint("An administrator who has reviewed the function takes it over: ALTER FUNCTION %s OWNER TO a superuser.",
					 format_procedure_qualified(fn))));
}

/*
 * check_object_functions
 *		Every function object (classid, objid) depends on, whenever that was
 *		recorded, must be trusted (it is code that runs on apply: what).
 */
static void
check_object_functions(Oid classid, Oid objid, const char *what, const char *which)
{
	Relation	dep = table_open(DependRelationId, AccessShareLock);
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tup;

	ScanKeyInit(&key[0], Anum_pg_depend_classid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(classid));
	ScanKeyInit(&key[1], Anum_pg_depend_objid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(objid));
	scan = systable_beginscan(dep, DependDependerIndexId, true, NULL, 2, key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_depend d = (Form_pg_depend) GETSTRUCT(tup);

		require_trusted(referenced_function(d->refclassid, d->refobjid), what, which);
	}
	systable_endscan(scan);
	table_close(dep, AccessShareLock);
}

/*
 * for_each_written
 *		Call visit for every row of catalog catalogid that this transaction wrote
 *		since command since (a full scan: the catalogs a schema change writes
 *		have no index on it).
 */
static void
for_each_written(Oid catalogid, CommandId since, void (*visit) (HeapTuple tup, Relation rel))
{
	Relation	rel = table_open(catalogid, AccessShareLock);
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	HeapTuple	tup;

	while ((tup = systable_getnext(scan)) != NULL)
		if (written_since(tup, since))
			visit(tup, rel);
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

/* A new dependency: on a temporary object (refused), of code that runs on apply on a function. */
static void
check_dependency(HeapTuple tup, Relation rel)
{
	Form_pg_depend d = (Form_pg_depend) GETSTRUCT(tup);
	Oid			fn;
	const char *what;

	if (permanent_on_temporary(d))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: this schema change makes a permanent object depend on a temporary one"),
				 errdetail("The other nodes do not have this session's temporary objects."),
				 errhint("Create the object in pg_temp, or SET chorus.replicate_ddl = off.")));
	fn = referenced_function(d->refclassid, d->refobjid);
	if (OidIsValid(fn) && (what = runs_on_apply(d->classid, d->objid, d->objsubid)) != NULL)
		require_trusted(fn, what, "");
}

/* A new domain constraint must be immutable: it is checked again wherever a value is read. */
static void
check_domain_constraint(HeapTuple tup, Relation rel)
{
	Form_pg_constraint con = (Form_pg_constraint) GETSTRUCT(tup);
	bool		isnull;
	Datum		bin;

	if (!OidIsValid(con->contypid) || con->contype != CONSTRAINT_CHECK)
		return;
	bin = heap_getattr(tup, Anum_pg_constraint_conbin, RelationGetDescr(rel), &isnull);
	if (!isnull && contain_mutable_functions(stringToNode(TextDatumGetCString(bin))))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: constraint \"%s\" of domain %s is not immutable",
						NameStr(con->conname), format_type_be_qualified(con->contypid)),
				 errdetail("A domain's constraint is checked wherever a value of the domain is read, "
						   "on every node; it must give the same answer everywhere "
						   "(PostgreSQL assumes CHECK constraints are immutable)."),
				 errhint("Use immutable functions only; a CHECK constraint of a table may use others.")));
}

/*
 * A new or changed trigger that fires on apply (ALWAYS or REPLICA): its
 * function and its WHEN clause's must be trusted, and it may not be deferred.
 */
static void
check_trigger(HeapTuple tup, Relation rel)
{
	Form_pg_trigger trig = (Form_pg_trigger) GETSTRUCT(tup);
	char	   *which;

	if (trig->tgenabled != TRIGGER_FIRES_ALWAYS && trig->tgenabled != TRIGGER_FIRES_ON_REPLICA)
		return;
	which = psprintf(" (trigger \"%s\" on %s)", NameStr(trig->tgname),
					 get_rel_name(trig->tgrelid) ? quote_identifier(get_rel_name(trig->tgrelid)) : "?");
	if (trig->tgdeferrable)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: a deferrable constraint trigger cannot fire where rows are applied%s", which),
				 errdetail("It would fire at the commit of the apply, outside the restricted context "
						   "the table owner's code runs in there."),
				 errhint("Enable it ORIGIN, or make it not deferrable.")));
	require_trusted(trig->tgfoid, "a trigger enabled ALWAYS or REPLICA", which);
	check_object_functions(TriggerRelationId, trig->oid, "a trigger enabled ALWAYS or REPLICA", which);
}

/* A new or changed rule that fires on apply (ALWAYS or REPLICA): its functions must be trusted. */
static void
check_rule(HeapTuple tup, Relation rel)
{
	Form_pg_rewrite rule = (Form_pg_rewrite) GETSTRUCT(tup);

	if (rule->ev_enabled != RULE_FIRES_ALWAYS && rule->ev_enabled != RULE_FIRES_ON_REPLICA)
		return;
	check_object_functions(RewriteRelationId, rule->oid, "a rule enabled ALWAYS or REPLICA",
						   psprintf(" (rule \"%s\")", NameStr(rule->rulename)));
}

/*
 * chorus_ddl_check_made
 *		Check what the replicated statement that began at command since made
 *		(see the file's header); an ERROR refuses the statement.
 */
void
chorus_ddl_check_made(CommandId since)
{
	CommandCounterIncrement();	/* what the statement wrote, visible to the scans */
	for_each_written(DependRelationId, since, check_dependency);
	for_each_written(ConstraintRelationId, since, check_domain_constraint);
	for_each_written(TriggerRelationId, since, check_trigger);
	for_each_written(RewriteRelationId, since, check_rule);
}
