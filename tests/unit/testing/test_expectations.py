"""Expectations and failure messages (:mod:`celery_outbox.testing.expectations`): a failed
assertion names the expected call, lists every dispatch, and says why each dispatch of
the same task did not match.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_outbox.testing.expectations import (
    MAX_LISTED,
    Dispatch,
    Expectation,
    matching,
    not_sent_message,
    sent_message,
    task_name_of,
)


def dispatch(
    name: str = "shop.mail",
    *args: Any,
    state: str = "committed",
    task_id: str = "t1",
    using: str | None = None,
    options: dict[str, Any] | None = None,
    eager: bool = False,
    **kwargs: Any,
) -> Dispatch:
    """A dispatch of ``name(*args, **kwargs)``; ``state``: committed, awaiting or gone."""
    made = Dispatch(
        task_name=name,
        task_id=task_id,
        args=args,
        kwargs=kwargs,
        options=options or {},
        using=using,
        row_id=None if eager else 1,
        message=None if eager else object(),  # type: ignore[arg-type]
        committed=state == "committed",
    )
    made.awaiting = lambda: state == "awaiting"
    return made


def test_it_matches_on_each_given_field_only() -> None:
    sent = dispatch("shop.mail", 1, options={"queue": "mail", "priority": 3}, using="db2", to="a")

    assert Expectation(task_name="shop.mail").matches(sent)
    assert Expectation(task_name="shop.mail", args=(1,), kwargs={"to": "a"}).matches(sent)
    assert Expectation(task_name="shop.mail", using="db2", options={"queue": "mail"}).matches(sent)
    assert not Expectation(task_name="shop.sms").matches(sent)
    assert not Expectation(task_name="shop.mail", using=None).matches(sent)
    assert not Expectation(task_name="shop.mail", kwargs={}).matches(sent)
    assert Expectation(task_name="shop.mail", rolled_back=True).matches(dispatch(state="gone"))
    assert matching(Expectation(task_name="shop.mail"), [dispatch(state="awaiting")])


def test_each_difference_is_named() -> None:
    expected = Expectation(
        task_name="shop.mail",
        args=(1, 2),
        kwargs={"to": "a", "cc": "b", "bcc": "c"},
        using="default",
        options={"queue": "mail", "priority": 9},
    )
    got = dispatch(
        "shop.mail", 1, 3, state="gone", to="x", cc="b", reply="r", options={"queue": "q"}
    )

    assert expected.differences(got) == [
        "rolled back: its transaction did not commit",
        "args differ: expected (1, 2), got (1, 3)",
        "kwarg bcc: expected 'c', not given",
        "kwarg reply: not expected, got 'r'",
        "kwarg to: expected 'a', got 'x'",
        "using differs: expected 'default', got None",
        "option queue: expected 'mail', got 'q'",
        "option priority: expected 9, not given",
    ]


def test_the_assert_sent_message_lists_every_dispatch_and_explains_near_misses() -> None:
    expected = Expectation(task_name="shop.mail", args=(1,))
    dispatches = [
        dispatch("shop.mail", 2, task_id="a"),
        dispatch("shop.sms", 1, task_id="b", using="other", options={"queue": "sms"}),
        dispatch("shop.mail", 1, task_id="c", state="gone"),
    ]

    assert not_sent_message(expected, 1, [], dispatches) == (
        "Expected 1 outbox dispatch of shop.mail(1, **any), found 0.\n"
        "Dispatched during this test (3):\n"
        "  - shop.mail(2)  [committed, using=None, task_id=a]\n"
        "      args differ: expected (1,), got (2,)\n"
        "  - shop.sms(1)  [committed, using='other', queue='sms', task_id=b]\n"
        "  - shop.mail(1)  [rolled back, using=None, task_id=c]\n"
        "      rolled back: its transaction did not commit"
    )


def test_a_missing_task_name_suggests_the_dispatched_names_close_to_it() -> None:
    expected = Expectation(task_name="shop.send_mail", kwargs={"to": "a"}, using="x")
    message = not_sent_message(expected, 2, [], [dispatch("shop.send_mails")])

    assert message.splitlines()[:2] == [
        "Expected 2 outbox dispatches of shop.send_mail(*any, to='a') using='x', found 0.",
        "No dispatch of 'shop.send_mail' at all; similar names: 'shop.send_mails'.",
    ]


def test_an_empty_test_says_nothing_was_dispatched() -> None:
    message = not_sent_message(Expectation(task_name="shop.mail"), 1, [], [])
    assert message == (
        "Expected 1 outbox dispatch of shop.mail(*any, **any), found 0.\n"
        "Nothing was dispatched through the outbox during this test (the `outbox` fixture "
        "records OutboxTask dispatches made after it was set up)."
    )


def test_the_assert_not_sent_message_marks_the_matches() -> None:
    expected = Expectation(task_name="shop.mail", options={"queue": "mail"})
    sent = dispatch("shop.mail", 1, options={"queue": "mail"}, task_id="a")

    assert sent_message(expected, [sent], [sent, dispatch("shop.mail", task_id="b")]) == (
        "Expected no outbox dispatch of shop.mail(*any, **any) with options {'queue': 'mail'}, "
        "found 1.\n"
        "Dispatched during this test (2):\n"
        "  - shop.mail(1)  [committed, using=None, queue='mail', task_id=a]  <- matches\n"
        "  - shop.mail()  [committed, using=None, task_id=b]\n"
        "      option queue: expected 'mail', not given"
    )


def test_long_listings_and_values_are_cut() -> None:
    dispatches = [dispatch("shop.mail", "x" * 500, task_id=str(i)) for i in range(MAX_LISTED + 5)]
    message = sent_message(Expectation(task_name="shop.sms"), [], dispatches)

    assert message.endswith("\n  ... and 5 more")
    assert "x" * 100 not in message


def test_a_task_is_named_by_itself_or_its_name() -> None:
    app = Celery("expectations", set_as_current=False)

    @app.task(name="shop.mail", shared=False)
    def mail() -> None: ...

    assert task_name_of(mail) == task_name_of("shop.mail") == "shop.mail"
    with pytest.raises(TypeError, match="give a Celery task or a task name"):
        task_name_of(42)  # type: ignore[arg-type]
