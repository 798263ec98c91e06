-- chorus extension, version 0.4: capture triggers, attachment of replicated tables,
-- the functions the coordinator calls (docs/PROTOCOL.md section 4), the links' resume
-- positions, row stamps and exceptions (docs/LINKS.md). A node at 0.1, 0.2 or 0.3 moves to it
-- with ALTER EXTENSION chorus UPDATE (chorus--0.1--0.2.sql, chorus--0.2--0.3.sql,
-- chorus--0.3--0.4.sql).
--
-- Every function written in SQL or PL/pgSQL runs under SET search_path = pg_catalog, pg_temp
-- (pg_temp last: a caller's temporary objects never shadow the catalogs), and every statement
-- at the top level of this script names pg_catalog's objects in full (docs/SECURITY.md).

\echo Use "CREATE EXTENSION chorus" to load this file. \quit

-- The capture: internal triggers on these functions (chorus.attach), which no user sees or
-- switches off (extension/chorus_attach.c); nobody else makes triggers on them.
CREATE FUNCTION chorus.capture() RETURNS trigger
    AS 'MODULE_PATHNAME', 'chorus_capture' LANGUAGE C;

CREATE FUNCTION chorus.capture_truncate() RETURNS trigger
    AS 'MODULE_PATHNAME', 'chorus_capture_truncate' LANGUAGE C;

CREATE FUNCTION chorus.node_init(committed_gid bigint, lanes int DEFAULT 1) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_node_init' LANGUAGE C STRICT;

CREATE FUNCTION chorus.set_online(online boolean, reason text DEFAULT '') RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_set_online' LANGUAGE C STRICT;

CREATE FUNCTION chorus.set_paused(paused boolean) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_set_paused' LANGUAGE C STRICT;

CREATE FUNCTION chorus.committed_gid() RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_committed_gid' LANGUAGE C STRICT;

CREATE FUNCTION chorus.apply_begin(gid bigint, wait_for bigint, prev bigint DEFAULT -1) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_apply_begin' LANGUAGE C STRICT;

CREATE FUNCTION chorus.apply_writeset(gid bigint, wait_for bigint, ws bytea, prev bigint DEFAULT -1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_apply_writeset' LANGUAGE C STRICT;
CREATE FUNCTION chorus.apply_run(gid bigint, wait_for bigint, run bytea) RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_apply_run' LANGUAGE C STRICT;
-- a large writeset, from the coordinator's spool file (mapped, not read into memory)
CREATE FUNCTION chorus.apply_writeset_file(gid bigint, wait_for bigint, path text, prev bigint,
                                           off bigint DEFAULT 0, len bigint DEFAULT -1) RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_apply_writeset_file' LANGUAGE C STRICT;

CREATE FUNCTION chorus.abort_local(pid integer, gid bigint, how text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'chorus_abort_local' LANGUAGE C STRICT;

-- causal reads on demand: wait until this node has committed everything certified in the
-- cluster before the call (run it before BEGIN of a REPEATABLE READ transaction)
CREATE FUNCTION chorus.sync_wait(timeout_ms integer DEFAULT NULL) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_sync_wait_sql' LANGUAGE C;

CREATE FUNCTION chorus.wait_turn(wait_for bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_wait_turn' LANGUAGE C STRICT;

CREATE FUNCTION chorus.status(OUT ready boolean, OUT online boolean, OUT committed_gid bigint)
    AS 'MODULE_PATHNAME', 'chorus_status' LANGUAGE C STRICT;

-- What the coordinator knows (docs/OPERATIONS.md): this node, the members it sees online, the
-- last certification failures. chorus.cluster_info asks this backend's coordinator (JSON).
CREATE FUNCTION chorus.cluster_info(what text) RETURNS text
    AS 'MODULE_PATHNAME', 'chorus_cluster_info' LANGUAGE C VOLATILE STRICT;

CREATE VIEW chorus.node AS
SELECT * FROM jsonb_to_record(chorus.cluster_info('node')::jsonb) AS n(
    name text, phase text, reason text, accepts_writes boolean, quorate boolean, cluster_uuid text,
    members_online integer, committed_gid bigint, certified_gid bigint, lag_gids bigint, lag_ms double precision,
    local_commits bigint, certification_failures bigint, local_certification_failures bigint, applied bigint,
    flow_control_paused_by text[], wslog_low_gid bigint, wslog_high_gid bigint, uptime_s double precision);

CREATE VIEW chorus.members AS
SELECT * FROM jsonb_to_recordset(chorus.cluster_info('members')::jsonb) AS m(
    name text, this_node boolean, phase text, committed_gid bigint, lag_gids bigint);

-- the coordinator's answers are pages (at most 60 kB each): read them all, oldest first
CREATE FUNCTION chorus.conflict_history() RETURNS SETOF jsonb LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    after bigint := 0;
    page jsonb;
BEGIN
    LOOP
        page := chorus.cluster_info('conflicts ' || after)::jsonb;
        RETURN QUERY SELECT r FROM jsonb_array_elements(page->'rows') AS r;
        EXIT WHEN NOT (page->>'more')::boolean OR jsonb_array_length(page->'rows') = 0;
        after := (page->'rows'->-1->>'gid')::bigint;
    END LOOP;
END
$$;

CREATE VIEW chorus.conflicts AS
SELECT to_timestamp((c->>'at')::double precision) AS at, (c->>'gid')::bigint AS gid,
       NULLIF(c->>'schema', '') AS schema_name, NULLIF(c->>'table', '') AS table_name,
       NULLIF(c->>'key', '') AS key, NULLIF((c->>'winner_gid')::bigint, 0) AS winner_gid,
       NULLIF(c->>'winner_node', '') AS winner_node, c->>'loser_node' AS loser_node,
       (c->>'loser_xid')::bigint AS loser_xid, (c->>'loser_pid')::integer AS loser_pid, c->>'reason' AS reason
  FROM chorus.conflict_history() AS c;

-- After a connection lost at COMMIT (08006, 08007): what became of the transaction. Read
-- chorus.transaction_id() in the transaction before COMMIT; chorus.commit_outcome(id) on any node
-- answers committed, aborted, in doubt (and what it waits for) or unknown (docs/CLIENTS.md).
CREATE FUNCTION chorus.transaction_id() RETURNS text LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT (chorus.cluster_info('node')::jsonb->>'name') || ':' || txid_current()::text || ':'
           || (chorus.status()).committed_gid::text
$$;

CREATE FUNCTION chorus.commit_outcome(id text, OUT outcome text, OUT gid bigint, OUT detail text)
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts text[] := regexp_match(id, '^(.+):([0-9]{1,19}):([0-9]{1,19})$');
    status text := '-';
    answer jsonb;
BEGIN
    IF parts IS NULL THEN
        RAISE EXCEPTION 'chorus: % is not a transaction identifier', quote_literal(id)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'chorus.transaction_id() gives them: node:xid:gid.';
    END IF;
    IF parts[1] = chorus.cluster_info('node')::jsonb->>'name' THEN  -- this node is its origin
        BEGIN
            status := coalesce(replace(pg_xact_status(parts[2]::xid8), ' ', '_'), 'unknown');
        EXCEPTION WHEN invalid_parameter_value THEN  -- "in the future": lost in a crash, with its WAL
            status := 'unknown';
        END;
    END IF;
    answer := chorus.cluster_info(format('outcome %s %s %s %s', parts[2], parts[3], status, parts[1]))::jsonb;
    outcome := answer->>'outcome';
    gid := (answer->>'gid')::bigint;
    detail := answer->>'detail';
END
$$;

-- the conflicts show keys, so rows' values: for the roles that may see every session's data
REVOKE ALL ON FUNCTION chorus.conflict_history() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION chorus.conflict_history() TO pg_read_all_stats;
REVOKE ALL ON chorus.conflicts FROM PUBLIC;
GRANT SELECT ON chorus.conflicts TO pg_read_all_stats;
GRANT SELECT ON chorus.node, chorus.members TO PUBLIC;
-- every role may read the views and call chorus.sync_wait(); what only the coordinator may call
-- is revoked below, and chorus.cluster_info() answers 'conflicts' to pg_read_all_stats only
GRANT USAGE ON SCHEMA chorus TO PUBLIC;

-- The GID of every replicated commit is written into the commit record as the progress of
-- the replication origin "chorus": after any restart this is the node's last committed GID.
SELECT pg_catalog.pg_replication_origin_create('chorus')
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_origin WHERE roname OPERATOR(pg_catalog.=) 'chorus');

CREATE FUNCTION chorus.snapshot_gid() RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_snapshot_gid' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION chorus.hold_commits(above bigint, timeout_ms integer) RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_hold_commits' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION chorus.release_commits() RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_release_commits' LANGUAGE C VOLATILE STRICT;

CREATE FUNCTION chorus.forget_watermark() RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_forget_watermark' LANGUAGE C VOLATILE STRICT;

-- Commit lanes (docs/APPLY.md): lane 0 commits through the origin "chorus", lane k > 0 through
-- "chorus_lane_k". Each origin records the last GID committed through its lane.
CREATE FUNCTION chorus.lane_origins() RETURNS TABLE (lane int, origin text) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT 0, 'chorus'::text
    UNION ALL
    SELECT substr(roname, 13)::int, roname::text FROM pg_replication_origin WHERE roname ~ '^chorus_lane_[0-9]+$'
    ORDER BY 1
$$;

CREATE FUNCTION chorus.lane_state(OUT lanes int, OUT committed_gid bigint, OUT max_done bigint, OUT above int)
    AS 'MODULE_PATHNAME', 'chorus_lane_state' LANGUAGE C STRICT;

-- Total recovery: the node's data is the donor's snapshot at GID gid; make that its durable GID.
CREATE FUNCTION chorus.adopt_gid(gid bigint) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
BEGIN
    PERFORM chorus.forget_watermark();
    FOR o IN SELECT origin FROM chorus.lane_origins() LOOP
        PERFORM pg_replication_origin_advance(o.origin, '0/0'::pg_lsn + gid);
    END LOOP;
END
$$;

-- Every certified GID up to this one is committed durably (the lowest of the lanes' origins).
CREATE FUNCTION chorus.durable_gid() RETURNS bigint LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT min(coalesce((pg_replication_origin_progress(origin, true) - '0/0'::pg_lsn)::bigint, 0))
      FROM chorus.lane_origins()
$$;

-- Use n commit lanes from the next chorus.node_init(). Lanes change only at a settled point
-- (every lane's origin at the same GID: after chorus.settle_lanes() at a clean shutdown, or with
-- one lane); otherwise a commit above the watermark could be recorded under the old mapping of
-- GIDs to lanes, and the lanes stay as they are until then. Returns the lanes in use.
CREATE FUNCTION chorus.set_lanes(n int) RETURNS int LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    have int;
    lo bigint;
    hi bigint;
BEGIN
    IF n < 1 OR n > 16 THEN
        RAISE EXCEPTION 'chorus: commit lanes must be 1 to 16, not %', n USING ERRCODE = '22023';
    END IF;
    SELECT count(*) INTO have FROM chorus.lane_origins();
    IF have = n THEN
        RETURN n;
    END IF;
    SELECT min(p), max(p) INTO lo, hi
      FROM (SELECT coalesce((pg_replication_origin_progress(origin, true) - '0/0'::pg_lsn)::bigint, 0) AS p
              FROM chorus.lane_origins()) s;
    IF lo <> hi THEN
        RAISE WARNING 'chorus: keeping % commit lanes: they are not settled (the node did not shut down cleanly); % lanes from the next clean restart', have, n;
        RETURN have;
    END IF;
    FOR k IN have .. n - 1 LOOP
        PERFORM pg_replication_origin_create('chorus_lane_' || k);
        PERFORM pg_replication_origin_advance('chorus_lane_' || k, '0/0'::pg_lsn + hi);
    END LOOP;
    FOR k IN n .. have - 1 LOOP
        PERFORM pg_replication_origin_drop('chorus_lane_' || k);
    END LOOP;
    RETURN n;
END
$$;

-- At a clean shutdown: every certified GID up to the watermark is committed and none above it,
-- so every lane's origin can record the watermark. Then the lanes can change. False if not settled.
CREATE FUNCTION chorus.settle_lanes() RETURNS boolean LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s record;
    o record;
BEGIN
    SELECT * INTO s FROM chorus.lane_state();
    IF s.lanes <= 1 THEN
        RETURN true;
    END IF;
    IF s.above > 0 OR s.max_done <> s.committed_gid THEN
        RETURN false;
    END IF;
    FOR o IN SELECT origin FROM chorus.lane_origins() LOOP
        PERFORM pg_replication_origin_advance(o.origin, '0/0'::pg_lsn + s.committed_gid);
    END LOOP;
    RETURN true;
EXCEPTION WHEN object_in_use THEN
    RETURN false;
END
$$;

-- Is a table one Chorus replicates automatically? Plain permanent tables outside the system
-- schemas and chorus.exclude_schemas, partitions included; not a partitioned table itself (its
-- rows live in its partitions, which capture them). Read from the catalogs in C.
CREATE FUNCTION chorus.replicable(rel regclass) RETURNS boolean
    AS 'MODULE_PATHNAME', 'chorus_replicable' LANGUAGE C STABLE STRICT;

-- The capture triggers are internal (not in \d, information_schema or pg_dump; ALTER TABLE ...
-- DISABLE TRIGGER ALL leaves them alone) and fire whatever session_replication_role says
-- (ENABLE ALWAYS): a session in replica mode still has its writes replicated. Only
-- chorus.capture = off keeps a session's writes on its node, and chorus.detach a table's
-- (docs/DDL.md). Made and removed in C, not by statements: no event trigger sees them.
CREATE FUNCTION chorus.attach(rel regclass) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_attach' LANGUAGE C STRICT;

CREATE FUNCTION chorus.detach(rel regclass) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_detach' LANGUAGE C STRICT;

CREATE FUNCTION chorus.attach_all() RETURNS integer LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r regclass;
    n integer := 0;
BEGIN
    FOR r IN SELECT c.oid::regclass FROM pg_class c
              WHERE c.relkind = 'r' AND chorus.replicable(c.oid) LOOP
        PERFORM chorus.attach(r);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- Sequences never collide between nodes (docs/DDL.md): node k of at most chorus.max_nodes
-- draws start + (k-1)*increment, then steps by increment * max_nodes (chorus_sequence.c).
CREATE FUNCTION chorus.spread_sequence(seq regclass, restart_above bigint DEFAULT NULL) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_spread_sequence' LANGUAGE C VOLATILE SET chorus.replicate_ddl = off;

-- The replay of a setval(): the sequence restarts at this node's first value beyond "beyond".
CREATE FUNCTION chorus.restart_sequence(seq regclass, beyond bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_restart_sequence' LANGUAGE C VOLATILE STRICT;

-- setval() in a captured session runs as this (chorus_setval.c): setval, and the sequence
-- restarts in every node's class above where it ended, at the transaction's commit.
CREATE FUNCTION chorus.setval_captured(seq regclass, value bigint, is_called boolean) RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_setval_captured' LANGUAGE C STRICT VOLATILE;

-- Re-spread every sequence after chorus.max_nodes changed: run on every node with the same
-- restart_above, larger than any value any node has drawn (docs/DDL.md).
CREATE FUNCTION chorus.spread_all_sequences(restart_above bigint) RETURNS integer
LANGUAGE plpgsql SET chorus.replicate_ddl = off SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s regclass;
    n integer := 0;
BEGIN
    FOR s IN SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
              WHERE c.relkind = 'S' AND c.relpersistence = 'p'
                AND ns.nspname NOT IN ('pg_catalog', 'information_schema', 'chorus') LOOP
        PERFORM chorus.spread_sequence(s, restart_above);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- New tables are replicated as soon as they are created, on every node (the trigger fires in
-- apply sessions too); so is a table that becomes replicable (ALTER TABLE ... SET LOGGED, a
-- partition attached); new sequences get this node's residue class. In C (chorus_attach.c): what
-- it changes it changes as the bootstrap superuser, restricted, so an application role that may
-- create tables needs no other right, and no function of the extension is SECURITY DEFINER.
CREATE FUNCTION chorus.on_ddl_end() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'chorus_on_ddl_end' LANGUAGE C;

CREATE EVENT TRIGGER chorus_on_ddl_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'CREATE SEQUENCE', 'ALTER TABLE',
                 'CREATE SCHEMA')  -- CREATE SCHEMA ... CREATE TABLE ...: its tables too
    EXECUTE FUNCTION chorus.on_ddl_end();
ALTER EVENT TRIGGER chorus_on_ddl_end ENABLE ALWAYS;

REVOKE ALL ON FUNCTION chorus.node_init(bigint, int), chorus.set_online(boolean, text), chorus.set_paused(boolean),
    chorus.apply_begin(bigint, bigint, bigint), chorus.apply_writeset(bigint, bigint, bytea, bigint),
    chorus.set_lanes(int), chorus.settle_lanes(), chorus.restart_sequence(regclass, bigint),
    chorus.apply_run(bigint, bigint, bytea), chorus.apply_writeset_file(bigint, bigint, text, bigint, bigint, bigint),
    chorus.abort_local(integer, bigint, text),
    chorus.wait_turn(bigint), chorus.spread_sequence(regclass, bigint),
    chorus.hold_commits(bigint, integer), chorus.release_commits(), chorus.forget_watermark(),
    chorus.adopt_gid(bigint), chorus.attach(regclass), chorus.detach(regclass), chorus.attach_all(),
    chorus.spread_all_sequences(bigint), chorus.capture(), chorus.capture_truncate() FROM PUBLIC;

SELECT chorus.attach_all();

-- Links between sites (docs/LINKS.md section 3): where each link's receiver resumes, one row per
-- link this site receives. Written only by the apply of a link writeset, in the same transaction
-- as the rows it applies (as a row of that writeset, so a catch-up from the writeset log writes
-- it alike), the same on every node at every GID; no role but the extension's owner writes it.
-- Its rows are data of the site: pg_dump keeps them (pg_extension_config_dump).
CREATE TABLE chorus.link_position (
    link text PRIMARY KEY,
    peer_site text NOT NULL,
    applied_gid bigint NOT NULL,  -- the last GID of the peer site applied here
    peer_clock bigint NOT NULL,  -- the peer site's clock value last seen with it
    max_replicated bigint NOT NULL,  -- the highest of this site's clock values the peer reflected
    updated_at timestamptz NOT NULL  -- when the receiver sent it on (the same on every node)
);
SELECT pg_catalog.pg_extension_config_dump('chorus.link_position', '');
REVOKE ALL ON chorus.link_position FROM PUBLIC;
GRANT SELECT ON chorus.link_position TO pg_read_all_stats;

-- Links (docs/LINKS.md sections 5 and 9): the stamp of each linked row's last change (its key's
-- certification hash, the site whose change it was, that site's clock value and commit time)
-- and every conflict the apply of a link writeset met and settled. Both are written only by the
-- apply of a link writeset, as rows of the writeset it applies (so a catch-up from the writeset
-- log writes them alike), the same on every node at every GID; no role but the extension's
-- owner writes them. Their rows are data of the site: pg_dump keeps them.
CREATE TABLE chorus.link_stamp (
    key bytea PRIMARY KEY,  -- wire.key_hash of the row's identity key (16 bytes)
    site text NOT NULL,  -- the site whose change the row's last change was
    clock bigint NOT NULL,  -- that site's clock value for it (its GID there)
    commit_time timestamptz NOT NULL  -- its origin commit time
);
SELECT pg_catalog.pg_extension_config_dump('chorus.link_stamp', '');
REVOKE ALL ON chorus.link_stamp FROM PUBLIC;
GRANT SELECT ON chorus.link_stamp TO pg_read_all_stats;

CREATE TABLE chorus.link_exceptions (
    gid bigint NOT NULL,  -- this site's GID of the link writeset that met the conflict
    n integer NOT NULL,  -- the conflict's number within it
    link text NOT NULL,
    table_name text NOT NULL,  -- schema.table, quoted as needed
    row_key text NOT NULL,  -- the row's identity, as a person reads it
    local_site text,  -- whose change the local version was (NULL: no stamp, a row rejected with its transaction)
    local_clock bigint,
    local_commit_time timestamptz,
    local_row jsonb,  -- the local version (NULL: absent); values in their text form
    remote_site text NOT NULL,
    remote_clock bigint NOT NULL,
    remote_commit_time timestamptz NOT NULL,
    remote_row jsonb,  -- the incoming version (NULL: a delete)
    max_replicated bigint NOT NULL,  -- this site's clock value the peer had reflected
    detection text NOT NULL,  -- row, transaction, dependent
    policy text NOT NULL,
    decision text NOT NULL,  -- kept-local, took-remote, merged, rejected
    result_row jsonb,  -- the row the decision left (NULL: absent)
    PRIMARY KEY (gid, n)
);
SELECT pg_catalog.pg_extension_config_dump('chorus.link_exceptions', '');
REVOKE ALL ON chorus.link_exceptions FROM PUBLIC;
GRANT SELECT ON chorus.link_exceptions TO pg_read_all_stats;

-- Links (docs/LINKS.md section 7.1): the apply's call of a link's conflict function (policy
-- "function"), as the function's owner in a restricted security context, read-only, with
-- search_path = pg_catalog; refused unless fn is IMMUTABLE, not SECURITY DEFINER, not owned by a
-- superuser, with this signature (extension/chorus_link_call.c). For the apply session alone.
CREATE FUNCTION chorus.link_conflict_call(fn regprocedure, tbl regclass, a_row jsonb, a_site text, b_row jsonb,
                                          b_site text, a_meta jsonb, b_meta jsonb) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'chorus_link_conflict_call' LANGUAGE C;
REVOKE ALL ON FUNCTION chorus.link_conflict_call(regprocedure, regclass, jsonb, text, jsonb, text, jsonb, jsonb)
    FROM PUBLIC;
-- The whole of such a call, as link/funcall.py makes it: build's row (the versions as jsonb, the
-- sites, the metadata) from args made values of types, the call, then read's row (the answer read
-- back through the table's row type) as text; build and read run as tbl's owner in a restricted
-- security context, read-only, search_path = pg_catalog, the values made there too, so a
-- domain's CHECK or a cast a role defined runs with that owner's rights, never the apply
-- session's. For the apply session alone.
CREATE FUNCTION chorus.link_conflict_eval(fn regprocedure, tbl regclass, build text, read text, types regtype[],
                                          args bytea[], is_binary boolean[]) RETURNS text[]
    AS 'MODULE_PATHNAME', 'chorus_link_conflict_eval' LANGUAGE C;
REVOKE ALL ON FUNCTION chorus.link_conflict_eval(regprocedure, regclass, text, text, regtype[], bytea[], boolean[])
    FROM PUBLIC;

-- Links (docs/LINKS.md section 9): each link this node has a part in, by direction ('in': the
-- peer's changes applied here; 'out': this site's sent from this node), as its coordinator knows
-- it, with the link's row here and the conflicts this site's apply met, counted by table and
-- decision. It names sites, nodes, addresses and tables: for pg_read_all_stats, as
-- chorus.conflicts (chorus.cluster_info('links') refuses the other roles too).
CREATE VIEW chorus.link_status AS
SELECT l.link, l.direction, l.site, l.peer_site, l.state, l.receiver_node, l.sender, l.peer_gid, l.applied_gid,
       l.lag_gids, l.lag_seconds, l.own_clock, l.peer_clock, l.max_replicated,
       p.applied_gid AS position_gid, p.updated_at AS position_updated_at,
       l.received, l.applied, l.sent, l.filtered, l.returned,
       CASE WHEN l.direction OPERATOR(pg_catalog.=) 'in' THEN COALESCE(c.conflicts, 0) END AS conflicts,
       CASE WHEN l.direction OPERATOR(pg_catalog.=) 'in' THEN COALESCE(c.conflicts_by, '[]'::jsonb) END
           AS conflicts_by,
       l.why
  FROM pg_catalog.jsonb_to_recordset(chorus.cluster_info('links')::jsonb) AS l(
       link text, direction text, site text, peer_site text, state text, receiver_node text, sender text,
       peer_gid bigint, applied_gid bigint, lag_gids bigint, lag_seconds double precision, own_clock bigint,
       peer_clock bigint, max_replicated bigint, position_gid bigint, received bigint, applied bigint,
       sent bigint, filtered bigint, returned bigint, why text)
  LEFT JOIN chorus.link_position AS p
         ON p.link OPERATOR(pg_catalog.=) l.link AND l.direction OPERATOR(pg_catalog.=) 'in'
  LEFT JOIN LATERAL (
       SELECT pg_catalog.sum(g.n)::bigint AS conflicts,
              pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('table', g.table_name, 'decision', g.decision,
                                                                 'count', g.n) ORDER BY g.table_name, g.decision)
                  AS conflicts_by
         FROM (SELECT e.table_name, e.decision, pg_catalog.count(*) AS n
                 FROM chorus.link_exceptions AS e
                WHERE e.link OPERATOR(pg_catalog.=) l.link
                GROUP BY e.table_name, e.decision) AS g) AS c ON true;
REVOKE ALL ON chorus.link_status FROM PUBLIC;
GRANT SELECT ON chorus.link_status TO pg_read_all_stats;
