"""Cancel pending outbox rows from Django: the one entry the admin, ``manage.py outbox
cancel`` and Python code use.

The cancel itself is the store's (:meth:`DjangoOutboxStore.cancel_pending`: lock the
chosen ``pending`` rows, delete them, close their workflows as ``cancelled``) followed by
Celery's revoke after commit: :mod:`celery_outbox.cancelling`, which says what a cancel
guarantees. This module adds what Django has: one admin-log entry per row
(``django.contrib.admin``'s ``LogEntry``: who and when), and the user named in the log.
Every cancel that commits is logged (``WARNING`` on this module's logger: who, and the
task ids), including one given no user, which has no admin-log entry.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import router, transaction
from django.db.models import QuerySet

from celery_outbox.cancelling import (
    CancelResult,
    Revocation,
    after_commit,
    announce,
    result,
    revoke,
)
from celery_outbox.long_text import bounded_logger
from celery_outbox.registry import store_for
from django_outbox.celery_app import outbox_app

__all__ = ["LOG_MESSAGE", "CancelResult", "Canceller", "cancel_messages", "revoke"]

#: Who cancels: a user, a username, or ``None`` (no admin-log entry: no user to record).
Canceller = AbstractBaseUser | str | None

logger = bounded_logger(__name__)

#: The admin-log text of a cancelled row.
LOG_MESSAGE = "Cancelled (never to be published); revoke sent for task id {task_id}."


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
    store = store_for(app)
    revocation = Revocation()
    with transaction.atomic(using=alias):
        selected = list(rows.order_by("id").values_list("id", flat=True))
        cancelled = store.cancel_pending(ids=selected, now=store.now(using=alias), using=alias)
        if user is not None:
            _log(user, rows.model, [(c.id, c.task_id, c.task_name) for c in cancelled])
        after_commit(
            app,
            cancelled,
            on_commit=lambda callback: transaction.on_commit(callback, using=alias),
            revocation=revocation,
            announce=lambda task_ids: _announce(alias, user, task_ids),
        )
    return result(cancelled, skipped=len(selected) - len(cancelled), revocation=revocation)


def _announce(alias: str, user: AbstractBaseUser | None, task_ids: list[str]) -> None:
    """Log a committed cancel on this module's logger: a record even when no user was given."""
    who = "no user (not in the admin log)" if user is None else repr(user.get_username())
    announce(task_ids, by=who, where=alias, log=logger)


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
