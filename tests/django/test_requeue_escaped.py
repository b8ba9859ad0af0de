"""Requeuing a letter that was escaped to be stored (issue 13, item 3), on PostgreSQL.

The new task gets the arguments the failed one was given (NaN, Infinity), not their
escaped text; a letter stored without its arguments is never requeued without them.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import pytest

from celery_outbox.dead_letters import escape_letter, minimal_letter
from celery_outbox.exceptions import OutboxError, StoreDataError
from celery_outbox.store.records import NewDeadLetter
from django_outbox.dead_letters import requeue_letter
from django_outbox.models import DeadLetter, OutboxMessage
from tests.django.admin_app import APP_PATH, make_letter

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """Requeue through the test app (``tests.django.admin_app``)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def stored(letter: NewDeadLetter) -> DeadLetter:
    """Save ``letter`` as the worker would, escaped."""
    fields = asdict(letter)
    fields.pop("task_id")
    return make_letter(task_id=letter.task_id, **fields)  # type: ignore[no-any-return]


def new_letter(**fields: Any) -> NewDeadLetter:
    template = make_letter()
    values = {f: getattr(template, f) for f in NewDeadLetter.__dataclass_fields__}
    template.delete()
    return NewDeadLetter(**{**values, **fields})


def test_requeue_restores_the_escaped_arguments() -> None:
    letter = stored(escape_letter(new_letter(args=[math.nan], kwargs={"using": -math.inf})))
    assert (letter.args, letter.kwargs) == (["NaN"], {"using": "-Infinity"})

    requeue_letter(letter, by="test")

    payload = OutboxMessage.objects.get().payload
    assert '[NaN], {"using": -Infinity}' in payload


def test_a_letter_stored_without_its_arguments_is_not_requeued() -> None:
    letter = stored(minimal_letter(new_letter(args=["x"]), StoreDataError("too long")))

    with pytest.raises(OutboxError, match="stored without its arguments"):
        requeue_letter(letter, by="test")
    assert not OutboxMessage.objects.exists()
