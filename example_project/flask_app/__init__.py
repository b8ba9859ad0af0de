"""celery-outbox in a Flask app: Flask-SQLAlchemy's ``db.session``, tables from Alembic."""

from __future__ import annotations
