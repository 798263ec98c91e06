"""What running the snapshot-diff job on a Spark cluster needs, without importing pyspark (the
``chorus`` process that calls spark-submit may not have it): the ``chorus_spark`` package as a zip
for the executors (``--py-files`` / ``addPyFile``), the entry script, the log configuration, and
whether a master is on this machine's loopback (then the driver binds and advertises 127.0.0.1)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

PACKAGE_DIR = Path(__file__).resolve().parent
# spark/log4j2.properties in the source tree; absent in an installed package (Spark's defaults then)
LOG4J = PACKAGE_DIR.parent / "log4j2.properties"

ENTRY = """import sys

from chorus_spark.job import main

raise SystemExit(main(sys.argv[1:]))
"""

LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_local(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: Spark in the driver's JVM."""
    return master == "local" or master.startswith("local[")


def is_loopback(master: str) -> bool:
    """A ``spark://`` master (possibly several, for standby masters) only on this machine."""
    if not master.startswith("spark://"):
        return False
    hosts = [urlsplit("spark://" + hp).hostname or "" for hp in master[len("spark://"):].split(",")]
    return bool(hosts) and all(h in LOOPBACK or h.startswith("127.") for h in hosts)


def log_java_options() -> str:
    """The driver's JVM options: UTC, and Spark's logging as spark/log4j2.properties says."""
    opts = "-Duser.timezone=UTC"
    if LOG4J.is_file():
        opts += f" -Dlog4j.configurationFile=file:{LOG4J}"
    return opts


def package(directory: str | os.PathLike[str]) -> str:
    """Zip the ``chorus_spark`` package (the code this process runs) into ``directory``: the
    executors import it from there whatever their Python has installed."""
    path = Path(directory) / "chorus_spark.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(PACKAGE_DIR.glob("*.py")):
            z.write(f, f"chorus_spark/{f.name}")
    return str(path)


def entry(directory: str | os.PathLike[str]) -> str:
    """The spark-submit entry script (``main(PLAN.json)``), written into ``directory``: it imports
    ``chorus_spark`` from the ``--py-files`` zip, so no source tree is needed."""
    path = Path(directory) / "chorus_diff_job.py"
    path.write_text(ENTRY)
    return str(path)
