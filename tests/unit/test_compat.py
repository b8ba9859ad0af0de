"""The Celery internals of :mod:`celery_outbox._compat`, pinned.

A failure here means a Celery upgrade changed something celery-outbox leans on: fix
``celery_outbox/_compat.py`` (and only it) before anything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task, group
from celery.result import AsyncResult

from celery_outbox import _compat
from celery_outbox.task import OutboxTask


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("compat-unit", broker="memory://", set_as_current=False)
    yield app
    app.close()


def test_finalize_callbacks_run_before_pending_tasks_and_on_after_finalize_after(
    app: Celery,
) -> None:
    seen: list[tuple[str, bool]] = []

    @app.task(name="compat.pending", shared=False)
    def pending() -> None: ...

    def on_finalize(finalized: Celery) -> None:
        if finalized is app:
            seen.append(("callback", "compat.pending" in _compat.registered_tasks(app)))

    def after(sender: Celery, **kwargs: Any) -> None:
        if sender is app:
            seen.append(("after", "compat.pending" in _compat.registered_tasks(app)))

    _compat.connect_on_app_finalize(on_finalize)
    app.on_after_finalize.connect(after, weak=False)
    app.finalize()

    assert seen == [("callback", False), ("after", True)]


def test_active_apps_lists_a_live_app(app: Celery) -> None:
    assert app in _compat.active_apps()


def test_registered_tasks_does_not_finalize(app: Celery) -> None:
    tasks = _compat.registered_tasks(app)
    assert isinstance(tasks, dict)
    assert not app.finalized  # type: ignore[attr-defined]


def test_orig_run_stops_celery_wrapping_run_for_autoretry(app: Celery) -> None:
    # OutboxTask defines ``_orig_run`` so that Celery leaves ``run`` alone.
    assert hasattr(OutboxTask, _compat.ORIG_RUN)

    def work() -> None: ...

    plain = app.task(name="compat.plain", shared=False, autoretry_for=(KeyError,))(work)
    outbox = app.task(
        name="compat.outbox", base=OutboxTask, shared=False, autoretry_for=(KeyError,)
    )(work)
    app.finalize()

    assert getattr(plain, _compat.ORIG_RUN) is not None  # Celery wrapped it
    assert getattr(outbox, _compat.ORIG_RUN) is None  # left alone


def test_capture_message_gets_celerys_message_without_a_broker(app: Celery) -> None:
    # An unreachable broker: capturing must never connect.
    app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"

    def capture(x: int, a: int) -> None: ...

    task: Task[Any, Any] = app.task(name="compat.capture", shared=False)(capture)

    body, publish, result = _compat.capture_message(
        task, (1,), {"a": 2}, task_id="tid", options={"countdown": 5, "priority": 3}
    )

    assert body == (
        (1,),
        {"a": 2},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    )
    assert publish["headers"]["id"] == "tid"
    assert publish["headers"]["task"] == "compat.capture"
    assert publish["headers"]["eta"] is not None
    assert publish["priority"] == 3
    assert publish["routing_key"] == "celery"
    assert {"exchange", "serializer", "retry", "declare"} <= set(publish)
    assert isinstance(result, AsyncResult)
    assert (result.id, result.ignored) == ("tid", False)


def test_capture_message_returns_the_result_celery_built(app: Celery) -> None:
    def quiet() -> None: ...

    task: Task[Any, Any] = app.task(name="compat.quiet", shared=False, ignore_result=True)(quiet)

    *_, result = _compat.capture_message(task, (), {}, task_id="quiet", options={})

    assert result.ignored is True


def test_celery_counts_replacements_in_the_replaced_task_nesting_header(app: Celery) -> None:
    # Task.replace() sets replaced_task_nesting on the replacing signature; Celery's
    # message carries it (0 when not given) under the name _compat names.
    def work() -> None: ...

    task: Task[Any, Any] = app.task(name="compat.nested", shared=False)(work)

    _, first, _ = _compat.capture_message(task, (), {}, task_id="t", options={})
    _, nested, _ = _compat.capture_message(
        task, (), {}, task_id="t", options={"replaced_task_nesting": 2}
    )

    assert first["headers"][_compat.REPLACED_TASK_NESTING] == 0
    assert nested["headers"][_compat.REPLACED_TASK_NESTING] == 2


@pytest.mark.parametrize("forget", [False, True], ids=["celery-dispatches", "forgotten"])
def test_the_tracer_dispatches_the_successors_left_on_the_request(
    app: Celery, queue_name: str, forget: bool
) -> None:
    from celery.app.trace import build_tracer
    from kombu import Connection, Queue

    app.conf.task_default_queue = queue_name

    @app.task(name="compat.next", shared=False)
    def following(value: int) -> None: ...

    @app.task(name="compat.step", shared=False, bind=True)
    def step(self: Task[Any, Any]) -> int:
        assert _compat.successors(self.request) == (
            [dict(following.s())],
            [dict(following.s())],
        )
        if forget:
            _compat.forget_successors(self.request)
        return 1

    tracer = build_tracer(step.name, step, eager=False, app=app)
    request = {
        "id": "s1",
        "callbacks": [dict(following.s())],
        "chain": [dict(following.s())],
        "delivery_info": {},
    }
    tracer("s1", (), {}, request)

    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        sent = []
        while (message := queue.get(no_ack=True)) is not None:
            sent.append(message.headers["task"])
    assert sent == ([] if forget else ["compat.next", "compat.next"])


# -- canvas hooks (install_canvas_hooks) --------------------------------------------------
def _noop(*args: Any) -> None:
    """A task body."""


class _Recording(Task):  # type: ignore[type-arg]
    """Records the options of every dispatch instead of sending it."""

    sent: list[dict[str, Any]] = []

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        _Recording.sent.append(options)
        return self.AsyncResult(options["task_id"])


def test_celerys_chord_run_opens_the_chord_once_through_app_backend_before_its_header(
    app: Celery,
) -> None:
    # What _JoinApp relies on: chord.run uses app.backend only for apply_chord, called
    # with (group_id, header results) and the frozen body before the header is sent.
    from celery import chord, group

    _Recording.sent = []
    calls: list[tuple[str, list[str], str]] = []

    def open_join(group_id: str, task_ids: list[str], body: Any) -> None:
        assert _Recording.sent == []  # before any header task
        calls.append((group_id, task_ids, body.id))

    app.task(name="compat.h", base=_Recording, shared=False)(_noop)
    header = group([app.tasks["compat.h"].s(), app.tasks["compat.h"].s()], app=app)
    body = app.tasks["compat.h"].s()
    c = chord(header, body)
    result = _compat._ORIGINAL_CHORD_RUN(c, header, body, (), app=_compat._JoinApp(app, open_join))
    assert len(calls) == 1
    group_id, ids, body_id = calls[0]
    assert ids == [options["task_id"] for options in _Recording.sent]
    assert {options["group_id"] for options in _Recording.sent} == {group_id}
    assert body_id == result.id


def test_a_groups_root_id_option_becomes_every_members_root(app: Celery) -> None:
    # What the top-level root relies on: group.apply_async(root_id=...) freezes every
    # member, the first task of a member chain included, with that root.
    from celery import chain, group

    _Recording.sent = []
    app.task(name="compat.m", base=_Recording, shared=False)(_noop)
    m = app.tasks["compat.m"]
    _compat._ORIGINAL_GROUP_APPLY_ASYNC(
        group(m.s(), chain(m.s(), m.s()), app=app), task_id="g1", root_id="g1"
    )
    assert [options["root_id"] for options in _Recording.sent] == ["g1", "g1"]


def test_a_delivered_messages_headers_are_attributes_of_the_tasks_request(
    app: Celery, queue_name: str
) -> None:
    # How a worker hands a message header to the running task: as an attribute of its
    # request (not in request.headers); the Celery instrumentation reads the trace there too.
    from celery.worker.request import Request
    from kombu import Connection, Queue

    app.conf.task_default_queue = queue_name
    seen: list[dict[str, str]] = []

    @app.task(name="compat.headers", shared=False, bind=True)
    def headers(self: Task[Any, Any]) -> None:
        seen.append(_compat.delivered_headers(self.request, ["traceparent", "absent", "id"]))

    body, publish, _ = _compat.capture_message(
        headers, (), {}, task_id="h1", options={"headers": {"traceparent": "00-abc-def-01"}}
    )
    with Connection("memory://") as conn:
        producer = app.amqp.Producer(conn)
        producer.publish(body, **{**publish, "retry": False})
        message = Queue(queue_name)(conn.default_channel).get(no_ack=True)
        assert message is not None
        Request(message, app=app, task=headers).execute()

    assert seen == [{"traceparent": "00-abc-def-01", "id": "h1"}]


def test_a_groups_generator_is_a_regen_that_says_when_it_is_drawn_to_its_end(
    app: Celery,
) -> None:
    # drawn_lazily() reads celery.utils.functional._regen's private "done" flag.
    def members() -> Any:
        yield from (app.signature("t", (n,)) for n in range(3))

    lazy = group(members())
    assert _compat.drawn_lazily(lazy.tasks)
    assert len(list(lazy.tasks)) == 3
    assert not _compat.drawn_lazily(lazy.tasks)
    assert not _compat.drawn_lazily(group([app.signature("t")]).tasks)


def test_a_groups_members_are_dispatched_inside_its_apply_async_in_order(app: Celery) -> None:
    # What group batching relies on: Celery's group.apply_async calls each member's
    # apply_async, in member order, before it returns (a batch opened around it holds
    # them all).
    from celery import chunks

    _Recording.sent = []
    app.task(name="compat.b", base=_Recording, shared=False)(_noop)
    b = app.tasks["compat.b"]
    result = _compat._ORIGINAL_GROUP_APPLY_ASYNC(group([b.s(n) for n in range(3)], app=app))
    assert [options["task_id"] for options in _Recording.sent] == [r.id for r in result.results]
    # chunks dispatches a group of celery.starmap messages (Celery's own task, which
    # runs the member task in process): the member task's apply_async is never called.
    pieces = chunks(b.s(), [(n,) for n in range(4)], 2, app=app).group()
    assert isinstance(pieces, group)
    assert [t.task for t in pieces.tasks] == ["celery.starmap", "celery.starmap"]
