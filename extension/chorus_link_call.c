/*-------------------------------------------------------------------------
 *
 * chorus_link_call.c
 *		The call of a link's conflict function (docs/LINKS.md section 7.1,
 *		the "function" policy): f(table regclass, a_row jsonb, a_site text,
 *		b_row jsonb, b_site text, a_meta jsonb, b_meta jsonb) returns jsonb,
 *		made by the apply of a link writeset on every node of the receiving
 *		site.
 *
 *		The function is a user's code, run by the apply session (a superuser):
 *		so it runs as its owner, in a restricted security context (as
 *		PostgreSQL's maintenance commands run index expressions: no SET ROLE,
 *		no SET SESSION AUTHORIZATION, no temporary tables, the owner's rights
 *		only), with search_path = pg_catalog, and in a read-only state: what
 *		it writes would not be in the writeset every node and every catch-up
 *		commits, so it writes nothing, even where its owner may. It is refused
 *		unless it has the signature above, is IMMUTABLE, is not SECURITY
 *		DEFINER and is not owned by a superuser (a conflict function needs no
 *		rights at all: a superuser's would run with every right). Its errors
 *		are the apply's (the link stops there, docs/LINKS.md section 7.1).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#define CALL_NARGS 7

PG_FUNCTION_INFO_V1(chorus_link_conflict_call);

static const Oid call_types[CALL_NARGS] = {REGCLASSOID, JSONBOID, TEXTOID, JSONBOID, TEXTOID, JSONBOID, JSONBOID};

/*
 * check_function
 *		Refuse what may not be a conflict function; returns its owner.
 */
static Oid
check_function(Oid fn)
{
	HeapTuple	tup;
	Form_pg_proc proc;
	Oid			owner;
	char	   *name = format_procedure_qualified(fn);
	bool		ok;
	int			i;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("chorus: conflict function %u does not exist", fn)));
	proc = (Form_pg_proc) GETSTRUCT(tup);
	owner = proc->proowner;
	ok = proc->prokind == PROKIND_FUNCTION && !proc->proretset && proc->prorettype == JSONBOID &&
		proc->pronargs == CALL_NARGS;
	for (i = 0; ok && i < CALL_NARGS; i++)
		ok = proc->proargtypes.values[i] == call_types[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("chorus: conflict function %s has the wrong signature", name),
				 errdetail("A conflict function is f(regclass, jsonb, text, jsonb, text, jsonb, jsonb) returns jsonb.")));
	if (proc->provolatile != PROVOLATILE_IMMUTABLE)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("chorus: conflict function %s is not IMMUTABLE", name),
				 errdetail("Every node of both sites must reach the same answer from the same arguments.")));
	if (proc->prosecdef)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("chorus: conflict function %s is SECURITY DEFINER", name),
				 errdetail("It runs as its owner anyway; SECURITY DEFINER is refused.")));
	ReleaseSysCache(tup);
	if (superuser_arg(owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("chorus: conflict function %s is owned by superuser \"%s\"", name,
						GetUserNameFromId(owner, false)),
				 errdetail("It runs as its owner and needs no rights: a superuser's would run with all of them."),
				 errhint("Make an ordinary role its owner (ALTER FUNCTION ... OWNER TO).")));
	return owner;
}

/*
 * chorus_link_conflict_call(fn regprocedure, tbl regclass, a_row jsonb, a_site text,
 *		b_row jsonb, b_site text, a_meta jsonb, b_meta jsonb) returns jsonb
 *		fn's answer for these arguments (NULL ones included), made as above.
 *		Only a superuser calls it (no grant): the apply session.
 */
Datum
chorus_link_conflict_call(PG_FUNCTION_ARGS)
{
	Oid			fn;
	Oid			owner;
	Oid			save_uid;
	int			save_sec;
	int			nest;
	bool		save_ro = XactReadOnly;
	FmgrInfo	flinfo;
	LOCAL_FCINFO(call, CALL_NARGS);
	Datum		result;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("chorus: no conflict function")));
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("chorus: only the apply of a link calls conflict functions")));
	fn = PG_GETARG_OID(0);
	owner = check_function(fn);
	if (pg_proc_aclcheck(fn, owner, ACL_EXECUTE) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, get_func_name(fn));

	fmgr_info(fn, &flinfo);
	InitFunctionCallInfoData(*call, &flinfo, CALL_NARGS, PG_GET_COLLATION(), NULL, NULL);
	for (i = 0; i < CALL_NARGS; i++)
	{
		call->args[i].isnull = PG_ARGISNULL(i + 1);
		call->args[i].value = call->args[i].isnull ? (Datum) 0 : PG_GETARG_DATUM(i + 1);
	}

	GetUserIdAndSecContext(&save_uid, &save_sec);
	nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
							 false);
	SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	XactReadOnly = true;
	PG_TRY();
	{
		result = FunctionCallInvoke(call);
	}
	PG_FINALLY();
	{
		XactReadOnly = save_ro;
		SetUserIdAndSecContext(save_uid, save_sec);
	}
	PG_END_TRY();
	AtEOXact_GUC(false, nest);
	if (call->isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}
