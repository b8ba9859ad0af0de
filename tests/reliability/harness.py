"""Helpers shared by the scenarios: expected keys, tallies, producer subprocesses."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from celery_outbox.sqlalchemy import outbox_table
from celery_outbox.store.records import MessageStatus
from tests.integration.sweep_support import queued_count
from tests.reliability import ledger
from tests.reliability.app import expected_table
from tests.worker import REPO_ROOT, WorkerProcess, worker_env


@dataclass(frozen=True, kw_only=True)
class ScenarioEnv:
    """Where one scenario's processes meet: broker, database, queue and ledger."""

    broker: str
    db_url: str
    queue: str
    ledger_dir: Path
    beat_schedule: Path

    def as_env(self) -> dict[str, str]:
        """The ``RELIABILITY_*`` variables :mod:`tests.reliability.app` reads."""
        return {
            "RELIABILITY_BROKER": self.broker,
            "RELIABILITY_DB": self.db_url,
            "RELIABILITY_QUEUE": self.queue,
            "RELIABILITY_LEDGER": str(self.ledger_dir),
            "RELIABILITY_BEAT_SCHEDULE": str(self.beat_schedule),
        }


def sqlalchemy_url(url: str) -> str:
    """A ``postgresql://`` URL with the psycopg 3 driver SQLAlchemy needs."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def expected_keys(engine: Engine) -> set[str]:
    """The keys whose dispatching transaction committed."""
    with engine.connect() as conn:
        return {str(key) for key in conn.execute(select(expected_table.c.key)).scalars()}


def expected_count(engine: Engine) -> int:
    """How many dispatches committed."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(expected_table)).scalar_one())


def pending_rows(engine: Engine) -> int:
    """Outbox rows still pending: a sweep may publish them (again, if their lease runs out)."""
    pending = outbox_table.c.status == MessageStatus.PENDING.value
    with engine.connect() as conn:
        query = select(func.count()).select_from(outbox_table).where(pending)
        return int(conn.execute(query).scalar_one())


def quiescent(env: ScenarioEnv, engine: Engine) -> bool:
    """Nothing more can run: no outbox row is pending and the task queue is empty.

    A row published and then swept again (its producer was killed between the publish and
    the mark) shows as a duplicate only once its lease ran out and a sweep published it;
    after this is true, no sweep publishes anything and the worker has every message.
    """
    return pending_rows(engine) == 0 and queued_count(env.broker, env.queue) == 0


def done_tally(env: ScenarioEnv, expected: set[str]) -> ledger.Tally:
    """``expected`` against the ``done`` events of the scenario's ledger."""
    return ledger.tally(expected, ledger.events(env.ledger_dir, ledger.DONE))


def settle(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.25) -> bool:
    """Poll ``predicate`` until true or ``timeout``; return its last value (never raises)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return True
        except SQLAlchemyError:
            pass  # a server that is still coming back
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def start_producer(env: ScenarioEnv, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start ``python -m tests.reliability.producer *args`` with the scenario's environment."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.producer", *args],
            cwd=REPO_ROOT,
            env=worker_env(env.as_env()),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


_SWEPT = re.compile(r"celery_outbox\.sweep\[[^\]]+\] succeeded in [^:]+: \{'published': (\d+)")


def swept_rows(worker_log: str) -> int:
    """Rows the sweep task published, summed from a worker's log (its results)."""
    return sum(int(match) for match in _SWEPT.findall(worker_log))


class Supervisor:
    """Keeps one worker alive as systemd or Kubernetes would, with a liveness probe.

    :meth:`check` starts a new worker when the current one exited, or when it made no
    progress for ``stall_after`` seconds while work was left (it is stopped first, warm,
    so it gives its unacknowledged messages back). Restarts are counted and reported:
    they come from the broker client (kombu's Redis transport), not from the outbox.
    """

    def __init__(self, start: Callable[[], WorkerProcess], *, stall_after: float = 15.0) -> None:
        self.start = start
        self.stall_after = stall_after
        self.worker = start()
        self.restarts = 0
        self._progress = -1
        self._since = time.monotonic()

    def check(self, progress: int) -> None:
        """Note the current ``progress`` (a growing count); restart a dead or stuck worker."""
        now = time.monotonic()
        if progress != self._progress:
            self._progress, self._since = progress, now
        stuck = now - self._since > self.stall_after
        if stuck or not self.worker.is_running():
            self.worker.stop(timeout=10)
            self.worker = self.start()
            self.restarts += 1
            self._since = time.monotonic()
