"""The disturbances and the end of the workflow chaos scenario (``test_workflow_chaos.py``).

:class:`Workers` keeps the scenario's two prefork workers (``outbox`` and ``plain``) alive
as a process manager would (:class:`~tests.reliability.harness.Supervisor`: a worker that
exited, or stalled with work left, is restarted and counted), SIGKILLs one pool child of
each every ``kill_every`` seconds (never a main process), and steps the outbox's
:class:`~tests.reliability.chaos.Chaos` (one published row in five made pending again, so
the sweep publishes the same message a second time; then a sweep).
:func:`run_to_the_end` keeps that up until both variants are done or a timeout.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import Engine, func, select, update

from celery_outbox.sqlalchemy import completed_table, outbox_table, workflow_table
from celery_outbox.store.records import MessageStatus
from tests.reliability.chaos import Chaos
from tests.reliability.harness import Supervisor, pending_rows
from tests.reliability.workflow_chaos_app import plain_run_table, run_table
from tests.worker import WorkerProcess

#: Seconds a variant's counts must stand still, with nothing queued, to call it done.
QUIET = 5.0
#: Seconds without a committed run, with work queued, before a worker counts as stuck.
STALL_AFTER = 10.0


class Workers:
    """The supervised workers, their kills, and the outbox's republishes and sweeps."""

    def __init__(
        self,
        starts: dict[str, Callable[[], WorkerProcess]],
        *,
        chaos: Callable[[WorkerProcess], Chaos],
        kill_every: float,
    ) -> None:
        self.started: list[WorkerProcess] = []
        self.supervisors = {
            name: Supervisor(self._keeping(start), stall_after=STALL_AFTER)
            for name, start in starts.items()
        }
        self.chaos = chaos(self.supervisors["outbox"].worker)
        self.kill_every = kill_every
        self.kills = 0
        self._last_kill = time.monotonic()

    def _keeping(self, start: Callable[[], WorkerProcess]) -> Callable[[], WorkerProcess]:
        def started() -> WorkerProcess:
            worker = start()
            self.started.append(worker)
            return worker

        return started

    def step(self, *, kill: bool = True) -> None:
        """A kill of one pool child of each worker when due, a republish and a sweep."""
        if kill and time.monotonic() - self._last_kill >= self.kill_every:
            self._last_kill = time.monotonic()
            for supervisor in self.supervisors.values():
                worker = supervisor.worker
                children = sorted(pid for pid in worker.group_pids() if pid != worker.pid)
                if children:
                    os.kill(children[self.kills % len(children)], signal.SIGKILL)
                    self.kills += 1
        self.chaos.step(kill=False)

    def check(self, name: str, progress: int) -> None:
        """Restart ``name``'s worker when it exited or stalled with work left."""
        self.supervisors[name].check(progress)

    def tasks_killed(self) -> int:
        """Task runs the workers reported lost with their child (``WorkerLostError``)."""
        return sum(worker.log_text().count("WorkerLostError(") for worker in self.started)

    def restarts(self, name: str) -> int:
        """How many times ``name``'s worker was restarted."""
        return self.supervisors[name].restarts


def count(engine: Engine, table: Any) -> int:
    """Rows in ``table``."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def workflows(engine: Engine) -> list[Any]:
    """Every ``Workflow`` row."""
    with engine.connect() as conn:
        return list(conn.execute(select(workflow_table)).all())


def backlog(url: str, queue: str) -> int:
    """Messages queued or unacknowledged on the Redis broker ``url`` (1 while it is down)."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.llen(queue)) + int(client.hlen("unacked"))
    except redis.RedisError:
        return 1
    finally:
        client.close()


def republish_stalled(engine: Engine) -> int:
    """Make published rows whose task never completed pending again; how many."""
    c = outbox_table.c
    stalled = (c.status == MessageStatus.PUBLISHED.value) & c.task_id.not_in(
        select(completed_table.c.task_id)
    )
    with engine.begin() as conn:
        ids = list(conn.execute(select(c.id).where(stalled)).scalars())
        if ids:
            conn.execute(
                update(outbox_table)
                .where(c.id.in_(ids))
                .values(status=MessageStatus.PENDING.value, locked_until=None)
            )
    return len(ids)


@dataclass(frozen=True)
class Outcome:
    """How the run ended: messages lost past the broker (republished), a timeout, and
    when (``time.monotonic()``) every outbox workflow had succeeded (0.0: never).
    """

    lost_past_broker: int
    timed_out: bool
    outbox_done_at: float


@dataclass(frozen=True, kw_only=True)
class Queues:
    """Where each variant's messages wait: ``{name: (broker URL, queue)}``."""

    outbox: tuple[str, str]
    plain: tuple[str, str]


def run_to_the_end(
    workers: Workers, engine: Engine, queues: Queues, *, workflows_total: int, timeout: float
) -> Outcome:
    """Keep killing, republishing and sweeping until every outbox workflow succeeded and
    the plain variant went quiet (nothing queued or unacknowledged, no new run for
    :data:`QUIET` s), or ``timeout``, or the outbox went quiet with a workflow failed.
    An outbox that went quiet unfinished has lost a message past the broker: its
    stalled rows are republished (and counted).
    """
    deadline = time.monotonic() + timeout
    lost_past_broker, outbox_done_at = 0, 0.0
    last: dict[str, int] = {}
    since: dict[str, float] = {}
    while time.monotonic() < deadline:
        workers.step()
        now = time.monotonic()
        work = {
            "outbox": backlog(*queues.outbox) + pending_rows(engine),
            "plain": backlog(*queues.plain),
        }
        for name, table in (("outbox", run_table), ("plain", plain_run_table)):
            runs = count(engine, table)
            if last.get(name) != runs or work[name]:
                last[name], since[name] = runs, now
            if work[name]:
                workers.check(name, runs)
        quiet = {name: now - since[name] >= QUIET for name in last}
        statuses = Counter(flow.status for flow in workflows(engine))
        finished = statuses["succeeded"]
        if quiet["outbox"] and statuses["failed"]:  # dead letters: nothing more will run
            return Outcome(lost_past_broker, timed_out=False, outbox_done_at=0.0)
        if quiet["outbox"] and finished < workflows_total:
            lost_past_broker += republish_stalled(engine)
            since["outbox"] = now
        if finished == workflows_total:
            outbox_done_at = outbox_done_at or now
            if quiet["plain"]:
                return Outcome(lost_past_broker, timed_out=False, outbox_done_at=outbox_done_at)
        time.sleep(0.1)
    return Outcome(lost_past_broker, timed_out=True, outbox_done_at=outbox_done_at)
