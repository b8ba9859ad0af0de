"""Django's task statuses, typed (django-stubs declares ``TaskResultStatus``'s members as
``...``, so mypy would not know them as statuses).
"""

from __future__ import annotations

from typing import cast

from django.tasks import TaskResultStatus

READY = cast(TaskResultStatus, TaskResultStatus.READY)
RUNNING = cast(TaskResultStatus, TaskResultStatus.RUNNING)
FAILED = cast(TaskResultStatus, TaskResultStatus.FAILED)
SUCCESSFUL = cast(TaskResultStatus, TaskResultStatus.SUCCESSFUL)
