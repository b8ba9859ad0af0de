"""The one error translation every store uses (:mod:`celery_outbox.store_errors`)."""

from __future__ import annotations

import pytest

from celery_outbox.exceptions import StoreDataError, StoreError
from celery_outbox.store_errors import store_errors


class Refused(Exception):
    pass


class Down(Exception):
    pass


@pytest.mark.parametrize(("raised", "expected"), [(Refused, StoreDataError), (Down, StoreError)])
def test_driver_errors_leave_as_store_errors_with_the_cause(
    raised: type[Exception], expected: type[StoreError]
) -> None:
    with (
        pytest.raises(expected, match="could not write a row: driver says") as caught,
        store_errors("write a row", data=(Refused,), outage=(Down,)),
    ):
        raise raised("driver says")
    assert type(caught.value) is expected
    assert isinstance(caught.value.__cause__, raised)


def test_other_errors_pass_through() -> None:
    with pytest.raises(KeyError), store_errors("write a row", data=(Refused,), outage=(Down,)):
        raise KeyError("mine")


class RefusedByDriver(Down):
    """A driver's data error is one of its errors too (as with DB-API's hierarchy)."""


def test_a_data_error_is_told_apart_from_the_outage_it_subclasses() -> None:
    with (
        pytest.raises(StoreDataError),
        store_errors("write a row", data=(RefusedByDriver,), outage=(Down,)),
    ):
        raise RefusedByDriver("value too long")
