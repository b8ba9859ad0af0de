"""The value objects crossing the store boundary (:mod:`celery_outbox.store.records`): aware
datetimes only, a written row keeps everything its message held, and a claim's fencing
tokens.
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone

import pytest

from celery_outbox.store.records import (
    Claim,
    MessageStatus,
    NewMessage,
    StoredMessage,
    check_aware,
)

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
LEASE = NOW + timedelta(seconds=30)


def new_message(**changes: object) -> NewMessage:
    base = NewMessage(
        task_id="id-1", task_name="t.x", payload="[]", options={"queue": "q"}, available_at=NOW
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_check_aware_names_a_naive_datetime() -> None:
    assert check_aware("at", NOW) is NOW
    naive = datetime(2030, 1, 1)
    with pytest.raises(ValueError, match=r"at=datetime.datetime\(2030, 1, 1, 0, 0\) is naive"):
        check_aware("at", naive)


@pytest.mark.parametrize("field", ["available_at", "locked_until"])
def test_a_message_refuses_naive_datetimes(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}=.* is naive"):
        new_message(**{field: datetime(2030, 1, 1)})


def test_a_written_row_keeps_every_field_of_its_message() -> None:
    message = new_message(locked_until=LEASE)

    row = StoredMessage.written(message, 7)

    assert {f.name: getattr(row, f.name) for f in fields(NewMessage)} == {
        f.name: getattr(message, f.name) for f in fields(NewMessage)
    }
    assert (row.id, row.status, row.attempts, row.last_error) == (7, MessageStatus.PENDING, 0, "")


def test_a_sweeps_claim_is_fenced_by_its_lease() -> None:
    rows = tuple(StoredMessage.written(new_message(task_id=f"id-{n}"), n) for n in (1, 2))
    assert Claim(messages=rows, lease_until=LEASE).leases == frozenset({LEASE})


def test_rows_born_leased_are_fenced_by_their_own_lease() -> None:
    own = NOW + timedelta(seconds=5)
    born = StoredMessage.written(new_message(locked_until=own), 1)
    swept = StoredMessage.written(new_message(task_id="id-2"), 2)

    assert Claim(messages=(born, swept), lease_until=LEASE).leases == frozenset({own, LEASE})


def test_an_empty_claim_still_has_its_lease() -> None:
    assert Claim(messages=(), lease_until=LEASE).leases == frozenset({LEASE})
