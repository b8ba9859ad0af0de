"""Where a dispatch writes (:mod:`celery_outbox.dispatch.target`): the alias an atomic body
runs on, for the dispatches it makes, and nothing left behind after it.
"""

from __future__ import annotations

import threading

from celery import Celery

from celery_outbox import OutboxTask
from celery_outbox.dispatch.target import dispatch_alias, is_atomic, writing_to


def test_inside_an_atomic_body_dispatches_write_to_its_alias_unless_told_otherwise() -> None:
    assert dispatch_alias(None) is None
    with writing_to("billing"):
        assert dispatch_alias(None) == "billing"
        assert dispatch_alias("other") == "other"
        with writing_to(None):  # an atomic body on the default database
            assert dispatch_alias(None) is None
        assert dispatch_alias(None) == "billing"
    assert dispatch_alias(None) is None


def test_another_thread_does_not_see_the_alias() -> None:
    seen: list[str | None] = []
    with writing_to("billing"):
        thread = threading.Thread(target=lambda: seen.append(dispatch_alias(None)))
        thread.start()
        thread.join()
    assert seen == [None]


def body() -> None:
    """A task body."""


def test_a_task_is_atomic_only_when_it_says_so() -> None:
    app = Celery("target-unit", set_as_current=False)
    app.task(base=OutboxTask, name="t.atomic", shared=False, atomic=True)(body)
    app.task(base=OutboxTask, name="t.plain", shared=False)(body)
    app.task(base=OutboxTask, name="t.truthy", shared=False, atomic="yes")(body)
    tasks = [app.tasks[f"t.{name}"] for name in ("atomic", "plain", "truthy")]
    assert [is_atomic(task) for task in tasks] == [True, False, False]
