"""``outbox purge``: delete published or failed rows older than an age, in bounded batches;
with ``--completed``, the ``CompletedTask`` rows of atomic tasks completed before that age
instead (a duplicate delivered after its row is gone runs again).

``--older-than`` and ``--batch`` are checked, never clamped: a negative, NaN or infinite
age is refused (it once became 0 and deleted every published and failed row).
``--dry-run`` counts what a real run would delete and deletes nothing.
"""

from __future__ import annotations

import functools
from argparse import ArgumentParser
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand

from celery_outbox.config import Count, Seconds
from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import MessageStatus
from django_outbox.management.outbox_commands._arguments import count, seconds
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)

HELP = (
    "Delete published/failed rows created more than --older-than seconds ago "
    "(--completed: atomic tasks' CompletedTask rows completed before then)."
)
CHOICES = (MessageStatus.PUBLISHED.value, MessageStatus.FAILED.value)
#: Accepted ``--older-than``: up to a century (beyond it the cut-off date overflows).
AGE = Seconds(minimum=0.0, maximum=100 * 365 * 24 * 3600.0)
#: Accepted ``--batch``: rows per ``DELETE``.
BATCH = Count(minimum=1, maximum=100_000, unit="rows")


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument(
        "--older-than", type=seconds(AGE), required=True, metavar="SECONDS", help=AGE.accepted
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--status",
        choices=CHOICES,
        action="append",
        help="published or failed (repeatable; default both)",
    )
    which.add_argument(
        "--completed",
        action="store_true",
        help="purge CompletedTask rows instead: their duplicates would run again",
    )
    parser.add_argument(
        "--batch",
        type=count(BATCH),
        default=1000,
        help=f"rows per DELETE (default 1000; {BATCH.accepted})",
    )
    parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    statuses = [MessageStatus(s) for s in options["status"] or CHOICES]
    age = timedelta(seconds=options["older_than"])
    batch = options["batch"]
    for alias in context.aliases:
        older_than = context.store.now(using=alias) - age  # the database's clock
        if options["completed"]:
            purge_completed(command, context.store, alias_name(alias), older_than, options)
            continue
        if options["dry_run"]:
            write_dry_run(command, alias_name(alias), statuses, older_than)
            continue
        purge_one = functools.partial(
            context.store.purge, statuses=statuses, older_than=older_than, limit=batch, using=alias
        )
        total = _in_batches(purge_one, batch)
        command.stdout.write(f"{alias_name(alias)}: purged {total} row(s)")


def _in_batches(purge_one: Callable[[], int], batch: int) -> int:
    """Call ``purge_one`` until a batch comes back short; the rows deleted in all."""
    total = 0
    while deleted := purge_one():
        total += deleted
        if deleted < batch:
            break
    return total


def purge_completed(
    command: BaseCommand,
    store: OutboxStore,
    alias: str,
    older_than: datetime,
    options: dict[str, Any],
) -> None:
    """Delete (or with ``--dry-run`` count) ``alias``'s ``CompletedTask`` rows completed
    before ``older_than``, ``--batch`` rows per ``DELETE``.
    """
    if options["dry_run"]:
        from django_outbox.models import CompletedTask

        found = CompletedTask.objects.using(alias).filter(completed_at__lt=older_than).count()
        command.stdout.write(
            f"{alias}: would purge {found} completed task(s) completed before "
            f"{older_than.isoformat()} (dry run)"
        )
        return
    batch = options["batch"]
    purge_one = functools.partial(
        store.purge_completed, older_than=older_than, limit=batch, using=alias
    )
    total = _in_batches(purge_one, batch)
    command.stdout.write(f"{alias}: purged {total} completed task(s)")


def write_dry_run(
    command: BaseCommand, alias: str, statuses: list[MessageStatus], older_than: datetime
) -> None:
    """Print how many rows of each status a real run would delete."""
    from django_outbox.models import OutboxMessage

    rows = OutboxMessage.objects.using(alias)
    for status in statuses:
        found = rows.purgeable([status.value], older_than).count()
        command.stdout.write(
            f"{alias}: would purge {found} {status.value} row(s) created before "
            f"{older_than.isoformat()} (dry run)"
        )
