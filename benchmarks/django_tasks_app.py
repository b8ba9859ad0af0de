"""The Django task of the ``django_tasks`` benchmark (imported while ``TASKS`` is set).

Its Celery task (``benchmarks.django_tasks_app.noop``) is registered on the benchmark's
app like any ``@task`` function's; no worker runs it.
"""

from __future__ import annotations

from django.tasks import task


@task
def noop(i: int) -> None:
    """Does nothing: the benchmark measures the enqueue."""
