"""Workflow rows and chord joins in the Django store on PostgreSQL: the cases every Django
database runs (:mod:`tests.django.workflow_cases`), the tables, and the ORM path of
``add_workflow_steps`` for databases without an upsert.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from celery_outbox.store.records import CHORD_JOIN_TABLE, COMPLETED_TABLE, WORKFLOW_TABLE
from django_outbox.models import ChordJoin, Workflow
from django_outbox.store.workflows import add_steps_by_orm
from tests.conftest import django_db_is_postgres
from tests.contract.factories import NOW
from tests.contract.harness import DjangoHarness
from tests.django.helpers import postgres_only
from tests.django.workflow_cases import (  # noqa: F401 (collected here)
    CONCURRENT,
    RACERS,
    race,
    test_a_dead_letter_fails_its_workflow_in_the_letters_transaction,
    test_a_failed_workflow_resumes_keeping_its_last_failure,
    test_a_join_opens_once_and_counts_each_header_step_once,
    test_a_requeue_resumes_its_workflow_only_when_it_requeues,
    test_an_atomic_step_stores_its_workflow,
    test_concurrent_additions_are_never_lost,
    test_concurrent_header_steps_each_count_once_and_one_sees_zero,
    test_done_joins_are_purged_oldest_first,
    test_steps_add_up_on_one_row_that_keeps_its_name,
    test_the_last_step_finishes_the_workflow_and_no_count_passes_the_total,
    test_workflows_are_counted_by_status,
    test_writes_join_the_callers_transaction,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[DjangoHarness]:
    if request.node.name in CONCURRENT and not django_db_is_postgres():
        pytest.skip("needs a database shared by connections (not in-memory SQLite)")
    harness = DjangoHarness()
    yield harness
    harness.clear()


def test_the_tables_have_their_shared_names_and_unique_keys() -> None:
    assert (Workflow._meta.db_table, ChordJoin._meta.db_table) == (
        WORKFLOW_TABLE,
        CHORD_JOIN_TABLE,
    )
    with connection.cursor() as cursor:
        tables = {
            table: connection.introspection.get_constraints(cursor, table)
            for table in (WORKFLOW_TABLE, CHORD_JOIN_TABLE, COMPLETED_TABLE)
        }
    for table, key in ((WORKFLOW_TABLE, "root_id"), (CHORD_JOIN_TABLE, "group_id")):
        assert any(c["unique"] and c["columns"] == [key] for c in tables[table].values())
    assert tables[COMPLETED_TABLE]["celery_outbox_completed_root_idx"]["columns"] == ["root_id"]


def test_the_orm_path_adds_steps_like_the_upsert(harness: DjangoHarness) -> None:
    add_steps_by_orm("root-1", name="tests.chain", steps=2, now=NOW, alias="default")
    add_steps_by_orm("root-1", name="tests.other", steps=3, now=NOW, alias="default")
    row = Workflow.objects.get()
    assert (row.name, row.status, row.steps_total, row.steps_done) == (
        "tests.chain",
        "running",
        5,
        0,
    )


@postgres_only
def test_the_orm_path_never_loses_a_concurrent_addition(harness: DjangoHarness) -> None:
    def add(n: int) -> None:
        add_steps_by_orm("root-c", name="tests.group", steps=n + 1, now=NOW, alias="default")

    race(harness, add, RACERS)
    assert Workflow.objects.get().steps_total == sum(range(1, RACERS + 1))
