"""The workflow cases (:mod:`tests.django.workflow_cases`) on the Django store, in a
process of its own on the database its environment names.

``python -m tests.django.workflows_client`` runs with ``tests.django.db_settings`` (so
MySQL/MariaDB and SQLite get a Django of their own, outside pytest-django's PostgreSQL),
migrates, runs each case on a fresh :class:`~tests.contract.harness.DjangoHarness`, and
prints ``{case: "passed" or the traceback}`` and the vendor as JSON.
"""

from __future__ import annotations

import json
import os
import traceback

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.contract.harness import DjangoHarness  # noqa: E402
from tests.django import workflow_cases  # noqa: E402


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    outcome: dict[str, str] = {}
    for name, case in vars(workflow_cases).items():
        if not name.startswith("test_") or not callable(case):
            continue
        harness = DjangoHarness()
        harness.clear()
        try:
            case(harness)
            outcome[name] = "passed"
        except BaseException:
            outcome[name] = traceback.format_exc()
    print(json.dumps({"vendor": connection.vendor, "tests": outcome}))


if __name__ == "__main__":
    main()
