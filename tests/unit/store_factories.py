"""``outbox_store`` targets for ``test_registry.py`` (dotted paths need a module)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_outbox.testing import InMemoryOutboxStore

#: Not callable: ``outbox_store`` pointing here is refused.
NOT_CALLABLE = 42


class AppStore(InMemoryOutboxStore):
    """A store that remembers the app it was built for."""

    def __init__(self, app: Celery | None = None) -> None:
        super().__init__()
        self.app = app

    @classmethod
    def from_celery(cls, app: Celery) -> AppStore:
        """Build the store for ``app`` (what ``outbox_store`` calls on a class)."""
        return cls(app)


def make_store(app: Celery) -> AppStore:
    """A factory taking the app, as documented."""
    return AppStore(app)


def broken(app: Celery) -> Any:
    """A factory whose own code fails."""
    return app.conf["no_such_setting"]
