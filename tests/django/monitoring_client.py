"""The contract tests of the backlog and the sweep record (``tests/contract/test_monitoring.py``)
on the Django store, in a process of its own on the database its environment names.

``python -m tests.django.monitoring_client`` runs with ``tests.django.db_settings``, so
MySQL/MariaDB (``UTC_TIMESTAMP(6)`` as the clock) and SQLite get a Django of their own. It
migrates, runs each contract test on a fresh :class:`~tests.contract.harness.DjangoHarness`,
and prints ``{test: "passed" or the traceback}`` and the vendor as JSON.
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

from tests.contract import test_monitoring as contract  # noqa: E402
from tests.contract.harness import DjangoHarness  # noqa: E402


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    outcome: dict[str, str] = {}
    for name, test in vars(contract).items():
        if not name.startswith("test_") or not callable(test):
            continue
        harness = DjangoHarness()
        harness.clear()
        try:
            test(harness)
            outcome[name] = "passed"
        except BaseException:
            outcome[name] = traceback.format_exc()
    print(json.dumps({"vendor": connection.vendor, "tests": outcome}))


if __name__ == "__main__":
    main()
