"""Cancel pending outbox rows: the one entry the admin, ``manage.py outbox cancel`` and
Python code use.

A cancel is a durable revoke. In one transaction it locks the selected ``pending`` rows
(due now or parked), writes one admin-log entry per row (``django.contrib.admin``'s
``LogEntry``: who and when) and deletes them, so no publisher ever publishes them
afterwards. After that transaction commits it sends Celery's revoke (``app.control.revoke``)
for every cancelled task id, in one broadcast: a row a publisher had already taken (its
lease, ``locked_until``, was set) may be on the broker or in a worker, and the workers that
hear the revoke drop the message instead of running it.

So when a cancel reports a row cancelled, either no publisher took it (it is never
published), or it is reported ``in_flight`` and its revoke was sent once the delete
committed (``revoked``; ``revoke_error`` when the broker refused the broadcast). A revoke
reaches the workers running then (and those that sync revokes from them at start-up:
Celery's mingle, or ``--statedb``); Celery keeps a revoked id for three hours by default.
Rows neither pending nor found are skipped. ``failed`` rows are not cancelled (they are
not published unless reset; delete them with ``outbox purge``).

Every cancel that commits is also logged (``WARNING`` on this module's logger: who, and the
task ids), including one given no user, which has no admin-log entry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import router, transaction
from django.db.models import QuerySet
from kombu.exceptions import KombuError

from celery_outbox.broker import Deadline, close, connect
from celery_outbox.config import OutboxConfig
from celery_outbox.records import MessageStatus
from django_outbox.celery_app import outbox_app

#: Who cancels: a user, a username, or ``None`` (no admin-log entry: no user to record).
Canceller = AbstractBaseUser | str | None

logger = logging.getLogger(__name__)

#: The admin-log text of a cancelled row.
LOG_MESSAGE = "Cancelled (never to be published); revoke sent for task id {task_id}."


@dataclass(frozen=True, kw_only=True)
class CancelResult:
    """What a cancel did.

    ``cancelled`` maps each deleted row's id to its task id; ``in_flight`` lists the task
    ids of those a publisher had taken (they may reach a worker: the revoke is what stops
    them); ``skipped`` counts selected rows that were not ``pending``. ``revoked`` says
    whether the revoke broadcast was sent (``False`` until the caller's transaction
    commits, when the cancel ran inside one), ``revoke_error`` why it failed.
    """

    cancelled: dict[int, str] = field(default_factory=dict)
    in_flight: tuple[str, ...] = ()
    skipped: int = 0
    revoked: bool = False
    revoke_error: str = ""


def cancel_messages(
    rows: QuerySet[Any], *, by: Canceller = None, app: Celery | None = None
) -> CancelResult:
    """Cancel the ``pending`` rows of ``rows`` (an ``OutboxMessage`` queryset).

    Raises
    ------
    LookupError
        ``by`` is a username no user has.
    """
    app = app or outbox_app()
    user = _user(by)
    alias = rows.db
    outcome: dict[str, Any] = {}
    with transaction.atomic(using=alias):
        selected = list(rows.order_by("id").values_list("id", flat=True))
        locked = list(
            rows.model.objects.using(alias)
            .select_for_update()
            .filter(id__in=selected, status=MessageStatus.PENDING.value)
            .order_by("id")
            .values_list("id", "task_id", "task_name", "locked_until")
        )
        cancelled = {pk: task_id for pk, task_id, _, _ in locked}
        if user is not None:
            _log(user, rows.model, [(pk, task_id, name) for pk, task_id, name, _ in locked])
        rows.model.objects.using(alias).filter(id__in=list(cancelled)).delete()
        if cancelled:
            task_ids = list(dict.fromkeys(cancelled.values()))
            transaction.on_commit(lambda: outcome.update(revoke(app, task_ids)), using=alias)
            transaction.on_commit(lambda: _announce(alias, user, task_ids), using=alias)
    return CancelResult(
        cancelled=cancelled,
        in_flight=tuple(task_id for _, task_id, _, lease in locked if lease is not None),
        skipped=len(selected) - len(cancelled),
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


#: How many task ids a cancel's log line names (the admin log has each row).
ANNOUNCED_IDS = 20


def _announce(alias: str, user: AbstractBaseUser | None, task_ids: list[str]) -> None:
    """Log a committed cancel: a record even when no user was given."""
    who = "no user (not in the admin log)" if user is None else repr(user.get_username())
    shown = ", ".join(task_ids[:ANNOUNCED_IDS])
    if len(task_ids) > ANNOUNCED_IDS:
        shown += f" and {len(task_ids) - ANNOUNCED_IDS} more"
    logger.warning(
        "Cancelled %d outbox row(s) on database %r by %s, never to be published: task ids %s",
        len(task_ids),
        alias,
        who,
        shown,
    )


def _user(by: Canceller) -> AbstractBaseUser | None:
    if by is None or isinstance(by, AbstractBaseUser):
        return by
    model = get_user_model()
    try:
        user: AbstractBaseUser = model._default_manager.get_by_natural_key(by)
    except model.DoesNotExist:
        raise LookupError(
            f"no user {by!r}: give the username of the operator cancelling "
            "(recorded in the admin log)"
        ) from None
    return user


def _log(user: AbstractBaseUser, model: type[Any], rows: list[tuple[int, str, str]]) -> None:
    """One admin-log deletion entry per cancelled row (when the admin is installed)."""
    if not rows or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import DELETION, LogEntry
    from django.contrib.contenttypes.models import ContentType

    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    entries = [
        LogEntry(
            user_id=user.pk,
            content_type=content_type,
            object_id=str(pk),
            object_repr=f"{name}[{task_id}]"[:200],
            action_flag=DELETION,
            change_message=LOG_MESSAGE.format(task_id=task_id),
        )
        for pk, task_id, name in rows
    ]
    LogEntry.objects.using(router.db_for_write(LogEntry)).bulk_create(entries)
