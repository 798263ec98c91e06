"""The bus on Corosync's closed process groups (libcpg) and votequorum, through cffi.

CPG gives what :class:`chorus.bus.Bus` promises: agreed order (``CPG_TYPE_AGREED``),
self-delivery, and configuration changes delivered in the same order as messages. Each
coordinator is its own CPG member (``"nodeid:pid"``), so several nodes on one machine share one
daemon. The CPG file descriptor is read in the asyncio loop (``loop.add_reader``), and
``cpg_dispatch`` runs the callbacks, which only queue events. Whether this node is in the quorate
partition comes from ``votequorum_getinfo`` at every configuration change (and every second).

Two CPG members, one per engine (docs/NATIVE.md, "Step 2, first part"): given the native core's
cffi module (``native``: the caller asks dataplane/native.py's ``cpg_module``, which follows
``CHORUS_IMPL``; the bus imports nothing of the data plane above it) the member is ``native/bus_cpg.c``, whose C callbacks
append every frame and configuration change of one ``cpg_dispatch`` to one buffer, read here in
one pass in Corosync's order (:func:`batch_records`), and whose sends are ``cpg_mcast_joined`` in C;
with ``CHORUS_IMPL=python`` it is libcpg through cffi's ABI mode with a Python callback per frame.
Joining, quorum, reassembly of fragments, the views and the errors are this class's for both.

Corosync checks IPC permissions: root always connects; another user needs
``uidgid { uid: USER gid: GROUP }`` in corosync.conf.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from typing import Any, AsyncIterator, Iterator, Optional

from cffi import FFI  # type: ignore[import-untyped]

from chorus.bus import Bus, BusError, Delivery, Event, View
from chorus.bus.fragment import DEFAULT_FRAME_LIMIT, FragmentError, Reassembler, SpoolError, fragments, whole_frame
from chorus.bus.fragment import HEADER as FRAME_HEADER

log = logging.getLogger("chorus.bus.corosync")

_CDEF = """
typedef uint64_t cpg_handle_t;
typedef int cs_error_t;
typedef int cs_dispatch_flags_t;
typedef int cpg_model_t;
typedef int cpg_guarantee_t;
struct cpg_address { uint32_t nodeid; uint32_t pid; uint32_t reason; };
struct cpg_name { uint32_t length; char value[128]; };
struct cpg_ring_id { uint32_t nodeid; uint64_t seq; };
typedef void (*cpg_deliver_fn_t)(cpg_handle_t handle, const struct cpg_name *group_name,
    uint32_t nodeid, uint32_t pid, void *msg, size_t msg_len);
typedef void (*cpg_confchg_fn_t)(cpg_handle_t handle, const struct cpg_name *group_name,
    const struct cpg_address *member_list, size_t member_list_entries,
    const struct cpg_address *left_list, size_t left_list_entries,
    const struct cpg_address *joined_list, size_t joined_list_entries);
typedef void (*cpg_totem_confchg_fn_t)(cpg_handle_t handle, struct cpg_ring_id ring_id,
    uint32_t member_list_entries, const uint32_t *member_list);
typedef struct {
    cpg_model_t model;
    cpg_deliver_fn_t cpg_deliver_fn;
    cpg_confchg_fn_t cpg_confchg_fn;
    cpg_totem_confchg_fn_t cpg_totem_confchg_fn;
    unsigned int flags;
} cpg_model_v1_data_t;
struct iovec { void *iov_base; size_t iov_len; };
cs_error_t cpg_model_initialize(cpg_handle_t *handle, cpg_model_t model, void *model_data, void *context);
cs_error_t cpg_finalize(cpg_handle_t handle);
cs_error_t cpg_fd_get(cpg_handle_t handle, int *fd);
cs_error_t cpg_dispatch(cpg_handle_t handle, cs_dispatch_flags_t dispatch_types);
cs_error_t cpg_join(cpg_handle_t handle, const struct cpg_name *group);
cs_error_t cpg_leave(cpg_handle_t handle, const struct cpg_name *group);
cs_error_t cpg_mcast_joined(cpg_handle_t handle, cpg_guarantee_t guarantee, const struct iovec *iovec, unsigned int iov_len);
cs_error_t cpg_local_get(cpg_handle_t handle, unsigned int *local_nodeid);
cs_error_t cpg_max_atomic_msgsize_get(cpg_handle_t handle, uint32_t *size);

typedef uint64_t votequorum_handle_t;
struct votequorum_info {
    unsigned int node_id; unsigned int node_state; unsigned int node_votes;
    unsigned int node_expected_votes; unsigned int highest_expected; unsigned int total_votes;
    unsigned int quorum; unsigned int flags; unsigned int qdevice_votes; char qdevice_name[255];
};
typedef struct { void *q; void *e; void *n; } votequorum_callbacks_t;
cs_error_t votequorum_initialize(votequorum_handle_t *handle, votequorum_callbacks_t *callbacks);
cs_error_t votequorum_finalize(votequorum_handle_t handle);
cs_error_t votequorum_getinfo(votequorum_handle_t handle, unsigned int nodeid, struct votequorum_info *info);

typedef uint64_t cmap_handle_t;
cs_error_t cmap_initialize(cmap_handle_t *handle);
cs_error_t cmap_finalize(cmap_handle_t handle);
cs_error_t cmap_get_uint32(cmap_handle_t handle, const char *key_name, uint32_t *u32);
cs_error_t cmap_get_string(cmap_handle_t handle, const char *key_name, char **str);
void free(void *ptr);
"""

CS_OK = 1
CS_ERR_TRY_AGAIN = 6
CS_DISPATCH_ALL = 2
CPG_MODEL_V1 = 1
CPG_TYPE_AGREED = 2
VOTEQUORUM_INFO_QUORATE = 2
VOTEQUORUM_INFO_AUTO_TIE_BREAKER = 16

_ffi = FFI()
_ffi.cdef(_CDEF)
_libs: dict[str, Any] = {}


def _lib(name: str) -> Any:
    if name not in _libs:
        try:
            _libs[name] = _ffi.dlopen(name)
        except OSError as e:
            raise BusError(f"cannot load {name} (install Debian's libcpg-dev/libvotequorum-dev): {e}") from e
    return _libs[name]


def _member(nodeid: int, pid: int) -> str:
    return f"{nodeid}:{pid}"


def _tie_breaker() -> str:
    """The node id whose half wins an even split, from Corosync's configuration (cmap).

    ``auto_tie_breaker_node: lowest`` (the default) and ``highest`` name the lowest or highest
    *configured* node id; a list names its first node. A fixed node, not whoever happens to be
    present, so that two halves can never both count as a quorum. "" if it cannot be read.
    """
    try:
        cmap = _lib("libcmap.so.4")
    except BusError as e:
        log.warning("cannot read the tie breaker, even splits stay unbroken: %s", e)
        return ""
    handle = _ffi.new("cmap_handle_t *")
    if cmap.cmap_initialize(handle) != CS_OK:
        log.warning("cmap_initialize failed: even splits stay unbroken")
        return ""
    try:
        ids: list[int] = []
        value = _ffi.new("uint32_t *")
        while cmap.cmap_get_uint32(handle[0], f"nodelist.node.{len(ids)}.nodeid".encode(), value) == CS_OK:
            ids.append(int(value[0]))
        rule = "lowest"
        text = _ffi.new("char **")
        if cmap.cmap_get_string(handle[0], b"quorum.auto_tie_breaker_node", text) == CS_OK:
            rule = _ffi.string(text[0]).decode(errors="replace").strip() or rule
            _lib_c().free(text[0])
    finally:
        cmap.cmap_finalize(handle[0])
    if rule == "lowest":
        return str(min(ids)) if ids else ""
    if rule == "highest":
        return str(max(ids)) if ids else ""
    first = rule.split()[0]
    return first if first.isdigit() else ""


def _lib_c() -> Any:
    if "c" not in _libs:
        _libs["c"] = _ffi.dlopen(None)
    return _libs["c"]


# ch_cpg_dispatch's "a callback could not keep its record" (native/ch_cpg.h)
_NATIVE_ENOMEM = -3
_D, _V = ord("D"), ord("V")
_REC = struct.Struct("=BIII")  # a batch record's head: kind and three u32 (native/ch_cpg.h)
_PAIR = struct.Struct("=II")


class BatchError(ValueError):
    """A batch buffer that does not parse (a bug of bus_cpg.c, never of the peers)."""


Change = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # members, left, joined


def _pairs(buf: Any, off: int, n: int) -> tuple[str, ...]:
    return tuple(f"{nodeid}:{pid}" for nodeid, pid in _PAIR.iter_unpack(buf[off:off + n * _PAIR.size]))


def batch_records(buf: Any) -> Iterator[tuple[str, Any]]:
    """The records of one dispatch's batch (native/ch_cpg.h), in Corosync's delivery order:
    ``(sender, frame)`` for a delivered frame (``frame`` a slice of ``buf``: bytes when ``buf``
    is a cffi buffer or bytes) and ``("", (members, left, joined))`` for a configuration change."""
    off, end = 0, len(buf)
    while off < end:
        if end - off < _REC.size:
            raise BatchError(f"batch record head cut at {off} of {end}")
        kind, a, b, c = _REC.unpack_from(buf, off)
        off += _REC.size
        if kind == _D:
            if end - off < c:
                raise BatchError(f"frame of {c} bytes cut at {off} of {end}")
            yield f"{a}:{b}", buf[off:off + c]
            off += c
        elif kind == _V:
            n = (a + b + c) * _PAIR.size
            if end - off < n:
                raise BatchError(f"configuration change cut at {off} of {end}")
            change: Change = (_pairs(buf, off, a), _pairs(buf, off + a * _PAIR.size, b),
                              _pairs(buf, off + (a + b) * _PAIR.size, c))
            yield "", change
            off += n
        else:
            raise BatchError(f"unknown batch record {kind} at {off - _REC.size}")


class _Member:
    """One CPG member's calls; each returns Corosync's cs_error_t, and ``value`` holds what the
    last of local_get, max_msgsize and fd_get read."""

    impl = ""
    value = 0

    def initialize(self) -> int: raise NotImplementedError
    def local_get(self) -> int: raise NotImplementedError
    def max_msgsize(self) -> int: raise NotImplementedError
    def fd_get(self) -> int: raise NotImplementedError
    def join(self) -> int: raise NotImplementedError
    def dispatch(self) -> int: raise NotImplementedError
    def send(self, frame: bytes) -> int: raise NotImplementedError
    def send_whole(self, payload: bytes, seq: int) -> int: raise NotImplementedError
    def leave(self) -> int: raise NotImplementedError
    def finalize(self) -> None: raise NotImplementedError


class _AbiMember(_Member):
    """libcpg through cffi's ABI mode; its callbacks are Python functions, one call per frame
    (the Python engine's bus)."""

    impl = "python"

    def __init__(self, bus: "CorosyncBus") -> None:
        self._bus = bus
        self._cpg = _lib("libcpg.so.4")
        self._handle = _ffi.new("cpg_handle_t *")
        self._name = _ffi.new("struct cpg_name *")
        raw = bus.group.encode()
        self._name.length = len(raw)
        _ffi.memmove(self._name.value, raw, len(raw))
        self._out = _ffi.new("unsigned int *")
        # keep the callbacks alive as long as the handle
        self._cb_deliver = _ffi.callback("cpg_deliver_fn_t", self._on_deliver)
        self._cb_confchg = _ffi.callback("cpg_confchg_fn_t", self._on_confchg)
        self._model = _ffi.new("cpg_model_v1_data_t *")
        self._model.model = CPG_MODEL_V1
        self._model.cpg_deliver_fn = self._cb_deliver
        self._model.cpg_confchg_fn = self._cb_confchg
        self._model.cpg_totem_confchg_fn = _ffi.NULL
        self._model.flags = 0
        self._iov = _ffi.new("struct iovec *")

    def _read(self, rc: int) -> int:
        self.value = int(self._out[0])
        return int(rc)

    def initialize(self) -> int:
        return int(self._cpg.cpg_model_initialize(self._handle, CPG_MODEL_V1, self._model, _ffi.NULL))

    def local_get(self) -> int:
        return self._read(self._cpg.cpg_local_get(self._handle[0], self._out))

    def max_msgsize(self) -> int:
        return self._read(self._cpg.cpg_max_atomic_msgsize_get(self._handle[0], _ffi.cast("uint32_t *", self._out)))

    def fd_get(self) -> int:
        return self._read(self._cpg.cpg_fd_get(self._handle[0], _ffi.cast("int *", self._out)))

    def join(self) -> int:
        return int(self._cpg.cpg_join(self._handle[0], self._name))

    def dispatch(self) -> int:
        return int(self._cpg.cpg_dispatch(self._handle[0], CS_DISPATCH_ALL))

    def send(self, frame: bytes) -> int:
        iov = self._iov
        iov.iov_base = _ffi.from_buffer(frame)
        iov.iov_len = len(frame)
        return int(self._cpg.cpg_mcast_joined(self._handle[0], CPG_TYPE_AGREED, iov, 1))

    def send_whole(self, payload: bytes, seq: int) -> int:
        return self.send(whole_frame(payload, seq))

    def leave(self) -> int:
        return int(self._cpg.cpg_leave(self._handle[0], self._name))

    def finalize(self) -> None:
        if self._handle[0]:
            self._cpg.cpg_finalize(self._handle[0])
            self._handle[0] = 0

    def _on_deliver(self, handle: Any, group: Any, nodeid: int, pid: int, msg: Any, msg_len: int) -> None:
        self._bus._frame(_member(nodeid, pid), bytes(_ffi.buffer(msg, msg_len)))

    def _on_confchg(self, handle: Any, group: Any, members: Any, nmembers: int, left: Any, nleft: int,
                    joined: Any, njoined: int) -> None:
        self._bus._confchg(tuple(_member(members[i].nodeid, members[i].pid) for i in range(nmembers)),
                           tuple(_member(left[i].nodeid, left[i].pid) for i in range(nleft)),
                           tuple(_member(joined[i].nodeid, joined[i].pid) for i in range(njoined)))


class _NativeMember(_Member):
    """bus_cpg.c's member (native/ch_cpg.h), bound through the native core's cffi module (API mode):
    one C call per wake-up runs ``cpg_dispatch``, whose C callbacks gather the frames and
    configuration changes in one buffer, read here in one pass in their order."""

    impl = "c"

    def __init__(self, bus: "CorosyncBus", mod: Any) -> None:
        self._ffi, self._lib = mod.ffi, mod.lib
        self._bus = bus
        raw = bus.group.encode()
        c = self._lib.ch_cpg_new(raw, len(raw))
        if c == self._ffi.NULL:
            raise MemoryError("cannot make the CPG member")
        self._c = self._ffi.gc(c, self._lib.ch_cpg_free)
        self._out = self._ffi.new("uint32_t *")
        self._fd = self._ffi.new("int *")
        self._len = self._ffi.new("size_t *")

    def _read(self, rc: int) -> int:
        self.value = int(self._out[0])
        return int(rc)

    def initialize(self) -> int:
        return int(self._lib.ch_cpg_initialize(self._c))

    def local_get(self) -> int:
        return self._read(self._lib.ch_cpg_local_get(self._c, self._out))

    def max_msgsize(self) -> int:
        return self._read(self._lib.ch_cpg_max_msgsize(self._c, self._out))

    def fd_get(self) -> int:
        rc = int(self._lib.ch_cpg_fd(self._c, self._fd))
        self.value = int(self._fd[0])
        return rc

    def join(self) -> int:
        return int(self._lib.ch_cpg_join(self._c))

    def dispatch(self) -> int:
        rc = int(self._lib.ch_cpg_dispatch(self._c))
        self.take()
        return rc

    def take(self) -> None:
        """Hand the batch gathered so far to the bus, record by record in its order, and clear it."""
        lib = self._lib
        p = lib.ch_cpg_batch(self._c, self._len)
        n = self._len[0]
        if n:
            bus = self._bus
            try:
                for sender, frame in batch_records(self._ffi.buffer(p, n)):
                    if sender:
                        bus._frame(sender, frame)
                    else:
                        bus._confchg(*frame)
            except BatchError as e:  # what follows the broken record is lost: this member cannot follow
                bus._fail(f"cpg_dispatch: {e}")
            finally:
                lib.ch_cpg_batch_clear(self._c)

    def _bytes(self, data: bytes) -> Any:
        """``data`` as the ``const char *`` the C call takes, not copied (bytes pass as they are)."""
        return data if type(data) is bytes else self._ffi.from_buffer(data)

    def send(self, frame: bytes) -> int:
        return int(self._lib.ch_cpg_send(self._c, self._bytes(frame), len(frame)))

    def send_whole(self, payload: bytes, seq: int) -> int:
        return int(self._lib.ch_cpg_send_whole(self._c, seq & 0xFFFFFFFF, self._bytes(payload), len(payload)))

    def leave(self) -> int:
        return int(self._lib.ch_cpg_leave(self._c))

    def finalize(self) -> None:
        self._lib.ch_cpg_finalize(self._c)


class CorosyncBus(Bus):
    """One CPG member in group ``group``."""

    def __init__(self, group: str, frame_limit: int = DEFAULT_FRAME_LIMIT, join_timeout: float = 30.0,
                 send_timeout: float = 30.0, native: Optional[Any] = None) -> None:
        if not group or len(group.encode()) > 127:
            raise ValueError("CPG group name must have 1 to 127 bytes")
        self.group = group
        self.frame_limit = frame_limit
        self.join_timeout = join_timeout
        self.send_timeout = send_timeout
        # the CPG member: libcpg through cffi's ABI mode with Python callbacks, or bus_cpg.c's
        # member whose C callbacks gather a whole dispatch in one buffer (CHORUS_IMPL=c)
        self._cpg: _Member = _NativeMember(self, native) if native is not None else _AbiMember(self)
        self.impl = self._cpg.impl
        self._vq: Optional[Any] = None
        self._vq_handle = _ffi.new("votequorum_handle_t *")
        # events arrive in cpg_dispatch's callbacks; the consumer takes them all at once
        self._pending: list[Event] = []
        self._failure: Optional[BusError] = None
        self._wake: Optional[asyncio.Future[None]] = None  # batches() waits on it for events
        self._reassembler = Reassembler()
        self._send_lock = asyncio.Lock()
        self._seq = 0
        self._nodeid = 0
        self._local = ""
        self._fd = -1
        self._joined = False
        self._view_id = 0
        self._members: tuple[str, ...] = ()
        self._quorate = False
        self._quorum = 1
        self._expected = 0
        self._tie_breaker: Optional[str] = None  # read from cmap once auto_tie_breaker is seen
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._quorum_task: Optional[asyncio.Task[None]] = None

    @property
    def local_id(self) -> str:
        return self._local

    # ---- joining ------------------------------------------------------------------------

    async def _retry(self, what: str, call: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            rc = call()
            if rc == CS_OK:
                return
            if rc != CS_ERR_TRY_AGAIN or time.monotonic() > deadline:
                raise BusError(f"{what} failed with corosync error {rc}"
                               + (" (is corosync running, and may this user use it?)" if what == "cpg_initialize" else ""))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def join(self) -> None:
        self._loop = asyncio.get_running_loop()
        cpg = self._cpg
        await self._retry("cpg_initialize", cpg.initialize, self.join_timeout)
        await self._retry("cpg_local_get", cpg.local_get, self.join_timeout)
        self._nodeid = cpg.value
        self._local = _member(self._nodeid, os.getpid())
        if cpg.max_msgsize() == CS_OK and cpg.value > 1024:
            self.frame_limit = min(self.frame_limit, cpg.value)
        self._init_quorum()
        await self._retry("cpg_fd_get", cpg.fd_get, self.join_timeout)
        self._fd = cpg.value
        self._loop.add_reader(self._fd, self._dispatch)
        await self._retry("cpg_join", cpg.join, self.join_timeout)
        self._joined = True
        self._quorum_task = asyncio.create_task(self._watch_quorum())

    def _init_quorum(self) -> None:
        try:
            self._vq = _lib("libvotequorum.so.8")
        except BusError as e:
            log.warning("votequorum unavailable (%s); treating this partition as quorate", e)
            self._vq = None
            return
        cbs = _ffi.new("votequorum_callbacks_t *")
        rc = self._vq.votequorum_initialize(self._vq_handle, cbs)
        if rc != CS_OK:
            log.warning("votequorum_initialize failed (%d); treating this partition as quorate", rc)
            self._vq = None

    def _read_quorate(self) -> bool:
        """Whether this partition is quorate; also refreshes ``_quorum`` (votes needed)."""
        if self._vq is None:
            return True
        info = _ffi.new("struct votequorum_info *")
        rc = self._vq.votequorum_getinfo(self._vq_handle[0], self._nodeid, info)
        if rc != CS_OK:
            return False
        self._quorum = max(1, int(info.quorum))
        self._expected = int(info.node_expected_votes)
        if info.flags & VOTEQUORUM_INFO_AUTO_TIE_BREAKER and self._tie_breaker is None:
            self._tie_breaker = _tie_breaker()
        return bool(info.flags & VOTEQUORUM_INFO_QUORATE)

    def _view(self, members: tuple[str, ...], joined: tuple[str, ...], left: tuple[str, ...]) -> View:
        self._view_id += 1
        return View(self._view_id, members, joined, left, self._local, self._quorate, self._quorum,
                    self._expected, self._tie_breaker or "")

    async def _watch_quorum(self) -> None:
        """Quorum can change without a CPG configuration change of our group: re-check."""
        while self._joined:
            await asyncio.sleep(1.0)
            before = self._quorum
            q = self._read_quorate()
            if (q != self._quorate or before != self._quorum) and self._members:
                self._quorate = q
                self._push(self._view(self._members, (), ()))

    # ---- callbacks (run inside cpg_dispatch) --------------------------------------------

    def _dispatch(self) -> None:
        rc = self._cpg.dispatch()
        if rc == _NATIVE_ENOMEM:
            self._fail("cpg_dispatch: no memory to keep what Corosync delivered")
        elif rc not in (CS_OK, CS_ERR_TRY_AGAIN):
            self._fail(f"cpg_dispatch failed with corosync error {rc} (daemon gone?)")

    def _push(self, ev: Event) -> None:
        self._pending.append(ev)
        self._wakeup()

    def _wakeup(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, why: str) -> None:
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._fd = -1
        if self._failure is None:
            self._failure = BusError(why)
        self._wakeup()

    def _frame(self, sender: str, frame: bytes) -> None:
        """One delivered frame of ``sender``, in delivery order."""
        try:
            whole = self._reassembler.feed(sender, frame)
        except FragmentError as e:
            log.warning("dropping malformed frame: %s", e)
            return
        except SpoolError as e:  # a message this member cannot keep: it cannot follow the group
            self._fail(f"cannot keep a large bus message in the spool directory: {e}")
            return
        if whole is not None:
            self._push(Delivery(sender, whole))

    def _confchg(self, m: tuple[str, ...], lf: tuple[str, ...], jn: tuple[str, ...]) -> None:
        """A configuration change of the group, in delivery order: members, left, joined."""
        for s in lf:
            self._reassembler.drop(s)
        self._members = m
        self._quorate = self._read_quorate()
        self._push(self._view(m, jn, lf))
        if self._local and self._local in lf:
            self._fail("this member was removed from the CPG group")

    # ---- sending ------------------------------------------------------------------------

    async def send(self, payload: bytes) -> None:
        if not self._joined:
            raise BusError("not joined to the CPG group")
        async with self._send_lock:
            self._seq += 1
            for frame in fragments(payload, self._seq, self.frame_limit):
                await self._retry("cpg_mcast_joined", lambda: self._cpg.send(frame), self.send_timeout)

    def send_nowait(self, payload: bytes) -> bool:
        if not self._joined or self._send_lock.locked():
            return False
        if len(payload) + FRAME_HEADER.size > self.frame_limit:
            return False  # a fragmented message goes whole through send(), in order
        seq = self._seq + 1
        if self._cpg.send_whole(payload, seq) != CS_OK:
            return False  # "try again" (or a failure send() will report): nothing was sent
        self._seq = seq
        return True

    async def events(self) -> AsyncIterator[Event]:
        async for batch in self.batches():
            for ev in batch:
                yield ev

    async def batches(self) -> AsyncIterator[list[Event]]:
        while True:
            if not self._pending:
                if self._failure is not None:
                    raise self._failure
                # a future of the loop kept at join: asyncio.Event.wait would look the loop up
                # (a getpid() system call in Python 3.11) once per batch
                assert self._loop is not None
                self._wake = self._loop.create_future()
                await self._wake
                continue
            batch, self._pending = self._pending, []
            yield batch

    async def leave(self) -> None:
        if self._quorum_task is not None:
            self._quorum_task.cancel()
            self._quorum_task = None
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._fd = -1
        if self._joined:
            self._joined = False
            self._cpg.leave()
        self._cpg.finalize()
        if self._vq is not None:
            self._vq.votequorum_finalize(self._vq_handle[0])
            self._vq = None
