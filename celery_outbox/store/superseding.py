"""When a dispatch takes the place of the pending row of its task id.

A task id is an idempotency key: while a row with that id is ``pending``, a second
dispatch with the same id writes nothing, because the pending row will deliver that call.
But a pending row is not always undelivered: its publisher deletes it only after the broker
confirmed the message, so for a moment a row whose message a worker may already be running
is still ``pending``. Celery reuses a task id on purpose once its message was delivered:
``Task.replace()`` sends the replacement, the chord body of a replacing group or the last
step of a replacing chain under the replaced task's id. Swallowed by the key, that dispatch
would vanish, and its result would never arrive.

So a dispatch *supersedes* the pending row of its id (the store deletes that row, only while
it is still pending, and inserts the new one, in the caller's transaction) when that row's
message has necessarily been delivered already:

1. the dispatch is made by a run of that task id (the attempt running in this context):
   that run is the delivery of the id's message;
2. the new message is a later replacement generation than the row. Celery counts them in
   the ``replaced_task_nesting`` header: 0 for a dispatch, n + 1 for what a run of
   generation n hands its id to. A message of generation n + 1 is built only by a run of
   generation n, so a row of generation n or lower has been delivered. This covers the
   chord body and the chain's last step, which other tasks send later.

Anything else with a pending id is still a second dispatch of the same call (the same
generation, not from a run of that id), and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_outbox._compat import REPLACED_TASK_NESTING
from celery_outbox.store.base import Supersedes
from celery_outbox.store.records import NewMessage, StoredMessage


def generation(options: Mapping[str, Any]) -> int:
    """The replacement generation of a stored message's ``options`` (0 when none)."""
    headers = options.get("headers") or {}
    value = headers.get(REPLACED_TASK_NESTING) if isinstance(headers, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def superseding(message: NewMessage, *, running_task_id: str | None) -> Supersedes | None:
    """Which pending row of ``message``'s task id it supersedes (``None``: none).

    ``running_task_id`` is the id of the attempt running in this context, if any.
    """
    if running_task_id is not None and running_task_id == message.task_id:
        return _delivered
    newer = generation(message.options)
    if newer <= 0:
        return None
    return lambda row: generation(row.options) < newer


def _delivered(row: StoredMessage) -> bool:
    return True
