"""``outbox sweep``: a shell over :mod:`celery_outbox.console.sweep` (the same pass as
``celery -A proj outbox sweep``), over each database alias the store sweeps.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from celery_outbox.console import sweep
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    load_context,
)

HELP = sweep.HELP


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    failed = sweep.sweep(context.sweeper(), context.aliases, write=command.stdout.write)
    if failed:
        raise CommandError("outbox sweep: " + "\n".join(failed))
