"""Old module paths keep working (``celery_outbox._moved``): each is the module it moved to,
with one ``DeprecationWarning`` naming the new path; a module that became a package keeps
its names through the package's ``__getattr__``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from celery_outbox._moved import MOVED
from tests.worker import REPO_ROOT


def fresh_import(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_its_new_module(old: str) -> None:
    try:
        importlib.import_module(MOVED[old])
    except ImportError as missing:  # an optional dependency (django.tasks: Django 6)
        pytest.skip(f"{MOVED[old]} needs {missing.name}")
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_an_old_path_warns_once_per_process_and_names_its_new_home() -> None:
    done = fresh_import(
        "from celery_outbox.relay_loop import RelayLoop\n"
        "from celery_outbox.relay_loop import RelayLoop as again\n"
        "import celery_outbox.relay.loop as new\n"
        "assert RelayLoop is new.RelayLoop is again\n"
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(lines) == 1, done.stderr
    assert "celery_outbox.relay_loop moved to celery_outbox.relay.loop" in lines[0]


def test_a_module_that_became_a_package_keeps_its_names_with_a_warning() -> None:
    done = fresh_import(
        "from celery_outbox.relay import Relay\n"
        "from celery_outbox.relay.relay import Relay as new\n"
        "assert Relay is new\n"
        "from celery_outbox.testing import InMemoryOutboxStore\n"
    )
    assert done.returncode == 0, done.stderr
    assert "celery_outbox.relay.Relay moved to celery_outbox.relay.relay.Relay" in done.stderr
    assert "InMemoryOutboxStore" not in done.stderr  # its documented home: no warning


def test_an_unknown_name_of_such_a_package_is_an_attribute_error() -> None:
    relay = importlib.import_module("celery_outbox.relay")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        relay.Nope  # noqa: B018
