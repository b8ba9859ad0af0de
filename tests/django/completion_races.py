"""Races of atomic runs beyond the contract, run on every Django database: PostgreSQL
through pytest-django (``test_store_completions.py``), MariaDB and SQLite through
``completions_client``.
"""

from __future__ import annotations

import threading
import time
import uuid

from tests.contract.factories import NOW
from tests.contract.harness import Harness

#: Duplicates waiting on one run that rolls back.
WAITING = 3


def test_duplicates_waiting_on_a_run_that_rolls_back_never_fail(harness: Harness) -> None:
    # On MySQL/MariaDB the waiting inserts deadlock on the key when the first run rolls
    # back; the store starts the victim's transaction again (it then sees the winner's row).
    for _ in range(3):
        ran, errors = duplicates_after_a_rollback(harness)
        assert errors == []
        assert sorted(ran) == [False] * (WAITING - 1) + [True]  # one ran, the rest skipped


def duplicates_after_a_rollback(harness: Harness) -> tuple[list[bool], list[BaseException]]:
    """:data:`WAITING` duplicates wait on a run that rolls back; whether each ran, and the
    errors any thread met.
    """
    tid = f"race-{uuid.uuid4()}"
    inside, release = threading.Event(), threading.Event()
    ran: list[bool] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with harness.store.complete_once(tid, "tests.atomic", now=NOW):
                inside.set()
                release.wait(10)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        except BaseException as exc:
            errors.append(exc)
            inside.set()

    def duplicate() -> None:
        try:
            with harness.store.complete_once(tid, "tests.atomic", now=NOW) as completion:
                ran.append(completion.previous is None)
                time.sleep(0.1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=harness.in_thread, args=(first,))]
    threads[0].start()
    assert inside.wait(10)
    threads += [
        threading.Thread(target=harness.in_thread, args=(duplicate,)) for _ in range(WAITING)
    ]
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.3)
    release.set()
    for thread in threads:
        thread.join(30)
    return ran, errors
