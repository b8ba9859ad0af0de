"""The contract tests of atomic tasks (``tests/contract/test_completions.py``) and the
races of ``completion_races`` on the Django store, in a process of its own on the
database its environment names.

``python -m tests.django.completions_client`` runs with ``tests.django.db_settings``, so
MySQL/MariaDB and SQLite get a Django of their own, outside pytest-django's PostgreSQL.
It migrates, runs each contract test (both cases of a parametrised one) on a fresh
:class:`~tests.contract.harness.DjangoHarness`, and prints ``{test: "passed" or the
traceback}`` and the vendor as JSON.
"""

from __future__ import annotations

import inspect
import json
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.contract import test_completions as contract  # noqa: E402
from tests.contract.harness import DjangoHarness  # noqa: E402
from tests.django import completion_races  # noqa: E402


def cases() -> Iterator[tuple[str, Callable[..., None], dict[str, Any]]]:
    """Every contract test, once per parameter value (only ``first_commits`` exists), and
    the races of :mod:`tests.django.completion_races`.
    """
    tests = {**vars(contract), **vars(completion_races)}
    for name, test in tests.items():
        if not name.startswith("test_") or not callable(test):
            continue
        if "first_commits" in inspect.signature(test).parameters:
            for first_commits in (True, False):
                yield f"{name}[{first_commits}]", test, {"first_commits": first_commits}
        else:
            yield name, test, {}


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    outcome: dict[str, str] = {}
    for name, test, params in cases():
        harness = DjangoHarness()
        harness.clear()
        try:
            test(harness, **params)
            outcome[name] = "passed"
        except BaseException:
            outcome[name] = traceback.format_exc()
    print(json.dumps({"vendor": connection.vendor, "tests": outcome}))


if __name__ == "__main__":
    main()
