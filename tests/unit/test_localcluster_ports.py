"""A local cluster refuses a port that stays taken, and waits out one that is taken for a moment
(a port in the kernel's ephemeral range can be some client connection's local end)."""
from __future__ import annotations

import socket
import threading

import pytest

from chorus.testkit.localcluster import LocalClusterError, _port_free_or_fail


def _listener() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_that_stays_taken_is_refused_with_its_name() -> None:
    with _listener() as s:
        port = s.getsockname()[1]
        with pytest.raises(LocalClusterError, match=rf"n2's recovery server: port {port} is in use"):
            _port_free_or_fail(port, "n2's recovery server", patience_s=0.5)


def test_a_port_freed_within_the_patience_is_taken() -> None:
    s = _listener()
    port = s.getsockname()[1]
    threading.Timer(0.5, s.close).start()
    _port_free_or_fail(port, "n1", patience_s=5.0)


def test_a_free_port_passes_at_once() -> None:
    with _listener() as s:
        port = s.getsockname()[1]
    _port_free_or_fail(port, "n1", patience_s=0.0)
