"""The contract tests of dispatch, superseding and concurrent same-id dispatches
(``tests/contract/test_dispatch.py``, ``test_superseding.py``, ``test_dispatch_races.py``)
on the Django store, in a process of its own on the database its environment names.

``python -m tests.django.dispatch_races_client`` runs with ``tests.django.db_settings``, so
MySQL/MariaDB (the unique key over the generated ``pending_task_id``, migration 0008) and
SQLite get a Django of their own. It migrates, runs each contract test on a fresh
:class:`~tests.contract.harness.DjangoHarness`, and prints ``{test: "passed" or the
traceback}``, the vendor and the pending key's columns as JSON.
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

from celery_outbox.store.records import OUTBOX_TABLE  # noqa: E402
from celery_outbox.store.schema import PENDING_TASK_INDEX  # noqa: E402
from tests.contract import test_dispatch, test_dispatch_races, test_superseding  # noqa: E402
from tests.contract.harness import DjangoHarness  # noqa: E402


def _key_columns() -> list[str]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, OUTBOX_TABLE)
    found = constraints.get(PENDING_TASK_INDEX)
    return list(found["columns"]) if found and found["unique"] else []


def main() -> None:
    call_command("migrate", "--noinput", verbosity=0)
    outcome: dict[str, str] = {}
    for module in (test_dispatch, test_superseding, test_dispatch_races):
        for name, test in vars(module).items():
            if not name.startswith("test_") or not callable(test):
                continue
            harness = DjangoHarness()
            harness.clear()
            try:
                test(harness)
                outcome[name] = "passed"
            except BaseException:
                outcome[name] = traceback.format_exc()
    print(json.dumps({"vendor": connection.vendor, "key": _key_columns(), "tests": outcome}))


if __name__ == "__main__":
    main()
