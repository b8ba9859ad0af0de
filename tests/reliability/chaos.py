"""The disturbances of the atomic chaos scenario, stepped from the test's own loop.

- :meth:`Chaos.kill_child` SIGKILLs one of the worker's prefork pool children (never its
  main process), as the OOM killer would: the task it was running is redelivered
  (``acks_late``, ``reject_on_worker_lost``), possibly after its transaction committed;
- :meth:`Chaos.republish` makes a fixed share of the rows already published ``pending``
  and due again, as a relay that published a row and then lost its mark (a crash between
  the publish and the ``UPDATE``, a lease that ran out) leaves it: the next sweep
  publishes the same message, same task id, a second time. The rows are kept after
  publishing for that (``outbox_keep_published``). Which rows is decided by a hash of the
  task id, so parents and follow-ups alike are chosen, each at most once;
- :meth:`Chaos.sweep` runs the sweep (the relay of the rows above, and of rows whose
  on-commit publish died with a killed child).
"""

from __future__ import annotations

import os
import signal
import time
import zlib
from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy import select, update

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, outbox_table
from celery_outbox.store.records import MessageStatus
from celery_outbox.sweep_task import sweep_app
from tests.worker import WorkerProcess

#: One published row in this many is published again.
REPUBLISH_ONE_IN = 5


def republished(task_id: str) -> bool:
    """Whether :meth:`Chaos.republish` publishes ``task_id``'s row a second time."""
    return zlib.crc32(task_id.encode()) % REPUBLISH_ONE_IN == 0


@dataclass
class Chaos:
    """Kills, republishes and sweeps for one worker and one app; counts what it did."""

    app: Celery
    store: SQLAlchemyOutboxStore
    worker: WorkerProcess
    kill_every: float = 0.5
    kills: int = 0
    republished: int = 0
    examined: set[int] = field(default_factory=set)
    _last_kill: float = field(default_factory=time.monotonic)

    def step(self, *, kill: bool = True) -> None:
        """One round: a kill when one is due (and ``kill``), a republish, a sweep."""
        if kill and time.monotonic() - self._last_kill >= self.kill_every:
            self.kill_child()
        self.republish()
        self.sweep()

    def kill_child(self) -> bool:
        """SIGKILL one live pool child of the worker, in turn; whether there was one."""
        self._last_kill = time.monotonic()
        # Only a process of the worker's own group, and never its main process.
        children = sorted(pid for pid in self.worker.group_pids() if pid != self.worker.pid)
        if not children:
            return False
        os.kill(children[self.kills % len(children)], signal.SIGKILL)
        self.kills += 1
        return True

    def tasks_killed(self) -> int:
        """Task runs the worker reported lost with their child (``WorkerLostError``)."""
        return self.worker.log_text().count("raised error: WorkerLostError(")

    def republish(self) -> int:
        """Make the chosen published rows not examined before due again; how many."""
        c = outbox_table.c
        published = MessageStatus.PUBLISHED.value
        with self.store.engine.begin() as conn:
            rows = conn.execute(select(c.id, c.task_id).where(c.status == published)).all()
            fresh = [row for row in rows if row.id not in self.examined]
            self.examined.update(row.id for row in fresh)
            chosen = [row.id for row in fresh if republished(row.task_id)]
            if chosen:
                conn.execute(
                    update(outbox_table)
                    .where(c.id.in_(chosen), c.status == published)
                    .values(status=MessageStatus.PENDING.value, locked_until=None)
                )
        self.republished += len(chosen)
        return len(chosen)

    def sweep(self) -> None:
        """One sweep of the app's outbox."""
        sweep_app(self.app)
