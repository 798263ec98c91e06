-- chorus extension, version 0.1: capture triggers, attachment of replicated tables,
-- and the functions the coordinator calls (docs/PROTOCOL.md section 4).

\echo Use "CREATE EXTENSION chorus" to load this file. \quit

CREATE FUNCTION chorus.capture() RETURNS trigger
    AS 'MODULE_PATHNAME', 'chorus_capture' LANGUAGE C;

CREATE FUNCTION chorus.capture_truncate() RETURNS trigger
    AS 'MODULE_PATHNAME', 'chorus_capture_truncate' LANGUAGE C;

CREATE FUNCTION chorus.node_init(committed_gid bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_node_init' LANGUAGE C STRICT;

CREATE FUNCTION chorus.set_online(online boolean) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_set_online' LANGUAGE C STRICT;

CREATE FUNCTION chorus.set_paused(paused boolean) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_set_paused' LANGUAGE C STRICT;

CREATE FUNCTION chorus.committed_gid() RETURNS bigint
    AS 'MODULE_PATHNAME', 'chorus_committed_gid' LANGUAGE C STRICT;

CREATE FUNCTION chorus.apply_begin(gid bigint, wait_for bigint) RETURNS void
    AS 'MODULE_PATHNAME', 'chorus_apply_begin' LANGUAGE C STRICT;

CREATE FUNCTION chorus.abort_local(pid integer, gid bigint, how text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'chorus_abort_local' LANGUAGE C STRICT;

CREATE FUNCTION chorus.status(OUT ready boolean, OUT online boolean, OUT committed_gid bigint)
    AS 'MODULE_PATHNAME', 'chorus_status' LANGUAGE C STRICT;

-- The GID of every replicated commit is written into the commit record as the progress of
-- the replication origin "chorus": after any restart this is the node's last committed GID.
SELECT pg_replication_origin_create('chorus')
 WHERE NOT EXISTS (SELECT 1 FROM pg_replication_origin WHERE roname = 'chorus');

CREATE FUNCTION chorus.durable_gid() RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT coalesce((pg_replication_origin_progress('chorus', true) - '0/0'::pg_lsn)::bigint, 0)
$$;

-- Is a table one Chorus replicates automatically?
CREATE FUNCTION chorus.replicable(rel regclass) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
       AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'chorus', 'pg_toast')
       AND n.nspname NOT LIKE 'pg\_temp%' AND n.nspname NOT LIKE 'pg\_toast%'
       AND n.nspname <> ALL (string_to_array(replace(current_setting('chorus.exclude_schemas', true), ' ', ''), ','))
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = rel
$$;

CREATE FUNCTION chorus.attach(rel regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = rel AND tgname = 'chorus_capture') THEN
        EXECUTE format('CREATE TRIGGER chorus_capture AFTER INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION chorus.capture()', rel);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = rel AND tgname = 'chorus_capture_truncate') THEN
        EXECUTE format('CREATE TRIGGER chorus_capture_truncate AFTER TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION chorus.capture_truncate()', rel);
    END IF;
END
$$;

CREATE FUNCTION chorus.detach(rel regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS chorus_capture ON %s', rel);
    EXECUTE format('DROP TRIGGER IF EXISTS chorus_capture_truncate ON %s', rel);
END
$$;

CREATE FUNCTION chorus.attach_all() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    r regclass;
    n integer := 0;
BEGIN
    FOR r IN SELECT c.oid::regclass FROM pg_class c
              WHERE c.relkind IN ('r', 'p') AND chorus.replicable(c.oid) LOOP
        PERFORM chorus.attach(r);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- New tables are replicated as soon as they are created.
CREATE FUNCTION chorus.on_ddl_end() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    cmd record;
BEGIN
    FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands()
                WHERE object_type = 'table' AND command_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO') LOOP
        IF chorus.replicable(cmd.objid::regclass) THEN
            PERFORM chorus.attach(cmd.objid::regclass);
        END IF;
    END LOOP;
END
$$;

CREATE EVENT TRIGGER chorus_attach_new_tables ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO')
    EXECUTE FUNCTION chorus.on_ddl_end();

REVOKE ALL ON FUNCTION chorus.node_init(bigint), chorus.set_online(boolean), chorus.set_paused(boolean),
    chorus.apply_begin(bigint, bigint), chorus.abort_local(integer, bigint, text) FROM PUBLIC;

SELECT chorus.attach_all();
