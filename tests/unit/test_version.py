"""One release version (packaging/version.sh): chorus.__version__ is the source; the wheel, the CLI
and the Debian packages take it from there, and the extension's default_version must be its
MAJOR.MINOR. A tree where they disagree builds no package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import chorus
from chorus.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("coordinator/chorus/__init__.py", "pyproject.toml", "extension/chorus.control")


def version_of(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(ROOT / "packaging/version.sh"), str(tree)], capture_output=True, text=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The files packaging/version.sh reads, copied as they are."""
    for name in SOURCES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "sql", tmp_path / "sql")
    return tmp_path


def test_the_tree_agrees_and_every_place_says_chorus_version() -> None:
    r = version_of(ROOT)
    assert (r.returncode, r.stdout.strip()) == (0, chorus.__version__), r.stderr
    assert CliRunner().invoke(cli, ["--version"]).output.strip() == f"chorus, version {chorus.__version__}"


def test_an_extension_version_other_than_the_releases_major_minor_fails(tree: Path) -> None:
    control = tree / "extension/chorus.control"
    control.write_text(control.read_text().replace(f"default_version = '{chorus.__version__.rsplit('.', 1)[0]}'",
                                                   "default_version = '9.9'"))
    r = version_of(tree)
    assert r.returncode == 1 and "default_version '9.9'" in r.stderr and r.stdout == ""


def test_a_version_stated_in_pyproject_fails(tree: Path) -> None:
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('name = "pgchorus"\n', 'name = "pgchorus"\nversion = "0.2.0"\n'))
    r = version_of(tree)
    assert r.returncode == 1 and "states a version of its own" in r.stderr


def test_a_missing_script_for_the_extensions_version_fails(tree: Path) -> None:
    (tree / f"sql/chorus--{chorus.__version__.rsplit('.', 1)[0]}.sql").unlink()
    r = version_of(tree)
    assert r.returncode == 1 and "is missing" in r.stderr
