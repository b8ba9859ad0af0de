"""The ``celery_outbox.sweep`` task and its beat entry register themselves with outbox apps."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import PersistentScheduler

import celery_outbox  # noqa: F401 - connects the finalize callback
from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import default_store, set_default_store
from celery_outbox.sweep_task import BEAT_ENTRY, SWEEP_TASK
from celery_outbox.testing import InMemoryOutboxStore

MEMORY_STORE = "celery_outbox.testing.InMemoryOutboxStore"


@pytest.fixture
def new_app() -> Iterator[Celery]:
    """An app using the outbox (its store set by ``outbox_store``)."""
    app = Celery("sweep-task-unit", broker="memory://", set_as_current=False)
    app.conf.outbox_store = MEMORY_STORE
    yield app
    app.close()


@pytest.fixture
def plain_app() -> Iterator[Celery]:
    """An app that does not use the outbox (no process default store either)."""
    default = default_store()  # pytest-django set up django_outbox, which sets one
    set_default_store(None)
    app = Celery("not-an-outbox-app", broker="memory://", set_as_current=False)
    yield app
    app.close()
    set_default_store(default)


def test_an_outbox_app_gets_the_task_and_a_beat_entry(new_app: Celery) -> None:
    new_app.conf.outbox_sweep_interval = 0.5
    new_app.finalize()

    assert SWEEP_TASK in new_app.tasks
    entry = new_app.conf.beat_schedule[BEAT_ENTRY]
    assert entry["task"] == SWEEP_TASK
    assert entry["schedule"] == timedelta(seconds=0.5)


def test_a_user_entry_of_the_same_name_is_kept(new_app: Celery) -> None:
    mine = {"task": SWEEP_TASK, "schedule": 60.0}
    new_app.conf.beat_schedule = {BEAT_ENTRY: mine, "other": {"task": "x", "schedule": 1.0}}
    new_app.finalize()

    assert new_app.conf.beat_schedule[BEAT_ENTRY] == mine
    assert "other" in new_app.conf.beat_schedule


def test_outbox_beat_schedule_false_adds_no_entry(new_app: Celery) -> None:
    new_app.conf.outbox_beat_schedule = False
    new_app.finalize()

    assert SWEEP_TASK in new_app.tasks
    assert BEAT_ENTRY not in (new_app.conf.beat_schedule or {})


def test_the_default_scheduler_schedules_the_entry(new_app: Celery, tmp_path: Path) -> None:
    new_app.finalize()
    scheduler = PersistentScheduler(app=new_app, schedule_filename=f"{tmp_path}/beat", lazy=False)
    try:
        assert scheduler.schedule[BEAT_ENTRY].task == SWEEP_TASK
        assert scheduler.schedule[BEAT_ENTRY].schedule.run_every == timedelta(seconds=5)
    finally:
        scheduler.close()


def test_the_task_sweeps_the_app_store(new_app: Celery) -> None:
    store = InMemoryOutboxStore()
    install_store(new_app, store)
    new_app.finalize()

    result = new_app.tasks[SWEEP_TASK].apply().get()

    assert result == {
        "published": 0,
        "failed": 0,
        "rescheduled": 0,
        "batches": 0,
        "more": False,
        "purged": 0,
        "purged_completed": 0,
    }


def test_a_bad_setting_read_again_at_runtime_fails_the_sweep_naming_it(new_app: Celery) -> None:
    from celery_outbox import OutboxConfigError
    from celery_outbox.state import state_of
    from tests.contract.factories import new_message

    store = InMemoryOutboxStore()
    install_store(new_app, store)
    new_app.finalize()  # started with good settings
    row_id = store.add(new_message())
    new_app.conf.outbox_sweep_batch_size = "500"
    state_of(new_app).config = None  # read again (``celery_outbox.state.reset`` does)

    with pytest.raises(OutboxConfigError, match=r"outbox_sweep_batch_size='500'"):
        new_app.tasks[SWEEP_TASK].apply().get()
    assert store.rows[row_id].status.value == "pending"  # left for the next good sweep


def test_an_app_without_the_outbox_gets_neither() -> None:
    # Before: every app in the process got both, and beat sent a sweep that failed with
    # NoStoreConfigured every interval. A fresh process: other tests' shared OutboxTasks
    # (``shared=True``) join every app finalised after them.
    code = (
        "from celery import Celery\n"
        "import celery_outbox\n"
        "outbox = Celery('outbox', set_as_current=False)\n"
        f"outbox.conf.outbox_store = {MEMORY_STORE!r}\n"
        "plain = Celery('plain', set_as_current=False)\n"
        "def work(): pass\n"
        "plain.task(name='plain.work', shared=False)(work)\n"
        "outbox.finalize(); plain.finalize()\n"
        "assert 'celery_outbox.sweep' in outbox.tasks\n"
        "assert 'celery-outbox-sweep' in outbox.conf.beat_schedule\n"
        "assert 'celery_outbox.sweep' not in plain.tasks, list(plain.tasks)\n"
        "assert 'celery-outbox-sweep' not in (plain.conf.beat_schedule or {})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_installed_store_makes_an_outbox_app(plain_app: Celery) -> None:
    install_store(plain_app, InMemoryOutboxStore())
    plain_app.finalize()

    assert SWEEP_TASK in plain_app.tasks
    assert BEAT_ENTRY in plain_app.conf.beat_schedule


def test_a_pending_outbox_task_makes_an_outbox_app(plain_app: Celery) -> None:
    # Finalize callbacks run before pending task decorators are evaluated.
    @plain_app.task(base=OutboxTask, shared=False)
    def work() -> None: ...

    plain_app.finalize()

    assert SWEEP_TASK in plain_app.tasks
    assert BEAT_ENTRY in plain_app.conf.beat_schedule


def test_an_app_finalised_before_the_import_gets_the_task_too() -> None:
    code = (
        "from celery import Celery\n"
        "app = Celery('early', set_as_current=False)\n"
        f"app.conf.outbox_store = {MEMORY_STORE!r}; app.finalize()\n"
        "plain = Celery('plain', set_as_current=False); plain.finalize()\n"
        "import celery_outbox.state; assert celery_outbox.state.default_store() is None\n"
        "import celery_outbox\n"
        "assert 'celery_outbox.sweep' in app.tasks\n"
        "assert 'celery-outbox-sweep' in app.conf.beat_schedule\n"
        "assert 'celery_outbox.sweep' not in plain.tasks\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
