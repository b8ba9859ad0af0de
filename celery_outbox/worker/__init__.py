"""The worker side of an outbox task: one attempt, from Celery's request to its outcome.

- :mod:`~celery_outbox.worker.attempt`: the :class:`Attempt` value, built once from
  Celery's request (the only code that reads the request).
- :mod:`~celery_outbox.worker.options`: a task's retry options, read and checked.
- :mod:`~celery_outbox.worker.policy`: the pure decision after a failure (retry now,
  park, or dead-letter).
- :mod:`~celery_outbox.worker.outcomes`: carries a decision out, through
  :mod:`~celery_outbox.worker.republish` (ETA retry, parked row, put back while the
  store is down) and :mod:`~celery_outbox.worker.letters` (dead letters).
- :mod:`~celery_outbox.worker.runner`: runs one delivery (counting redeliveries) and
  serves ``OutboxTask.retry``.

:class:`celery_outbox.OutboxTask` is a thin shell over this package.
"""
