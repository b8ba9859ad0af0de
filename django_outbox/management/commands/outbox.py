"""``python manage.py outbox <subcommand>``: status, sweep, relay, purge (and more).

Each subcommand lives in its own module of :mod:`django_outbox.management.outbox_commands`.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from celery_outbox.exceptions import OutboxError
from django_outbox.management.outbox_commands import subcommands


class Command(BaseCommand):
    """Dispatch to the subcommand module; report outbox errors as ``CommandError``."""

    help = "Inspect and operate the celery-outbox: " + ", ".join(subcommands())

    def add_arguments(self, parser: ArgumentParser) -> None:
        choices = parser.add_subparsers(dest="subcommand", metavar="subcommand", required=True)
        for name, module in subcommands().items():
            module.add_arguments(choices.add_parser(name, help=module.HELP))

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            subcommands()[options["subcommand"]].handle(self, options)
        except OutboxError as exc:
            raise CommandError(f"outbox {options['subcommand']}: {exc}") from exc
