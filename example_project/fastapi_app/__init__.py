"""celery-outbox in a FastAPI app on async SQLAlchemy: ``await task.adelay()``."""

from __future__ import annotations
