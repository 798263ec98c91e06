-- chorus extension, 0.3 to 0.4 (ALTER EXTENSION chorus UPDATE, on every node; docs/DEPLOY.md).
--
-- What 0.4 adds: chorus.link_stamp and chorus.link_exceptions, the links' conflict windows and
-- the conflicts their apply settled, the view chorus.link_status (docs/LINKS.md sections 5
-- and 9) and chorus.link_conflict_call, the call of a link's conflict function (section 7.1).
-- Nothing else changes. The
-- node ends as a fresh CREATE EXTENSION chorus at 0.4 would make it
-- (tests/integration/test_upgrade.py compares the two).

\echo Use "ALTER EXTENSION chorus UPDATE TO '0.4'" to load this file. \quit

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
