"""Dispatch records (:mod:`celery_outbox.testing.expectations`): their state and how they read."""

from __future__ import annotations

from celery_outbox.testing.expectations import Dispatch, DispatchState, Drained, call_text
from tests.unit.testing.test_expectations import dispatch


def test_the_state_is_committed_awaiting_or_rolled_back() -> None:
    assert dispatch(state="committed").state is DispatchState.COMMITTED
    assert dispatch(state="awaiting").state is DispatchState.AWAITING_COMMIT
    assert dispatch(state="gone").state is DispatchState.ROLLED_BACK


def test_a_description_shows_the_call_state_alias_options_and_task_id() -> None:
    sent = dispatch(
        "shop.mail", 1, "a", options={"queue": "q", "countdown": 5, "link": None}, to=[1, 2]
    )
    sent.drained = Drained.RAN

    assert sent.describe() == (
        "shop.mail(1, 'a', to=[1, 2])  [committed, ran, using=None, queue='q', countdown=5, "
        "task_id=t1]"
    )


def test_eager_and_duplicate_dispatches_say_they_wrote_no_row() -> None:
    eager = dispatch(eager=True)
    duplicate = dispatch()
    duplicate.row_id = None

    assert (eager.eager, eager.duplicate) == (True, False)
    assert eager.status() == "committed, eager: no row"
    assert (duplicate.eager, duplicate.duplicate) == (False, True)
    assert duplicate.status() == "committed, no row: task id already pending"


def test_call_text_shows_unspecified_arguments_as_any() -> None:
    assert call_text("t", None, None) == "t(*any, **any)"
    assert call_text("t", (1,), None) == "t(1, **any)"
    assert call_text("t", None, {"a": 1}) == "t(*any, a=1)"
    assert call_text("t", (), {}) == "t()"


def test_a_dispatch_repr_leaves_the_stored_message_out() -> None:
    assert "message=" not in repr(dispatch())
    assert isinstance(dispatch(), Dispatch)
