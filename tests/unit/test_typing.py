"""The coordinator and the Spark jobs type-check strictly (mypy --strict, pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_mypy_strict() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "-p", "chorus", "-p", "chorus_spark"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
