"""The Debian packages operators install (issue 39; docs/DEPLOY.md, "1. Packages"), built from the
tree by packaging/build-debs.sh: named and versioned as the one version source says, depending on
what a Debian 12 host has for what they load, holding the extension where PostgreSQL 15 looks for
it and the coordinator with its own environment. dpkg installs them, upgrades them to a next
version and purges them in a temporary root (never into this system: CI's extension is the one
`make install` put there), and the installed /usr/bin/chorus runs from the package's environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import chorus

ROOT = Path(__file__).resolve().parents[2]
VERSION = chorus.__version__
EXTENSION, COORDINATOR = "postgresql-15-chorus", "chorus"
PGXS = Path("/usr/lib/postgresql/15/lib/pgxs/src/makefiles/pgxs.mk")
PYTHON_H = Path("/usr/include/python3.11/Python.h")
# what the coordinator loads with dlopen (chorus/bus/corosync.py), so no ELF header names it
DLOPENED = ("libcpg.so.4", "libvotequorum.so.8", "libcmap.so.4")
# a clean environment: nothing of this test's Python may reach the package's
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _why_skip() -> str:
    missing = [tool for tool in ("dpkg", "dpkg-deb", "dpkg-query", "make", "cc", "ldd", "nm")
               if shutil.which(tool) is None]
    if missing:
        return f"not a Debian build host: {', '.join(missing)} missing (scripts/setup.sh installs what is needed)"
    if not PGXS.exists():
        return f"{PGXS} missing: PostgreSQL 15's server headers (apt-get install postgresql-server-dev-15)"
    if not PYTHON_H.exists() or subprocess.run(["/usr/bin/python3", "-c", "import venv, ensurepip"]).returncode:
        return "Debian's python3 cannot build the environment (apt-get install python3-venv python3-dev)"
    return ""


pytestmark = [pytest.mark.integration, pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "-"),
              pytest.mark.timeout(900)]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dpkg installs into a root of its own only as root")


def run(*argv: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def field(deb: Path, name: str) -> str:
    return run("dpkg-deb", "--field", deb, name).strip()


def depends(deb: Path) -> dict[str, str]:
    """Depends as {package: its version constraints, joined}: 'python3 (>= 3.11~), python3 (<< 3.12)'
    gives {'python3': '>= 3.11~, << 3.12'}."""
    result: dict[str, str] = {}
    for clause in field(deb, "Depends").split(","):
        m = re.fullmatch(r"\s*([a-z0-9][a-z0-9.+-]*)\s*(?:\((.*)\))?\s*", clause)
        assert m, f"{deb.name}: a Depends clause this test does not read: {clause!r}"
        result[m[1]] = ", ".join(filter(None, [result.get(m[1], ""), (m[2] or "").strip()]))
    return result


def contents(deb: Path) -> dict[str, str]:
    """The package's paths (without './'), each with its owner and mode as dpkg-deb lists them."""
    listing = {}
    for line in run("dpkg-deb", "--contents", deb).splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        listing[path.split(" -> ")[0].removeprefix("./").rstrip("/")] = f"{owner} {mode}"
    return listing


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("debs")
    run("bash", ROOT / "packaging/build-debs.sh", out)
    arch = run("dpkg", "--print-architecture").strip()
    built = {name: out / f"{name}_{VERSION}_{arch}.deb" for name in (EXTENSION, COORDINATOR)}
    assert sorted(out.glob("*.deb")) == sorted(built.values())
    return built


class DpkgRoot:
    """A directory dpkg installs into as into a system of its own (dpkg --root): its database knows
    this host's packages the debs depend on (so dpkg checks their Depends for real), and the
    maintainer scripts run with DPKG_ROOT set, which keeps them off this system."""

    def __init__(self, path: Path, debs: dict[str, Path]) -> None:
        self.path = path
        admin = path / "var/lib/dpkg"
        (admin / "info").mkdir(parents=True)
        (admin / "updates").mkdir()
        ours = set(debs)
        needed = sorted({name for deb in debs.values() for name in depends(deb)} - ours)
        r = subprocess.run(["dpkg-query", "--status", *needed], capture_output=True, text=True)
        assert r.returncode == 0, f"this host lacks what the packages depend on: {r.stderr}"
        (admin / "status").write_text(r.stdout)
        # their (empty) file lists: dpkg warns of every package without one
        for name in run("dpkg-query", "--show", "--showformat=${binary:Package}\\n", *needed).split():
            (admin / "info" / f"{name}.list").touch()

    def dpkg(self, *args: str | Path) -> None:
        """Runs dpkg on this root; it must succeed without a warning (a dependency it had to
        ignore, a directory a package left behind ...)."""
        argv = ["dpkg", f"--root={self.path}", f"--log={self.path}/dpkg.log", "--force-script-chrootless", *map(str, args)]
        r = subprocess.run(argv, capture_output=True, text=True, env=CLEAN_ENV, timeout=300)
        assert r.returncode == 0 and "warning" not in r.stderr, f"{' '.join(argv)}: exit {r.returncode}\n{r.stderr}"

    def status(self, package: str) -> str:
        return run("dpkg-query", f"--admindir={self.path}/var/lib/dpkg", "--show",
                   "--showformat=${Status} ${Version}", package)


@pytest.fixture(scope="module")
def installed(debs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DpkgRoot]:
    if os.geteuid() != 0:
        pytest.skip("dpkg installs into a root of its own only as root")
    root = DpkgRoot(tmp_path_factory.mktemp("root"), debs)
    root.dpkg("--install", debs[EXTENSION], debs[COORDINATOR])
    yield root


def test_the_packages_are_versioned_by_the_one_source_and_depend_on_what_they_load(debs: dict[str, Path]) -> None:
    assert run(ROOT / "packaging/version.sh").strip() == VERSION
    for name, deb in debs.items():
        assert (field(deb, "Package"), field(deb, "Version")) == (name, VERSION)

    assert "postgresql-15" in depends(debs[EXTENSION])
    coordinator = depends(debs[COORDINATOR])
    # the coordinator speaks the extension's protocol: the same release, exactly
    assert coordinator[EXTENSION] == f"= {VERSION}"
    assert "corosync" in coordinator
    # the environment's compiled modules are built for this interpreter's minor version
    assert coordinator["python3"] == ">= 3.11~, << 3.12"
    for library in DLOPENED:
        owners = {line.split(":")[0] for line in run("dpkg-query", "--search", f"*/{library}").splitlines()}
        assert owners & set(coordinator), f"{library} comes with {owners}, which the package does not depend on"


def test_the_extension_package_holds_the_library_and_every_sql_script(debs: dict[str, Path]) -> None:
    files = contents(debs[EXTENSION])
    scripts = {f"usr/share/postgresql/15/extension/{p.name}" for p in (ROOT / "sql").glob("chorus--*.sql")}
    wanted = {"usr/lib/postgresql/15/lib/chorus.so", "usr/share/postgresql/15/extension/chorus.control"} | scripts
    assert wanted == {path for path, kind in files.items() if kind.split()[1].startswith("-")}
    assert {kind.split()[0] for kind in files.values()} == {"root/root"}


def test_the_coordinator_package_holds_the_cli_the_unit_and_corosyncs_uidgid_file(debs: dict[str, Path]) -> None:
    files = contents(debs[COORDINATOR])
    for path in ("usr/bin/chorus", "opt/chorus/venv/bin/chorus", "opt/chorus/venv/bin/python",
                 "lib/systemd/system/chorus@.service", "etc/corosync/uidgid.d/chorus-postgres"):
        assert path in files, path
    assert {kind.split()[0] for kind in files.values()} == {"root/root"}
    assert run("dpkg-deb", "--info", debs[COORDINATOR], "conffiles").split() == ["/etc/corosync/uidgid.d/chorus-postgres"]
    # the unit as the tree has it, running a program the package holds
    unit = (ROOT / "packaging/systemd/chorus@.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+)", unit, re.MULTILINE)
    assert exec_start and exec_start[1].lstrip("/") in files
    # nothing is started or enabled by installing it (docs/DEPLOY.md)
    for script in ("postinst", "prerm", "postrm"):
        text = run("dpkg-deb", "--info", debs[COORDINATOR], script)
        assert not re.search(r"\b(start|restart|enable|reload-or-restart)\b.*chorus@|deb-systemd-invoke start", text), script


@needs_root
def test_installed_the_cli_runs_from_the_packages_own_environment(installed: DpkgRoot, tmp_path: Path) -> None:
    for package in (EXTENSION, COORDINATOR):
        assert installed.status(package) == f"install ok installed {VERSION}"
    root = installed.path
    r = run(root / "usr/bin/chorus", "--help", env=CLEAN_ENV, cwd=tmp_path)
    assert "Chorus: synchronous multi-master replication" in r
    assert run(root / "usr/bin/chorus", "--version", env=CLEAN_ENV, cwd=tmp_path).strip() == f"chorus, version {VERSION}"
    # the compiled hot path loads, from the package's environment and not from anywhere else
    probe = ("import chorus, chorus.wire, chorus.certifier, chorus.commit.scheduler, chorus.bus.proto; "
             "print(chorus.__file__)")
    where = run(root / "opt/chorus/venv/bin/python", "-c", probe, env={**CLEAN_ENV, "CHORUS_IMPL": "c"}, cwd=tmp_path)
    assert where.startswith(f"{root}/opt/chorus/venv/lib/python3.11/site-packages/chorus/"), where

    # every library and program finds what it links against on this host
    elves = [p for p in (root / "opt", root / "usr/lib") for p in p.rglob("*")
             if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF"]
    assert len(elves) > 10
    unresolved = {str(p.relative_to(root)): line.strip() for p in elves
                  for line in subprocess.run(["ldd", str(p)], capture_output=True, text=True).stdout.splitlines()
                  if "not found" in line}
    assert not unresolved, unresolved
    # the extension is a PostgreSQL module
    symbols = run("nm", "--dynamic", "--defined-only", root / "usr/lib/postgresql/15/lib/chorus.so")
    assert {"Pg_magic_func", "_PG_init"} <= set(re.findall(r"\s(\w+)$", symbols, re.MULTILINE))


def next_version(deb: Path, out: Path) -> Path:
    """The same package as the release after this one (VERSION+next): what an upgrade installs."""
    tree = out / deb.name.split("_")[0]
    run("dpkg-deb", "--raw-extract", deb, tree)
    control = tree / "DEBIAN/control"
    control.write_text(control.read_text().replace(VERSION, f"{VERSION}+next"))
    built = out / deb.name.replace(VERSION, f"{VERSION}+next")
    run("dpkg-deb", "--root-owner-group", "-Znone", "--build", tree, built)
    return built


@needs_root
def test_dpkg_upgrades_to_the_next_version_and_purges(debs: dict[str, Path], tmp_path: Path) -> None:
    root = DpkgRoot(tmp_path / "root", debs)
    root.dpkg("--install", debs[EXTENSION], debs[COORDINATOR])
    uidgid = root.path / "etc/corosync/uidgid.d/chorus-postgres"
    assert "uid: postgres" in uidgid.read_text()
    uidgid.write_text(uidgid.read_text() + "# the operator's\n")

    following = [next_version(debs[name], tmp_path) for name in (EXTENSION, COORDINATOR)]
    root.dpkg("--force-confold", "--install", *following)
    for package in (EXTENSION, COORDINATOR):
        assert root.status(package) == f"install ok installed {VERSION}+next"
    assert uidgid.read_text().endswith("# the operator's\n"), "an upgrade replaced a changed conffile"
    assert run(root.path / "usr/bin/chorus", "--version", env=CLEAN_ENV).strip() == f"chorus, version {VERSION}"

    root.dpkg("--purge", COORDINATOR, EXTENSION)
    left = [p for p in root.path.rglob("*") if p.is_file() and "var/lib/dpkg" not in str(p) and p.name != "dpkg.log"]
    assert left == [], left
