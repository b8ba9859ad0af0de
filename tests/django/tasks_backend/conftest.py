"""Fixtures of the ``django.tasks`` backend tests."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.brokers import delete_queue, new_queue_name


@pytest.fixture(scope="module")
def djtasks_queue(redis_url: str) -> Iterator[str]:
    """The module's queue on Redis: :data:`tests.django.tasks_backend.app.app` routes every task to
    it (and keeps its results in that Redis).
    """
    from tests.django.tasks_backend import app as djtasks_app

    name = new_queue_name()
    djtasks_app.configure(redis_url, name)
    yield name
    delete_queue(redis_url, name)


@pytest.fixture
def tasks_setting(settings: Any, djtasks_queue: str) -> None:
    """``TASKS`` of :mod:`tests.django.tasks_backend.settings` for the test."""
    from tests.django.tasks_backend.settings import TASKS

    settings.TASKS = TASKS


@pytest.fixture
def tasks(tasks_setting: None) -> ModuleType:
    """:mod:`tests.django.tasks_backend.functions`, imported (once) while ``TASKS`` is set."""
    return importlib.import_module("tests.django.tasks_backend.functions")
