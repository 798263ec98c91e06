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
import mmap
import os
import tempfile
import weakref
from typing import Any, Optional

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

    def writer(self) -> "SpoolWriter":
        """A new spool file to write piece by piece."""
        return SpoolWriter(self)

    async def write_async(self, data: Buffer) -> str:
        """:meth:`write` in a worker thread: the event loop goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(None, self.write, data)

    @staticmethod
    def remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class SpooledBuffer:
    """Bytes held in a spool file and mapped, not in the process's memory: a large message from
    the bus or a large writeset from a backend (docs/APPLY.md, "Large writesets"). ``view`` is
    the bytes (the file's pages, which the kernel may drop); ``path``, ``offset`` and ``length``
    say where they are, for PostgreSQL's apply function to map them too. The file is removed once
    no buffer of it is left."""

    __slots__ = ("path", "offset", "length", "_mm", "_owner", "__weakref__")

    def __init__(self, path: str, mm: mmap.mmap, offset: int, length: int,
                 owner: Optional["SpooledBuffer"] = None) -> None:
        self.path, self.offset, self.length = path, offset, length
        self._mm = mm
        self._owner = owner  # the buffer of the whole file: kept alive while a part of it is

    @classmethod
    def of_file(cls, path: str) -> "SpooledBuffer":
        """The whole of spool file ``path`` (not empty); removed with the last buffer of it."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        whole = cls(path, mm, 0, size)
        weakref.finalize(whole, Spool.remove, path)
        return whole

    @property
    def view(self) -> memoryview:
        return memoryview(self._mm)[self.offset:self.offset + self.length]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: Any) -> Any:
        """A byte (an int), or a slice copied out as bytes (meant for small ones: a header, a frame)."""
        if isinstance(key, int):
            return self.view[key]
        return bytes(self.view[key])

    def sub(self, start: int) -> "SpooledBuffer":
        """The bytes from ``start`` on, in the same file."""
        if not 0 <= start <= self.length:
            raise ValueError(f"offset {start} outside a spooled buffer of {self.length} bytes")
        return SpooledBuffer(self.path, self._mm, self.offset + start, self.length - start, self._owner or self)


class SpoolWriter:
    """A spool file being written; :meth:`finish` gives its :class:`SpooledBuffer`."""

    def __init__(self, spool: "Spool") -> None:
        self.fd, self.path = tempfile.mkstemp(prefix="ws-", suffix=_SUFFIX, dir=spool.directory)  # 0600
        self.size = 0
        spool.files += 1

    def write(self, data: Buffer) -> None:
        with memoryview(data) as mv:
            done = 0
            while done < len(mv):
                done += os.write(self.fd, mv[done:done + _WRITE_CHUNK])
        self.size += len(data)

    def finish(self) -> SpooledBuffer:
        os.close(self.fd)
        self.fd = -1
        try:
            return SpooledBuffer.of_file(self.path)
        except BaseException:
            Spool.remove(self.path)
            raise

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        Spool.remove(self.path)


class Concat:
    """Bytes in parts, never joined: a bus message made of a small head and a spooled writeset.
    The bus cuts it into frames by slicing (each slice is copied out, one frame at a time)."""

    __slots__ = ("parts", "_len")

    def __init__(self, *parts: Any) -> None:
        self.parts = parts
        self._len = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key: slice) -> bytes:
        start, stop, step = key.indices(self._len)
        if step != 1:
            raise ValueError("only contiguous slices")
        out = []
        pos = 0
        for p in self.parts:
            n = len(p)
            if pos >= stop:
                break
            if start < pos + n:
                out.append(bytes(p[max(0, start - pos):min(n, stop - pos)]))
            pos += n
        return b"".join(out)
