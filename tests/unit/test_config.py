from __future__ import annotations

import os
from pathlib import Path

import pytest

from chorus.config import ChorusConfigError, NodeConfig, load_config, write_config


def cfg() -> NodeConfig:
    return NodeConfig("n1", "host=/x port=1", "/r/c.sock", "/r/a.sock", "/d/state.json", "/d",
                      "grp \"q\"", 3, "debug")


def test_round_trip_and_mode(tmp_path: Path) -> None:
    p = str(tmp_path / "c.toml")
    write_config(cfg(), p)
    assert load_config(p) == cfg()
    assert os.stat(p).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text, message", [
    ("[node]\nname='a'\n", "missing node.data_dir"),
    ("[nodes]\n", "unknown section"),
    ("[node]\nbogus=1\n", "unknown key node.bogus"),
    ("[apply]\nworkers='x'\n", "apply.workers must be a int"),
    ("not toml = = =", "Expected|Invalid"),
])
def test_errors_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ChorusConfigError, match=message):
        load_config(str(p))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ChorusConfigError, match="no such configuration file"):
        load_config(str(tmp_path / "none.toml"))
