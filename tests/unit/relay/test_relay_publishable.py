"""The sweeper's check of a stored row (:mod:`celery_outbox.relay.relay`): a row no
retry can publish is told apart, with the reason written to the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxTask
from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.publishing.producers import describe
from celery_outbox.relay.relay import refusal, sort_out
from celery_outbox.store.records import StoredMessage
from tests.messages import stored


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("publishable-unit", broker="memory://", set_as_current=False)

    @app.task(base=OutboxTask, name="unit.publishable.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    app.close()


def row(app: Celery, n: int, **changes: Any) -> StoredMessage:
    """The row of ``noop(n)``, id ``n``, with ``changes`` (:func:`tests.messages.stored`)."""
    return stored(app.tasks["unit.publishable.noop"], n, **changes)


def test_refusal_names_what_is_wrong(app: Celery) -> None:
    ok = row(app, 1)
    pickled = replace(ok, options={**ok.options, "content_type": "application/x-python-serialize"})

    assert refusal(app, ok, max_payload_bytes=None) is None
    assert "payload refused: content type" in (refusal(app, pickled, max_payload_bytes=None) or "")
    unknown = replace(ok, task_name="unit.relay.gone")
    assert refusal(app, unknown, max_payload_bytes=None) == (
        "task 'unit.relay.gone' is not registered with this app"
    )


def test_a_payload_that_cannot_be_decoded_is_described(app: Celery) -> None:
    garbled = row(app, 1, payload="not json at all")

    reason = refusal(app, garbled, max_payload_bytes=None) or ""

    assert reason.startswith("payload cannot be decoded: ")
    assert "Error" in reason  # the exception's dotted type, as in a row's last_error


def test_sort_out_keeps_the_order_and_names_each_refused_row(app: Celery) -> None:
    good = [row(app, 1), row(app, 3)]
    unknown = row(app, 2, task_name="unit.gone")

    publishable, refused = sort_out(app, [good[0], unknown, good[1]], max_payload_bytes=None)

    assert publishable == good
    assert list(refused) == [unknown.id]
    assert "'unit.gone' is not registered" in refused[unknown.id]


#: Payloads whose check takes the plain ``json.loads`` path, or must not (kombu's hook).
PAYLOADS = {
    "plain": '[[1], {"a": "b"}, {}]',
    "not json": "not json at all",
    "cut short": "[[1], {",
    "trailing": "[[1], {}, {}] x",
    "a datetime kombu decodes": (
        '[[{"__type__": "datetime", "__value__": "2030-01-01T00:00:00"}], {}, {}]'
    ),
    "a type kombu does not know": '[[{"__type__": "nope", "__value__": 1}], {}, {}]',
    "that type behind an escape": '[[{"\\u005f_type__": "nope", "__value__": 1}], {}, {}]',
    "an escaped character": '[["caf\\u00e9"], {}, {}]',
    "NaN": "[[NaN], {}, {}]",
}


@pytest.mark.parametrize("case", PAYLOADS)
def test_the_quick_json_check_refuses_exactly_what_kombus_decoder_refuses(
    app: Celery, case: str
) -> None:
    message = row(app, 1, payload=PAYLOADS[case])
    try:
        decode_body(message.payload, message.options, accept=None, max_bytes=None)
    except Exception as exc:  # the reason kombu's path gives, whatever it is
        expected: str | None = f"payload cannot be decoded: {describe(exc)}"
    else:
        expected = None
    assert refusal(app, message, max_payload_bytes=None) == expected
