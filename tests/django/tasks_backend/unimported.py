"""A Django task whose module the tests' worker never imports (so it does not know it)."""

from __future__ import annotations

from django_outbox.tasks import task


@task
def unknown_to_the_worker(key: str) -> None:
    """Never runs: the worker has no such Celery task."""
