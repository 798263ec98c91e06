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
 *		What surrounds the call can run a role's code too: the versions' values
 *		made of their types (a domain's CHECK), turned into jsonb (a cast to
 *		json a role made), the answer read back through the table's row type.
 *		chorus.link_conflict_eval runs all of it as the table's owner, in the
 *		same restricted, read-only context, as the apply of the row would.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "utils/array.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "chorus_table.h"

#define CALL_NARGS 7

PG_FUNCTION_INFO_V1(chorus_link_conflict_call);
PG_FUNCTION_INFO_V1(chorus_link_conflict_eval);

/* a restricted security context entered, and what it left */
typedef struct Restricted
{
	Oid			save_uid;
	int			save_sec;
	int			nest;
	bool		save_ro;
} Restricted;

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
 * restricted_enter
 *		Run as role as PostgreSQL's maintenance commands run index expressions:
 *		a restricted security context (no SET ROLE, no SET SESSION
 *		AUTHORIZATION, no temporary tables, the role's rights only), with
 *		search_path = pg_catalog, read-only (what it wrote would not be in the
 *		writeset every node and every catch-up commits). restricted_leave, in
 *		PG_FINALLY, returns to what was; restricted_done after it, on success,
 *		drops the settings the code made.
 */
static void
restricted_enter(Restricted *r, Oid role)
{
	GetUserIdAndSecContext(&r->save_uid, &r->save_sec);
	r->save_ro = XactReadOnly;
	r->nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
							 false);
	SetUserIdAndSecContext(role, r->save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	XactReadOnly = true;
}

static void
restricted_leave(Restricted *r)
{
	XactReadOnly = r->save_ro;
	SetUserIdAndSecContext(r->save_uid, r->save_sec);
}

static void
restricted_done(Restricted *r)
{
	AtEOXact_GUC(false, r->nest);
}

/*
 * call_conflict
 *		fn(args) as fn's owner, restricted (above), after check_function.
 */
static Datum
call_conflict(Oid fn, const Datum *args, const bool *nulls, Oid collation, bool *isnull)
{
	Oid			owner = check_function(fn);
	Restricted	r;
	FmgrInfo	flinfo;
	LOCAL_FCINFO(call, CALL_NARGS);
	Datum		result;
	int			i;

	if (pg_proc_aclcheck(fn, owner, ACL_EXECUTE) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, get_func_name(fn));
	fmgr_info(fn, &flinfo);
	InitFunctionCallInfoData(*call, &flinfo, CALL_NARGS, collation, NULL, NULL);
	for (i = 0; i < CALL_NARGS; i++)
	{
		call->args[i].isnull = nulls[i];
		call->args[i].value = nulls[i] ? (Datum) 0 : args[i];
	}
	restricted_enter(&r, owner);
	PG_TRY();
	{
		result = FunctionCallInvoke(call);
	}
	PG_FINALLY();
	{
		restricted_leave(&r);
	}
	PG_END_TRY();
	restricted_done(&r);
	*isnull = call->isnull;
	return result;
}

static void
only_the_apply(void)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("chorus: only the apply of a link calls conflict functions")));
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
	Datum		args[CALL_NARGS];
	bool		nulls[CALL_NARGS];
	bool		isnull;
	Datum		result;
	int			i;

	if (PG_ARGISNULL(0))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("chorus: no conflict function")));
	only_the_apply();
	for (i = 0; i < CALL_NARGS; i++)
	{
		nulls[i] = PG_ARGISNULL(i + 1);
		args[i] = nulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i + 1);
	}
	result = call_conflict(PG_GETARG_OID(0), args, nulls, PG_GET_COLLATION(), &isnull);
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

/*
 * eval_value
 *		The value of type typ that bytes b are, in that type's text form (read by
 *		its input function) or, binary, its send form (its receive function).
 */
static Datum
eval_value(Oid typ, bytea *b, bool binary)
{
	Oid			func;
	Oid			ioparam;
	char	   *data = VARDATA_ANY(b);
	int			len = VARSIZE_ANY_EXHDR(b);

	if (binary)
	{
		StringInfoData buf;

		getTypeBinaryInputInfo(typ, &func, &ioparam);
		initStringInfo(&buf);
		appendBinaryStringInfo(&buf, data, len);
		return OidReceiveFunctionCall(func, &buf, ioparam, -1);
	}
	getTypeInputInfo(typ, &func, &ioparam);
	(void) pg_verifymbstr(data, len, false);
	return OidInputFunctionCall(func, pnstrdup(data, len), ioparam, -1);
}

/* Run query (read-only) and check it gave one row (of n columns, unless n < 0). */
static void
eval_one_row(const char *query, int nargs, Oid *types, Datum *values, const char *nulls, int n, const char *what)
{
	int			rc = SPI_execute_with_args(query, nargs, types, values, nulls, true, 1);

	if (rc != SPI_OK_SELECT || SPI_processed != 1 || (n >= 0 && SPI_tuptable->tupdesc->natts != n))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("chorus: link_conflict_eval: the %s statement gave %s, not one row of %d columns", what,
						SPI_result_code_string(rc), n)));
}

/* build's columns: the function's arguments after the table */
static const Oid build_types[CALL_NARGS - 1] = {JSONBOID, TEXTOID, JSONBOID, TEXTOID, JSONBOID, JSONBOID};

/*
 * chorus_link_conflict_eval(fn regprocedure, tbl regclass, build text, read text,
 *		types regtype[], args bytea[], is_binary boolean[]) returns text[]
 *		The call of a link's conflict function fn as link/funcall.py makes it,
 *		every part of it that can run a role's code run as tbl's owner (as the
 *		apply of tbl's rows runs, chorus_apply.c), restricted (above):
 *		- build's one row is fn's arguments after tbl (the two versions as jsonb,
 *		  the sites, the metadata); its parameters $1.. are args, values of types
 *		  made by those types' input functions (or, where binary, receive
 *		  functions) as that owner, so a domain's CHECK or a cast to json a role
 *		  defined runs with that owner's rights, never the apply session's;
 *		- fn is called as chorus_link_conflict_call calls it (as its owner);
 *		- read's one row, with $1, $2 and $3 the two versions and the answer
 *		  (jsonb), is returned, each column as text (NULL kept): the answer read
 *		  back through tbl's row type.
 *		Only a superuser calls it (no grant): the apply session.
 */
Datum
chorus_link_conflict_eval(PG_FUNCTION_ARGS)
{
	Oid			fn;
	Oid			relid;
	char	   *build;
	char	   *read;
	Datum	   *typv;
	Datum	   *argv;
	Datum	   *binv;
	bool	   *typn;
	bool	   *argn;
	bool	   *binn;
	int			ntypes;
	int			nargs;
	int			nbin;
	Restricted	r;
	MemoryContext caller = CurrentMemoryContext;
	Oid			collation = PG_GET_COLLATION();
	ArrayType  *result = NULL;
	int			i;

	for (i = 0; i < 7; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("chorus: link_conflict_eval takes no NULL argument")));
	only_the_apply();
	fn = PG_GETARG_OID(0);
	relid = PG_GETARG_OID(1);
	build = text_to_cstring(PG_GETARG_TEXT_PP(2));
	read = text_to_cstring(PG_GETARG_TEXT_PP(3));
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(4), REGTYPEOID, sizeof(Oid), true, TYPALIGN_INT,
					  &typv, &typn, &ntypes);
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(5), BYTEAOID, -1, false, TYPALIGN_INT, &argv, &argn, &nargs);
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(6), BOOLOID, 1, true, TYPALIGN_CHAR, &binv, &binn, &nbin);
	if (ntypes != nargs || nbin != nargs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("chorus: link_conflict_eval: %d types, %d arguments, %d forms", ntypes, nargs, nbin)));

	restricted_enter(&r, chorus_relation_owner(relid));
	PG_TRY();
	{
		Oid		   *types = palloc(sizeof(Oid) * Max(nargs, 1));
		Datum	   *values = palloc(sizeof(Datum) * Max(nargs, 1));
		char	   *nulls = palloc(nargs + 1);
		Datum		call_args[CALL_NARGS];
		bool		call_nulls[CALL_NARGS];
		Oid			read_types[3] = {JSONBOID, JSONBOID, JSONBOID};
		Datum		read_values[3];
		char		read_nulls[4] = "   ";
		bool		isnull;
		Datum		answer;

		for (i = 0; i < nargs; i++)
		{
			if (typn[i] || binn[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("chorus: link_conflict_eval: parameter %d has no type or form", i + 1)));
			types[i] = DatumGetObjectId(typv[i]);
			nulls[i] = argn[i] ? 'n' : ' ';
			values[i] = argn[i] ? (Datum) 0 :
				eval_value(types[i], DatumGetByteaPP(argv[i]), DatumGetBool(binv[i]));
		}
		nulls[nargs] = '\0';
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "chorus: SPI_connect failed");
		eval_one_row(build, nargs, types, values, nulls, CALL_NARGS - 1, "build");
		call_args[0] = ObjectIdGetDatum(relid);
		call_nulls[0] = false;
		for (i = 1; i < CALL_NARGS; i++)
		{
			if (SPI_gettypeid(SPI_tuptable->tupdesc, i) != build_types[i - 1])
				ereport(ERROR,
						(errcode(ERRCODE_DATATYPE_MISMATCH),
						 errmsg("chorus: link_conflict_eval: the build statement's column %d is of the wrong type", i)));
			call_args[i] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, i, &call_nulls[i]);
			if (!call_nulls[i])
				call_args[i] = datumCopy(call_args[i], false, -1);
		}
		answer = call_conflict(fn, call_args, call_nulls, collation, &isnull);
		read_values[0] = call_args[1];
		read_nulls[0] = call_nulls[1] ? 'n' : ' ';
		read_values[1] = call_args[3];
		read_nulls[1] = call_nulls[3] ? 'n' : ' ';
		read_values[2] = isnull ? (Datum) 0 : answer;
		read_nulls[2] = isnull ? 'n' : ' ';
		eval_one_row(read, 3, read_types, read_values, read_nulls, -1, "read");
		{
			TupleDesc	desc = SPI_tuptable->tupdesc;
			HeapTuple	tup = SPI_tuptable->vals[0];
			int			n = desc->natts;
			char	  **texts = palloc(sizeof(char *) * Max(n, 1));
			Datum	   *elems;
			bool	   *enulls;
			int			dims[1];
			int			lbs[1] = {1};
			MemoryContext old;

			for (i = 0; i < n; i++)
				texts[i] = SPI_getvalue(tup, desc, i + 1);
			old = MemoryContextSwitchTo(caller);
			elems = palloc(sizeof(Datum) * Max(n, 1));
			enulls = palloc(sizeof(bool) * Max(n, 1));
			for (i = 0; i < n; i++)
			{
				enulls[i] = texts[i] == NULL;
				elems[i] = enulls[i] ? (Datum) 0 : PointerGetDatum(cstring_to_text(texts[i]));
			}
			dims[0] = n;
			result = construct_md_array(elems, enulls, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT);
			MemoryContextSwitchTo(old);
		}
		SPI_finish();
	}
	PG_FINALLY();
	{
		restricted_leave(&r);
	}
	PG_END_TRY();
	restricted_done(&r);
	PG_RETURN_ARRAYTYPE_P(result);
}
