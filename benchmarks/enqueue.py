"""Enqueue cost: plain ``apply_async`` vs ``OutboxTask.delay()`` inside a transaction.

Both sides run the same ``transaction.atomic()`` blocks of ``per_txn`` calls on
PostgreSQL with Redis as the broker; the outbox side writes its rows in the block and
publishes them on commit, so its time includes the INSERTs, the COMMIT, the claim, the
publish and the DELETE. Plain ``apply_async`` in an otherwise empty block touches no
database at all; the ``+ write`` case adds the business row an outbox exists for (one
INSERT into a small table) to each block on both sides. Rounds alternate the two
sides; the ratio is of the medians.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.stats import median, ratio

#: A business table: what a real transaction writes besides the task.
ORDERS = "celery_outbox_bench_order"
#: (case name, tasks per transaction, with a business write, target ratio, outbox side's way).
#: The plain side always calls ``apply_async`` once per task. ``group``: the outbox side
#: dispatches each transaction's tasks as one ``group([...])``; ``batched``: its ``delay``
#: loop runs in ``celery_outbox.batched_dispatch()`` (both: one multi-row INSERT).
CASES = (
    ("1/txn", 1, False, 0.6, "each"),
    ("100/txn", 100, False, 1.0, "each"),
    ("1/txn + write", 1, True, None, "each"),
    ("100/txn group", 100, False, 1.2, "group"),
    ("100/txn batched", 100, False, 1.2, "batched"),
)


def _create_orders() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (id bigserial PRIMARY KEY, n int)")
        cursor.execute(f"TRUNCATE {ORDERS}")


def _write(i: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {ORDERS} (n) VALUES (%s)", [i])


def _round(outbox: bool, tasks: int, per_txn: int, write: bool, way: str = "each") -> float:
    from celery import group
    from django.db import transaction

    from benchmarks.app import outbox_noop, plain_noop
    from celery_outbox import batched_dispatch

    started = time.perf_counter()
    for first in range(0, tasks, per_txn):
        with transaction.atomic():
            if write:
                _write(first)
            numbers = range(first, first + per_txn)
            if not outbox:
                for i in numbers:
                    plain_noop.apply_async((i,))
            elif way == "group":
                group([outbox_noop.s(i) for i in numbers]).apply_async()
            elif way == "batched":
                with batched_dispatch(app=outbox_noop.app):
                    for i in numbers:
                        outbox_noop.delay(i)
            else:
                for i in numbers:
                    outbox_noop.delay(i)
    return tasks / (time.perf_counter() - started)


def run(*, tasks: int, rounds: int) -> list[dict[str, Any]]:
    """Measure each case; one result row per case."""
    env.reset_outbox()
    env.purge_broker()
    _create_orders()
    _round(False, 200, 100, True)  # warm-up: connections, imports, caches
    _round(True, 200, 100, True)
    _round(True, 200, 100, False, "group")
    rows = []
    for case, per_txn, write, target, way in CASES:
        count = max(per_txn, tasks // per_txn * per_txn)
        plain, ours = [], []
        for _ in range(rounds):
            plain.append(_round(False, count, per_txn, write))
            ours.append(_round(True, count, per_txn, write, way))
            env.purge_broker()
        rows.append(
            {
                "benchmark": "enqueue",
                "case": case,
                "unit": "tasks/s",
                "tasks": count,
                "rounds": rounds,
                "plain": median(plain),
                "ours": median(ours),
                "ratio": ratio(median(ours), median(plain)),
                "target": target,
                "samples": {"plain": plain, "ours": ours},
            }
        )
    rows.append(_bound(rows))
    env.reset_outbox()
    _create_orders()
    return rows


def _bound(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best ratio any transactional outbox could reach at 1/txn, from this run.

    An outbox dispatch writes in a transaction that commits and publishes the task:
    at least what plain Celery pays in ``1/txn + write``. Its ratio to ``1/txn`` bounds
    every outbox's ``1/txn`` ratio on this machine.
    """
    by_case = {row["case"]: row for row in rows}
    bare, written = by_case["1/txn"]["plain"], by_case["1/txn + write"]["plain"]
    return {
        "benchmark": "enqueue",
        "case": "1/txn bound: plain + a write",
        "unit": "tasks/s",
        "plain": bare,
        "ours": written,
        "ratio": ratio(written, bare),
        "target": None,
    }
