"""``outbox sweep``: one pass of the sweeper over every outbox database.

It does what the beat sweep does: publish the due rows, then (with
``outbox_keep_published`` > 0) delete one batch of published rows older than that, and
one batch of ``CompletedTask`` rows older than ``outbox_keep_completed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery_outbox.console.status import alias_name
from celery_outbox.exceptions import StoreError
from celery_outbox.relay.sweeper import Sweeper, SweepReport

HELP = (
    "Publish the due rows left behind, purge old published rows and completed atomic tasks "
    "(one sweep, as beat does)."
)


def sweep(
    sweeper: Sweeper, aliases: Sequence[str | None], *, write: Callable[[str], object]
) -> list[str]:
    """Sweep each of ``aliases``, writing one line each; the errors of the databases that
    failed (the others are swept). The sweeper's relay is closed at the end.
    """
    failed: list[str] = []
    try:
        for alias in aliases:
            try:
                report = (
                    sweeper.sweep(alias)
                    + sweeper.purge_expired(alias)
                    + sweeper.purge_completed(alias)
                )
            except StoreError as exc:
                failed.append(f"database {alias_name(alias)}: {exc}")
                continue
            write(describe(alias, report, keep_published=bool(sweeper.config.keep_published)))
    finally:
        sweeper.relay.close()
    return failed


def describe(alias: str | None, report: SweepReport, *, keep_published: bool) -> str:
    """The line of one database's sweep."""
    return (
        f"{alias_name(alias)}: published {report.published}, rescheduled "
        f"{report.rescheduled}, failed {report.failed} in {report.batches} batch(es)"
        + (f", purged {report.purged}" if keep_published else "")
        + (
            f", purged {report.purged_completed} completed task(s)"
            if report.purged_completed
            else ""
        )
        + (" (time budget spent; rows left)" if report.more else "")
    )
