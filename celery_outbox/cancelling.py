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
(``WARNING`` on this module's logger: who, and the task ids).

The Django surfaces (admin button, ``manage.py outbox cancel``,
``django_outbox.cancelling.cancel_messages``) cancel through the same store call and add
an admin-log entry per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from kombu.exceptions import KombuError

from celery_outbox.broker import Deadline, close, connect
from celery_outbox.config import OutboxConfig
from celery_outbox.long_text import bounded_logger
from celery_outbox.records import CancelledRow
from celery_outbox.registry import store_for

logger = bounded_logger(__name__)

#: How many task ids a cancel's log line names.
ANNOUNCED_IDS = 20


@dataclass(frozen=True, kw_only=True)
class CancelResult:
    """What a cancel did.

    ``cancelled`` maps each deleted row's id to its task id; ``in_flight`` lists the task
    ids of those a publisher had taken (they may reach a worker: the revoke is what stops
    them); ``skipped`` counts what was chosen but not cancelled (not ``pending``, or not
    found). ``revoked`` says whether the revoke broadcast was sent (``False`` until the
    caller's transaction commits, when the cancel ran inside one), ``revoke_error`` why
    it failed.
    """

    cancelled: dict[int, str] = field(default_factory=dict)
    in_flight: tuple[str, ...] = ()
    skipped: int = 0
    revoked: bool = False
    revoke_error: str = ""


def cancel(
    app: Celery,
    *,
    ids: Sequence[int] = (),
    task_ids: Sequence[str] = (),
    by: str = "",
    using: str | None = None,
) -> CancelResult:
    """Cancel the ``pending`` rows with these row ids or task ids, on ``app``'s store.

    The rows are deleted and their workflows closed in the caller's transaction (or one
    of their own); the revoke is sent after it commits. ``by`` names who cancels, for the
    log.
    """
    store = store_for(app)
    rows = store.cancel_pending(
        ids=list(ids), task_ids=list(task_ids), now=store.now(using=using), using=using
    )
    outcome: dict[str, Any] = {}
    after_commit(
        app,
        rows,
        on_commit=lambda callback: store.on_commit(callback, using=using),
        outcome=outcome,
        announce=lambda task_ids: announce(task_ids, by=by or "no name given", where=using),
    )
    chosen = len(set(ids)) + len(set(task_ids))
    found = len({r.id for r in rows} & set(ids)) + len({r.task_id for r in rows} & set(task_ids))
    return result(rows, skipped=chosen - found, outcome=outcome)


def after_commit(
    app: Celery,
    rows: Sequence[CancelledRow],
    *,
    on_commit: Callable[[Callable[[], None]], None],
    outcome: dict[str, Any],
    announce: Callable[[list[str]], None],
) -> None:
    """Once the cancel's transaction commits: the revoke of the cancelled task ids (its
    outcome into ``outcome``), then ``announce`` of them."""
    if not rows:
        return
    task_ids = list(dict.fromkeys(row.task_id for row in rows))
    on_commit(lambda: outcome.update(revoke(app, task_ids)))
    on_commit(lambda: announce(task_ids))


def result(rows: Sequence[CancelledRow], *, skipped: int, outcome: dict[str, Any]) -> CancelResult:
    """The :class:`CancelResult` of ``rows`` (``outcome``: the revoke's, once sent)."""
    return CancelResult(
        cancelled={row.id: row.task_id for row in rows},
        in_flight=tuple(row.task_id for row in rows if row.leased),
        skipped=skipped,
        revoked=bool(outcome.get("revoked")),
        revoke_error=str(outcome.get("error", "")),
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


def announce(task_ids: list[str], *, by: str, where: str | None) -> None:
    """Log a committed cancel: who, and the task ids (the first :data:`ANNOUNCED_IDS`)."""
    shown = ", ".join(task_ids[:ANNOUNCED_IDS])
    if len(task_ids) > ANNOUNCED_IDS:
        shown += f" and {len(task_ids) - ANNOUNCED_IDS} more"
    logger.warning(
        "Cancelled %d outbox row(s) on database %r by %s, never to be published: task ids %s",
        len(task_ids),
        where or "default",
        by,
        shown,
    )
