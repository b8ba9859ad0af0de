"""Throwaway Redis and PostgreSQL servers that the reliability tests may stop and restart.

The shared services on the usual ports are never touched: every server here runs on a free
port, with its data in a temporary directory, and is stopped by the PID it was started
with (Redis) or by ``pg_ctl`` on its own data directory (PostgreSQL).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Literal

from tests.services import free_port
from tests.worker import wait_for

#: How a server is stopped: ``"terminate"`` (clean shutdown), ``"kill"`` (SIGKILL, a crash).
StopMode = Literal["terminate", "kill"]


class ServerUnavailable(RuntimeError):
    """The binaries are missing or the server would not start; the message says why."""


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class ThrowawayRedis:
    """A ``redis-server`` of the test's own; ``stop()``/``start()`` keep its port and data.

    Its append-only file is fsynced on every write, so a stop (even SIGKILL) loses no
    message the broker acknowledged, as a durable broker would: what is measured is the
    outbox, not Redis's persistence settings. The file is also the broker's record of what
    it accepted and handed out (:mod:`tests.reliability.aof`): it is never rewritten, has
    no RDB preamble, and carries ``#TS`` timestamps.
    """

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise ServerUnavailable("redis-server is not installed")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def aof_dir(self) -> Path:
        """The server's ``appendonlydir/`` (Redis 7 multi-part AOF)."""
        return self.workdir / "appendonlydir"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server (again) and wait until it accepts connections."""
        if self._process is not None:
            return
        assert self.binary is not None
        self._log = (self.workdir / "redis.log").open("ab")
        self._process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.workdir), "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--aof-use-rdb-preamble", "no",
             "--auto-aof-rewrite-percentage", "0", "--aof-timestamp-enabled", "yes",
             "--daemonize", "no"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: port_open(self.port), timeout=20, what="redis-server to listen")
        except TimeoutError:
            self.stop(mode="kill")
            raise ServerUnavailable(f"redis-server did not start: {self.log_text()}") from None

    def stop(self, *, mode: StopMode = "terminate") -> None:
        """Stop the server (SIGTERM, or SIGKILL for ``mode="kill"``) and wait for it."""
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.send_signal(signal.SIGKILL if mode == "kill" else signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)
        if self._log is not None:
            self._log.close()
            self._log = None

    def freeze(self) -> None:
        """SIGSTOP the server: it keeps its port but answers nothing (a hung broker)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        """The server's log so far."""
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop for good (thawing first, so SIGTERM is handled)."""
        self.thaw()
        self.stop(mode="kill")


def _postgres_bindir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    found = shutil.which("pg_ctl")
    if candidates:
        return Path(candidates[-1]).parent
    if found:
        return Path(found).parent
    raise ServerUnavailable("pg_ctl/initdb are not installed (/usr/lib/postgresql/*/bin)")


class ThrowawayPostgres:
    """A PostgreSQL cluster of the test's own (``initdb`` in a temporary directory).

    As root, the cluster belongs to the ``postgres`` OS user, as PostgreSQL refuses to run
    as root. ``fsync`` is off (speed): a stop is a clean or an immediate shutdown of the
    server process, never a power cut, so what reached the OS survives it. Commits stay
    synchronous: with ``synchronous_commit=off`` an immediate shutdown loses the last
    commits, which the first version of these tests caught as a lost dead letter.
    """

    def __init__(self, workdir: Path) -> None:
        self.bindir = _postgres_bindir()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.datadir = workdir / "data"
        self.port = free_port()
        self._as_user = self._run_as_prefix()
        self._running = False
        self._initdb()

    @property
    def url(self) -> str:
        """An SQLAlchemy/psycopg URL of the ``postgres`` database (psycopg 3 driver)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def libpq_url(self) -> str:
        """The same database as a plain libpq URL."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as_prefix(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        runuser = shutil.which("runuser")
        if runuser is None:
            raise ServerUnavailable("running as root without runuser: cannot start PostgreSQL")
        shutil.chown(self.workdir, user="postgres")
        return [runuser, "-u", "postgres", "--"]

    def _run(self, *argv: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [*self._as_user, *argv],
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise ServerUnavailable(
                f"{' '.join(argv)} failed ({result.returncode}): "
                f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}"
            )

    def _initdb(self) -> None:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )

    def start(self) -> None:
        """Start the server (again) and wait until it accepts connections."""
        if self._running:
            return
        options = (
            f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-o",
            options,
            "-l",
            str(self.workdir / "postgres.log"),
            "-w",
            "-t",
            "60",
            "start",
            timeout=90,
        )
        self._running = True

    def stop(self, *, mode: StopMode = "terminate") -> None:
        """Stop the server: ``fast`` shutdown, or ``immediate`` (a crash) for ``"kill"``."""
        if not self._running:
            return
        shutdown = "immediate" if mode == "kill" else "fast"
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-m",
            shutdown,
            "-w",
            "-t",
            "60",
            "stop",
            timeout=90,
        )
        self._running = False

    def log_text(self) -> str:
        """The server's log so far."""
        path = self.workdir / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop for good."""
        with contextlib.suppress(ServerUnavailable):
            self.stop(mode="kill")


def sleep_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline``."""
    time.sleep(max(0.0, deadline - time.monotonic()))
