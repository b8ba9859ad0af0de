"""A real Celery worker in a subprocess, so end-to-end tests can kill it.

The worker runs in its own session (process group), so :meth:`WorkerProcess.stop` and
:meth:`WorkerProcess.kill` reach its pool children too. Signals go only to that group, and only
while its leader is not yet reaped, so its PID cannot have been reused by another process.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

#: The repository root: put on the worker's ``PYTHONPATH`` so ``tests.*`` app modules import.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Celery logs this at INFO level once the consumer is consuming.
READY_LINE = re.compile(r"\] (\S+@\S+) ready\.")

Pool = Literal["solo", "prefork", "threads"]

#: Seconds a worker gets to finish a warm shutdown at teardown before its group is killed.
#: The test is over and its queue is deleted next: an idle solo worker exits well within it
#: (tests.worker_main), a prefork pool's own shutdown sleeps ~1.5 s and is cut short.
TEARDOWN_GRACE = 1.0
#: Seconds a :class:`SharedWorker` gets to finish a warm shutdown before a new one replaces
#: it: the module goes on with the same queue, so its tasks must finish, not be killed.
SWITCH_GRACE = 2.0


class WorkerStartError(RuntimeError):
    """The worker exited or did not log that it was ready in time; the message has its log."""


def wait_for(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = ""
) -> None:
    """Poll ``predicate`` until it is true; raise ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass(frozen=True, kw_only=True)
class WorkerCommand:
    """What to run: ``python -m tests.worker_main -A app_module worker`` with these options.

    :mod:`tests.worker_main` is the ``celery`` command whose idle workers stop at once on
    SIGTERM (see there).
    """

    app_module: str
    queue: str
    pool: Pool = "solo"
    concurrency: int = 1
    loglevel: str = "info"
    extra_args: tuple[str, ...] = ()
    nodename: str = field(default_factory=lambda: f"outbox-test-{os.urandom(4).hex()}@%h")

    def argv(self) -> list[str]:
        """The full command line."""
        return [
            sys.executable, "-m", "tests.worker_main", "-A", self.app_module, "worker",
            f"--pool={self.pool}", "-c", str(self.concurrency), "-Q", self.queue,
            "-n", self.nodename, "--without-heartbeat", "--without-gossip",
            "--without-mingle", "-l", self.loglevel, *self.extra_args,
        ]  # fmt: skip


class WorkerProcess:
    """A started worker: its ``pid``, its ``log_path``, and ways to stop it."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self._process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The PID of the worker's main process (also its process group id)."""
        return self._process.pid

    def log_text(self) -> str:
        """Everything the worker wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def nodename(self) -> str:
        """The worker's node name (``name@host``), as its ready line gives it."""
        found = READY_LINE.search(self.log_text())
        if found is None:
            raise WorkerStartError(f"the worker never logged that it was ready:\n{self.log_text()}")
        return found.group(1)

    def is_running(self) -> bool:
        """Whether the main process has not exited yet."""
        return self._process.returncode is None and not self._leader_exited()

    def wait_ready(self, *, timeout: float) -> None:
        """Wait until the worker logs that it is ready; raise ``WorkerStartError`` otherwise."""
        try:
            wait_for(self._ready_or_exited, timeout=timeout, what="the worker to be ready")
        except TimeoutError:
            raise WorkerStartError(f"worker not ready in {timeout}s:\n{self.log_text()}") from None
        if not READY_LINE.search(self.log_text()):
            raise WorkerStartError(f"worker exited before it was ready:\n{self.log_text()}")

    def stop(self, *, timeout: float = 15.0) -> int:
        """SIGTERM the worker (warm shutdown); SIGKILL its group after ``timeout`` seconds.

        The SIGKILL also reaches pool children the main process left behind.

        Returns
        -------
        int
            The main process's exit status (negative: the signal that ended it).
        """
        self.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            wait_for(self._leader_exited, timeout=timeout, what="the worker to exit")
        return self.kill()

    def kill(self) -> int:
        """SIGKILL the worker and its children at once, as a crash would; wait for the exit."""
        self._signal_group(signal.SIGKILL)
        status = self._process.wait(timeout=30)
        wait_for(lambda: not self.group_pids(), timeout=10, what="the pool children to die")
        return status

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the main process only (not its pool children)."""
        # Not Popen.send_signal: it reaps an exited leader, freeing our group id too early.
        if self._process.returncode is None:
            os.kill(self.pid, signum)

    def group_pids(self) -> list[int]:
        """The live PIDs in the worker's process group (main process and pool children)."""
        return [pid for pid in _all_pids() if _pgid(pid) == self.pid]

    def _ready_or_exited(self) -> bool:
        return bool(READY_LINE.search(self.log_text())) or self._leader_exited()

    def _leader_exited(self) -> bool:
        # WNOWAIT leaves the exited leader a zombie, so its PID (= our group id) stays ours.
        if self._process.returncode is not None:
            return True
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.pid, flags) is not None

    def _signal_group(self, signum: int) -> None:
        if self._process.returncode is not None:
            return  # reaped: the group id may belong to someone else by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)


def _all_pids() -> Iterable[int]:
    return (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def _pgid(pid: int) -> int | None:
    """The process group of a live process; ``None`` for a zombie or a vanished one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name: state, ppid, pgrp, ...
    state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
    return None if state in {"Z", "X"} else int(pgrp)


def worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment for a worker: ours, plus the repo on ``PYTHONPATH``, plus ``extra``."""
    env = dict(os.environ)
    path = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def start_worker(
    command: WorkerCommand, *, env: Mapping[str, str], log_path: Path, ready_timeout: float = 60.0
) -> WorkerProcess:
    """Start ``command`` in its own process group and wait until it is ready.

    Raises
    ------
    WorkerStartError
        The worker exited, or was not ready within ``ready_timeout``; it is killed first.
    """
    with log_path.open("wb") as log:
        worker = WorkerProcess(_spawn(command, env=worker_env(env), log=log), log_path)
    try:
        worker.wait_ready(timeout=ready_timeout)
    except WorkerStartError:
        worker.kill()
        raise
    return worker


def _spawn(
    command: WorkerCommand, *, env: dict[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command.argv(),
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


class WorkerStarter:
    """Starts real ``celery worker`` subprocesses, logging under ``log_dir``; stops them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def __call__(
        self,
        app_module: str,
        *,
        queue: str,
        env: Mapping[str, str] | None = None,
        pool: Pool = "solo",
        concurrency: int = 1,
        ready_timeout: float = 60.0,
        extra_args: tuple[str, ...] = (),
    ) -> WorkerProcess:
        command = WorkerCommand(
            app_module=app_module,
            queue=queue,
            pool=pool,
            concurrency=concurrency,
            extra_args=extra_args,
        )
        log_path = self.log_dir / f"worker-{len(self.started)}.log"
        worker = start_worker(
            command, env=env or {}, log_path=log_path, ready_timeout=ready_timeout
        )
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        """Stop every worker started here (a warm shutdown, then the group is killed)."""
        for worker in self.started:
            # A warm shutdown gets TEARDOWN_GRACE seconds, then the group is killed.
            # tests.worker_main wakes an idle worker's event loop on SIGTERM (kombu's hub
            # would sleep up to 10 s with no timer due, an idle RabbitMQ worker), so it
            # exits at once.
            worker.stop(timeout=TEARDOWN_GRACE)


class SharedWorker:
    """One worker at a time, kept across the tests of a module (starting one costs seconds).

    :meth:`get` takes the arguments of ``celery_worker_process``: the same arguments as the
    worker running now give that worker back; others stop it and start a new one. Tests that
    share it dispatch and observe only (their own queue of the module, their own run count).
    """

    def __init__(self, log_dir: Path) -> None:
        self._starter = WorkerStarter(log_dir)
        self._key: tuple[object, ...] | None = None
        self._worker: WorkerProcess | None = None

    def get(self, app_module: str, **options: object) -> WorkerProcess:
        """The running worker for these arguments, started (again) when needed."""
        env = options.get("env") or {}
        assert isinstance(env, Mapping)
        key = (app_module, tuple(sorted(env.items())), tuple(sorted(
            (name, value) for name, value in options.items() if name != "env"
        )))  # fmt: skip
        if self._worker is not None and (key != self._key or not self._worker.is_running()):
            self._worker.stop(timeout=SWITCH_GRACE)
            self._worker = None
        if self._worker is None:
            self._key = None
            self._worker = self._starter(app_module, **options)  # type: ignore[arg-type]
            self._key = key
        return self._worker

    def stop(self) -> None:
        """Stop the worker (and any left from earlier :meth:`get` calls)."""
        self._worker = None
        self._starter.stop_all()
