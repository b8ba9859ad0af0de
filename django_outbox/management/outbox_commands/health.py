"""``outbox health``: exit 0 when the outbox is healthy, 1 with one line per reason.

A probe for Kubernetes or a monitoring agent (:func:`celery_outbox.health.check`): a
due row waiting longer than ``--max-pending-age``, a last sweep older than
``--max-sweep-age``, failed rows with ``--fail-on-failed``, or a database that cannot be
read. A few bounded, indexed queries per database; reasons on standard error, never a
traceback.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from celery_outbox.config import SHORTEST, Seconds
from celery_outbox.health import check
from django_outbox.management.outbox_commands._arguments import seconds
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)

HELP = "Exit 0 when the outbox is healthy, 1 with one line per reason (a probe)."
#: Accepted ``--max-pending-age`` and ``--max-sweep-age``: up to a week.
AGE = Seconds(minimum=SHORTEST, maximum=7 * 24 * 3600.0)


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument(
        "--max-pending-age",
        type=seconds(AGE),
        metavar="SECONDS",
        help="longest a due row may wait (default: outbox_publish_grace + 3 sweep intervals)",
    )
    parser.add_argument(
        "--max-sweep-age",
        type=seconds(AGE),
        metavar="SECONDS",
        help="longest since the last sweep (default: 3 outbox_sweep_interval)",
    )
    parser.add_argument(
        "--fail-on-failed", action="store_true", help="unhealthy while any row is failed"
    )


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    reasons = check(
        context.app,
        max_pending_age=_age(options["max_pending_age"]),
        max_sweep_age=_age(options["max_sweep_age"]),
        fail_on_failed=options["fail_on_failed"],
        aliases=context.aliases,
    )
    if not reasons:
        command.stdout.write("healthy: " + ", ".join(alias_name(a) for a in context.aliases))
        return
    for reason in reasons:
        command.stderr.write(reason)
    raise SystemExit(1)


def _age(value: float | None) -> timedelta | None:
    return None if value is None else AGE.convert(value)
