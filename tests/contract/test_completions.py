"""Atomic tasks: ``complete_once`` inserts the ``CompletedTask`` row first, lets the block
write and dispatch in the same transaction, and tells a duplicate it already ran.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest

from celery_outbox.store.base import Completion
from tests.contract.factories import FAR_FUTURE, LEASE, NOW, new_message
from tests.contract.harness import Harness


def task_id() -> str:
    return f"atomic-{uuid.uuid4()}"


def pending_ids(h: Harness, task_ids: set[str]) -> set[str]:
    claim = h.store.claim_due(
        now=FAR_FUTURE, created_before=FAR_FUTURE, limit=1000, lease_until=FAR_FUTURE + LEASE
    )
    return {m.task_id for m in claim.messages} & task_ids


def test_the_store_runs_atomic_tasks(harness: Harness) -> None:
    assert harness.store.atomic_problem(None) is None


def test_a_first_run_writes_its_row_with_the_result(harness: Harness) -> None:
    tid = task_id()
    with harness.store.complete_once(tid, "tests.atomic", now=NOW) as completion:
        assert completion.previous is None
        completion.result = '{"total": 3, "note": "vé"}'
    stored = harness.store.completion(tid)
    assert stored is not None
    assert (stored.task_id, stored.task_name, stored.completed_at) == (tid, "tests.atomic", NOW)
    assert stored.result == '{"total": 3, "note": "vé"}'


def test_a_none_result_is_stored_as_none(harness: Harness) -> None:
    tid = task_id()
    with harness.store.complete_once(tid, "tests.atomic", now=NOW):
        pass
    stored = harness.store.completion(tid)
    assert stored is not None
    assert stored.result is None


def test_a_second_run_is_told_about_the_first_and_changes_nothing(harness: Harness) -> None:
    tid = task_id()
    with harness.store.complete_once(tid, "tests.atomic", now=NOW) as first:
        first.result = "1"
    later = NOW + timedelta(hours=1)
    with harness.store.complete_once(tid, "tests.atomic", now=later) as second:
        assert second.previous is not None
        assert (second.previous.completed_at, second.previous.result) == (NOW, "1")
        second.result = "2"  # a duplicate's result is never written
    stored = harness.store.completion(tid)
    assert stored is not None
    assert (stored.completed_at, stored.result) == (NOW, "1")


def test_a_raising_block_leaves_no_row_and_no_dispatch(harness: Harness) -> None:
    tid, message = task_id(), new_message()

    def failing_run() -> None:
        with harness.store.complete_once(tid, "tests.atomic", now=NOW) as completion:
            harness.store.add(message)
            completion.result = "lost"
            raise KeyError("the body failed")

    with pytest.raises(KeyError):
        failing_run()
    assert harness.store.completion(tid) is None
    assert pending_ids(harness, {message.task_id}) == set()
    with harness.store.complete_once(tid, "tests.atomic", now=NOW) as again:
        assert again.previous is None  # a rolled-back run does not count


def test_a_dispatch_in_the_block_commits_with_the_row(harness: Harness) -> None:
    tid, message = task_id(), new_message()
    with harness.store.complete_once(tid, "tests.atomic", now=NOW):
        assert harness.store.add(message) is not None
    assert pending_ids(harness, {message.task_id}) == {message.task_id}
    assert harness.store.completion(tid) is not None


def test_completed_rows_are_counted_and_purged_in_bounded_batches(harness: Harness) -> None:
    before = harness.store.count_completed()
    old = NOW - timedelta(days=30)
    ids = [task_id() for _ in range(5)]
    for n, tid in enumerate(ids):
        with harness.store.complete_once(tid, "tests.atomic", now=old if n < 3 else NOW):
            pass
    assert harness.store.count_completed() == before + 5
    cutoff = NOW - timedelta(days=1)
    assert harness.store.purge_completed(older_than=cutoff, limit=2) == 2
    assert harness.store.purge_completed(older_than=cutoff, limit=2) >= 1
    while harness.store.purge_completed(older_than=cutoff, limit=100):
        pass
    assert [harness.store.completion(t) is None for t in ids] == [True] * 3 + [False] * 2


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_a_concurrent_duplicate_waits_on_the_key(harness: Harness, first_commits: bool) -> None:
    tid = task_id()
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, Completion] = {}
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with harness.store.complete_once(tid, "tests.atomic", now=NOW) as completion:
                completion.result = '"first"'
                inside.set()
                release.wait(10)
                if not first_commits:
                    raise RuntimeError("roll back")
        except RuntimeError:
            pass
        except BaseException as exc:
            errors.append(exc)
            inside.set()

    def second() -> None:
        try:
            with harness.store.complete_once(tid, "tests.atomic", now=NOW) as completion:
                seen["second"] = completion
                completion.result = '"second"'
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=harness.in_thread, args=(first,)),
        threading.Thread(target=harness.in_thread, args=(second,)),
    ]
    threads[0].start()
    assert inside.wait(10)
    threads[1].start()
    time.sleep(0.3)
    assert "second" not in seen  # waits on the key the first run holds
    release.set()
    for thread in threads:
        thread.join(20)
    assert errors == []
    stored = harness.store.completion(tid)
    assert stored is not None
    if first_commits:
        assert seen["second"].previous is not None
        assert stored.result == '"first"'
    else:
        assert seen["second"].previous is None
        assert stored.result == '"second"'
