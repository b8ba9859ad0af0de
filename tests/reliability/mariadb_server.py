"""A throwaway MariaDB server with server settings of the test's own.

The shared MariaDB (3306) is never touched, nor its global settings: this server has its
own port, socket, data directory (``mariadb-install-db`` into a temporary directory) and
options such as a small ``max_allowed_packet``, so that a test can make it refuse a
packet cheaply. It is stopped by the PID it was started with, never by name.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from pathlib import Path
from typing import IO

from tests.reliability.servers import ServerUnavailable, free_port, port_open
from tests.worker import wait_for


class ThrowawayMariaDB:
    """A ``mariadbd`` of the test's own: ``root`` without a password on 127.0.0.1."""

    def __init__(self, workdir: Path, *, options: tuple[str, ...] = ()) -> None:
        self.server = shutil.which("mariadbd", path="/usr/sbin:/usr/bin:/usr/local/sbin")
        self.install = shutil.which("mariadb-install-db")
        if self.server is None or self.install is None:
            raise ServerUnavailable("mariadbd or mariadb-install-db is not installed")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.datadir = workdir / "data"
        self.port = free_port()
        self.options = options
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._install()

    def url(self, database: str) -> str:
        """The URL of ``database`` on this server (``mysql://``, as the tests use)."""
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def _install(self) -> None:
        done = subprocess.run(
            [self.install, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, timeout=120, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            raise ServerUnavailable(f"mariadb-install-db failed ({done.returncode}): {output}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        if self._process is not None:
            return
        assert self.server is not None
        self._log = (self.workdir / "mariadb.log").open("ab")
        self._process = subprocess.Popen(
            [self.server, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
             f"--port={self.port}", "--bind-address=127.0.0.1",
             f"--socket={self.workdir / 'mariadb.sock'}",
             f"--pid-file={self.workdir / 'mariadb.pid'}", "--skip-log-bin",
             "--innodb-buffer-pool-size=16M", "--skip-name-resolve", *self.options],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: port_open(self.port), timeout=60, what="mariadbd to listen")
        except TimeoutError:
            self.stop()
            raise ServerUnavailable(f"mariadbd did not start: {self.log_text()}") from None

    def stop(self) -> None:
        """Stop the server (SIGTERM, a clean shutdown; SIGKILL after 30 s) and wait."""
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        """The server's log so far."""
        path = self.workdir / "mariadb.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop for good."""
        with contextlib.suppress(ServerUnavailable):
            self.stop()
