"""Enqueue cost of the ``django.tasks`` backend: ``my_task.enqueue()`` against
``OutboxTask.delay()``, both inside ``transaction.atomic()`` on PostgreSQL with Redis.

Both sides write the same outbox row and publish it on commit; the backend adds Django's
validation, its ``TaskResult`` (JSON-normalised arguments), the priority mapping and the
``task_enqueued`` signal. Rounds alternate the two sides; the ratio is of the medians.
Needs Django >= 6.0 (Python >= 3.12): on an older Django it reports why it was skipped.

With django-tasks-db installed (``pip install django-tasks-db``: the ORM backend of Django's
task framework, whose own worker polls its table), one more row per case compares our
``enqueue()`` with its ``enqueue()`` in the same transactions, no target: it writes its row
and nothing else (no broker, no publish after COMMIT), so it bounds what an enqueue costs.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

from benchmarks import env
from benchmarks.stats import median, ratio

#: (case name, tasks per transaction, target ratio).
CASES = (("1/txn", 1, 0.9), ("100/txn", 100, 0.9))
#: ``TASKS`` of the benchmark: the outbox backend on the benchmark's Celery app, and
#: django-tasks-db's backend (used only when it is installed).
TASKS = {"default": {"BACKEND": "django_outbox.tasks.OutboxBackend"}}
#: django-tasks-db's backend, beside it when installed.
DATABASE_BACKEND = {"database": {"BACKEND": "django_tasks_db.DatabaseBackend"}}


def _round(django_task: Any, tasks: int, per_txn: int) -> float:
    from django.db import transaction

    from benchmarks.app import outbox_noop

    started = time.perf_counter()
    for first in range(0, tasks, per_txn):
        with transaction.atomic():
            for i in range(first, first + per_txn):
                if django_task is None:
                    outbox_noop.delay(i)
                else:
                    django_task.enqueue(i)
    return tasks / (time.perf_counter() - started)


def run(*, tasks: int, rounds: int) -> list[dict[str, Any]]:
    """Measure each case; one result row per case (one ``skipped`` row on Django < 6)."""
    if importlib.util.find_spec("django.tasks") is None:
        reason = "needs Django >= 6.0 (django.tasks), hence Python >= 3.12"
        return [{"benchmark": "django tasks", "case": "enqueue", "skipped": reason}]
    from django.test.utils import override_settings

    installed = importlib.util.find_spec("django_tasks_db") is not None
    with override_settings(TASKS={**TASKS, **(DATABASE_BACKEND if installed else {})}):
        from benchmarks.django_tasks_app import noop

        rows = _measure(noop, tasks=tasks, rounds=rounds)
        if not installed:
            reason = "django-tasks-db is not installed (pip install django-tasks-db)"
            skipped = {"benchmark": "django tasks", "case": "vs django-tasks-db", "skipped": reason}
            return [*rows, skipped]
        from benchmarks.django_tasks_db_app import noop_db

        return [*rows, *_against_the_database_backend(noop, noop_db, tasks=tasks, rounds=rounds)]


def _against_the_database_backend(
    ours: Any, theirs: Any, *, tasks: int, rounds: int
) -> list[dict[str, Any]]:
    """Our ``enqueue()`` against django-tasks-db's, case by case (no target)."""
    from django_tasks_db.models import DBTaskResult

    def clear() -> None:
        env.purge_broker()
        DBTaskResult.objects.all().delete()

    return _compare(
        theirs, ours, "vs django-tasks-db", tasks=tasks, rounds=rounds, clear=clear, target=False
    )


def _measure(django_task: Any, *, tasks: int, rounds: int) -> list[dict[str, Any]]:
    env.reset_outbox()
    env.purge_broker()
    _round(None, 200, 100)  # warm-up: connections, imports, caches
    _round(django_task, 200, 100)
    return _compare(
        None,
        django_task,
        "vs delay()",
        tasks=tasks,
        rounds=rounds,
        clear=env.purge_broker,
        target=True,
    )


def _compare(
    plain_task: Any,
    our_task: Any,
    against: str,
    *,
    tasks: int,
    rounds: int,
    clear: Callable[[], None],
    target: bool,
) -> list[dict[str, Any]]:
    """Alternate ``plain_task`` (``None``: ``OutboxTask.delay()``) and ``our_task`` in each
    case's rounds, ``clear`` after each pair; one row per case, ``our_task`` as ours.
    """
    rows = []
    for case, per_txn, case_target in CASES:
        count = max(per_txn, tasks // per_txn * per_txn)
        plain, ours = [], []
        for _ in range(rounds):
            plain.append(_round(plain_task, count, per_txn))
            ours.append(_round(our_task, count, per_txn))
            clear()
        rows.append(
            {
                "benchmark": "django tasks",
                "case": f"enqueue() {against} {case}",
                "unit": "tasks/s",
                "tasks": count,
                "rounds": rounds,
                "plain": median(plain),
                "ours": median(ours),
                "ratio": ratio(median(ours), median(plain)),
                "target": case_target if target else None,
                "samples": {"plain": plain, "ours": ours},
            }
        )
    env.reset_outbox()
    return rows
