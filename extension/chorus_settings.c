/*
 * chorus_settings.c
 *		Owns the extension's settings (GUCs, all named chorus.*): the variables
 *		every other file reads, and their definition at load time.
 */
#include "postgres.h"

#include <limits.h>

#include "utils/guc.h"

#include "chorus_settings.h"
#include "chorus_table.h"

char	   *chorus_socket_path = NULL;
bool		chorus_capture_enabled = true;
bool		chorus_replaying = false;
char	   *chorus_replay_role = NULL;
bool		chorus_causal_reads = false;
int			chorus_causal_reads_timeout = 10000;
int			chorus_max_writeset_mb = 4095;
int			chorus_capture_work_mem = 16384;
char	   *chorus_exclude_schemas = NULL;
bool		chorus_apply_executor = true;
int			chorus_max_row_keys_per_table = 10000;
bool		chorus_replicate_ddl = true;
bool		chorus_replicate_roles = true;
int			chorus_node_number = 0;
int			chorus_max_nodes = 16;
char	   *chorus_link_site = NULL;
char	   *chorus_commit_time = NULL;
char	   *chorus_link_old_columns = NULL;

/* chorus.link_old_columns must be a list chorus_table_old_columns reads */
static bool
chorus_check_old_columns(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || chorus_old_columns_valid(*newval))
		return true;
	GUC_check_errdetail("Expected entries \"schema.table:column,column\" separated by \";\".");
	return false;
}

/*
 * chorus_define_settings
 *		Define every chorus.* setting and reserve the prefix (from _PG_init).
 */
void
chorus_define_settings(void)
{
	DefineCustomStringVariable("chorus.socket_path",
							   "Unix socket of this node's Chorus coordinator.",
							   "Empty: replication is off and writes to replicated tables fail.",
							   &chorus_socket_path, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.capture",
							 "Capture this session's writes to replicated tables.",
							 "Off: the session's writes stay local (for loading identical data on every node).",
							 &chorus_capture_enabled, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.replaying",
							 "This session runs schema changes replicated from another node (set by the coordinator).",
							 "Their node-local parts are fixed up as in an apply: a tablespace this node lacks is left out.",
							 &chorus_replaying, false, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.replay_role",
							   "The role whose schema change this replaying session runs (set by the coordinator).",
							   "With chorus.replaying on, each statement runs as this role in a restricted security "
							   "context (SET ROLE, RESET ROLE and SET SESSION AUTHORIZATION refused), as a replay in an apply does.",
							   &chorus_replay_role, "", PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.causal_reads",
							 "Each READ COMMITTED statement first waits until this node has committed everything the cluster had committed when it began.",
							 "Like Galera's wsrep_sync_wait. For REPEATABLE READ, call chorus.sync_wait() before BEGIN.",
							 &chorus_causal_reads, false, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.causal_reads_timeout",
							"How long a causal read waits for this node to catch up before it fails.",
							NULL, &chorus_causal_reads_timeout, 10000, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.max_writeset_size",
							"Largest writeset a transaction may produce, in megabytes.",
							"The rows spill to a temporary file past chorus.capture_work_mem and the coordinators "
							"keep large writesets in spool files: the limit is the coordinator protocol's frame (4 GB).",
							&chorus_max_writeset_mb, 4095, 1, 4095, PGC_SUSET,
							GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.capture_work_mem",
							"Memory a transaction's writeset may take before its rows spill to a temporary file.",
							"Like logical_decoding_work_mem: past it the rows captured so far go to a temporary "
							"file (temp_tablespaces, temp_file_limit apply), so a large transaction takes no "
							"more memory than this.",
							&chorus_capture_work_mem, 16384, 64, MAX_KILOBYTES, PGC_USERSET,
							GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.exclude_schemas",
							   "Comma-separated schemas whose new tables are not replicated.",
							   NULL, &chorus_exclude_schemas, "", PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.max_row_keys_per_table",
							"Past this many row keys of one table, a writeset certifies the table as a whole.",
							"Its row keys become one table key in exclusive mode: the transaction conflicts with every concurrent one that writes the table (docs/ISOLATION.md).",
							&chorus_max_row_keys_per_table, 10000, 1, INT_MAX, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.apply_executor",
							 "Apply replicated rows through the executor's replication helpers, as logical replication does.",
							 "Off: through prepared statements (SPI), as tables without a primary key or identity index always are.",
							 &chorus_apply_executor, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.replicate_ddl",
							 "Replicate this session's schema changes to every node, in total order.",
							 "Off: schema changes stay on this node (for changes made on every node by hand).",
							 &chorus_replicate_ddl, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("chorus.replicate_roles",
							 "Replicate CREATE/ALTER/DROP ROLE and role membership changes.",
							 NULL, &chorus_replicate_roles, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.node_number",
							"This node's number (1..chorus.max_nodes): its residue class for sequences.",
							"0: sequences are left as created (they may collide between nodes).",
							&chorus_node_number, 0, 0, 1024, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("chorus.max_nodes",
							"Sequences step by this many values so each node draws its own residue class.",
							"Must be the same on every node; see docs/DDL.md to change it.",
							&chorus_max_nodes, 16, 1, 1024, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.link_site",
							   "This site's name in its links to other sites: set, every committed change of a replicated row records its GID in chorus.link_stamp.",
							   "Must be the same on every node of the site, and set where the site receives a link (docs/LINKS.md section 5); empty: no row stamps.",
							   &chorus_link_site, "", PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("chorus.link_old_columns",
							   "Columns whose old values an UPDATE or DELETE sends, beside the identity's: \"schema.table:column,column; ...\".",
							   "The counters of the links' delta policy (docs/LINKS.md section 7.1), written from the [[link]] configuration; the same on every node of the site.",
							   &chorus_link_old_columns, "", PGC_SIGHUP, 0, chorus_check_old_columns, NULL, NULL);
	DefineCustomStringVariable("chorus.commit_time",
							   "The apply session's: the origin commit time (µs since the Unix epoch) of the writeset it applies.",
							   "Set by the coordinator, transaction-local, with each apply; the row stamps of a site with links record it (docs/LINKS.md section 5.1). Empty or 0: unknown.",
							   &chorus_commit_time, "", PGC_SUSET,
							   GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE, NULL, NULL, NULL);
	MarkGUCPrefixReserved("chorus");
}
