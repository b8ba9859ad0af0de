"""The Django store knows which rows a commit wrote, and when it cannot know (PostgreSQL).

In the on-commit callback of the batch that wrote them, rows born leased need no read to
show they exist (``still_leased`` answers without a statement), unless something that
could have taken one away happened after the batch's first row: a savepoint rolled back
(an ``atomic`` block, ``savepoint_rollback()`` or hand-written SQL), a statement that
failed, or a pending row deleted to supersede a task id. Then the rows are read back and
those that are gone are left out, so a row of a rolled-back savepoint is never published.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_outbox.store.records import NewMessage, StoredMessage
from django_outbox.store import transactions as commits
from tests.contract.factories import new_message
from tests.django.helpers import new_savepoint, postgres_only, rolled_back

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "other"]),
    postgres_only,
]


class Publisher:
    """A publish callback asking the store, after the commit, which rows it still holds,
    and counting the statements that answer took.
    """

    def __init__(self, store: Any, using: str = "default") -> None:
        self.store, self.using = store, using
        self.held: list[set[int]] = []
        self.reads: list[int] = []

    def __call__(self, messages: Sequence[StoredMessage]) -> None:
        with CaptureQueriesContext(connections[self.using]) as queries:
            self.held.append(self.store.still_leased(messages, using=self.using))
        self.reads.append(len(queries))


def born_leased(**fields: Any) -> NewMessage:
    now = datetime.now(timezone.utc)
    return replace(new_message(available_at=now, **fields), locked_until=now + timedelta(hours=1))


def dispatch(store: Any, publish: Publisher, **fields: Any) -> int:
    """What ``OutboxTask.apply_async`` does with the store: add, then defer the publish."""
    message = born_leased(**fields)
    row_id = store.add(message, using=publish.using, supersedes=lambda _: True)
    assert row_id is not None
    store.defer_publish(StoredMessage.written(message, row_id), publish, using=publish.using)
    return row_id


@pytest.fixture
def publish(store: Any) -> Publisher:
    return Publisher(store)


def execute(sql: str, using: str = "default") -> None:
    with connections[using].cursor() as cursor:
        cursor.execute(sql)


def test_rows_of_a_clean_commit_are_known_without_a_read(store: Any, publish: Publisher) -> None:
    with transaction.atomic():
        kept = [dispatch(store, publish) for _ in range(3)]

    assert publish.held == [set(kept)]
    assert publish.reads == [0]
    # Outside that commit's callback the same question is a read.
    rows = [StoredMessage.written(born_leased(), row_id) for row_id in kept]
    with CaptureQueriesContext(connections["default"]) as queries:
        assert store.still_leased(rows) == set()  # other leases than the rows'
    assert len(queries) == 1


def test_rows_in_nested_blocks_released_and_durable_blocks_are_known(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic(durable=True):
        kept = [dispatch(store, publish)]
        with transaction.atomic():
            kept.append(dispatch(store, publish))
            with transaction.atomic():
                kept.append(dispatch(store, publish))
        kept.append(dispatch(store, publish))

    assert publish.held == [set(kept)]
    assert publish.reads == [0]


def test_a_savepoint_rolled_back_after_a_row_makes_the_commit_read(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic():
        kept = [dispatch(store, publish)]
        with rolled_back():
            dropped = dispatch(store, publish)
        kept.append(dispatch(store, publish))

    assert publish.held == [set(kept)]
    assert dropped not in publish.held[0]
    assert publish.reads == [1]


def test_a_savepoint_rolled_back_before_the_first_row_costs_no_read(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic():
        with rolled_back():
            execute("SELECT 1")
        kept = [dispatch(store, publish)]

    assert publish.held == [set(kept)]
    assert publish.reads == [0]


def test_a_savepoint_rolled_back_through_the_savepoint_api_is_seen(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic():
        kept = [dispatch(store, publish)]
        sid = new_savepoint()
        dropped = dispatch(store, publish)
        transaction.savepoint_rollback(sid)

    assert publish.held == [set(kept)]
    assert dropped not in publish.held[0]
    assert publish.reads == [1]


@pytest.mark.parametrize(
    "rollback",
    ["ROLLBACK TO SAVEPOINT by_hand", "  rollback to by_hand", "/* x */ ROLLBACK TO by_hand"],
)
def test_a_savepoint_rolled_back_by_hand_written_sql_is_seen(
    store: Any, publish: Publisher, rollback: str
) -> None:
    with transaction.atomic():
        kept = [dispatch(store, publish)]
        execute("SAVEPOINT by_hand")
        dropped = dispatch(store, publish)
        execute(rollback)

    assert publish.held == [set(kept)]
    assert dropped not in publish.held[0]
    assert publish.reads == [1]


def test_a_failed_statement_in_a_transaction_committed_anyway_makes_the_commit_read(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic():
        kept = [dispatch(store, publish)]
        execute("SAVEPOINT before_error")
        dropped = dispatch(store, publish)
        with pytest.raises(DatabaseError):
            execute("SELECT 1 / 0")
        # Recovery on the raw DBAPI cursor: a ROLLBACK Django's cursor never sees.
        with connections["default"].connection.cursor() as raw:
            raw.execute("ROLLBACK TO SAVEPOINT before_error")
        transaction.set_rollback(False)

    assert publish.held == [set(kept)]
    assert dropped not in publish.held[0]
    assert publish.reads == [1]


def test_a_superseded_row_of_the_same_transaction_makes_the_commit_read(
    store: Any, publish: Publisher
) -> None:
    with transaction.atomic():
        first = dispatch(store, publish, task_id="replaced")
        second = dispatch(store, publish, task_id="replaced")

    assert first != second
    assert publish.held == [{second}]
    assert publish.reads == [1]


def test_each_database_is_known_on_its_own(store: Any) -> None:
    default, other = Publisher(store, "default"), Publisher(store, "other")
    with transaction.atomic(using="default"), transaction.atomic(using="other"):
        on_default = [dispatch(store, default)]
        on_other = [dispatch(store, other)]
        with rolled_back("other"):
            dispatch(store, other)
        on_other.append(dispatch(store, other))

    assert default.held == [set(on_default)]
    assert default.reads == [0]
    assert other.held == [set(on_other)]
    assert other.reads == [1]


def test_rows_are_known_only_to_the_callback_of_their_alias() -> None:
    with commits.known_committed("other", frozenset({1, 2})):
        assert commits.committed_rows("other") == {1, 2}
        assert commits.committed_rows("default") == frozenset()
    assert commits.committed_rows("other") == frozenset()


def test_a_users_execute_wrapper_block_keeps_the_count_going(
    store: Any, publish: Publisher
) -> None:
    seen: list[str] = []

    def users(run: Callable[..., Any], sql: str, *args: Any) -> Any:
        seen.append(sql)
        return run(sql, *args)

    with transaction.atomic():
        with connections["default"].execute_wrapper(users):
            kept = [dispatch(store, publish)]  # the store starts counting here
        with rolled_back():
            dispatch(store, publish)

    assert seen  # the user's wrapper ran, and is gone again
    assert users not in connections["default"].execute_wrappers
    assert publish.held == [set(kept)]
    assert publish.reads == [1]
