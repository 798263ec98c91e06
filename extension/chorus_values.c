/*
 * chorus_values.c
 *		Values that mean the same on every node, whatever the session that wrote
 *		them had set (docs/PROTOCOL.md section 2).
 *
 *		A value travels in the binary send form of its type where that form is
 *		free of settings and of node-local identifiers: the built-in numeric,
 *		date/time, network, geometric and range types and arrays of them.
 *		Everything else travels as the type's text output, produced and read
 *		under fixed settings (DateStyle ISO, IntervalStyle postgres, TimeZone
 *		UTC, extra_float_digits 3, bytea_output hex; search_path pg_catalog for
 *		the reg* types, so their names come out qualified), as postgres_fdw and
 *		the logical replication worker fix them. Text keeps the database's
 *		encoding: types whose send form converts to the client's encoding (text,
 *		json, xml, ...) go as text for that reason.
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgtime.h"
#include "utils/builtins.h"
#include "utils/bytea.h"
#include "utils/datetime.h"
#include "utils/float.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "chorus_values.h"
#include "chorus_wire.h"

/* The scalar type behind typid: an array's element type (a domain's base type), else typid. */
static Oid
chorus_scalar_type(Oid typid)
{
	Oid			elem = get_element_type(typid);

	return OidIsValid(elem) ? getBaseType(elem) : typid;
}

/*
 * chorus_binary_type
 *		Whether values of type typid (a base type, not a domain) travel in
 *		their binary send form. An array of a domain does not: its send form
 *		names the domain's type OID, which differs between nodes.
 */
static bool
chorus_binary_type(Oid typid)
{
	Oid			elem = get_element_type(typid);

	if (OidIsValid(elem))
		typid = elem;
	switch (typid)
	{
		case PG_NDISTINCTOID:	/* the planner's statistics: their send form is their bytes */
		case PG_DEPENDENCIESOID:
		case PG_MCV_LISTOID:
		case PG_BRIN_BLOOM_SUMMARYOID:
		case PG_BRIN_MINMAX_MULTI_SUMMARYOID:
		case BOOLOID:
		case CHAROID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case OIDOID:
		case FLOAT4OID:
		case FLOAT8OID:
		case NUMERICOID:
		case CASHOID:
		case DATEOID:
		case TIMEOID:
		case TIMETZOID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
		case INTERVALOID:
		case UUIDOID:
		case BYTEAOID:
		case INETOID:
		case CIDROID:
		case MACADDROID:
		case MACADDR8OID:
		case BITOID:
		case VARBITOID:
		case POINTOID:
		case LSEGOID:
		case BOXOID:
		case PATHOID:
		case POLYGONOID:
		case CIRCLEOID:
		case LINEOID:
		case LSNOID:
		case TIDOID:
		case XID8OID:
		case INT4RANGEOID:
		case INT8RANGEOID:
		case NUMRANGEOID:
		case DATERANGEOID:
		case TSRANGEOID:
		case TSTZRANGEOID:
		case INT4MULTIRANGEOID:
		case INT8MULTIRANGEOID:
		case NUMMULTIRANGEOID:
		case DATEMULTIRANGEOID:
		case TSMULTIRANGEOID:
		case TSTZMULTIRANGEOID:
			return true;
		default:
			return false;
	}
}

/*
 * chorus_text_is_fixed
 *		Whether the text output of type typid (a base type) is the same under
 *		any session settings, so no fixed settings are needed to produce it.
 */
static bool
chorus_text_is_fixed(Oid typid)
{
	typid = chorus_scalar_type(typid);
	switch (typid)
	{
		case BOOLOID:
		case CHAROID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case OIDOID:
		case NUMERICOID:
		case TEXTOID:
		case VARCHAROID:
		case BPCHAROID:
		case NAMEOID:
		case UUIDOID:
		case JSONOID:
		case JSONBOID:
		case XMLOID:
		case INETOID:
		case CIDROID:
		case MACADDROID:
		case MACADDR8OID:
		case BITOID:
		case VARBITOID:
		case TSVECTOROID:
		case TSQUERYOID:
		case LSNOID:
			return true;
		default:
			return type_is_enum(typid);
	}
}

/* The reg* types: their text output depends on search_path (qualified or not). */
static bool
chorus_reg_type(Oid typid)
{
	switch (chorus_scalar_type(typid))
	{
		case REGCLASSOID:
		case REGTYPEOID:
		case REGPROCOID:
		case REGPROCEDUREOID:
		case REGOPEROID:
		case REGOPERATOROID:
		case REGCONFIGOID:
		case REGDICTIONARYOID:
		case REGNAMESPACEOID:
		case REGROLEOID:
		case REGCOLLATIONOID:
			return true;
		default:
			return false;
	}
}

/*
 * chorus_raw_type
 *		The planner's own types (pg_node_tree, statistics, BRIN summaries),
 *		whose input and receive functions refuse every value: they travel as
 *		their stored bytes (pg_node_tree as its text, the others in their send
 *		form, which is their bytes) and are applied as such
 *		(chorus_apply_datum). A table made by CREATE TABLE AS SELECT * FROM
 *		pg_class has one (issue 35: the regression suite's create_table).
 */
bool
chorus_raw_type(Oid typid)
{
	switch (typid)
	{
		case PG_NODE_TREEOID:
		case PG_NDISTINCTOID:
		case PG_DEPENDENCIESOID:
		case PG_MCV_LISTOID:
		case PG_BRIN_BLOOM_SUMMARYOID:
		case PG_BRIN_MINMAX_MULTI_SUMMARYOID:
			return true;
		default:
			return false;
	}
}

/*
 * chorus_check_replicable_type
 *		Refuse a column whose values no node can read back: an array of one of
 *		the planner's types (chorus_raw_type; the values themselves travel):
 *		better an error here, before anything commits, than a node that cannot
 *		apply the row.
 */
void
chorus_check_replicable_type(Oid typid, const char *column, const char *table)
{
	Oid			base = getBaseType(typid);

	if (OidIsValid(get_element_type(base)) && chorus_raw_type(chorus_scalar_type(base)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("chorus: column \"%s\" of %s has type %s, whose values cannot be replicated",
						column, table, format_type_be(typid)),
				 errdetail("PostgreSQL reads no array of this type back from its text or binary form."),
				 errhint("Cast the column to text, or keep the table on one node (chorus.exclude_schemas).")));
}

/*
 * chorus_column_io
 *		How a column of type typid travels: its value kind and the function
 *		that produces it (send or output), looked up once per table. *canonical
 *		and *qualify are set when its text needs fixed settings (for the value
 *		or, with as_key, for its certification key, which is always text).
 */
uint8
chorus_column_io(Oid typid, bool as_key, MemoryContext cxt, FmgrInfo *value_fn,
				 FmgrInfo *text_fn, bool *canonical, bool *qualify)
{
	Oid			base = getBaseType(typid);
	Oid			fn;
	bool		varlena;
	bool		binary = chorus_binary_type(base);

	if (binary)
	{
		getTypeBinaryOutputInfo(base, &fn, &varlena);
		binary = OidIsValid(fn);
	}
	if (binary)
		fmgr_info_cxt(fn, value_fn, cxt);
	getTypeOutputInfo(typid, &fn, &varlena);
	fmgr_info_cxt(fn, text_fn, cxt);
	if (!binary)
		*value_fn = *text_fn;
	if ((!binary || as_key) && !chorus_text_is_fixed(base))
	{
		*canonical = true;
		if (chorus_reg_type(base) || get_typtype(base) == TYPTYPE_COMPOSITE)
			*qualify = true;
	}
	return binary ? CHORUS_VAL_BINARY : CHORUS_VAL_TEXT;
}

static bool
chorus_timezone_is_utc(void)
{
	long		gmtoff;

	return pg_get_timezone_offset(session_timezone, &gmtoff) && gmtoff == 0;
}

static int
chorus_set(int nest, const char *name, const char *value)
{
	if (nest < 0)
		nest = NewGUCNestLevel();
	(void) set_config_option(name, value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	return nest;
}

/*
 * chorus_canonical_enter
 *		Fix the settings that text input and output depend on, where the
 *		session has them otherwise (usually it does not, and this costs a few
 *		comparisons). qualify: also search_path = pg_catalog, so reg* values
 *		print schema-qualified. Returns the GUC nest level to pass to
 *		chorus_canonical_exit, or -1 if nothing was changed. An error in
 *		between is undone by the transaction's abort.
 */
int
chorus_canonical_enter(bool qualify)
{
	int			nest = -1;

	if (DateStyle != USE_ISO_DATES)
		nest = chorus_set(nest, "datestyle", "ISO");
	if (IntervalStyle != INTSTYLE_POSTGRES)
		nest = chorus_set(nest, "intervalstyle", "postgres");
	if (extra_float_digits < 1)
		nest = chorus_set(nest, "extra_float_digits", "3");
	if (bytea_output != BYTEA_OUTPUT_HEX)
		nest = chorus_set(nest, "bytea_output", "hex");
	if (!chorus_timezone_is_utc())
		nest = chorus_set(nest, "timezone", "UTC");
	if (qualify && (namespace_search_path == NULL || strcmp(namespace_search_path, "pg_catalog") != 0))
		nest = chorus_set(nest, "search_path", "pg_catalog");
	return nest;
}

void
chorus_canonical_exit(int nest)
{
	if (nest >= 0)
		AtEOXact_GUC(true, nest);
}
