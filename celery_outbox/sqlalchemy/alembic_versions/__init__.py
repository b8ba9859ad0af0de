"""The Alembic revisions of the outbox's tables, on the branch label ``celery_outbox``.

Not imported by the library: an application names this folder
(:data:`celery_outbox.sqlalchemy.ALEMBIC_VERSIONS`) in its ``version_locations`` and runs
``alembic upgrade celery_outbox@head`` (docs/sqlalchemy.md).
"""
