"""A standalone Spark cluster for tests: one master and one worker, started from the pyspark
distribution (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) on
127.0.0.1 and free ports, with small memory, logs and the worker's work directory in a temporary
directory; stopped by pid (with the executors the worker started) when done."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "256m"  # the master's and the worker's own JVMs
START_TIMEOUT = 90.0


def spark_bin() -> Optional[Path]:
    """The directory of spark-class and spark-submit beside this Python (the venv's bin), if
    pyspark and java are there."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return None
    for d in (Path(sys.executable).parent, Path(sys.executable).resolve().parent):
        if (d / "spark-class").is_file() and (d / "spark-submit").is_file():
            return d
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneSpark:
    directory: Path
    bin: Path
    port: int
    webui: int
    master_proc: Optional[subprocess.Popen[bytes]] = None
    worker_proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def spark_submit(self) -> str:
        return str(self.bin / "spark-submit")

    @property
    def work_dir(self) -> Path:
        return self.directory / "work"

    def state(self) -> dict[str, Any]:
        """The master's JSON: workers, aliveworkers, activeapps, completedapps ..."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as r:
            out: dict[str, Any] = json.load(r)
            return out

    def completed_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("completedapps", []))

    def executor_logs(self) -> list[Path]:
        """The stderr files of the executors this worker ran (work/app-*/N/stderr)."""
        return sorted(self.work_dir.glob("app-*/*/stderr"))

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("master.log", "worker.log"):
            p = self.directory / name
            if p.exists():
                out.append(f"--- {p}\n" + "".join(p.read_text(errors="replace").splitlines(True)[-lines:]))
        return "\n".join(out)

    def _env(self) -> dict[str, str]:
        import pyspark

        return dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(self.directory / "logs"),
                    SPARK_PID_DIR=str(self.directory), SPARK_WORKER_DIR=str(self.work_dir),
                    SPARK_LOCAL_DIRS=str(self.directory / "local"),
                    SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_NO_DAEMONIZE="1")

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(self.directory / f"{name}.log", "ab") as log:
            # its own process group: the worker's executors (and their Python workers) stop with it
            return subprocess.Popen([str(self.bin / "spark-class"), *args], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self._env(), start_new_session=True)

    def start(self) -> None:
        for d in (self.directory / "logs", self.directory / "local", self.work_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.master_proc = self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                  "--port", str(self.port), "--webui-port", str(self.webui)])
        self.worker_proc = self._start("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                                  "--webui-port", str(free_port()), "--cores", str(WORKER_CORES),
                                                  "--memory", WORKER_MEMORY, "--work-dir", str(self.work_dir),
                                                  self.url])
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for p in (self.master_proc, self.worker_proc):
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.returncode}):\n{self.log_tail()}")
            try:
                if self.state().get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Spark worker registered in {START_TIMEOUT:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """The worker first (it stops its executors), then the master, each by its pid; then what
        is left of the process group each was started in (executors that outlived the worker),
        while the exited daemon is not yet reaped, so that group id is still ours."""
        for p in (self.worker_proc, self.master_proc):
            if p is None or p.returncode is not None:
                continue
            p.send_signal(signal.SIGTERM)
            if not _exited(p.pid, 20):
                p.kill()
                _exited(p.pid, 10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def _exited(pid: int, timeout: float) -> bool:
    """Whether child ``pid`` exited within ``timeout`` seconds; it is left unreaped."""
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def standalone_spark(directory: Path) -> Iterator[StandaloneSpark]:
    b = spark_bin()
    if b is None:
        raise RuntimeError("pyspark's spark-class or java is missing")
    s = StandaloneSpark(directory, b, free_port(), free_port())
    try:
        s.start()
        yield s
    finally:
        s.stop()
