"""The django_tasks benchmark's task on django-tasks-db's backend (``TASKS["database"]``);
imported only when django-tasks-db is installed.
"""

from __future__ import annotations

from django.tasks import task


@task(backend="database")
def noop_db(i: int) -> None:
    """Does nothing: the benchmark measures the enqueue."""
