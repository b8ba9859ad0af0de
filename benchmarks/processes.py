"""Subprocesses the benchmarks start (Celery workers, the relay loop) and their memory.

Each runs in its own session; the harness stops only the processes it started, by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: What a benchmark worker prints once it consumes (``benchmarks.worker_app``).
READY = "celery-outbox-bench worker ready"
#: The repository root (on the subprocesses' ``PYTHONPATH``).
ROOT = Path(__file__).resolve().parent.parent


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate``; raise ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Child:
    """A started subprocess: its PID, its log, and a way to stop it and its children."""

    def __init__(self, argv: list[str], *, env: Mapping[str, str], ready: str | None) -> None:
        self.log = Path(tempfile.mkstemp(prefix="celery-outbox-bench-", suffix=".log")[1])
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if ready is not None:
            try:
                wait_until(
                    lambda: ready in self.log_text() or self.process.poll() is not None,
                    timeout=90,
                    what=f"{argv[2:5]} to start",
                )
            except TimeoutError:
                self.stop()
                raise
            if self.process.poll() is not None:
                raise RuntimeError(f"{argv} exited:\n{self.log_text()[-3000:]}")

    @property
    def pid(self) -> int:
        """The PID of the main process (also its process group id)."""
        return self.process.pid

    def log_text(self) -> str:
        """What it printed so far."""
        return self.log.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """Resident memory of the main process and all its descendants (``/proc``)."""
        return sum(_rss(pid) for pid in [self.pid, *_descendants(self.pid)])

    def stop(self, *, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL the process group after ``timeout``; remove the log."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # Pool children left behind share the group; until wait() below reaps the leader,
        # the group id cannot have been reused, so it is still ours.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.unlink(missing_ok=True)


def start_worker(
    *,
    pool: str,
    concurrency: int,
    env: Mapping[str, str] | None = None,
    app_module: str = "benchmarks.worker_app",
    queue: str | None = None,
    nice: int = 0,
    cpus: str | None = None,
) -> Child:
    """A Celery worker of ``app_module`` (the benchmark app) on ``queue`` (this run's
    queue by default), at CPU priority ``nice``, confined to the CPUs ``cpus`` (a
    ``taskset -c`` list) when given, once it is ready (the module prints :data:`READY`).
    """
    from benchmarks.app import QUEUE

    argv = [
        *(["taskset", "-c", cpus] if cpus else []),
        *(["nice", "-n", str(nice)] if nice else []),
        sys.executable,
        "-m",
        "celery",
        "-A",
        app_module,
        "worker",
        f"--pool={pool}",
        "-c",
        str(concurrency),
        "-Q",
        queue or QUEUE,
        "-l",
        "warning",
        "-n",
        f"bench-{os.getpid()}-{time.monotonic_ns()}@%h",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
    ]
    return Child(argv, env=env or {}, ready=READY)


def start_relay(*, poll: float, grace: float, listen: bool = True) -> Child:
    """``django-admin outbox relay`` on the benchmark settings (``--no-listen``: poll only)."""
    argv = [
        sys.executable,
        "-m",
        "django",
        "outbox",
        "relay",
        "--poll",
        str(poll),
        "--grace",
        str(grace),
        *([] if listen else ["--no-listen"]),
    ]
    return Child(argv, env={"DJANGO_SETTINGS_MODULE": "benchmarks.settings"}, ready="polling every")


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found
