"""``outbox purge``: delete published or failed rows older than an age, in bounded batches."""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from celery_outbox.clock import utcnow
from celery_outbox.records import MessageStatus
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)

HELP = "Delete published/failed rows created more than --older-than seconds ago."
CHOICES = (MessageStatus.PUBLISHED.value, MessageStatus.FAILED.value)


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--older-than", type=float, required=True, metavar="SECONDS")
    parser.add_argument(
        "--status",
        choices=CHOICES,
        action="append",
        help="published or failed (repeatable; default both)",
    )
    parser.add_argument("--batch", type=int, default=1000, help="rows per DELETE (default 1000)")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    statuses = [MessageStatus(s) for s in options["status"] or CHOICES]
    older_than = utcnow() - timedelta(seconds=max(options["older_than"], 0.0))
    batch = max(options["batch"], 1)
    for alias in context.aliases:
        total = 0
        while deleted := context.store.purge(
            statuses=statuses, older_than=older_than, limit=batch, using=alias
        ):
            total += deleted
            if deleted < batch:
                break
        command.stdout.write(f"{alias_name(alias)}: purged {total} row(s)")
