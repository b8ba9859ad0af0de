"""``outbox status``: the rows still to publish (due, parked, failed), the oldest due row's
wait, the last sweep, the dead letters, the completed atomic tasks and the workflows by
status, for each database.

``--json`` prints the same as data, one object per database alias, with the keys of
DESIGN.md: ``pending`` (due now), ``parked`` (due later), ``failed``,
``oldest_pending_age_seconds``, ``dead_letters`` (by status), ``completed``,
``workflows`` (by status), and ``last_sweep_age_seconds``. Ages are on the database's
clock, ``null`` when there is nothing to age. Every count is a bounded, indexed query.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from celery_outbox.exceptions import StoreError
from celery_outbox.store.base import OutboxStore

HELP = (
    "Count the rows due, parked and failed, dead letters by status, completed atomic tasks "
    "and workflows by status; show the oldest due row's wait and the last sweep."
)


def report(
    store: OutboxStore,
    aliases: Sequence[str | None],
    *,
    as_json: bool,
    write: Callable[[str], object],
) -> list[str]:
    """Write the status of each of ``aliases``; the errors of those that could not be read
    (one database that fails does not stop the others).
    """
    found: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for name in map(alias_name, aliases):
        try:
            found[name] = status_of(store, name)
        except StoreError as exc:
            failed.append(f"database {name}: {exc}")
    if as_json:
        write(json.dumps(found, indent=2, sort_keys=True))
    else:
        for alias, status in found.items():
            write(format_status(alias, status))
    return failed


def status_of(store: OutboxStore, alias: str) -> dict[str, Any]:
    """The status of database ``alias``, keyed as DESIGN.md lists it."""
    backlog = store.backlog(using=alias)
    last = store.last_sweep(using=alias)
    return {
        "pending": backlog.due,
        "parked": backlog.parked,
        "failed": backlog.failed,
        "oldest_pending_age_seconds": _seconds(backlog.oldest_due_age),
        "last_sweep_age_seconds": None if last is None else _seconds(last.age),
        "dead_letters": {s.value: n for s, n in store.count_dead_letters(using=alias).items()},
        "completed": store.count_completed(using=alias),
        "workflows": dict(store.count_workflows(using=alias)),
    }


def format_status(alias: str, status: dict[str, Any]) -> str:
    """The human-readable block of one alias."""
    lines = [f"database {alias}:"]
    lines.append(f"  {'pending':<10}{status['pending']:>10}  (due now)")
    lines.append(f"  {'parked':<10}{status['parked']:>10}  (due later)")
    lines.append(f"  {'failed':<10}{status['failed']:>10}")
    waiting = status["oldest_pending_age_seconds"]
    swept = status["last_sweep_age_seconds"]
    lines.append(f"  oldest pending: {'-' if waiting is None else f'waiting {waiting:.1f} s'}")
    lines.append(f"  last sweep: {'never recorded' if swept is None else f'{swept:.1f} s ago'}")
    letters = ", ".join(f"{s} {n}" for s, n in status["dead_letters"].items())
    lines.append(f"  dead letters: {letters}")
    lines.append(f"  completed atomic tasks: {status['completed']}")
    workflows = ", ".join(f"{s} {n}" for s, n in status["workflows"].items())
    lines.append(f"  workflows: {workflows}")
    return "\n".join(lines)


def alias_name(alias: str | None) -> str:
    """How ``alias`` is printed (``None`` is the store's default database)."""
    return alias or "default"


def _seconds(age: timedelta | None) -> float | None:
    return None if age is None else round(age.total_seconds(), 3)
