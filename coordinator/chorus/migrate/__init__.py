"""Moving a database into Chorus and out of it (docs/MIGRATION.md): a dump of a node that
restores into a plain PostgreSQL (:mod:`chorus.migrate.portable`), and loading a dump into a
cluster, replicated or through one node and total recovery (:mod:`chorus.migrate.load`)."""
