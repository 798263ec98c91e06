/*
 * chorus_settings.h
 *		The extension's settings (GUCs): their variables and their definition.
 */
#ifndef CHORUS_SETTINGS_H
#define CHORUS_SETTINGS_H

extern char *chorus_socket_path;
extern bool chorus_capture_enabled;
extern bool chorus_replaying;
extern char *chorus_replay_role;
extern bool chorus_causal_reads;
extern int	chorus_causal_reads_timeout;
extern int	chorus_max_writeset_mb;
extern int	chorus_capture_work_mem;
extern char *chorus_exclude_schemas;
extern bool chorus_apply_executor;
extern int	chorus_max_row_keys_per_table;
extern bool chorus_replicate_ddl;
extern bool chorus_replicate_roles;
extern int	chorus_node_number;
extern int	chorus_max_nodes;
extern char *chorus_link_site;
extern char *chorus_link_old_columns;
extern char *chorus_commit_time;

extern void chorus_define_settings(void);

#endif							/* CHORUS_SETTINGS_H */
