"""Messages built at call time: Celery's own headers, typed JSON, size limits, parking."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from datetime import timedelta

import pytest
from celery import Celery

from celery_outbox import OutboxTask, PayloadError, ScheduleError
from celery_outbox.dispatch.envelope import build_message, decode_body, publish_body

NOW = dt.datetime.now(dt.timezone.utc)


def noop(*args: object) -> None:
    """A task body that does nothing."""


@pytest.fixture
def app() -> Celery:
    app = Celery("env", broker="memory://", set_as_current=False)
    app.conf.task_routes = {"env.routed": {"queue": "special"}}
    return app


def build(
    task: OutboxTask,
    *args: object,
    max_bytes: int | None = None,
    now: dt.datetime | None = None,
    **options: object,
) -> object:
    return build_message(
        task,
        args,
        {},
        task_id="tid",
        options=options,
        now=now or dt.datetime.now(dt.timezone.utc),
        park_after=timedelta(seconds=30),
        max_bytes=max_bytes,
    )


def test_typed_values_round_trip(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)
    values = (NOW, decimal.Decimal("1.10"), uuid.UUID(int=7), {"nested": [1, "x"]})
    message = build(task, *values)
    args, _kwargs, _embed = decode_body(
        message.payload, message.options, accept=None, max_bytes=None
    )  # type: ignore[attr-defined]
    assert tuple(args) == values
    assert message.task_id == "tid"  # type: ignore[attr-defined]
    assert message.options["headers"]["task"] == "env.t"  # type: ignore[attr-defined]


def test_celery_routing_is_applied(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.routed")(noop)
    message = build(task, priority=7, expires=60)
    options = message.options  # type: ignore[attr-defined]
    assert options["routing_key"] == "special"
    assert options["declare"] == ["special"]
    assert options["properties"]["priority"] == 7
    assert options["headers"]["expires"] is not None


def test_unserialisable_argument_names_task_and_type(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)

    class Opaque:
        pass

    with pytest.raises(PayloadError, match=r"'env.t'.*Opaque"):
        build(task, Opaque())


def test_payload_limit(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)
    with pytest.raises(
        PayloadError, match=r"arguments are \d+ bytes, above outbox_max_payload_bytes=1000"
    ):
        build(task, "x" * 2000, max_bytes=1000)
    build(task, "x" * 10, max_bytes=1000)


def test_long_countdown_is_parked_short_is_not(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)
    now = dt.datetime.now(dt.timezone.utc)
    assert build(task, countdown=5, now=now).available_at == now  # type: ignore[attr-defined]
    parked = build(task, countdown=3600, now=now)
    assert parked.available_at - now > timedelta(seconds=3590)  # type: ignore[attr-defined]


def test_binary_serializer_and_compression_are_base64(app: Celery) -> None:
    app.conf.accept_content = ["json", "pickle"]
    task = app.task(base=OutboxTask, name="env.p", serializer="pickle")(noop)
    message = build(task, {1, 2}, compression="zlib")
    options = message.options  # type: ignore[attr-defined]
    assert options["body_encoding"] == "base64"
    assert options["compression"] == "application/x-gzip"
    assert isinstance(publish_body(message.payload, options), bytes)  # type: ignore[attr-defined]
    args, _, _ = decode_body(
        message.payload, options, accept=app.conf.accept_content, max_bytes=None
    )  # type: ignore[attr-defined]
    assert args == ({1, 2},) or list(args) == [{1, 2}]


def test_an_unrepresentable_time_is_refused_while_building(app: Celery) -> None:
    # Each option's rules: test_schedule.py.
    task = app.task(base=OutboxTask, name="env.t")(noop)
    with pytest.raises(ScheduleError, match="countdown=1000000000000 is not accepted"):
        build(task, countdown=10**12)


def test_naive_eta_is_read_in_app_timezone_and_parked(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)
    naive = (NOW + timedelta(hours=2)).replace(tzinfo=None)  # app timezone is UTC
    message = build(task, eta=naive)
    assert message.available_at == naive.replace(tzinfo=dt.timezone.utc)  # type: ignore[attr-defined]


def test_negative_countdown_means_now(app: Celery) -> None:
    task = app.task(base=OutboxTask, name="env.t")(noop)
    now = dt.datetime.now(dt.timezone.utc)
    assert build(task, countdown=-5, now=now).available_at == now  # type: ignore[attr-defined]


def test_an_argument_too_deep_is_refused_while_building(app: Celery) -> None:
    # The depth rule itself: test_limits.py.
    task = app.task(base=OutboxTask, name="env.t")(noop)
    nested: object = 0
    for _ in range(101):
        nested = [nested]
    with pytest.raises(PayloadError, match=r"argument 0 \(positional\).*MAX_ARGUMENT_DEPTH=100"):
        build(task, nested)
