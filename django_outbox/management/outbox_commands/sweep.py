"""``outbox sweep``: one pass of the sweeper over every outbox database.

It does what the beat sweep does: publish the due rows, then (with
``outbox_keep_published`` > 0) delete one batch of published rows older than that, and
one batch of ``CompletedTask`` rows older than ``outbox_keep_completed``.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from celery_outbox.exceptions import StoreError
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)

HELP = (
    "Publish the due rows left behind, purge old published rows and completed atomic tasks "
    "(one sweep, as beat does)."
)


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    sweeper = context.sweeper()
    failed: list[str] = []
    try:
        for alias in context.aliases:
            try:  # a database that fails (or an alias gone from DATABASES): sweep the others
                report = (
                    sweeper.sweep(alias)
                    + sweeper.purge_expired(alias)
                    + sweeper.purge_completed(alias)
                )
            except StoreError as exc:
                failed.append(f"database {alias_name(alias)}: {exc}")
                continue
            command.stdout.write(
                f"{alias_name(alias)}: published {report.published}, rescheduled "
                f"{report.rescheduled}, failed {report.failed} in {report.batches} batch(es)"
                + (f", purged {report.purged}" if context.config.keep_published else "")
                + (
                    f", purged {report.purged_completed} completed task(s)"
                    if report.purged_completed
                    else ""
                )
                + (" (time budget spent; rows left)" if report.more else "")
            )
    finally:
        sweeper.relay.close()
    if failed:
        raise CommandError("outbox sweep: " + "\n".join(failed))
