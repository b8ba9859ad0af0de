"""A cancel racing a sweeper, with a real worker on real PostgreSQL and a real broker.

The sweeper has claimed the row and is about to publish it when the operator cancels:
the cancel deletes the row and reports it in flight, the revoke reaches the worker (its
``inspect().revoked()`` lists the task id), the sweeper then publishes its claim, and the
worker discards the message instead of running it. A sentinel dispatched afterwards
shows the worker got past it (a solo worker takes its queue in order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_outbox.clock import utcnow
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from django_outbox.cancelling import cancel_messages
from django_outbox.models import OutboxMessage
from django_outbox.store.transactions import settle
from tests.django.conftest import World
from tests.django.helpers import later, postgres_only
from tests.worker import WorkerProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), postgres_only]


def revoked_on_workers(world: World) -> set[str]:
    """The task ids the running workers hold as revoked."""
    replies = world.app.control.inspect(timeout=1.0).revoked() or {}
    return {task_id for ids in replies.values() for task_id in ids}


def test_a_row_claimed_by_a_sweeper_is_revoked_on_the_worker(
    world: World, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker()
    doomed = world.record.apply_async((None,), countdown=3600)  # parked: no publisher has it
    row = OutboxMessage.objects.get(task_id=doomed.id)
    row.options["headers"]["eta"] = None  # now due: the sweeper publishes it without an ETA
    now = utcnow()
    OutboxMessage.objects.filter(pk=row.pk).update(options=row.options, available_at=now)
    claim = store_for(world.app).claim([row.pk], now=now, lease_until=later(now, 60))
    assert [m.task_id for m in claim.messages] == [doomed.id]
    row_id = row.pk

    result = cancel_messages(OutboxMessage.objects.filter(pk=row_id), app=world.app)

    assert result.cancelled == {row_id: doomed.id}
    assert (result.in_flight, result.revoked) == ((doomed.id,), True)
    wait_for(lambda: doomed.id in revoked_on_workers(world), timeout=20, what="the revoke")
    report = relay_for(world.app).publish_claim(claim)  # the sweeper goes on
    assert report.published == (row_id,)
    sentinel = world.record.delay(None)
    runs: list[dict[str, Any]] = world.wait_for_runs(1)
    assert [run["task_id"] for run in runs] == [sentinel.id]
    wait_for(lambda: doomed.id in worker.log_text(), timeout=10, what="the discard logged")
    assert f"Discarding revoked task: django_e2e.record[{doomed.id}]" in worker.log_text()
    assert settle()  # the sentinel's row is deleted on a thread, a moment after its publish
    assert not OutboxMessage.objects.exists()
