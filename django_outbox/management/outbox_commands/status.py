"""``outbox status``: a shell over :mod:`celery_outbox.console.status` (the same report as
``celery -A proj outbox status``), for each database alias the store sweeps.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from celery_outbox.console import status
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    load_context,
)

HELP = status.HELP


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    failed = status.report(
        context.store, context.aliases, as_json=options["json"], write=command.stdout.write
    )
    if failed:
        raise CommandError("outbox status: " + "\n".join(failed))
