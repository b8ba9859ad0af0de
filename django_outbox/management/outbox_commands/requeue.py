"""``outbox requeue``: requeue dead letters chosen by task, exception type, time or id.

Only ``dead`` letters are requeued, each in its own transaction through the core, so one
that cannot be requeued (its task is no longer registered) does not stop the others; the
command then fails listing them. With no filter at all it refuses unless ``--all`` is
given. ``--since``/``--until`` bound ``failed_at`` and must carry a timezone
(``2024-05-01T12:00:00+00:00`` or ``...Z``): a naive time is an error naming the value,
never silently read in some zone.
"""

from __future__ import annotations

from argparse import ArgumentParser, ArgumentTypeError
from datetime import datetime, timezone
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from celery_outbox.config import Count
from django_outbox.dead_letters import RequeueResult, requeue_letters
from django_outbox.management.outbox_commands._arguments import count
from django_outbox.management.outbox_commands._context import (
    add_database_argument,
    alias_name,
    load_context,
)
from django_outbox.models import DeadLetterQuerySet

HELP = "Requeue dead letters by --task, --exception, --since/--until or --id (--dry-run)."

#: Options that select letters; at least one (or ``--all``) is required.
FILTERS = ("task", "exception", "since", "until", "id")
#: Accepted ``--id``: a dead letter id is a ``bigint``.
LETTER_ID = Count(minimum=1, maximum=2**63 - 1, unit="(a dead letter id)")


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--task", action="append", metavar="NAME", help="task name (repeatable)")
    parser.add_argument(
        "--exception",
        action="append",
        metavar="TYPE",
        help="exception type: dotted path or class name (repeatable)",
    )
    parser.add_argument(
        "--since",
        type=aware_datetime,
        metavar="ISO",
        help="failed at or after this aware ISO 8601 time",
    )
    parser.add_argument(
        "--until", type=aware_datetime, metavar="ISO", help="failed before this aware ISO 8601 time"
    )
    parser.add_argument(
        "--id",
        action="append",
        type=count(LETTER_ID),
        metavar="ID",
        help="dead letter id (repeatable)",
    )
    parser.add_argument("--all", action="store_true", help="every dead letter (no filter)")
    parser.add_argument("--dry-run", action="store_true", help="list, requeue nothing")
    parser.add_argument("--by", default="manage.py", help="recorded as requeued_by")


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    if not options["all"] and not any(options[name] for name in FILTERS):
        raise CommandError(
            "outbox requeue: give --task, --exception, --since, --until or "
            "--id to choose dead letters, or --all for every one of them."
        )
    check_by(options["by"])
    context = load_context(options["database"])
    failures: list[str] = []
    for alias in context.aliases:
        letters = select_letters(options, using=alias_name(alias))
        if options["dry_run"]:
            write_dry_run(command, letters, alias_name(alias))
            continue
        result = requeue_letters(letters, by=options["by"], app=context.app)
        write_result(command, result, alias_name(alias))
        failures += [f"#{pk}: {why}" for pk, why in result.failed.items()]
    if failures:
        raise CommandError(
            f"outbox requeue: {len(failures)} dead letter(s) could not be "
            "requeued:\n" + "\n".join(failures)
        )


def aware_datetime(value: str) -> datetime:
    """Parse an ISO 8601 time; a naive one is an error naming it.

    Raises
    ------
    ArgumentTypeError
        Reported by argparse as ``argument --since: ...`` (a ``CommandError``).
    """
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ArgumentTypeError(f"{value!r} is not an ISO 8601 time ({exc}).") from exc
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ArgumentTypeError(
            f"{value!r} has no timezone: add one, e.g. {value}+00:00 "
            "(times are never guessed in a local zone)."
        )
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError as exc:
        raise ArgumentTypeError(
            f"{value!r} is out of range: give a time from 0001-01-01 to 9999-12-31 in UTC."
        ) from exc


def check_by(by: str) -> None:
    """``--by`` fits its column (``requeued_by``).

    Raises
    ------
    CommandError
        Naming the value and the longest accepted length.
    """
    from django_outbox.models import DeadLetter

    longest: int | None = getattr(DeadLetter._meta.get_field("requeued_by"), "max_length", None)
    if longest is not None and len(by) > longest:
        raise CommandError(
            f"outbox requeue: --by {by!r} is not accepted: give at most {longest} "
            f"characters (it has {len(by)})."
        )


def select_letters(options: dict[str, Any], *, using: str) -> DeadLetterQuerySet:
    """The ``dead`` letters of database ``using`` matching the command's filters."""
    from django_outbox.models import DeadLetter

    letters = DeadLetter.objects.using(using).dead()
    if options["task"]:
        letters = letters.filter(task_name__in=options["task"])
    if options["exception"]:
        letters = letters.filter(exception_filter(options["exception"]))
    if options["since"]:
        letters = letters.filter(failed_at__gte=options["since"])
    if options["until"]:
        letters = letters.filter(failed_at__lt=options["until"])
    if options["id"]:
        letters = letters.filter(pk__in=options["id"])
    ordered: DeadLetterQuerySet = letters.order_by("failed_at", "id")
    return ordered


def exception_filter(types: list[str]) -> Q:
    """Letters whose exception type is one of ``types``, by dotted path or class name."""
    query = Q()
    for name in types:
        query |= Q(exception_type=name) | Q(exception_type__endswith=f".{name}")
    return query


def write_dry_run(command: BaseCommand, letters: DeadLetterQuerySet, alias: str) -> None:
    """List the letters a real run would requeue."""
    rows = list(letters.values_list("id", "task_name", "task_id", "exception_type", "failed_at"))
    for pk, task_name, task_id, exc_type, failed_at in rows:
        command.stdout.write(
            f"would requeue #{pk} {task_name}[{task_id}] {exc_type} failed {failed_at.isoformat()}"
        )
    command.stdout.write(f"{alias}: would requeue {len(rows)} dead letter(s) (dry run)")


def write_result(command: BaseCommand, result: RequeueResult, alias: str) -> None:
    """Print each requeued letter's new task id, then the counts."""
    for pk, task_id in result.requeued.items():
        command.stdout.write(f"requeued #{pk} as task {task_id}")
    command.stdout.write(
        f"{alias}: requeued {len(result.requeued)} dead letter(s), {len(result.failed)} failed, "
        f"{result.skipped} skipped (discarded or requeued meanwhile)"
    )
