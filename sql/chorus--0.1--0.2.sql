-- chorus extension, 0.1 to 0.2 (ALTER EXTENSION chorus UPDATE, on every node; docs/DEPLOY.md).
--
-- What 0.2 changes, and what this script does for a node made at 0.1:
-- - every function written in SQL or PL/pgSQL runs under SET search_path = pg_catalog, pg_temp
--   (docs/SECURITY.md section 4); chorus.replicable, chorus.spread_sequence, chorus.detach and
--   the event trigger's chorus.on_ddl_end are C (no function is SECURITY DEFINER any more);
--   chorus.restart_sequence replays a setval(); chorus.alter_sequence is gone;
-- - the capture triggers are internal (issue 35): users do not see them (\d,
--   information_schema, pg_dump) and cannot switch them off. Every table's visible 0.1 triggers
--   chorus_capture and chorus_capture_truncate are replaced by internal ones, in this
--   transaction: no row change goes uncaptured in between.
--
-- The node ends as a fresh CREATE EXTENSION chorus at 0.2 would make it
-- (tests/integration/test_upgrade.py compares the two).

\echo Use "ALTER EXTENSION chorus UPDATE TO '0.2'" to load this file. \quit

-- search_path pinned where the body is unchanged
ALTER FUNCTION chorus.conflict_history() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.transaction_id() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.commit_outcome(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.lane_origins() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.adopt_gid(bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.durable_gid() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.set_lanes(int) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.settle_lanes() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.attach_all() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION chorus.spread_all_sequences(bigint) SET search_path = pg_catalog, pg_temp;

-- Is a table one Chorus replicates automatically? Plain permanent tables outside the system
-- schemas and chorus.exclude_schemas, partitions included; not a partitioned table itself (its
-- rows live in its partitions, which capture them). Read from the catalogs in C.
CREATE OR REPLACE FUNCTION chorus.replicable(rel regclass) RETURNS boolean
    AS 'MODULE_PATHNAME', 'chorus_replicable' LANGUAGE C STABLE STRICT;

-- Sequences never collide between nodes (docs/DDL.md): node k of at most chorus.max_nodes
-- draws start + (k-1)*increment, then steps by increment * max_nodes (chorus_sequence.c).
CREATE OR REPLACE FUNCTION chorus.spread_sequence(seq regclass, restart_above bigint DEFAULT NULL) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_spread_sequence' LANGUAGE C VOLATILE SET chorus.replicate_ddl = off;

DROP FUNCTION chorus.alter_sequence(regclass, bigint, bigint, bigint);

-- The replay of a setval(): the sequence restarts at this node's first value beyond "beyond".
CREATE FUNCTION chorus.restart_sequence(seq regclass, beyond bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_restart_sequence' LANGUAGE C VOLATILE STRICT;

CREATE OR REPLACE FUNCTION chorus.detach(rel regclass) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_detach' LANGUAGE C STRICT;

CREATE OR REPLACE FUNCTION chorus.on_ddl_end() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'chorus_on_ddl_end' LANGUAGE C;

REVOKE ALL ON FUNCTION chorus.restart_sequence(regclass, bigint), chorus.capture(),
    chorus.capture_truncate() FROM PUBLIC;

-- The capture becomes internal: chorus.attach replaces a table's visible 0.1 triggers by
-- internal ones (extension/chorus_attach.c). Tables detached on this node stay detached.
SELECT chorus.attach(r.tgrelid::regclass)
  FROM (SELECT DISTINCT t.tgrelid FROM pg_catalog.pg_trigger t
         WHERE t.tgfoid OPERATOR(pg_catalog.=) 'chorus.capture()'::pg_catalog.regprocedure
           AND NOT t.tgisinternal) r;
