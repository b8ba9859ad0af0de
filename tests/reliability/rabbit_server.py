"""A throwaway RabbitMQ node that the reliability tests may kill and restart.

The shared RabbitMQ (``rabbit@localhost`` on 5672) is never touched: this node has its own
name (``rabbit-test-PORT@localhost``), AMQP and distribution ports, database and logs in a
temporary directory, no plugins, and an empty config file in place of
``/etc/rabbitmq/rabbitmq.conf`` (which would bind it to 5672). It runs as the current user
(the Erlang cookie is that user's ``~/.erlang.cookie``), in its own process group, from
RabbitMQ's own scripts (``/usr/lib/rabbitmq/bin``; Debian's wrappers in ``/usr/sbin``
switch to the ``rabbitmq`` user). It is stopped by its process group (``kill``) or by
``rabbitmqctl -n NODE shutdown`` (``terminate``), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import IO

from kombu import Connection

from tests.reliability.servers import ServerUnavailable, StopMode, free_port, port_open
from tests.worker import wait_for

#: RabbitMQ's own scripts (Debian's ``/usr/sbin`` wrappers ``su`` to the rabbitmq user).
RABBITMQ_BIN = Path(os.environ.get("OUTBOX_TEST_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))

#: Seconds a start may take: a cold boot on a loaded 2-core machine takes 10-45 s.
START_TIMEOUT = 120.0


class ThrowawayRabbitMQ:
    """A RabbitMQ node of the test's own; ``stop()``/``start()`` keep its ports and data."""

    def __init__(self, workdir: Path) -> None:
        self.server = RABBITMQ_BIN / "rabbitmq-server"
        self.ctl = RABBITMQ_BIN / "rabbitmqctl"
        if not (os.access(self.server, os.X_OK) and os.access(self.ctl, os.X_OK)):
            raise ServerUnavailable(f"rabbitmq-server is not installed in {RABBITMQ_BIN}")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"rabbit-test-{self.port}@localhost"
        (self.workdir / "enabled_plugins").write_text("[].\n")
        (self.workdir / "rabbitmq.conf").write_text("")
        (self.workdir / "rabbitmq-env.conf").write_text("")
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL (guest may log in from loopback)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        work = self.workdir
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(work / "mnesia"),
            "RABBITMQ_LOG_BASE": str(work / "log"),
            "RABBITMQ_PID_FILE": str(work / "node.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(work / "plugins-expand"),
            "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(work / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(work / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def start(self) -> None:
        """Start the node (again) and wait until it accepts AMQP connections."""
        if self._process is not None:
            return
        self._log = (self.workdir / "rabbitmq.out").open("ab")
        self._process = subprocess.Popen(
            [str(self.server)],
            cwd=self.workdir,
            env=self._env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(self._ready, timeout=START_TIMEOUT, what=f"RabbitMQ {self.node} to listen")
        except TimeoutError:
            self.stop(mode="kill")
            raise ServerUnavailable(f"RabbitMQ did not start: {self.log_text()[-2000:]}") from None

    def _ready(self) -> bool:
        process = self._process
        if process is None or process.poll() is not None:
            raise ServerUnavailable(f"RabbitMQ exited: {self.log_text()[-2000:]}")
        return port_open(self.port) and self.accepts()

    def accepts(self) -> bool:
        """Whether the node completes an AMQP handshake now (its port can be open while
        it boots, or restarts its listener after a crash, and still refuse one).
        """
        try:
            with Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
        except Exception:  # any failure: not ready yet
            return False
        return True

    def stop(self, *, mode: StopMode = "terminate") -> None:
        """Stop the node: ``rabbitmqctl shutdown`` (``terminate``), or SIGKILL to its whole
        process group (``kill``: a crash, nothing flushed that was not yet).
        """
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None and mode == "terminate":
                # rabbitmqctl boots an Erlang VM of its own: slow on a loaded machine. If it
                # does not finish, the node is killed below.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(
                        [str(self.ctl), "-n", self.node, "shutdown"],
                        env=self._env(),
                        capture_output=True,
                        timeout=120,
                        check=False,
                    )
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            # What the script started (beam.smp, erl_child_setup) goes with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        """The node's console output so far."""
        path = self.workdir / "rabbitmq.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop for good."""
        self.stop(mode="kill")
