"""Total recovery and verify (docs/RECOVERY.md): ``recover`` the steps around the snapshot diff,
``schema`` the schema and roles made the donor's, ``conn`` the connection strings and private
files."""
