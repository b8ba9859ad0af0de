"""``outbox cancel``: cancel pending (or parked) outbox rows by row id or task id.

Each cancelled row is deleted so no publisher ever publishes it, recorded in the admin log
as done by ``--by`` (an existing username; required unless ``--dry-run``), and its task id
is revoked through Celery once the delete committed (:mod:`django_outbox.cancelling`).
Rows that are not ``pending`` are skipped. The command fails when ``--by`` names no user,
or when the revoke could not be sent while a cancelled row was already in flight.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from celery_outbox.config import Count
from celery_outbox.store.records import TASK_ID_MAX_LENGTH
from django_outbox.cancelling import CancelResult, cancel_messages
from django_outbox.management.outbox_commands._arguments import count
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)
from django_outbox.models import OutboxMessageQuerySet

HELP = "Cancel pending or parked outbox rows by --id or --task (revoked too; --dry-run)."

#: Accepted ``--id``: an outbox row id is a ``bigint``.
ROW_ID = Count(minimum=1, maximum=2**63 - 1, unit="(an outbox row id)")


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument(
        "--id", action="append", type=count(ROW_ID), metavar="ID", help="row id (repeatable)"
    )
    parser.add_argument("--task", action="append", metavar="TASK_ID", help="task id (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="list, cancel nothing")
    parser.add_argument("--by", help="username recorded in the admin log (required)")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    check_options(options)
    context = load_context(options["database"])
    problems: list[str] = []
    for alias in context.aliases:
        rows = select_rows(options, using=alias_name(alias))
        if options["dry_run"]:
            write_dry_run(command, rows, alias_name(alias))
            continue
        try:
            result = cancel_messages(rows, by=options["by"], app=context.app)
        except LookupError as exc:
            by = options["by"]
            raise CommandError(f"outbox cancel: --by {by!r} is not accepted: {exc}.") from exc
        write_result(command, result, alias_name(alias))
        if result.in_flight and not result.revoked:
            problems.append(f"{alias_name(alias)}: {result.revoke_error}")
    if problems:
        raise CommandError(
            "outbox cancel: rows in flight were cancelled but not revoked:\n" + "\n".join(problems)
        )


def check_options(options: dict[str, Any]) -> None:
    """A selection is given, ``--by`` unless dry-running, and task ids fit their column."""
    if not options["id"] and not options["task"]:
        raise CommandError("outbox cancel: give --id ROW_ID or --task TASK_ID (repeatable).")
    if not options["dry_run"] and not options["by"]:
        raise CommandError(
            "outbox cancel: give --by USERNAME (the operator, recorded in the admin log)."
        )
    for task_id in options["task"] or ():
        if not task_id or len(task_id) > TASK_ID_MAX_LENGTH:
            raise CommandError(
                f"outbox cancel: --task {task_id!r} is not accepted: give a task id of 1 to "
                f"{TASK_ID_MAX_LENGTH} characters."
            )


def select_rows(options: dict[str, Any], *, using: str) -> OutboxMessageQuerySet:
    """The ``pending`` rows of database ``using`` with the given row ids or task ids."""
    from django_outbox.models import OutboxMessage

    query = Q(id__in=options["id"] or []) | Q(task_id__in=options["task"] or [])
    rows: OutboxMessageQuerySet = OutboxMessage.objects.using(using).pending().filter(query)
    ordered: OutboxMessageQuerySet = rows.order_by("id")
    return ordered


def write_dry_run(command: BaseCommand, rows: OutboxMessageQuerySet, alias: str) -> None:
    """List the rows a real run would cancel."""
    found = list(rows.values_list("id", "task_name", "task_id", "available_at"))
    for pk, task_name, task_id, due in found:
        command.stdout.write(f"would cancel #{pk} {task_name}[{task_id}] due {due.isoformat()}")
    command.stdout.write(f"{alias}: would cancel {len(found)} row(s) (dry run)")


def write_result(command: BaseCommand, result: CancelResult, alias: str) -> None:
    """Print each cancelled row, then the counts and the revoke's outcome."""
    for pk, task_id in result.cancelled.items():
        command.stdout.write(f"cancelled #{pk} task {task_id}")
    revoke = "revoke sent" if result.revoked else (result.revoke_error or "nothing to revoke")
    command.stdout.write(
        f"{alias}: cancelled {len(result.cancelled)} row(s), {len(result.in_flight)} in "
        f"flight, {result.skipped} skipped; {revoke}"
    )
