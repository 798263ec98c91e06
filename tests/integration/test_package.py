"""The package as operators and images install it (issue 36): a wheel built by pyproject's build
backend carries the compiled hot path (the four Cython modules), every subpackage, and a CLI
that works from it, without the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import chorus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_a_wheel_built_from_the_tree_installs_a_working_cli(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # built as the Debian package builds it: from the tree's files as git knows them (no build
    # directory or in-place module left by a run), once per content (packaging/build-wheel.sh)
    r = subprocess.run(["bash", str(ROOT / "packaging/build-wheel.sh"), sys.executable],
                       capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = Path(r.stdout.strip())
    assert wheel.name.startswith(f"pgchorus-{chorus.__version__}-"), wheel
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("_cwire", "_ccert", "_csched", "_cproto"):
        assert any(n.startswith(f"chorus/{module}.") and n.endswith(".so") for n in names), module
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    in_tree = {str(p.parent.relative_to(ROOT / "coordinator")) for p in (ROOT / "coordinator/chorus").rglob("__init__.py")}
    assert in_tree <= packages, f"subpackages missing from the wheel: {sorted(in_tree - packages)}"

    # installed apart from the tree; its dependencies from this environment
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = ("import chorus, chorus.impl as impl; import chorus._cwire, chorus._ccert, chorus._csched, chorus._cproto; "
             "print(chorus.__file__)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().startswith(str(site)), r.stderr
    r = subprocess.run([sys.executable, "-m", "chorus", "--help"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=60)
    assert r.returncode == 0 and "Chorus: synchronous multi-master replication" in r.stdout, r.stderr
