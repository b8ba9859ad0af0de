"""The unit tests mirror the package: each module of ``celery_outbox`` with logic has a
``tests/unit/.../test_<module>.py`` at the same place (``celery_outbox/worker/policy.py``:
``tests/unit/worker/test_policy.py``), unless it is on :data:`NO_UNIT_MODULE` below."""

from __future__ import annotations

from pathlib import Path

from tests.worker import REPO_ROOT

PACKAGE = REPO_ROOT / "celery_outbox"
UNIT = REPO_ROOT / "tests" / "unit"

#: Modules without a unit test module of their own, each with the reason. Keep it short:
#: a module with logic gets tests/unit/.../test_<name>.py instead.
NO_UNIT_MODULE: dict[str, str] = {
    # Pure declarations: no logic to test on their own.
    "__init__.py": "re-exports (tests/example/test_public_api.py checks __all__)",
    "worker/__init__.py": "package marker",
    "sqlalchemy/__init__.py": "re-exports",
    "exceptions.py": "the exception classes",
    "signals.py": "the signal objects",
    "clock.py": "utcnow(), one line",
    "table_storage.py": "DDL strings: tests/django/test_table_storage.py and "
    "tests/contract/test_sqlalchemy_table_storage.py see them applied",
    # The in-memory store, one of the stores the contract suite (tests/contract) runs.
    "testing.py": "InMemoryOutboxStore: held to the store contract by tests/contract",
    "memory_letters.py": "its dead letters: tests/contract/test_dead_letters.py",
    "memory_completions.py": "its CompletedTask rows: tests/contract/test_completions.py",
    "memory_monitoring.py": "its backlog and sweep record: tests/contract/test_monitoring.py",
    "monitoring.py": "the MonitoredStore contract: tests/contract/test_monitoring.py",
    "sqlalchemy/monitoring.py": "tests/contract/test_monitoring.py (every dialect)",
    "completions.py": "the CompletionStore contract: tests/contract/test_completions.py",
    "sqlalchemy/completions.py": "tests/contract/test_completions.py",
    "memory_transactions.py": "its transactions and on-commit: tests/contract",
    "memory_workflows.py": "its workflows and chord joins: tests/contract/test_workflows.py",
    "workflows.py": "the WorkflowStore contract: tests/contract/test_workflows.py",
    "wakeups.py": "the WakeupStore contract: tests/contract/test_wakeups.py",
    "sqlalchemy/wakeups.py": "tests/contract/test_wakeups.py, integration/test_relay_notify.py",
    "sqlalchemy/workflows.py": "tests/contract/test_workflows.py (every dialect, concurrency)",
    # The SQLAlchemy store, held to the same contract on PostgreSQL, MySQL and SQLite.
    "sqlalchemy/boundary.py": "driver errors of the SQLAlchemy store: tests/contract",
    "sqlalchemy/counting.py": "tests/contract/test_bounded_counts.py (every dialect)",
    "sqlalchemy/claims.py": "tests/contract/test_claims.py, test_claim_budget.py",
    "sqlalchemy/inserts.py": "tests/contract/test_dispatch.py, test_superseding.py",
    "sqlalchemy/bulk.py": "tests/contract/test_add_many.py (every dialect)",
    "sqlalchemy/claim_threads.py": "contract/test_sqlalchemy_claim_threads.py, integration",
    "bulk_store.py": "the BulkStore contract: tests/contract/test_add_many.py",
    "sqlalchemy/last_writes.py": "tests/contract/test_sqlalchemy_last_writes.py",
    "published_rows.py": "test_sqlalchemy_published_rows.py, django/test_published_deletes.py",
    "sqlalchemy/letters.py": "tests/contract/test_dead_letters.py",
    "sqlalchemy/statements.py": "tests/contract (every statement, every dialect)",
    "sqlalchemy/store.py": "tests/contract/test_sqlalchemy_store.py and the contract",
    "sqlalchemy/tables.py": "tests/contract/test_schema_parity.py",
    "sqlalchemy/transactions.py": "tests/contract (rollbacks, savepoints, on-commit)",
    "sqlalchemy/types.py": "tests/contract (aware datetimes and JSON on every dialect)",
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
