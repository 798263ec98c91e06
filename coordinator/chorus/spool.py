"""Spool files: large writesets on disk beside the coordinator, for PostgreSQL to read
(docs/APPLY.md, "Large writesets").

A writeset larger than :data:`SPOOL_AT` is handed to the apply function as a file
(``chorus.apply_writeset_file`` maps it) rather than as a ``bytea`` parameter: the apply backend
then holds none of it in memory (a parameter is received whole, then copied), and the 1 GB limit
of a ``bytea`` does not apply. The coordinator runs as the server's user on the server's host
(it connects through the server's socket), so the server can read what it writes. The files are
private (0600 in a 0700 directory), removed once applied, and the directory is emptied when the
coordinator starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile

from chorus.wslog import Buffer

SPOOL_AT = 8 << 20  # a writeset larger than this is applied from a spool file
_SUFFIX = ".ws"
_WRITE_CHUNK = 8 << 20


class Spool:
    """The spool directory of one coordinator."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files = 0  # spooled so far (status, tests)

    def open(self) -> None:
        """Create the directory (0700) and remove what an earlier run left in it."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for name in os.listdir(self.directory):
            if name.endswith(_SUFFIX):
                self.remove(os.path.join(self.directory, name))

    def write(self, data: Buffer) -> str:
        """A new spool file holding ``data``; its path."""
        fd, path = tempfile.mkstemp(prefix="ws-", suffix=_SUFFIX, dir=self.directory)  # 0600
        try:
            with memoryview(data) as mv:
                done = 0
                while done < len(mv):
                    done += os.write(fd, mv[done:done + _WRITE_CHUNK])
        except BaseException:
            os.close(fd)
            self.remove(path)
            raise
        os.close(fd)
        self.files += 1
        return path

    async def write_async(self, data: Buffer) -> str:
        """:meth:`write` in a worker thread: the event loop goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, self.write, data)

    @staticmethod
    def remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
