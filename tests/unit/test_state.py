"""What the outbox holds for each app (:mod:`celery_outbox.state`): one state per app,
created once, forgotten by ``reset`` (closing the relay) while the default store stays.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_outbox import OutboxConfig, state
from celery_outbox.registry import install_store
from celery_outbox.relay.relay import relay_for
from celery_outbox.state import AppState, default_store, reset, set_default_store, state_of
from celery_outbox.testing import InMemoryOutboxStore


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("state-unit", broker="memory://", set_as_current=False)
    yield app
    reset(app)
    app.close()


@pytest.fixture
def no_default() -> Iterator[None]:
    default = default_store()  # pytest-django set up django_outbox, which sets one
    set_default_store(None)
    yield
    set_default_store(default)


def test_each_app_has_one_state_created_on_first_use(app: Celery) -> None:
    other = Celery("state-unit-2", set_as_current=False)
    states = []
    threads = [threading.Thread(target=lambda: states.append(state_of(app))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert all(state is states[0] for state in states)
    assert state_of(app) is states[0]
    assert state_of(other) is not states[0]
    assert (states[0].config, states[0].store, states[0].relay) == (None, None, None)


def test_reset_reads_the_settings_again_and_closes_the_relay(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_store(app, InMemoryOutboxStore())
    app.conf.outbox_max_deliveries = 3
    assert OutboxConfig.from_celery(app).max_deliveries == 3
    relay, closed = relay_for(app), []
    monkeypatch.setattr(relay, "close", lambda: closed.append(True))

    app.conf.outbox_max_deliveries = 4
    assert OutboxConfig.from_celery(app).max_deliveries == 3  # read once
    reset(app)

    assert closed == [True]
    assert OutboxConfig.from_celery(app).max_deliveries == 4
    assert state_of(app).store is None  # an installed store is forgotten too


def test_a_state_made_while_waiting_for_the_lock_is_the_one_returned(app: Celery) -> None:
    # Two threads' first use at once: the second must take the first's state, not
    # replace it (its relay and store would be lost).
    got: list[AppState] = []
    made = AppState()
    with state._create_lock:
        waiting = threading.Thread(target=lambda: got.append(state_of(app)))
        waiting.start()
        waiting.join(timeout=0.2)  # now blocked on the lock
        setattr(app, state._SLOT, made)  # what the first thread does under the lock
    waiting.join()

    assert got == [made]


def test_reset_of_an_app_without_state_does_nothing(app: Celery) -> None:
    reset(app)
    first = state_of(app)
    reset(app)
    assert state_of(app) is not first


def test_reset_keeps_the_default_store(app: Celery, no_default: None) -> None:
    default = InMemoryOutboxStore()
    set_default_store(default)
    state_of(app)

    reset(app)

    assert default_store() is default
