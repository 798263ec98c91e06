"""The container entrypoint's settings and files (docker/entrypoint.py), without a container:
the environment is read strictly, and the files it writes are what Corosync, PostgreSQL and
the coordinator's configuration loader take."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from chorus.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _entrypoint() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chorus_docker_entrypoint", ROOT / "docker" / "entrypoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ep = _entrypoint()

PEERS = "1:n1:10.47.25.11,2:n2:10.47.25.12,3:n3:10.47.25.13"


def env(**extra: str) -> dict[str, str]:
    return {"CHORUS_NODE_NAME": "n2", "CHORUS_NODE_ID": "2", "CHORUS_PEERS": PEERS, **extra}


def test_settings_from_the_environment() -> None:
    s = ep.settings_from_env(env(CHORUS_BOOTSTRAP="1", CHORUS_RECOVERY_PARTNERS="n3, n1",
                                 CHORUS_COROSYNC_AUTHKEY_FILE="/k"))
    assert (s.name, s.node_id, s.bootstrap) == ("n2", 2, True)
    assert [(p.node_id, p.name, p.address) for p in s.peers] == [
        (1, "n1", "10.47.25.11"), (2, "n2", "10.47.25.12"), (3, "n3", "10.47.25.13")]
    assert s.recovery_partners == ("n3", "n1")
    assert s.authkey_file == "/k"
    assert s.tls_key_file == "/run/secrets/chorus-cluster.key"


@pytest.mark.parametrize("bad, words", [
    ({"CHORUS_NODE_NAME": ""}, "CHORUS_NODE_NAME"),
    ({"CHORUS_NODE_ID": "x"}, "whole number"),
    ({"CHORUS_NODE_ID": "17"}, "1 to 16"),
    ({"CHORUS_NODE_ID": "4"}, "no entry"),
    ({"CHORUS_NODE_NAME": "n9"}, "CHORUS_NODE_NAME says"),
    ({"CHORUS_PEERS": "1:n1:a,2:n2"}, "ID:NAME:ADDRESS"),
    ({"CHORUS_PEERS": "1:n1:a,2:n2:a"}, "appears twice"),
    ({"CHORUS_BOOTSTRAP": "maybe"}, "expected 1 or 0"),
    ({"CHORUS_RECOVERY_PARTNERS": "n7"}, "not in CHORUS_PEERS"),
    ({"CHORUS_LOG_TOTAL_MB": "64"}, "two segments"),
])
def test_a_bad_environment_is_refused_with_the_variable_named(bad: dict[str, str], words: str) -> None:
    with pytest.raises(ep.EntrypointError, match=words):
        ep.settings_from_env(env(**bad))


def test_ipv6_peers() -> None:
    s = ep.settings_from_env(env(CHORUS_PEERS="1:n1:fd00::1 2:n2:[fd00::2]"))
    assert s.me.address == "fd00::2"
    assert ep.node_config(s).recovery_advertise == "[fd00::2]:7433"


def test_corosync_conf_has_crypto_and_every_peer() -> None:
    text = ep.corosync_conf(ep.settings_from_env(env()))
    for line in ("transport: knet", "crypto_cipher: aes256", "crypto_hash: sha256",
                 "keyfile: /etc/corosync/authkey", "ring0_addr: 10.47.25.13", "uid: postgres"):
        assert line in text
    assert text.count("{") == text.count("}")
    assert text.count("nodeid:") == 3


def test_chorus_toml_loads(tmp_path: Path) -> None:
    s = ep.settings_from_env(env(CHORUS_LOG_SEGMENT_MB="16", CHORUS_LOG_TOTAL_MB="256"))
    path = tmp_path / "chorus.toml"
    ep.write_chorus_toml(s, str(path), lambda msg: None)
    cfg = load_config(str(path))
    assert cfg.name == "n2" and cfg.cluster_group == "chorus"
    assert cfg.recovery_listen == "0.0.0.0:7433" and cfg.recovery_advertise == "10.47.25.12:7433"
    assert cfg.socket_path == "/run/chorus/chorus.sock" and cfg.wslog_dir == "/var/lib/chorus/node/wslog"
    assert (cfg.log_segment_mb, cfg.log_total_mb) == (16, 256)
    assert path.stat().st_mode & 0o077 == 0


def test_metrics_section_only_where_the_configuration_takes_it(tmp_path: Path) -> None:
    s = ep.settings_from_env(env(CHORUS_METRICS_LISTEN="0.0.0.0:8008"))
    path = tmp_path / "chorus.toml"
    warnings: list[str] = []
    ep.write_chorus_toml(s, str(path), warnings.append)
    load_config(str(path))  # whatever the entrypoint left, the coordinator reads it
    text = path.read_text()
    if warnings:
        assert "[metrics]" not in text and "CHORUS_METRICS_LISTEN" in warnings[0]
    else:
        assert ep.METRICS_MARK in text and 'listen = "0.0.0.0:8008"' in text


def test_postgres_settings() -> None:
    text = ep.postgres_conf(ep.settings_from_env(env()))
    assert "shared_preload_libraries = 'chorus'" in text
    assert "chorus.node_number = 2" in text
    assert "chorus.socket_path = '/run/chorus/chorus.sock'" in text
    assert "scram-sha-256" in ep.PG_HBA and "trust" not in ep.PG_HBA
