"""Cancel pending outbox rows on any store: a durable revoke.

In one transaction (the caller's when there is one) the store locks the chosen
``pending`` rows (due now or parked), deletes them and closes the workflow each was a
step of as ``cancelled``, with its chord joins (:meth:`OutboxStore.cancel_pending`), so
no publisher ever publishes them afterwards. Once that transaction commits, Celery's
revoke (``app.control.revoke``) is broadcast for every cancelled task id: a row a
publisher had already taken (``in_flight``) may be on the broker or in a worker, and the
workers that hear the revoke drop the message instead of running it.

So when a cancel reports a row cancelled, either no publisher took it (it is never
published), or it is reported ``in_flight`` and its revoke was sent once the delete
committed (``revoked``; ``revoke_error`` when the broker refused the broadcast). A revoke
reaches the workers running then (and those that sync revokes from them at start-up:
Celery's mingle, or ``--statedb``); Celery keeps a revoked id for three hours by default.
Rows neither pending nor found are skipped; ``failed`` rows are not cancelled (they are
not published unless reset: purge them instead). Every cancel that commits is logged
(``WARNING`` on this module's logger: who, and the task ids), and so is a revoke that
could not be sent (``ERROR`` when a cancelled row was in flight: it may still run). The
result tells the revoke once the cancel's transaction committed (:class:`Revocation`),
also when that is the caller's transaction, committed after :func:`cancel` returned.

The Django surfaces (admin button, ``manage.py outbox cancel``,
``django_outbox.cancelling.cancel_messages``) cancel through the same store call and add
an admin-log entry per row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from kombu.exceptions import KombuError

from celery_outbox.config import OutboxConfig
from celery_outbox.long_text import bounded_logger
from celery_outbox.publishing.broker import Deadline, close, connect
from celery_outbox.registry import store_for
from celery_outbox.store.records import TASK_ID_MAX_LENGTH, CancelledRow

logger = bounded_logger(__name__)

#: How many task ids a cancel's log line names.
ANNOUNCED_IDS = 20


@dataclass(eq=False)
class Revocation:
    """The revoke of a cancel's task ids, filled in once the cancel's transaction committed
    and the broadcast was tried: ``sent``, or ``error`` saying why not.
    """

    sent: bool = False
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class CancelResult:
    """What a cancel did.

    ``cancelled`` maps each deleted row's id to its task id; ``in_flight`` lists the task
    ids of those a publisher had taken (they may reach a worker: the revoke is what stops
    them); ``skipped`` counts what was chosen but not cancelled (not ``pending``, or not
    found). :attr:`revoked` and :attr:`revoke_error` read the revoke, sent once the
    cancel's transaction commits: ``False`` and ``""`` until then (for ever when it rolled
    back), the outcome after, also when the caller committed after the cancel returned.
    """

    cancelled: dict[int, str] = field(default_factory=dict)
    in_flight: tuple[str, ...] = ()
    skipped: int = 0
    revocation: Revocation = field(default_factory=Revocation)

    @property
    def revoked(self) -> bool:
        """Whether the revoke broadcast was sent."""
        return self.revocation.sent

    @property
    def revoke_error(self) -> str:
        """Why the revoke broadcast was not sent (``""`` when it was, or not yet tried)."""
        return self.revocation.error


def cancel(
    app: Celery,
    *,
    ids: Iterable[int] = (),
    task_ids: Iterable[str] = (),
    by: str = "",
    using: str | None = None,
) -> CancelResult:
    """Cancel the ``pending`` rows with these row ids or task ids, on ``app``'s store.

    The rows are deleted and their workflows closed in the caller's transaction (or one
    of their own); the revoke is sent after it commits. ``by`` names who cancels, for the
    log.

    Raises
    ------
    TypeError
        ``ids`` or ``task_ids`` is one string rather than a collection of them.
    ValueError
        A row id that is not a positive integer, or a task id that is not a string of 1
        to 255 characters: nothing is cancelled.
    """
    wanted_ids, wanted_tasks = chosen(ids, task_ids)
    store = store_for(app)
    rows = store.cancel_pending(
        ids=wanted_ids, task_ids=wanted_tasks, now=store.now(using=using), using=using
    )
    revocation = Revocation()
    after_commit(
        app,
        rows,
        on_commit=lambda callback: store.on_commit(callback, using=using),
        revocation=revocation,
        announce=lambda task_ids: announce(task_ids, by=by or "no name given", where=using),
    )
    found = len({r.id for r in rows} & set(wanted_ids))
    found += len({r.task_id for r in rows} & set(wanted_tasks))
    return result(rows, skipped=len(wanted_ids) + len(wanted_tasks) - found, revocation=revocation)


def chosen(ids: Iterable[int], task_ids: Iterable[str]) -> tuple[list[int], list[str]]:
    """The row ids and task ids a cancel is given, each once, checked (see :func:`cancel`:
    a string would be read as its characters, and Django reads ``"12"`` as row id 12).
    """
    for name, given in (("ids", ids), ("task_ids", task_ids)):
        if isinstance(given, (str, bytes)):
            raise TypeError(f"cancel: {name}={given!r} is a string: give a list of them.")
    rows = list(dict.fromkeys(ids))
    for row_id in rows:
        if not isinstance(row_id, int) or isinstance(row_id, bool) or row_id < 1:
            raise ValueError(f"cancel: row id {row_id!r} is not accepted: give a positive integer.")
    tasks = list(dict.fromkeys(task_ids))
    for task_id in tasks:
        if not isinstance(task_id, str) or not 0 < len(task_id) <= TASK_ID_MAX_LENGTH:
            raise ValueError(
                f"cancel: task id {task_id!r} is not accepted: give a string of 1 to "
                f"{TASK_ID_MAX_LENGTH} characters."
            )
    return rows, tasks


def after_commit(
    app: Celery,
    rows: Sequence[CancelledRow],
    *,
    on_commit: Callable[[Callable[[], None]], None],
    revocation: Revocation,
    announce: Callable[[list[str]], None],
) -> None:
    """Once the cancel's transaction commits: the revoke of the cancelled task ids (its
    outcome into ``revocation``, a failure logged), then ``announce`` of them.
    """
    if not rows:
        return
    task_ids = list(dict.fromkeys(row.task_id for row in rows))
    in_flight = [row.task_id for row in rows if row.leased]
    on_commit(lambda: _revoke_into(revocation, app, task_ids, in_flight))
    on_commit(lambda: announce(task_ids))


def result(rows: Sequence[CancelledRow], *, skipped: int, revocation: Revocation) -> CancelResult:
    """The :class:`CancelResult` of ``rows`` (``revocation``: filled once sent)."""
    return CancelResult(
        cancelled={row.id: row.task_id for row in rows},
        in_flight=tuple(row.task_id for row in rows if row.leased),
        skipped=skipped,
        revocation=revocation,
    )


def _revoke_into(
    revocation: Revocation, app: Celery, task_ids: list[str], in_flight: list[str]
) -> None:
    outcome = revoke(app, task_ids)
    revocation.sent = bool(outcome.get("revoked"))
    revocation.error = str(outcome.get("error", ""))
    if revocation.sent:
        return
    # Never silent: the caller may have committed long after the cancel returned.
    logger.log(
        logging.ERROR if in_flight else logging.WARNING,
        "Cancelled %d outbox row(s), %s; %d of them in flight and may still run: %s",
        len(task_ids),
        revocation.error,
        len(in_flight),
        ", ".join(in_flight[:ANNOUNCED_IDS]) or "none",
    )


def revoke(app: Celery, task_ids: list[str]) -> dict[str, Any]:
    """Broadcast Celery's revoke of ``task_ids`` (never terminating a running task).

    Bounded by ``outbox_publish_timeout`` as a publish is; returns ``{"revoked": True}``
    or ``{"error": why}`` (a broker that is down never fails the cancel: the rows are
    gone, and only rows already in flight needed the revoke).
    """
    deadline = Deadline.after(OutboxConfig.from_celery(app).publish_timeout)
    try:
        conn = connect(app, deadline)
    except (OSError, KombuError) as exc:
        return {"error": f"revoke not sent: {exc}"}
    try:
        app.control.revoke(task_ids, connection=conn)
    except (OSError, KombuError) as exc:
        return {"error": f"revoke not sent: {exc}"}
    finally:
        close(conn, deadline)
    return {"revoked": True}


def announce(
    task_ids: list[str], *, by: str, where: str | None, log: logging.Logger = logger
) -> None:
    """Log a committed cancel on ``log``: who, and the task ids (the first
    :data:`ANNOUNCED_IDS`).
    """
    shown = ", ".join(task_ids[:ANNOUNCED_IDS])
    if len(task_ids) > ANNOUNCED_IDS:
        shown += f" and {len(task_ids) - ANNOUNCED_IDS} more"
    log.warning(
        "Cancelled %d outbox row(s) on database %r by %s, never to be published: task ids %s",
        len(task_ids),
        where or "default",
        by,
        shown,
    )
