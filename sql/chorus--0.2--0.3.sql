-- chorus extension, 0.2 to 0.3 (ALTER EXTENSION chorus UPDATE, on every node; docs/DEPLOY.md).
--
-- What 0.3 adds: chorus.link_position, where each link this site receives resumes (docs/LINKS.md
-- section 3). Nothing else changes. The node ends as a fresh CREATE EXTENSION chorus at 0.3
-- would make it (tests/integration/test_upgrade.py compares the two).

\echo Use "ALTER EXTENSION chorus UPDATE TO '0.3'" to load this file. \quit

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
