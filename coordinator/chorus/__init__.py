"""Chorus: synchronous multi-master replication for PostgreSQL."""

# The release's version, said here only: the wheel (pyproject.toml), the CLI's --version and the
# Debian packages (packaging/version.sh) take it from this line. The extension's SQL version,
# default_version in extension/chorus.control, is its MAJOR.MINOR; packaging/version.sh checks.
__version__ = "0.4.0"
