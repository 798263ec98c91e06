"""Chorus: synchronous multi-master replication for PostgreSQL."""

__version__ = "0.1.0"
