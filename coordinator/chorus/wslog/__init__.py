"""The writeset log: an on-disk ring of fixed-size segment files (seed sections 9.1 and 9.5), in
which every node appends each certified writeset in GID order, to serve the partial recovery of
a node that was away. The format, durability and reuse rules: docs/WSLOG.md.

``format`` (the bytes), ``scan`` (a directory as it is on disk), ``reader`` (the open log's
segments and readers), ``writer`` (the writer and the feeder), ``inspect`` (``chorus log``).
"""

from chorus.wslog.format import (DATA_START, FLAG_DDL_SKIPPED, Buffer, LogCorrupt, LogError, LogRangeUnavailable,
                                 LogRecord, LogVersionError)
from chorus.wslog.inspect import inspect_segment, verify_directory
from chorus.wslog.reader import LogReader, PiecedPayload
from chorus.wslog.writer import LogFeeder, WritesetLog, starts_again

__all__ = ["DATA_START", "FLAG_DDL_SKIPPED", "Buffer", "LogCorrupt", "LogError", "LogFeeder", "LogRangeUnavailable",
           "LogReader", "LogRecord", "LogVersionError", "PiecedPayload", "WritesetLog", "inspect_segment", "starts_again",
           "verify_directory"]
