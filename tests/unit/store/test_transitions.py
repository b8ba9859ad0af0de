"""``celery_outbox.store.transitions``: the status rules every store writes its statements from."""

from __future__ import annotations

import pytest

from celery_outbox.store import transitions
from celery_outbox.store.base import WORKFLOW_STATUSES
from celery_outbox.store.records import DeadLetterStatus
from celery_outbox.store.transitions import Transition

LETTERS = [transitions.REQUEUE, transitions.DISCARD, transitions.COMPLETE]
WORKFLOWS = [transitions.SUCCEED, transitions.FAIL, transitions.CANCEL, transitions.RESUME]


@pytest.mark.parametrize("rule", LETTERS)
def test_a_dead_letter_leaves_dead_once(rule: Transition[str]) -> None:
    assert rule.sources == ("dead",)
    assert rule.target in {status.value for status in DeadLetterStatus} - {"dead"}
    assert rule.allows(DeadLetterStatus.DEAD)  # the enum, as the in-memory store keeps it
    assert rule.allows("dead")  # the stored value, as the SQL stores read it
    assert not any(rule.allows(status) for status in DeadLetterStatus if status.value != "dead")


@pytest.mark.parametrize("rule", WORKFLOWS)
def test_a_cancelled_workflow_stays_cancelled(rule: Transition[str]) -> None:
    assert set(rule.sources) <= set(WORKFLOW_STATUSES)
    assert rule.target in WORKFLOW_STATUSES
    assert not rule.allows("cancelled")


def test_a_failed_workflow_runs_again_and_only_a_running_one_succeeds() -> None:
    assert transitions.RESUME.allows("failed")
    assert not transitions.RESUME.allows("succeeded")
    assert transitions.SUCCEED.sources == ("running",)
    assert transitions.CANCEL.sources == ("running", "failed")
