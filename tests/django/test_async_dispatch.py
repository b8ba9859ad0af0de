"""``await task.adelay()`` with the Django store, on real PostgreSQL and Redis.

An async dispatch runs in ``sync_to_async(thread_sensitive=True)``: committed at once
outside a transaction and published, joining a transaction a ``sync_to_async`` block opened;
a sync ``delay()`` on the event loop's thread is refused with an error naming ``adelay``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from celery import Celery, group
from django.contrib.auth.models import User
from django.db import connections, transaction

from celery_outbox import OutboxTask
from celery_outbox.dispatch.asynchronous import adispatch
from celery_outbox.exceptions import OutboxError
from celery_outbox.relay.relay import relay_for
from celery_outbox.state import reset
from django_outbox.models import OutboxMessage
from tests.brokers import delete_queue, new_queue_name, take_task_ids
from tests.worker import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "async_django.record"


def record(n: int) -> int:
    """The task's body (never run here: the tests read the queue)."""
    return n


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    queue = new_queue_name()
    made = Celery("async-django", broker=redis_url, set_as_current=False)
    made.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    made.task(base=OutboxTask, name=NAME, shared=False)(record)
    made.conf.async_test_queue = queue
    yield made
    relay_for(made).close()
    reset(made)
    made.close()
    delete_queue(redis_url, queue)


def queued(app: Celery, redis_url: str) -> list[str]:
    return take_task_ids(redis_url, app.conf.async_test_queue)


def run(coro: Any) -> Any:
    """``asyncio.run``, then close the connections of the thread Django ran sync code on."""
    try:
        return asyncio.run(coro)
    finally:
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


def test_adelay_outside_a_transaction_commits_and_publishes(app: Celery, redis_url: str) -> None:
    result = run(app.tasks[NAME].adelay(1))

    assert queued(app, redis_url) == [result.id]
    # Published rows are deleted off the request, soon after the publish.
    wait_for(
        lambda: not OutboxMessage.objects.filter(status="pending").exists(),
        timeout=10,
        what="the published row's delete",
    )


def test_adelay_joins_the_transaction_of_the_sync_block_it_runs_in(
    app: Celery, redis_url: str
) -> None:
    task = app.tasks[NAME]

    def place(commit: bool) -> str:
        with transaction.atomic():
            User.objects.create(username=f"async-{commit}")
            task_id = str(task.delay(2).id)  # on Django's sync thread: allowed
            transaction.set_rollback(not commit)
        return task_id

    async def view() -> tuple[str, str]:
        kept = await sync_to_async(place, thread_sensitive=True)(True)
        dropped = await sync_to_async(place, thread_sensitive=True)(False)
        return kept, dropped

    kept, _dropped = run(view())
    assert queued(app, redis_url) == [kept]
    assert list(User.objects.values_list("username", flat=True)) == ["async-True"]


def test_aapply_async_takes_the_options_and_a_group_dispatches_through_adispatch(
    app: Celery, redis_url: str
) -> None:
    task = app.tasks[NAME]

    async def view() -> list[str]:
        one = await task.aapply_async((3,), task_id="async-fixed-id", countdown=0)
        many = await adispatch(app, group(task.s(i) for i in range(3)).apply_async)
        return [str(one.id), *(str(child.id) for child in many.results)]

    ids = run(view())
    assert ids[0] == "async-fixed-id"
    assert sorted(queued(app, redis_url)) == sorted(ids)


def test_a_sync_delay_on_the_event_loop_names_adelay(app: Celery, redis_url: str) -> None:
    async def view() -> None:
        app.tasks[NAME].delay(4)

    with pytest.raises(OutboxError, match="adelay"):
        run(view())
    assert queued(app, redis_url) == []
    assert not OutboxMessage.objects.exists()
