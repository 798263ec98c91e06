"""Partial recovery (seed 8.1, 9.3; changelog-ruv-anchor-csn): a node that missed writesets
streams them from a member's writeset log over a direct TLS connection, not through the bus.

The partner keeps no session state. Each request names a range, ``(after, upto]``; the partner
anchors a reader on its log after ``after``, streams every record up to a *safe stop* (the
lowest of ``upto`` and the GID it has committed itself, so it never serves a writeset whose
schema-change outcome it does not know yet), ends with that stop and closes. The joiner asks
again from where it got to (the reload) until it reaches ``upto``.

Both ends prove they hold the cluster's keys: TLS with the cluster certificate on both sides
(each verifies the other against it), then an HMAC-SHA256 challenge over fresh nonces with the
cluster secret, so a peer that has only one of the two cannot take part.

The wire format (the hello exchange, then record, end and error frames) is recoveryproto.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Sequence

from chorus.bus import proto as bp
from chorus import recoveryproto as proto
from chorus.catchupplan import Progress as Progress, choose_partners as choose_partners
from chorus.recoveryproto import RangeUnavailable as RangeUnavailable, RecoveryError as RecoveryError
from chorus.spool import Spool
from chorus.wslog import LogRangeUnavailable, LogRecord, WritesetLog

log = logging.getLogger("chorus.recovery")

CHUNK_BYTES = 1 << 20


# ---- keys -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterKeys:
    cert: str
    key: str
    secret_file: str

    def secret(self) -> bytes:
        return read_secret(self.secret_file)


def read_secret(path: str) -> bytes:
    """A shared secret (the cluster's, or a link's) from its file: at least 32 bytes."""
    with open(path, "rb") as f:
        data = f.read().strip()
    if len(data) < 32:
        raise RecoveryError(f"secret {path} is too short (at least 32 bytes)")
    return data


def generate_keys(directory: str) -> ClusterKeys:
    """A cluster's recovery keys: a self-signed certificate every node presents and trusts, its
    private key, and a random secret. Files 0600 in a 0700 directory; existing keys are kept."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    keys = ClusterKeys(os.path.join(directory, "cluster.crt"), os.path.join(directory, "cluster.key"),
                       os.path.join(directory, "cluster.secret"))
    if not os.path.exists(keys.cert) or not os.path.exists(keys.key):
        old = os.umask(0o077)
        try:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-days", "3650", "-subj", "/CN=chorus-cluster", "-keyout", keys.key,
                            "-out", keys.cert], check=True, capture_output=True, timeout=60)
        finally:
            os.umask(old)
    if not os.path.exists(keys.secret_file):
        fd = os.open(keys.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    for path in (keys.cert, keys.key, keys.secret_file):
        os.chmod(path, 0o600)
    return keys


def _context(keys: ClusterKeys, server: bool) -> ssl.SSLContext:
    return tls_context(keys.cert, keys.key, keys.cert, server)


def tls_context(cert: str, key: str, trust: str, server: bool) -> ssl.SSLContext:
    """TLS that presents ``cert`` and accepts only a peer presenting a certificate ``trust``
    verifies (the cluster's own, for recovery; the peer site's, for a link), on both sides.
    Peers are identified by that certificate, not by host name."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(trust)
    ctx.verify_mode = ssl.CERT_REQUIRED
    if not server:
        ctx.check_hostname = False
    return ctx


# ---- the partner ------------------------------------------------------------------------


class RecoveryServer:
    """Serves ranges of this node's writeset log to authenticated joiners."""

    def __init__(self, wslog: WritesetLog, keys: ClusterKeys, cluster_uuid: Callable[[], str],
                 committed: Callable[[], int]) -> None:
        self.log = wslog
        self.keys = keys
        self.cluster_uuid = cluster_uuid
        self.committed = committed
        self.server: Optional[asyncio.base_events.Server] = None
        self.served_records = 0
        self.served_bytes = 0
        self.active = 0

    async def start(self, listen: str) -> None:
        host, port = split_address(listen)
        self.server = await asyncio.start_server(self._serve, host, port, ssl=_context(self.keys, True),
                                                 ssl_handshake_timeout=proto.HANDSHAKE_TIMEOUT_S)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self.active += 1
        try:
            await self._answer(reader, writer)
        except (RecoveryError, ConnectionError, asyncio.TimeoutError, ssl.SSLError) as e:
            log.warning("recovery stream to %s ended: %s", peer, e)
        finally:
            self.active -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        secret = self.keys.secret()
        cluster = self.cluster_uuid()
        hello = await proto.read_hello(reader)
        protocol = hello.get("protocol")
        if protocol not in proto.PROTOCOLS:
            raise RecoveryError(f"unsupported recovery protocol {protocol!r}")
        nonce_c = str(hello.get("nonce", ""))
        if hello.get("cluster") != cluster or len(nonce_c) < 32:
            writer.write(proto.hello({"error": f"this node serves cluster {cluster}"}))
            raise RecoveryError(f"joiner {hello.get('node')!r} asked for cluster {hello.get('cluster')!r}")
        nonce_s = secrets.token_hex(16)
        writer.write(proto.hello({"nonce": nonce_s, "proof": proto.proof(secret, b"partner", cluster, nonce_c, nonce_s)}))
        req = await proto.read_hello(reader)
        if not hmac.compare_digest(str(req.get("proof", "")), proto.proof(secret, b"joiner", cluster, nonce_s, nonce_c)):
            raise RecoveryError(f"joiner {hello.get('node')!r} failed authentication")
        after, upto = req.get("after"), req.get("upto")
        if not isinstance(after, int) or not isinstance(upto, int) or not 0 <= after <= upto:
            raise RecoveryError(f"bad range request {req!r}")
        stop = min(upto, self.committed())  # the safe stop: only what this node committed
        try:
            rd = self.log.reader(after)
        except LogRangeUnavailable as e:
            writer.write(proto.encode_error(f"{proto.RANGE_UNAVAILABLE} {e}"))
            await writer.drain()
            return
        try:
            while recs := rd.read(stop, CHUNK_BYTES):
                for r in recs:
                    # a record logged in pieces is read from the log a part at a time, as sent
                    for frame in proto.encode_record_frames(r, int(protocol), hello.get("commit_times") is True):
                        writer.write(frame)
                        await writer.drain()
                    self.served_records += 1
                    self.served_bytes += len(r.payload)
        except LogRangeUnavailable as e:  # the writer reused a segment under us (even inside a record)
            writer.write(proto.encode_error(f"{proto.RANGE_UNAVAILABLE} {e}"))
            await writer.drain()
            return
        finally:
            rd.close()
        writer.write(proto.encode_end(stop))
        await writer.drain()
        log.info("served GIDs %d..%d to %s", after + 1, stop, hello.get("node"))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as host and port."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RecoveryError(f"bad address {address!r} (want host:port)")
    return host.strip("[]"), int(port)


# ---- the joiner -------------------------------------------------------------------------

# A partner streams what its log holds and ends: it never waits for more. One that sends nothing
# for this long in the middle of a stream (frozen, or cut off with the connection left open) is
# given up; the catch-up round asks the members again.
FRAME_TIMEOUT_S = 30.0


async def fetch(address: str, keys: ClusterKeys, cluster: str, node: str, after: int, upto: int,
                on_record: Callable[[LogRecord], Awaitable[None]], spool: Optional[Spool] = None) -> int:
    """One request: stream ``(after, upto]`` from the partner at ``address``, handing each record
    to ``on_record`` in order (a large one, with a ``spool``, as a spooled payload). Returns the
    safe stop the partner reached (``<= upto``)."""
    host, port = split_address(address)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=_context(keys, False), limit=1 << 20), proto.HANDSHAKE_TIMEOUT_S)
    except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
        raise RecoveryError(f"cannot connect to {address}: {e}") from e
    parts = proto.PartAssembler(spool)
    try:
        secret = keys.secret()
        nonce_c = secrets.token_hex(16)
        writer.write(proto.hello({"protocol": proto.PROTOCOL, "cluster": cluster, "node": node, "nonce": nonce_c,
                                  "commit_times": True}))
        hello = await proto.read_hello(reader)
        if "error" in hello:
            raise RecoveryError(f"partner refused: {hello['error']}")
        nonce_s = str(hello.get("nonce", ""))
        if len(nonce_s) < 32 or not hmac.compare_digest(
                str(hello.get("proof", "")), proto.proof(secret, b"partner", cluster, nonce_c, nonce_s)):
            raise RecoveryError(f"partner {address} failed authentication")
        writer.write(proto.hello({"proof": proto.proof(secret, b"joiner", cluster, nonce_s, nonce_c),
                            "after": after, "upto": upto}))
        last = after
        while True:
            try:
                kind, body = await asyncio.wait_for(proto.read_frame(reader), FRAME_TIMEOUT_S)
            except asyncio.TimeoutError as e:
                raise RecoveryError(f"partner {address} sent nothing for {FRAME_TIMEOUT_S:.0f} s after GID {last}") from e
            if parts.open and kind not in (proto.FrameKind.PART, proto.FrameKind.ERROR):
                raise RecoveryError(f"partner sent a {kind.name} frame inside a record sent in parts")
            if kind in (proto.FrameKind.RECORD, proto.FrameKind.PART):
                whole = parts.add(body) if kind == proto.FrameKind.PART else proto.decode_record(body)
                if whole is None:
                    continue
                r = whole
                if r.gid <= last or r.gid > upto:
                    raise RecoveryError(f"partner sent GID {r.gid} out of order (after {last}, up to {upto})")
                last = r.gid
                await on_record(r)
            elif kind == proto.FrameKind.END:
                stop = proto.decode_end(body)
                if stop < last or stop > upto:
                    raise RecoveryError(f"partner ended at {stop}, outside ({last}, {upto}]")
                return stop
            else:
                raise proto.decode_error(body)
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError) as e:
        raise RecoveryError(f"stream from {address} broke: {e}") from e
    finally:
        parts.discard()
        writer.close()
