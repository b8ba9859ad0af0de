"""Concurrent transactions dispatching the same task ids: at most one pending row per id.

Many threads, each in its own transaction, add the same few task ids at once (after a
barrier), round after round. The store's key decides: the partial unique index on
PostgreSQL and SQLite, the unique key over the generated ``pending_task_id`` on
MySQL/MariaDB (:mod:`celery_outbox.store.schema`). A transaction that lost keeps going (its
own other rows commit), and a row rolled back frees the id for a waiting transaction.

InnoDB (MySQL/MariaDB) waits on a secondary unique key with next-key locks, which cover the
gap below the contended key: a transaction adding a contended id and then rows of its own
in that gap may be chosen as a deadlock victim and rolled back whole (error 1213), as in
any InnoDB insert race. It wrote nothing and its caller got the error. Only there is that
allowed; the key holds either way.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from tests.contract.factories import new_message
from tests.contract.harness import DjangoHarness, Harness
from tests.contract.test_dispatch import claim_all

#: MySQL/MariaDB ``ER_LOCK_DEADLOCK``.
MYSQL_DEADLOCK = 1213
THREADS = 8
ROUNDS = 12
IDS_PER_ROUND = 3


class _RollBack(Exception):
    """Raised in a transaction to roll it back."""


@dataclass
class _Outcome:
    """What one thread's transaction did in one round."""

    committed: bool = False
    #: Rolled back whole by the database as a deadlock victim (InnoDB only).
    deadlocked: bool = False
    #: Row id the store returned per task id (``None``: already pending).
    added: dict[str, int | None] = field(default_factory=dict)
    #: Its own task id, unique to this transaction, written around the contended ones.
    own: str = field(default_factory=lambda: f"own-{uuid.uuid4()}")
    error: str = ""


def _race(harness: Harness, task_ids: list[str], rollback_every: int) -> list[_Outcome]:
    """Every thread adds ``task_ids`` (in the same order) and its own id in a transaction;
    every ``rollback_every``-th thread (0: none) rolls back.
    """
    barrier = threading.Barrier(THREADS)
    outcomes = [_Outcome() for _ in range(THREADS)]

    def dispatcher(n: int) -> None:
        outcome = outcomes[n]

        def work() -> None:
            barrier.wait(timeout=30)
            try:
                with harness.transaction():
                    harness.store.add(new_message(task_id=outcome.own))
                    for task_id in task_ids:
                        outcome.added[task_id] = harness.store.add(new_message(task_id=task_id))
                    harness.store.add(new_message(task_id=outcome.own + "-after"))
                    if rollback_every and n % rollback_every == 0:
                        raise _RollBack
                outcome.committed = True
            except _RollBack:
                pass
            except Exception as error:
                outcome.deadlocked = _is_deadlock(error)
                outcome.error = "" if outcome.deadlocked else f"{type(error).__name__}: {error}"

        harness.in_thread(work)

    threads = [threading.Thread(target=dispatcher, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a dispatcher hung"
    return outcomes


def _is_deadlock(error: BaseException) -> bool:
    current: BaseException | None = error
    while current is not None:
        if current.args and current.args[0] == MYSQL_DEADLOCK:
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return False


def _on_innodb(harness: Harness) -> bool:
    engine = getattr(harness, "engine", None)
    if engine is not None:
        return str(engine.dialect.name) in ("mysql", "mariadb")
    if isinstance(harness, DjangoHarness):
        from django.db import connection

        return str(connection.vendor) == "mysql"
    return False


def _check_round(harness: Harness, task_ids: list[str], outcomes: list[_Outcome]) -> int:
    """Check one round; how many transactions were deadlock victims."""
    assert [o.error for o in outcomes if o.error] == []
    deadlocked = sum(o.deadlocked for o in outcomes)
    assert deadlocked == 0 or _on_innodb(harness), "a deadlock outside InnoDB"
    rows = claim_all(harness).messages
    pending = {m.task_id: m.id for m in rows}
    counts = Counter(m.task_id for m in rows)
    committed = [o for o in outcomes if o.committed]
    for task_id in task_ids:
        assert counts[task_id] <= 1, f"{task_id}: {counts[task_id]} pending rows"
        winners = [o.added[task_id] for o in committed if o.added[task_id] is not None]
        if committed:
            # One committed transaction wrote the row; every other one was told it was pending.
            assert winners == [pending[task_id]], task_id
        else:
            assert task_id not in pending
    for outcome in outcomes:
        # Losing the race never aborted the transaction: its own rows are all there or gone.
        kept = {outcome.own in pending, outcome.own + "-after" in pending}
        assert kept == {outcome.committed}, outcome
    return deadlocked


def test_concurrent_dispatches_of_one_task_id_write_one_pending_row(harness: Harness) -> None:
    for _ in range(ROUNDS):
        task_ids = [f"race-{uuid.uuid4()}" for _ in range(IDS_PER_ROUND)]
        _check_round(harness, task_ids, _race(harness, task_ids, rollback_every=0))
        harness.clear()


def test_a_rolled_back_dispatch_frees_its_task_id_for_a_waiting_one(harness: Harness) -> None:
    rng = random.Random(21)
    for _ in range(ROUNDS):
        task_ids = [f"race-{uuid.uuid4()}" for _ in range(IDS_PER_ROUND)]
        outcomes = _race(harness, task_ids, rollback_every=rng.choice([2, 3]))
        _check_round(harness, task_ids, outcomes)
        harness.clear()
