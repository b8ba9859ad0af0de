"""Operating the outbox from a terminal, on any store: ``celery -A proj outbox ...``.

One implementation for both commands: the ``celery outbox`` group (:mod:`.command`,
registered through Celery's ``celery.commands`` entry point, no Django needed) and
``manage.py outbox`` (Django's shell over the same functions). Each subcommand's work is a
function of the app, its store and the database aliases, writing lines to a callable
(:mod:`.status`, :mod:`.sweep`).
"""
