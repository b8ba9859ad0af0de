"""The unit tests mirror the package: each module of ``celery_outbox`` with logic has a
``tests/unit/.../test_<module>.py`` at the same place (``celery_outbox/worker/policy.py``:
``tests/unit/worker/test_policy.py``), unless it is on :data:`NO_UNIT_MODULE` below.
"""

from __future__ import annotations

from pathlib import Path

from tests.worker import REPO_ROOT

PACKAGE = REPO_ROOT / "celery_outbox"
UNIT = REPO_ROOT / "tests" / "unit"

#: Modules without a unit test module of their own, each with the reason. Keep it short:
#: a module with logic gets tests/unit/.../test_<name>.py instead.
NO_UNIT_MODULE: dict[str, str] = {
    "__init__.py": "re-exports (tests/example/test_public_api.py checks __all__)",
    "console/__init__.py": "package docstring",
    "console/command.py": "tests/integration/test_console_command.py (from a subprocess)",
    "console/status.py": (
        "tests/integration/test_console_command.py; tests/django/test_outbox_command.py"
    ),
    "console/sweep.py": (
        "tests/integration/test_console_command.py; tests/django/test_outbox_command.py"
    ),
    "dispatch/__init__.py": "package: re-exports",
    "dispatch/asynchronous.py": (
        "tests/integration/test_async_sqlalchemy.py; tests/django/test_async_dispatch.py"
    ),
    "exceptions.py": "the exception classes",
    "publishing/__init__.py": "package: re-exports",
    "relay/__init__.py": "package: re-exports",
    "signals.py": "the signal objects",
    "sqlalchemy/__init__.py": "re-exports",
    "sqlalchemy/alembic_versions/__init__.py": "package docstring",
    "sqlalchemy/alembic_versions/celery_outbox_0001_tables.py": (
        "tests/contract/test_alembic_revisions.py (PostgreSQL, MariaDB, SQLite, Django)"
    ),
    "sqlalchemy/asynchronous.py": (
        "tests/integration/test_async_sqlalchemy.py; test_async_broker_stall.py"
    ),
    "sqlalchemy/completions.py": (
        "tests/contract/test_completions.py; tests/contract/test_sqlalchemy_last_writes.py"
    ),
    "sqlalchemy/letters.py": "tests/contract/test_dead_letters.py",
    "sqlalchemy/monitoring.py": (
        "tests/contract/test_monitoring.py (every dialect); "
        "tests/contract/test_bounded_counts.py (every dialect)"
    ),
    "sqlalchemy/statements.py": (
        "tests/contract (every statement, every dialect); "
        "tests/contract/test_claims.py, test_claim_budget.py; "
        "tests/contract/test_dispatch.py, test_superseding.py"
    ),
    "sqlalchemy/store.py": (
        "tests/contract/test_sqlalchemy_store.py and the contract; "
        "tests/contract/test_add_many.py (every dialect); "
        "contract/test_sqlalchemy_claim_threads.py, integration; "
        "tests/contract/test_wakeups.py, integration/test_relay_notify.py"
    ),
    "sqlalchemy/tables.py": "tests/contract/test_schema_parity.py",
    "sqlalchemy/transactions.py": "tests/contract (rollbacks, savepoints, on-commit)",
    "sqlalchemy/types.py": (
        "tests/contract (aware datetimes and JSON on every dialect); driver "
        "errors of the SQLAlchemy store: tests/contract"
    ),
    "sqlalchemy/workflows.py": "tests/contract/test_workflows.py (every dialect, concurrency)",
    "store/__init__.py": "package: re-exports",
    "store/published.py": "test_sqlalchemy_published_rows.py, django/test_published_deletes.py",
    "testing/__init__.py": "package: re-exports",
    "testing/memory.py": (
        "InMemoryOutboxStore: held to the store contract by tests/contract; its"
        " CompletedTask rows: tests/contract/test_completions.py; its dead "
        "letters: tests/contract/test_dead_letters.py; its backlog and sweep "
        "record: tests/contract/test_monitoring.py; its transactions and on-"
        "commit: tests/contract; its workflows and chord joins: "
        "tests/contract/test_workflows.py"
    ),
    "worker/__init__.py": "package marker",
    "workflows/__init__.py": "package: re-exports",
}


def modules() -> list[str]:
    """Every module of the package, as a path relative to it."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def unit_test_of(module: str) -> Path:
    """Where the unit tests of ``module`` live (``_compat.py``: ``test_compat.py``)."""
    path = Path(module)
    return UNIT / path.parent / f"test_{path.stem.lstrip('_')}.py"


def test_every_module_with_logic_has_a_unit_test_module() -> None:
    missing = [
        f"{m} (write {unit_test_of(m).relative_to(REPO_ROOT)})"
        for m in modules()
        if m not in NO_UNIT_MODULE and not unit_test_of(m).is_file()
    ]
    assert missing == [], "modules without unit tests: " + ", ".join(missing)


def test_the_exceptions_name_existing_modules_without_unit_tests() -> None:
    # A module removed, renamed, or given its own tests leaves the list.
    known = set(modules())
    stale = [m for m in NO_UNIT_MODULE if m not in known or unit_test_of(m).is_file()]
    assert stale == []
