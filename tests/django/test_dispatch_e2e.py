"""End to end on real PostgreSQL, a real broker (Redis, then RabbitMQ) and a real worker.

``delay()`` inside ``atomic()`` writes an outbox row; the worker gets the task only after
COMMIT, and only if the transaction (and the savepoint around the call) committed.
A *sentinel* task dispatched last tells when the worker has drained the queue: a solo
worker runs its queue in order, so once the sentinel ran, any earlier message had too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext

from celery_outbox.state import reset
from celery_outbox.store.records import MessageStatus
from django_outbox.hooks import DispatchHook, dispatch_on
from django_outbox.models import OutboxMessage
from django_outbox.store.calls import clock_of
from django_outbox.store.transactions import settle
from tests.django.celery_app import create_app
from tests.django.conftest import World, close_app
from tests.django.helpers import database_url, postgres_only, rolled_back

# The worker must reach the test database: the suite's in-memory SQLite mode cannot.
pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


def drain(world: World, *, expected_before: int) -> list[dict[str, Any]]:
    """Dispatch a sentinel and wait for it; return the runs before it."""
    sentinel = world.record.delay(None)
    runs = world.wait_for_runs(expected_before + 1)
    assert runs[-1]["task_id"] == sentinel.id, runs
    return runs[:-1]


def test_commit_runs_the_task_once_and_it_sees_the_committed_row(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    with transaction.atomic():
        user = User.objects.create(username="alice")
        result = world.record.delay(user.pk)
        assert OutboxMessage.objects.filter(task_id=result.id).exists()
    runs = drain(world, expected_before=1)
    assert runs == [{"task_id": result.id, "user_id": user.pk, "saw_user": True}]
    assert settle()  # the published rows' DELETE runs on a thread, a moment after
    assert not OutboxMessage.objects.exists()


def test_rollback_and_rolled_back_savepoint_run_nothing(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    with rolled_back():
        world.record.delay(User.objects.create(username="rolled-back").pk)
    with transaction.atomic():
        kept = User.objects.create(username="kept")
        with rolled_back():
            world.record.delay(User.objects.create(username="savepoint").pk)
        result = world.record.delay(kept.pk)
    runs = drain(world, expected_before=1)
    assert runs == [{"task_id": result.id, "user_id": kept.pk, "saw_user": True}]
    assert settle()
    assert not OutboxMessage.objects.exists()


def test_outside_a_transaction_the_task_is_published_at_once(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    user = User.objects.create(username="bob")
    with CaptureQueriesContext(connections["default"]) as queries:
        result = world.record.delay(user.pk)
    # Committed at once, then published before delay() returned; its DELETE is the thread's.
    statements = [q["sql"].split()[0] for q in queries]
    assert statements[:1] == ["INSERT"]
    assert "DELETE" not in statements
    assert settle()
    assert not OutboxMessage.objects.exists()
    runs = drain(world, expected_before=1)
    assert runs == [{"task_id": result.id, "user_id": user.pk, "saw_user": True}]


def test_post_save_hook_dispatches_with_the_save(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    hook = dispatch_on(
        post_save,
        sender=User,
        task=world.record,
        args=lambda user, created: (user.pk,),
        when=lambda user, created: created,
    )
    try:
        with rolled_back():
            User.objects.create(username="rolled-back")
        with transaction.atomic():
            user = User.objects.create(username="carol")
            user.save()  # an update: ``when`` says no
    finally:
        assert hook.disconnect() is True
    User.objects.create(username="after-disconnect")
    runs = drain(world, expected_before=1)
    assert [(run["user_id"], run["saw_user"]) for run in runs] == [(user.pk, True)]


def test_a_hook_runs_its_task_after_commit_and_never_after_rollback(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    hook = dispatch_on(
        post_save, sender=User, task=world.record, kwargs=lambda u: {"user_id": u.pk}
    )
    try:
        with rolled_back():
            rolled = User.objects.create(username="hook-rolled-back")
        with transaction.atomic():
            kept = User.objects.create(username="hook-committed")
            assert OutboxMessage.objects.count() == 1  # written in the same transaction
    finally:
        hook.disconnect()
    runs = drain(world, expected_before=1)
    assert [(run["user_id"], run["saw_user"]) for run in runs] == [(kept.pk, True)]
    assert rolled.pk not in [run["user_id"] for run in runs]


def test_a_hook_built_unconnected_is_connected_explicitly(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker()
    new_user = DispatchHook(
        post_save,
        sender=User,
        task=world.record,
        args=lambda user: (user.pk,),
        when=lambda user, created: created,
    )

    User.objects.create(username="before-connect")
    new_user.connect()
    try:
        with transaction.atomic():
            user = User.objects.create(username="dave")
    finally:
        new_user.disconnect()
    runs = drain(world, expected_before=1)
    assert [run["user_id"] for run in runs] == [user.pk]


@pytest.mark.parametrize("count", [1, 100])
def test_statements_on_commit_do_not_grow_with_the_rows(world: World, count: int) -> None:
    connection = connections["default"]
    # A fresh reading of the database's clock, which is read again once a reading is 30 s
    # old, on whatever statement that falls (CI once saw it after this COMMIT).
    clock_of("default")()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        for n in range(count):
            world.record.delay(n)
    sql = [query["sql"] for query in queries]
    last_insert = max(i for i, statement in enumerate(sql) if statement.startswith("INSERT"))
    on_commit = sql[last_insert + 1 :]
    # COMMIT; then the relay: the rows were born leased to it, so no claim, and the store
    # saw the commit write them (no savepoint rolled back): no read either; and their one
    # DELETE runs on a thread of the process (django_outbox.store.transactions).
    assert [statement.split()[0] for statement in on_commit] == ["COMMIT"], on_commit
    assert settle()
    assert not OutboxMessage.objects.exists()


def test_a_transaction_longer_than_the_grace_claims_its_rows_before_publishing(
    world: World, start_worker: Callable[..., Any]
) -> None:
    # The rows' birth lease (the publish grace) ran out before COMMIT: a sweeper may
    # already hold them, so the on-commit publisher claims them instead of trusting it.
    world.app.conf.outbox_publish_grace = 0.2
    reset(world.app)  # read the settings again
    start_worker()
    connection = connections["default"]
    clock_of("default")()  # a fresh reading of the clock (see the test above; CI saw it here too)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        result = world.record.delay(1)
        time.sleep(0.3)
    sql = [query["sql"] for query in queries]
    after_commit = sql[[text.split()[0] for text in sql].index("COMMIT") + 1 :]
    # The claim (an UPDATE, under a WITH that sums the payload bytes); the DELETE is the
    # thread's.
    assert [" UPDATE " in f" {text} " for text in after_commit] == [True], after_commit
    runs = drain(world, expected_before=1)
    assert [run["task_id"] for run in runs] == [result.id]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("scheme", ["redis://127.0.0.1:{}/0", "amqp://guest:guest@127.0.0.1:{}//"])
def test_broker_down_at_commit_keeps_the_row_pending(scheme: str) -> None:
    app = create_app(scheme.format(closed_port()), "nowhere")
    try:
        with transaction.atomic():
            result = app.tasks["django_e2e.record"].delay(1)
            started = time.monotonic()
        elapsed = time.monotonic() - started
    finally:
        close_app(app)
    assert elapsed < 2.0
    row = OutboxMessage.objects.get(task_id=result.id)
    assert (row.status, row.attempts, row.locked_until) == (MessageStatus.PENDING.value, 1, None)
    assert row.last_error


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_using_dispatches_in_the_other_databases_transaction(
    world: World, start_worker: Callable[..., Any]
) -> None:
    start_worker(OUTBOX_DJANGO_OTHER_DB_URL=database_url("other"))
    with transaction.atomic(using="other"):
        user = User.objects.using("other").create(username="elsewhere")
        result = world.record.apply_async((user.pk, "other"), using="other")
        assert OutboxMessage.objects.using("other").filter(task_id=result.id).exists()
        assert not OutboxMessage.objects.using("default").exists()
    runs = drain(world, expected_before=1)
    assert runs == [{"task_id": result.id, "user_id": user.pk, "saw_user": True}]
    assert settle()
    assert not OutboxMessage.objects.using("other").exists()
