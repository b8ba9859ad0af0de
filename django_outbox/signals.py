"""Django signals of celery-outbox, re-sent from the core's Celery signals.

Connect receivers as for any Django signal::

    from django_outbox.signals import task_dead_lettered

    @receiver(task_dead_lettered)
    def alert(sender, letter_id, task_id, exception, **kwargs): ...

=========================  ==================  ========================================
signal                     ``sender``          keyword arguments
=========================  ==================  ========================================
``message_published``      the Celery app      ``task_ids``, ``messages``, ``path``
``task_dead_lettered``     the task            ``letter_id``, ``task_id``, ``exception``
``dead_letter_requeued``   as the core sends   ``letter_id``, ``task_id`` (new), ``by``
``task_duplicate_skipped`` the task            ``task_id``, ``completed_at`` (first run's)
=========================  ==================  ========================================
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

from celery_outbox import signals as core

#: Outbox rows reached the broker.
message_published = Signal()
#: A task ended without a retry and became a dead letter.
task_dead_lettered = Signal()
#: A dead letter was requeued under a new task id.
dead_letter_requeued = Signal()

#: An atomic task's duplicate delivery was skipped: its task id had already completed.
task_duplicate_skipped = Signal()

#: (core signal, Django signal) pairs that :func:`connect` links.
_FORWARDS = (
    (core.message_published, message_published),
    (core.task_dead_lettered, task_dead_lettered),
    (core.dead_letter_requeued, dead_letter_requeued),
    (core.task_duplicate_skipped, task_duplicate_skipped),
)


def _forwarder(django_signal: Signal) -> Any:
    def forward(sender: Any = None, signal: Any = None, **kwargs: Any) -> None:
        django_signal.send(sender=sender, **kwargs)

    return forward


#: One forwarding receiver per Django signal, built once so ``connect`` is idempotent.
_RECEIVERS = [
    (source, _forwarder(target), index) for index, (source, target) in enumerate(_FORWARDS)
]


def connect() -> None:
    """Re-send the core's signals as this module's Django signals (idempotent)."""
    for source, receiver, index in _RECEIVERS:
        source.connect(receiver, weak=False, dispatch_uid=f"django_outbox.signals.{index}")


def disconnect() -> None:
    """Undo :func:`connect`."""
    for source, receiver, index in _RECEIVERS:
        source.disconnect(receiver, dispatch_uid=f"django_outbox.signals.{index}")
