"""Old module paths of the layout before version 0.2 (issue 37), importable until a later
release: each is the module it moved to, with a ``DeprecationWarning`` the first time.

Installed on ``sys.meta_path`` when ``celery_outbox`` is imported (``django_outbox``
imports it too). A module that became a package of the same name (``celery_outbox.relay``,
``celery_outbox.workflows``, ``celery_outbox.testing``, ``django_outbox.admin``) keeps its
names through the package's own ``__getattr__`` instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

#: Old module path: the module it moved to.
MOVED: dict[str, str] = {
    "celery_outbox.batching": "celery_outbox.dispatch.batching",
    "celery_outbox.broker": "celery_outbox.publishing.broker",
    "celery_outbox.broker_links": "celery_outbox.publishing.links",
    "celery_outbox.bulk_store": "celery_outbox.store.base",
    "celery_outbox.canvas_shape": "celery_outbox.workflows.shape",
    "celery_outbox.canvas_warnings": "celery_outbox.workflows.checks",
    "celery_outbox.claim_ahead": "celery_outbox.relay.sweeper",
    "celery_outbox.claim_threads": "celery_outbox.store.base",
    "celery_outbox.completions": "celery_outbox.store.base",
    "celery_outbox.database_clock": "celery_outbox.clock",
    "celery_outbox.dispatch_target": "celery_outbox.dispatch.target",
    "celery_outbox.dispatches": "celery_outbox.testing.recorder",
    "celery_outbox.draining": "celery_outbox.testing.recorder",
    "celery_outbox.eager": "celery_outbox.dispatch.eager",
    "celery_outbox.envelope": "celery_outbox.dispatch.envelope",
    "celery_outbox.escaping": "celery_outbox.dead_letters",
    "celery_outbox.estimates": "celery_outbox.store.counts",
    "celery_outbox.expectations": "celery_outbox.testing.recorder",
    "celery_outbox.inflation": "celery_outbox.dispatch.envelope",
    "celery_outbox.join_parts": "celery_outbox.store.records",
    "celery_outbox.limits": "celery_outbox.dispatch.validation",
    "celery_outbox.listener": "celery_outbox.relay.loop",
    "celery_outbox.memory_completions": "celery_outbox.testing.memory",
    "celery_outbox.memory_letters": "celery_outbox.testing.memory",
    "celery_outbox.memory_monitoring": "celery_outbox.testing.memory",
    "celery_outbox.memory_transactions": "celery_outbox.testing.memory",
    "celery_outbox.memory_workflows": "celery_outbox.testing.memory",
    "celery_outbox.message_sends": "celery_outbox.publishing.producers",
    "celery_outbox.metric_counters": "celery_outbox.metrics",
    "celery_outbox.monitoring": "celery_outbox.store.base",
    "celery_outbox.pending_key": "celery_outbox.store.schema",
    "celery_outbox.producers": "celery_outbox.publishing.producers",
    "celery_outbox.publishable": "celery_outbox.relay.relay",
    "celery_outbox.published_rows": "celery_outbox.store.published",
    "celery_outbox.recorder": "celery_outbox.testing.recorder",
    "celery_outbox.records": "celery_outbox.store.records",
    "celery_outbox.redis_push": "celery_outbox.publishing.redis",
    "celery_outbox.relay_loop": "celery_outbox.relay.loop",
    "celery_outbox.root_indexes": "celery_outbox.store.schema",
    "celery_outbox.rows": "celery_outbox.store.records",
    "celery_outbox.rules": "celery_outbox.config",
    "celery_outbox.schedule": "celery_outbox.dispatch.validation",
    "celery_outbox.sqlalchemy.boundary": "celery_outbox.sqlalchemy.types",
    "celery_outbox.sqlalchemy.bulk": "celery_outbox.sqlalchemy.store",
    "celery_outbox.sqlalchemy.claim_threads": "celery_outbox.sqlalchemy.store",
    "celery_outbox.sqlalchemy.claims": "celery_outbox.sqlalchemy.statements",
    "celery_outbox.sqlalchemy.counting": "celery_outbox.sqlalchemy.monitoring",
    "celery_outbox.sqlalchemy.inserts": "celery_outbox.sqlalchemy.statements",
    "celery_outbox.sqlalchemy.last_writes": "celery_outbox.sqlalchemy.completions",
    "celery_outbox.sqlalchemy.wakeups": "celery_outbox.sqlalchemy.store",
    "celery_outbox.storage": "celery_outbox.store.base",
    "celery_outbox.store_errors": "celery_outbox.store.errors",
    "celery_outbox.superseding": "celery_outbox.store.superseding",
    "celery_outbox.sweeper": "celery_outbox.relay.sweeper",
    "celery_outbox.table_storage": "celery_outbox.store.schema",
    "celery_outbox.wakeups": "celery_outbox.store.base",
    "celery_outbox.worker.retry_frames": "celery_outbox.worker.runner",
    "celery_outbox.worker.successors": "celery_outbox.worker.steps",
    "celery_outbox.worker.unknown": "celery_outbox.worker.letters",
    "celery_outbox.workflow_dispatch": "celery_outbox.workflows.dispatch",
    "django_outbox.admin_actions": "django_outbox.admin.actions",
    "django_outbox.admin_base": "django_outbox.admin.base",
    "django_outbox.admin_chart": "django_outbox.admin.overview",
    "django_outbox.admin_completed": "django_outbox.admin.completed",
    "django_outbox.admin_messages": "django_outbox.admin.messages",
    "django_outbox.admin_overview": "django_outbox.admin.overview",
    "django_outbox.admin_paging": "django_outbox.admin.paging",
    "django_outbox.admin_rows": "django_outbox.admin.buttons",
    "django_outbox.admin_workflows": "django_outbox.admin.workflows",
    "django_outbox.bounded_counts": "django_outbox.admin.counts",
    "django_outbox.letter_groups": "django_outbox.admin.actions",
    "django_outbox.metrics_view": "django_outbox.views",
    "django_outbox.overview": "django_outbox.admin.overview",
    "django_outbox.overview_models": "django_outbox.models",
    "django_outbox.store.batches": "django_outbox.store.transactions",
    "django_outbox.store.bulk": "django_outbox.store.store",
    "django_outbox.store.claim_threads": "django_outbox.store.store",
    "django_outbox.store.clocks": "django_outbox.store.calls",
    "django_outbox.store.commits": "django_outbox.store.transactions",
    "django_outbox.store.counting": "django_outbox.store.monitoring",
    "django_outbox.store.orm": "django_outbox.store.vendors",
    "django_outbox.store.outbox": "django_outbox.store.store",
    "django_outbox.store.published": "django_outbox.store.transactions",
    "django_outbox.store.sql": "django_outbox.store.statements",
    "django_outbox.store.wakeups": "django_outbox.store.store",
    "django_outbox.sweep_models": "django_outbox.models",
    "django_outbox.tasks.priority": "django_outbox.tasks.backend",
    "django_outbox.workflow_models": "django_outbox.models",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module it moved to."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path of :data:`MOVED`; ``None`` for every other name."""
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The module the old path moved to (imported if need be), after a warning."""
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}: import from there (the old path goes away in a "
            "later release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module was executed under its new name."""


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once: it answers only for old paths, and
    before any finder that could still find an old file (a stale copy elsewhere).
    """
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


install()
