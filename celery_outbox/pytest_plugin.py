"""The pytest plugin of celery-outbox (entry point ``pytest11``: active once installed).

Fixtures, all opt-in (nothing runs unless a test asks for it):

``outbox``
    An :class:`~celery_outbox.testing.recorder.OutboxRecorder` for the test: every
    ``OutboxTask`` dispatch is recorded (task, arguments, options, alias, whether its
    transaction committed), nothing is published on commit, and ``outbox.drain()`` runs
    the kept dispatches in the test process (``drain(publish=True)``: to the broker).
``outbox_celery_app``
    The Celery app whose store and tasks ``outbox`` uses: Celery's current app.
    Override it in your ``conftest.py`` to name another.

One hook runs for every test: after a test, the published rows whose ``DELETE`` the
Django store handed to a thread (:mod:`django_outbox.store.transactions`) are deleted and
that thread's connection is closed, so no test sees another's rows and the test database
can be dropped at the end (nothing happens unless that module was loaded).

This module never imports Django or SQLAlchemy. See ``docs/pytest-plugin.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pytest
from celery import Celery, current_app

if TYPE_CHECKING:
    from celery_outbox.testing.recorder import OutboxRecorder

__all__ = ["outbox", "outbox_celery_app"]


@pytest.fixture
def outbox_celery_app() -> Celery:
    """The Celery app of the ``outbox`` fixture: Celery's current app (override to change)."""
    app: Celery = current_app._get_current_object()  # type: ignore[attr-defined]
    return app


@pytest.fixture
def outbox(outbox_celery_app: Celery) -> Iterator[OutboxRecorder]:
    """What this test dispatched through the outbox; assertions and ``drain()`` on it."""
    # Imported here: loading the plugin (every pytest run, once installed) stays cheap.
    from celery_outbox.testing.recorder import OutboxRecorder

    with OutboxRecorder.recording(outbox_celery_app) as recorder:
        yield recorder


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """Before a test's fixtures end: delete its published rows still waiting (Django)."""
    published = sys.modules.get("django_outbox.store.transactions")
    if published is not None:
        published.settle()
    yield
