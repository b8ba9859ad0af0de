"""The pytest plugin (:mod:`celery_outbox.pytest_plugin`) as users load it: a pytest run in
a subprocess with ``-p celery_outbox.pytest_plugin`` (what the ``pytest11`` entry point
does once the package is installed), over the in-memory store and broker.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.worker import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

pytest_plugins = ["pytester"]

USER_TESTS = """
import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_outbox import OutboxTask, install_store
from celery_outbox.testing import InMemoryOutboxStore

app = Celery("users_app", broker="memory://")  # the current app: the fixture's default
app.conf.task_default_queue = "users-queue"
store = InMemoryOutboxStore()
install_store(app, store)
ran = []


@app.task(base=OutboxTask, name="users.greet", shared=False)
def greet(name):
    ran.append(name)


def published():
    with Connection("memory://") as conn:
        queue = Queue("users-queue")(conn.default_channel)
        return [m.headers["id"] for m in iter(lambda: queue.get(no_ack=True), None)]


def test_records_and_drains(outbox):
    assert outbox.app is app
    with store.atomic():
        greet.delay("ada")
    outbox.assert_sent(greet, args=("ada",))
    assert published() == []
    outbox.drain()
    assert ran == ["ada"]


def test_failure_message(outbox):
    greet.delay("bob")
    outbox.assert_sent("users.greet", args=("alice",))


def test_without_the_fixture_nothing_changes():
    result = greet.delay("eve")
    assert published() == [result.id]
"""


def test_the_plugin_gives_users_the_outbox_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    pytester.makepyfile(test_users=USER_TESTS)

    result = pytester.runpytest_subprocess(
        "-p", "celery_outbox.pytest_plugin", "-p", "no:django", "-p", "no:cacheprovider", "-n", "0"
    )

    result.assert_outcomes(passed=2, failed=1)
    output = result.stdout.str()
    assert (
        'outbox.assert_sent("users.greet", args=("alice",))\n'
        "E       AssertionError: Expected 1 outbox dispatch of "
        "users.greet('alice', **any), found 0.\n"
        "E       Dispatched during this test (1):\n"
        "E         - users.greet('bob')  [committed, using=None, task_id="
    ) in output
    assert "E             args differ: expected ('alice',), got ('bob',)\n" in output
    assert "raise AssertionError" not in output  # the plugin's frames are hidden


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]["pytest11"]
    # Named as the module, so `-p celery_outbox.pytest_plugin` or `pytest_plugins = [...]`
    # with the package installed registers it once, not twice (pluggy refuses that).
    assert entry_points == {"celery_outbox.pytest_plugin": "celery_outbox.pytest_plugin"}


def test_the_plugin_defines_only_opt_in_fixtures() -> None:
    from celery_outbox import pytest_plugin

    for name in pytest_plugin.__all__:
        marker = getattr(pytest_plugin, name)._fixture_function_marker
        assert marker.autouse is False, name
