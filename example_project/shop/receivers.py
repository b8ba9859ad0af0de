"""Fail a notification over to the next channel when its task becomes a dead letter.

The ``task_dead_lettered`` signal is sent by the worker right after the dead letter is
written and *before* the task message is acknowledged (``OutboxTask`` is ``acks_late``):
if the worker dies in between, the message is delivered again and the fail-over runs
then. The fail-over itself (mark this channel dead, dispatch the next) is one
transaction, and the next channel's task goes through the outbox like any other.
"""

from __future__ import annotations

from typing import Any

from django_outbox.signals import task_dead_lettered

#: Names of the channel tasks whose dead letters fail over.
CHANNEL_TASK_NAMES = frozenset({"shop.send_push", "shop.send_sms", "shop.send_messenger"})


def on_dead_letter(sender: Any, letter_id: int, **kwargs: Any) -> None:
    """Receiver of ``task_dead_lettered``: fail the channel tasks over."""
    if getattr(sender, "name", None) in CHANNEL_TASK_NAMES:
        from shop.services import fail_over

        fail_over(letter_id)


def connect() -> None:
    """Connect :func:`on_dead_letter` (idempotent)."""
    task_dead_lettered.connect(on_dead_letter, dispatch_uid="shop.fail_over")
