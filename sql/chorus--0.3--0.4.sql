-- chorus extension, 0.3 to 0.4 (ALTER EXTENSION chorus UPDATE, on every node; docs/DEPLOY.md).
--
-- What 0.4 adds: chorus.link_stamp and chorus.link_exceptions, the links' conflict windows and
-- the conflicts their apply settled (docs/LINKS.md sections 5 and 9). Nothing else changes. The
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
