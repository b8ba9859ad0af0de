"""The logic of the admin actions, as plain functions testable without a request.

The logic of the admin actions, as plain functions testable without a request.

The dead letter actions requeue and discard through :mod:`django_outbox.dead_letters`
(as ``requeued_by``, :func:`actor_name` of the user acting). Each outbox message action
takes a queryset, keeps only the rows in a state the action applies to, delegates to the
core, and returns counts. Each ``*_messages`` function turns counts into ``(level, text)``
pairs for ``ModelAdmin.message_user``, translated with ``ngettext`` (modelled on
``django_celery_beat.admin.PeriodicTaskAdmin.enable_tasks``).

Requeue or discard a group of dead letters: the ``dead`` letters of one task and one
exception type, from the admin's overview page.

A group action acts on the letters the confirmation page counted: those with an id up to
the newest one seen then (``upto``; letters that failed since are left for the next
look), and at most :data:`GROUP_BATCH` of them, the oldest failure first, so one request
stays short (``manage.py outbox requeue --task T --exception E`` does any number). Each
letter is requeued or discarded in its own transaction through
:mod:`django_outbox.dead_letters`, as the list's actions do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import Celery
from django.contrib import messages
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils.translation import gettext, ngettext

from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.cancelling import CancelResult
from django_outbox.celery_app import outbox_app
from django_outbox.dead_letters import RequeueResult, discard_letters, requeue_letters
from django_outbox.models import DeadLetter, OutboxMessageQuerySet

# --- The logic of the admin actions, as plain functions testable without a request.

#: A message for ``message_user``: its level (``django.contrib.messages``) and text.
UserMessage = tuple[int, str]

#: How many failure reasons a requeue report lists before "and N more".
MAX_REASONS = 5


def actor_name(user: AbstractBaseUser | AnonymousUser | str) -> str:
    """What ``requeued_by`` records for ``user``: its username (or the string given)."""
    return user if isinstance(user, str) else user.get_username()


# -- dead letters --------------------------------------------------------------------------
def requeue_messages(result: RequeueResult) -> list[UserMessage]:
    """The report of a requeue: successes, letters skipped, and failures with reasons."""
    report: list[UserMessage] = []
    if result.requeued or not (result.skipped or result.failed):
        count = len(result.requeued)
        report.append(
            (
                messages.SUCCESS,
                ngettext(
                    "%(count)d dead letter was requeued.",
                    "%(count)d dead letters were requeued.",
                    count,
                )
                % {"count": count},
            )
        )
    if result.skipped:
        report.append(
            (
                messages.WARNING,
                ngettext(
                    "%(count)d selected letter was skipped: it is not dead (already requeued or "
                    "discarded).",
                    "%(count)d selected letters were skipped: they are not dead (already "
                    "requeued or discarded).",
                    result.skipped,
                )
                % {"count": result.skipped},
            )
        )
    if result.failed:
        report.append((messages.ERROR, _failures_text(result.failed)))
    return report


def _failures_text(failed: dict[int, str]) -> str:
    count = len(failed)
    reasons = "; ".join(f"#{pk}: {why}" for pk, why in list(failed.items())[:MAX_REASONS])
    more = count - MAX_REASONS
    text = ngettext(
        "%(count)d dead letter could not be requeued: %(reasons)s",
        "%(count)d dead letters could not be requeued: %(reasons)s",
        count,
    ) % {"count": count, "reasons": reasons}
    if more > 0:
        text += " " + ngettext("(and %(more)d more)", "(and %(more)d more)", more) % {"more": more}
    return text


def discard_messages(selected: int, discarded: int) -> list[UserMessage]:
    """The report of a discard of ``selected`` letters of which ``discarded`` were dead."""
    report: list[UserMessage] = [
        (
            messages.SUCCESS,
            ngettext(
                "%(count)d dead letter was discarded.",
                "%(count)d dead letters were discarded.",
                discarded,
            )
            % {"count": discarded},
        )
    ]
    skipped = selected - discarded
    if skipped > 0:
        report.append(
            (
                messages.WARNING,
                ngettext(
                    "%(count)d selected letter was skipped: it is not dead.",
                    "%(count)d selected letters were skipped: they are not dead.",
                    skipped,
                )
                % {"count": skipped},
            )
        )
    return report


# -- outbox messages -----------------------------------------------------------------------
def publish_messages_now(
    rows: OutboxMessageQuerySet, *, app: Celery | None = None, now: datetime | None = None
) -> int:
    """Make the ``pending`` rows of ``rows`` due now and publish them after commit.

    Each row is validated as the sweeper validates it: a row naming a task the app
    does not know, or whose payload the app does not accept, becomes ``failed`` with
    the reason instead of being published. Returns how many rows were made due. The
    publish itself never raises (a broker that is down leaves the rows to the sweeper).
    """
    app = app or outbox_app()
    store = store_for(app)
    alias = rows.db
    ids = list(rows.pending().values_list("id", flat=True))
    with transaction.atomic(using=alias):
        changed = store.reset(ids, now=now or store.now(using=alias), using=alias)
        if changed:
            store.on_commit(functools.partial(_publish, app, ids, using=alias), using=alias)
    return changed


def _publish(app: Celery, ids: list[int], *, using: str) -> None:
    """Publish rows ``ids`` now (never raises: see :meth:`Relay.publish_ids`)."""
    relay_for(app).publish_ids(ids, using=using)


def reset_failed_messages(
    rows: OutboxMessageQuerySet, *, app: Celery | None = None, now: datetime | None = None
) -> int:
    """Make the ``failed`` rows of ``rows`` pending again, due now, with fresh attempts.

    The sweeper publishes them on its next pass. A row whose task id already has
    another pending row is left alone. Returns how many rows were reset.
    """
    app = app or outbox_app()
    ids = list(rows.filter(status=MessageStatus.FAILED.value).values_list("id", flat=True))
    store = store_for(app)
    return store.reset(ids, now=now or store.now(using=rows.db), using=rows.db)


def publish_now_messages(selected: int, changed: int) -> list[UserMessage]:
    """The report of "publish now" for ``selected`` rows of which ``changed`` were pending."""
    report: list[UserMessage] = [
        (
            messages.SUCCESS,
            ngettext(
                "%(count)d outbox message is being published.",
                "%(count)d outbox messages are being published.",
                changed,
            )
            % {"count": changed},
        )
    ]
    return report + _skipped_rows(selected - changed, gettext("pending"))


def reset_messages(selected: int, changed: int) -> list[UserMessage]:
    """The report of "reset" for ``selected`` rows of which ``changed`` were reset."""
    report: list[UserMessage] = [
        (
            messages.SUCCESS,
            ngettext(
                "%(count)d failed outbox message was reset; the sweeper will publish it.",
                "%(count)d failed outbox messages were reset; the sweeper will publish them.",
                changed,
            )
            % {"count": changed},
        )
    ]
    return report + _skipped_rows(selected - changed, gettext("failed"))


def _skipped_rows(skipped: int, status: str) -> list[UserMessage]:
    if skipped <= 0:
        return []
    return [
        (
            messages.WARNING,
            ngettext(
                "%(count)d selected message was skipped: it is not %(status)s, or its task id "
                "already has a pending message.",
                "%(count)d selected messages were skipped: they are not %(status)s, or their "
                "task id already has a pending message.",
                skipped,
            )
            % {"count": skipped, "status": status},
        )
    ]


def cancel_report(result: CancelResult) -> list[UserMessage]:
    """The report of a cancel: rows cancelled, those in flight and the revoke, skips."""
    count = len(result.cancelled)
    report: list[UserMessage] = [
        (
            messages.SUCCESS,
            ngettext(
                "%(count)d outbox message was cancelled: it will not be published.",
                "%(count)d outbox messages were cancelled: they will not be published.",
                count,
            )
            % {"count": count},
        )
    ]
    if result.in_flight:
        level = messages.ERROR if result.revoke_error else messages.WARNING
        outcome = (
            gettext("revoked")
            if result.revoked
            else result.revoke_error or gettext("revoked when the transaction commits")
        )
        report.append(
            (
                level,
                ngettext(
                    "%(count)d of them was being published; its task id is %(outcome)s.",
                    "%(count)d of them were being published; their task ids are %(outcome)s.",
                    len(result.in_flight),
                )
                % {"count": len(result.in_flight), "outcome": outcome},
            )
        )
    if result.skipped:
        report.append(
            (
                messages.WARNING,
                ngettext(
                    "%(count)d selected message was skipped: it is not pending.",
                    "%(count)d selected messages were skipped: they are not pending.",
                    result.skipped,
                )
                % {"count": result.skipped},
            )
        )
    return report


# --- Requeue or discard a group of dead letters: the ``dead`` letters of one task and one

#: Letters one group action acts on at most.
GROUP_BATCH = 1000

#: A group's letters counted at most on the confirmation page.
COUNT_CAP = 10_000


@dataclass(frozen=True, kw_only=True)
class LetterGroupKey:
    """Which letters a group action acts on: ``dead`` letters of ``task_name`` failed with
    ``exception_type`` whose id is at most ``upto``.
    """

    task_name: str
    exception_type: str
    upto: int

    @classmethod
    def parse(cls, data: Any) -> LetterGroupKey:
        """The key from a request's ``task``, ``exception`` and ``upto`` parameters.

        Raises
        ------
        ValueError
            A parameter is missing, or ``upto`` is not a whole number.
        """
        task, exception, upto = (data.get(name, "") for name in ("task", "exception", "upto"))
        if not task or not exception:
            raise ValueError(
                f"task={task!r}, exception={exception!r}: both are required (a task name "
                "and an exception type, as the overview's groups give them)."
            )
        try:
            limit = int(upto)
        except (TypeError, ValueError):
            raise ValueError(f"upto={upto!r} is not accepted: give a whole number.") from None
        return cls(task_name=task, exception_type=exception, upto=limit)


def group_letters(key: LetterGroupKey, *, using: str) -> QuerySet[Any]:
    """Every ``dead`` letter ``key`` names."""
    letters: QuerySet[Any] = DeadLetter.objects.using(using).filter(
        status=DeadLetterStatus.DEAD.value,
        task_name=key.task_name,
        exception_type=key.exception_type,
        id__lte=key.upto,
    )
    return letters


def count_group(key: LetterGroupKey, *, using: str) -> tuple[int, bool]:
    """How many letters ``key`` names, up to :data:`COUNT_CAP`; and whether there are more."""
    found = group_letters(key, using=using).order_by()[: COUNT_CAP + 1].count()
    return min(found, COUNT_CAP), found > COUNT_CAP


def batch(key: LetterGroupKey, *, using: str) -> QuerySet[Any]:
    """The oldest :data:`GROUP_BATCH` letters ``key`` names (one action's share)."""
    ids = list(
        group_letters(key, using=using)
        .order_by("failed_at", "id")
        .values_list("id", flat=True)[:GROUP_BATCH]
    )
    chosen: QuerySet[Any] = DeadLetter.objects.using(using).filter(id__in=ids)
    return chosen


def requeue_group(key: LetterGroupKey, *, by: str, using: str) -> RequeueResult:
    """Requeue one batch of the group (see the module)."""
    return requeue_letters(batch(key, using=using), by=by)


def discard_group(key: LetterGroupKey, *, using: str) -> tuple[int, int]:
    """Discard one batch of the group; ``(selected, discarded)``."""
    letters = batch(key, using=using)
    selected = letters.count()
    return selected, discard_letters(letters)
