"""``outbox status``: rows by state, the oldest pending row's age, the dead letters, the
completed atomic tasks (``CompletedTask`` rows) and the workflows by status."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count

from celery_outbox.clock import utcnow
from celery_outbox.records import DeadLetterStatus, MessageStatus
from celery_outbox.storage import OutboxStore
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)

HELP = (
    "Count outbox rows by state, dead letters by status, completed atomic tasks and "
    "workflows by status; show the oldest pending age."
)


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    report = {alias_name(a): status_of(context.store, alias_name(a)) for a in context.aliases}
    if options["json"]:
        command.stdout.write(json.dumps(report, indent=2, sort_keys=True))
        return
    for alias, status in report.items():
        command.stdout.write(format_status(alias, status))


def status_of(store: OutboxStore, alias: str) -> dict[str, Any]:
    """Counts, oldest pending age (seconds), dead letters, completed atomic tasks and
    workflows of database ``alias``."""
    counts = store.count_by_status(using=alias)
    oldest = store.oldest_pending(using=alias)
    return {
        "messages": {s.value: counts.get(s, 0) for s in MessageStatus},
        "oldest_pending_age": None
        if oldest is None
        else round((utcnow() - oldest).total_seconds(), 3),
        "dead_letters": dead_letter_counts(alias),
        "completed_tasks": store.count_completed(using=alias),
        "workflows": dict(store.count_workflows(using=alias)),
    }


def dead_letter_counts(alias: str) -> dict[str, int]:
    """Dead letters of database ``alias`` by status."""
    from django_outbox.models import DeadLetter

    rows = DeadLetter.objects.using(alias).order_by().values_list("status").annotate(n=Count("id"))
    found = dict(rows)
    return {s.value: found.get(s.value, 0) for s in DeadLetterStatus}


def format_status(alias: str, status: dict[str, Any]) -> str:
    """The human-readable block of one alias."""
    age = status["oldest_pending_age"]
    lines = [f"database {alias}:"]
    lines += [f"  {state:<10}{count:>10}" for state, count in status["messages"].items()]
    lines.append(f"  oldest pending: {'-' if age is None else f'{age:.1f} s ago'}")
    letters = ", ".join(f"{s} {n}" for s, n in status["dead_letters"].items())
    lines.append(f"  dead letters: {letters}")
    lines.append(f"  completed atomic tasks: {status['completed_tasks']}")
    workflows = ", ".join(f"{s} {n}" for s, n in status["workflows"].items())
    lines.append(f"  workflows: {workflows}")
    return "\n".join(lines)
