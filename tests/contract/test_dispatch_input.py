"""What ``apply_async`` accepts: every store either keeps a call exactly or refuses it clearly.

Arguments with NUL or lone surrogates are stored exactly (JSON-escaped) and their
``argsrepr``/``kwargsrepr`` stored escaped; anything the table cannot hold or a worker
cannot run (a header that is not strict JSON, an unknown codec, a row above
``outbox_max_payload_bytes``, a task id or name longer than its column, an argument
nested deeper than ``MAX_ARGUMENT_DEPTH``) is a ``PayloadError`` at the call site naming
the value and what is accepted, and the caller's transaction goes on without a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxTask, PayloadError
from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.registry import install_store
from celery_outbox.store.records import StoredMessage
from tests.contract.factories import FAR_FUTURE, LEASE
from tests.contract.harness import Harness

TASK = "tests.contract.dispatch_input.noop"
#: Far enough ahead that the row is parked: written, never published during the test.
LATER = 3600


def noop(*args: Any, **kwargs: Any) -> None:
    """A task body that does nothing."""


def nested(depth: int) -> Any:
    """A value ``depth`` lists deep around an int."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def app(harness: Harness) -> Iterator[Celery]:
    app = Celery("dispatch_input", broker="memory://", set_as_current=False)
    install_store(app, harness.store)
    app.task(base=OutboxTask, name=TASK, shared=False)(noop)
    yield app
    app.close()


def rows(h: Harness) -> tuple[StoredMessage, ...]:
    return h.store.claim_due(
        now=FAR_FUTURE, created_before=FAR_FUTURE, limit=100, lease_until=FAR_FUTURE + LEASE
    ).messages


def dispatch(app: Celery, *args: Any, **options: Any) -> str:
    kwargs = options.pop("kwargs", {})
    return str(app.tasks[TASK].apply_async(args, kwargs, countdown=LATER, **options).id)


def test_nul_and_lone_surrogates_in_arguments_are_stored_exactly(
    harness: Harness, app: Celery
) -> None:
    args = ("a\x00b", "c\ud800d", ["\udfff"])
    kwargs = {"note": "\x00\udc80", "plain": "é"}

    task_id = dispatch(app, *args, kwargs=kwargs)

    (row,) = rows(harness)
    assert row.task_id == task_id
    stored_args, stored_kwargs, _embed = decode_body(
        row.payload, row.options, accept=None, max_bytes=None
    )
    assert (tuple(stored_args), stored_kwargs) == (args, kwargs)
    for name in ("argsrepr", "kwargsrepr"):
        shown = row.options["headers"][name]
        assert "\x00" not in shown
        shown.encode("utf-8")  # no lone surrogate left
    assert "\\x00" in row.options["headers"]["argsrepr"]


def test_an_explicit_argsrepr_with_nul_is_stored_escaped(harness: Harness, app: Celery) -> None:
    dispatch(app, 1, argsrepr="secret\x00\ud800", kwargsrepr="\x00")

    (row,) = rows(harness)
    assert row.options["headers"]["argsrepr"] == "secret\\x00\\ud800"
    assert row.options["headers"]["kwargsrepr"] == "\\x00"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(object(), "not JSON serializable", id="object"),
        pytest.param(float("nan"), "not JSON compliant", id="nan"),
        pytest.param(float("inf"), "not JSON compliant", id="infinity"),
        pytest.param("a\x00b", "NUL", id="nul"),
        pytest.param("a\ud800b", "lone surrogate", id="surrogate"),
    ],
)
def test_a_header_the_table_cannot_store_is_refused_naming_it(
    harness: Harness, app: Celery, value: object, reason: str
) -> None:
    with pytest.raises(PayloadError, match=rf"header 'x-bad'=.*{reason}.*must be JSON"):
        dispatch(app, 1, headers={"x-bad": value})

    assert rows(harness) == ()


def test_an_unstorable_option_is_refused_naming_it(harness: Harness, app: Celery) -> None:
    with pytest.raises(
        PayloadError, match=r"option 'correlation_id'='id\\x00' cannot be stored: .*NUL"
    ):
        dispatch(app, 1, correlation_id="id\x00")
    with pytest.raises(PayloadError, match=r"header 'shadow'=.*lone surrogate"):
        dispatch(app, 1, shadow="name\ud800")

    assert rows(harness) == ()


def test_an_unknown_compression_is_refused_naming_the_codecs(harness: Harness, app: Celery) -> None:
    with pytest.raises(PayloadError, match=r"compression='bogus'.*accepts \[.*'gzip'"):
        dispatch(app, 1, compression="bogus")

    assert rows(harness) == ()
    dispatch(app, 1, compression="gzip")
    (row,) = rows(harness)
    assert decode_body(row.payload, row.options, accept=None, max_bytes=None)[0] == [1]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"argsrepr": "r" * 20_000}, id="argsrepr"),
        pytest.param({"kwargsrepr": "k" * 20_000}, id="kwargsrepr"),
        pytest.param({"shadow": "s" * 20_000}, id="shadow"),
        pytest.param({"headers": {"x-big": "h" * 20_000}}, id="header"),
    ],
)
def test_the_payload_limit_bounds_the_whole_row(
    harness: Harness, app: Celery, options: dict[str, Any]
) -> None:
    app.conf.outbox_max_payload_bytes = 1000

    with pytest.raises(
        PayloadError, match=r"outbox row is \d+ bytes.*outbox_max_payload_bytes=1000"
    ):
        dispatch(app, 1, **options)

    assert rows(harness) == ()
    dispatch(app, 1)  # a small call still fits
    assert len(rows(harness)) == 1


def test_a_task_id_longer_than_its_column_is_refused(harness: Harness, app: Celery) -> None:
    with pytest.raises(PayloadError, match=r"task id .* is 256 characters long.* 255"):
        dispatch(app, 1, task_id="i" * 256)

    assert rows(harness) == ()
    assert dispatch(app, 1, task_id="i" * 255) == "i" * 255
    assert [row.task_id for row in rows(harness)] == ["i" * 255]


def test_a_task_name_longer_than_its_column_is_refused(harness: Harness, app: Celery) -> None:
    long_name = "tests." + "n" * 250
    app.task(base=OutboxTask, name=long_name, shared=False)(noop)

    with pytest.raises(PayloadError, match=r"task name .* is 256 characters long.* 255"):
        app.tasks[long_name].apply_async((1,), countdown=LATER)

    assert rows(harness) == ()


def test_an_argument_nested_too_deep_is_refused_naming_the_limit(
    harness: Harness, app: Celery
) -> None:
    with pytest.raises(
        PayloadError, match=r"argument 'tree' is nested more than MAX_ARGUMENT_DEPTH=100"
    ):
        dispatch(app, 1, kwargs={"tree": nested(600)})
    with pytest.raises(PayloadError, match=r"argument 1 \(positional\).*MAX_ARGUMENT_DEPTH=100"):
        dispatch(app, 1, ({"a": nested(101)},))

    assert rows(harness) == ()
    dispatch(app, nested(100), kwargs={"flat": list(range(500))})
    (row,) = rows(harness)
    assert decode_body(row.payload, row.options, accept=None, max_bytes=None)[0] == [nested(100)]


def test_a_refused_call_leaves_the_transaction_usable(harness: Harness, app: Celery) -> None:
    with harness.transaction():
        with pytest.raises(PayloadError):
            dispatch(app, nested(600))
        with pytest.raises(PayloadError):
            dispatch(app, 1, headers={"x": float("nan")})
        kept = dispatch(app, "kept\x00")

    assert [row.task_id for row in rows(harness)] == [kept]


def test_eager_mode_refuses_what_a_real_dispatch_refuses(harness: Harness, app: Celery) -> None:
    app.conf.task_always_eager = True

    with pytest.raises(PayloadError, match=r"MAX_ARGUMENT_DEPTH=100"):
        dispatch(app, nested(600))
    with pytest.raises(PayloadError, match=r"compression='bogus'"):
        dispatch(app, 1, compression="bogus")
