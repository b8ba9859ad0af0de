"""The soak's load: rounds of mixed dispatches, each in a database transaction.

Each round (:meth:`Load.step`, a round a second in a thread of its own: :meth:`Load.run`)
commits one transaction dispatching:

- ``r<n>-<i>``: ``record`` tasks (run now), and ``e<n>``: one ``record`` with a countdown
  of 0.5-3 s (an ETA message, or a row parked until due);
- ``f<n>``: one ``flaky`` task failing 1-4 times: retries on the backoff (ETA messages,
  and those waiting over ``outbox_park_after`` parked in the table for the sweeper);
- ``a<n>-<i>``: atomic tasks (task id ``atomic-a<n>-<i>``) that add one to a counter and
  dispatch an atomic follow-up (:mod:`tests.reliability.atomic_app`);
- ``wc<n>`` or ``wd<n>``, in turn: a chain of 3 atomic workflow steps, or a chord of 3
  steps and a body (:mod:`tests.reliability.workflow_chaos_app`; keys and values as
  :func:`workflow_expected` gives them).

Every key goes into ``reliability_expected`` in the same transaction, so the keys there
are exactly what committed. Then a second transaction dispatches ``rb<n>-0`` (``record``)
and ``rb<n>-a`` (atomic) and rolls back: neither may ever run. A transaction that fails
(the database is down) is counted and the next round goes on.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, chain, chord
from sqlalchemy import insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from celery_outbox.exceptions import StoreError
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests.reliability.app import FLAKY, RECORD, expected_table
from tests.reliability.atomic_app import ATOMIC_ADD
from tests.reliability.workflow_chaos_app import COLLECT, STEP

#: ``record`` tasks run now, and atomic tasks, per round.
RECORDS, ATOMIC = 3, 2
#: Steps of a chain, and header steps of a chord (each chord also has its body).
CHAIN_STEPS, HEADER = 3, 3


class _RollBack(Exception):
    """Raised inside the round's second transaction to roll it back."""


@dataclass
class Load:
    """Dispatches rounds of mixed load with ``app`` and counts them."""

    app: Celery
    store: SQLAlchemyOutboxStore
    rng: random.Random
    rounds: int = 0
    failed_transactions: int = 0
    rolled_back: int = 0
    attempted: Counter[str] = field(default_factory=Counter)

    error: BaseException | None = None

    def run(self, stop: threading.Event, *, every: float) -> None:
        """Rounds every ``every`` seconds until ``stop`` (a thread's target: the disturbances
        block the test's loop, starting a worker or a server, but not the load). An
        unexpected error ends it and is kept in :attr:`error`.
        """
        try:
            while not stop.is_set():
                self.step()
                stop.wait(every)
        except BaseException as exc:  # the test re-raises it
            self.error = exc

    def step(self) -> None:
        """One round: a committed transaction of mixed dispatches and a rolled-back one."""
        n, self.rounds = self.rounds, self.rounds + 1
        try:
            self._commit(n)
        except (SQLAlchemyError, StoreError):
            self.failed_transactions += 1
        try:
            with self._transaction():
                self.app.tasks[RECORD].apply_async((f"rb{n}-0",), task_id=f"rb{n}-0")
                self.app.tasks[ATOMIC_ADD].apply_async((f"rb{n}-a",), task_id=f"atomic-rb{n}-a")
                raise _RollBack
        except _RollBack:
            self.rolled_back += 2
        except (SQLAlchemyError, StoreError):
            self.failed_transactions += 1

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        engine = self.store.engine
        with Session(engine) as session, session.begin(), self.store.bind_session(session):
            yield session

    def _commit(self, n: int) -> None:
        tasks = self.app.tasks
        keys: list[str] = []
        with self._transaction() as session:
            for i in range(RECORDS):
                keys.append(key := f"r{n}-{i}")
                tasks[RECORD].apply_async((key,), task_id=key)
            keys.append(key := f"e{n}")
            tasks[RECORD].apply_async((key,), task_id=key, countdown=self.rng.uniform(0.5, 3.0))
            keys.append(key := f"f{n}")
            tasks[FLAKY].apply_async((key, self.rng.randint(1, 4)), task_id=key)
            for i in range(ATOMIC):
                keys.append(key := f"a{n}-{i}")
                tasks[ATOMIC_ADD].apply_async((key,), task_id=f"atomic-{key}")
            keys.append(key := f"w{'c' if n % 2 == 0 else 'd'}{n}")
            canvas(self.app, key).apply_async()
            session.execute(insert(expected_table), [{"key": k} for k in keys])
        self.attempted.update(kind_of(key) for key in keys)


def kind_of(key: str) -> str:
    """The kind of a committed key: ``record``, ``flaky``, ``atomic`` or ``workflow``."""
    kinds = {"r": "record", "e": "record", "f": "flaky", "a": "atomic", "w": "workflow"}
    if key[:1] not in kinds:
        raise ValueError(f"not a key of the soak's load: {key!r}")
    return kinds[key[0]]


def canvas(app: Celery, key: str) -> Any:
    """The chain (``wc<n>``) or chord (``wd<n>``) of ``key``."""
    step, collect = app.tasks[STEP], app.tasks[COLLECT]
    if key.startswith("wc"):
        rest = (step.s(f"{key}-s{j}") for j in range(2, CHAIN_STEPS + 1))
        return chain(step.s(0, f"{key}-s1"), *rest)
    header = [step.s(10 * i, f"{key}-h{i}") for i in range(HEADER)]
    return chord(header, collect.s(f"{key}-body"))


def workflow_expected(keys: list[str]) -> dict[str, Any]:
    """Every step key the committed canvases ``keys`` record, with the value it must record."""
    found: dict[str, Any] = {}
    for key in keys:
        if key.startswith("wc"):
            found.update({f"{key}-s{j}": j for j in range(1, CHAIN_STEPS + 1)})
        else:
            header = [10 * i + 1 for i in range(HEADER)]
            found.update({f"{key}-h{i}": value for i, value in enumerate(header)})
            found[f"{key}-body"] = header
    return found
