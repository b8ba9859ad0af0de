"""The pure parts of the chaos soak (``test_soak.py``): its duration setting, the kinds of
its keys, what its workflows must record, and which rows its drain republishes (on
SQLite). Seconds, no services.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from tests.reliability.app import FLAKY
from tests.reliability.atomic_app import ATOMIC_ADD
from tests.reliability.ledger import Tally
from tests.reliability.soak_app import (
    ATOMIC_RETRIES,
    create_soak_app,
    create_soak_tables,
    soak_seconds,
)
from tests.reliability.soak_load import canvas, kind_of, workflow_expected
from tests.reliability.soak_tally import SoakCount, republish_missing
from tests.reliability.workflow_chaos_app import STEP
from tests.reliability.workflow_tally import WorkflowTally, tally


def test_soak_seconds_default_and_value() -> None:
    assert soak_seconds({}) == 600.0
    assert soak_seconds({"OUTBOX_SOAK_SECONDS": "120"}) == 120.0


@pytest.mark.parametrize("raw", ["ten", "5", "-1", "100000", "nan"])
def test_soak_seconds_refuses_bad_values_naming_them(raw: str) -> None:
    with pytest.raises(ValueError, match=f"OUTBOX_SOAK_SECONDS='{raw}'.*10 to 86400"):
        soak_seconds({"OUTBOX_SOAK_SECONDS": raw})


def test_kinds_of_keys() -> None:
    kinds = [kind_of(key) for key in ("r3-1", "e3", "f3", "a3-0", "wc2", "wd3")]
    assert kinds == ["record", "record", "flaky", "atomic", "workflow", "workflow"]
    with pytest.raises(ValueError, match="'x1'"):
        kind_of("x1")


def test_workflow_expected_keys_and_values() -> None:
    expect = workflow_expected(["wc0", "wd1"])
    assert expect == {
        "wc0-s1": 1,
        "wc0-s2": 2,
        "wc0-s3": 3,
        "wd1-h0": 1,
        "wd1-h1": 11,
        "wd1-h2": 21,
        "wd1-body": [1, 11, 21],
    }
    assert tally(expect, list(expect.items())) == WorkflowTally(
        lost=0, duplicates=0, wrong=0, bodies_lost=0, bodies_duplicated=0, bodies_wrong=0
    )


def test_canvases_record_the_expected_keys(tmp_path: Path) -> None:
    app, store = create_soak_app(
        broker="memory://",
        db_url=f"sqlite:///{tmp_path / 'soak.db'}",
        queue="soak",
        ledger_dir=str(tmp_path),
    )
    chain_keys = [step.args[-1] for step in canvas(app, "wc0").tasks]
    chord = canvas(app, "wd1")
    chord_keys = [step.args[-1] for step in chord.tasks] + [chord.body.args[-1]]
    assert chain_keys + chord_keys == list(workflow_expected(["wc0", "wd1"]))
    # The atomic tasks' retries outlast the soak's database outages (soak_app.ATOMIC_RETRIES).
    assert {app.tasks[name].max_retries for name in (ATOMIC_ADD, STEP)} == {ATOMIC_RETRIES}
    store.engine.dispose()


def test_a_lost_task_retried_before_is_republished_once_its_newest_row(tmp_path: Path) -> None:
    """A lost ``flaky`` task has a published row per attempt; only its newest is made
    pending again (a task id has one pending row: CI's soak once died on the second).
    """
    _app, store = create_soak_app(
        broker="memory://",
        db_url=f"sqlite:///{tmp_path / 'soak.db'}",
        queue="soak",
        ledger_dir=str(tmp_path),
    )
    create_soak_tables(store.engine)
    rows = [("f1", "published"), ("f1", "published"), ("r2", "published"), ("r3", "published")]
    table = store.tables.outbox
    now = datetime.now(timezone.utc)
    with store.engine.begin() as conn:
        for task_id, status in rows:
            conn.execute(
                insert(table).values(
                    task_id=task_id,
                    task_name=FLAKY,
                    payload=b"{}",
                    options={},
                    status=status,
                    available_at=now,
                    created_at=now,
                )
            )
    plain = Tally(expected=frozenset({"f1", "r2", "r3"}), seen=Counter({"r3": 1}))
    found = SoakCount(
        committed=Counter(),
        plain=plain,
        atomic_counter=0,
        atomic_effects=0,
        atomic_effect_duplicates=0,
        atomic_lost=0,
        atomic_phantoms=0,
        workflow=WorkflowTally(
            lost=0, duplicates=0, wrong=0, bodies_lost=0, bodies_duplicated=0, bodies_wrong=0
        ),
        workflow_steps=0,
        workflows_succeeded=0,
        workflows_total=0,
        dead_letters={},
    )
    assert republish_missing(store.engine, found) == 2
    c = table.c
    with store.engine.connect() as conn:
        pending = conn.execute(select(c.id, c.task_id).where(c.status == "pending")).all()
    assert sorted(task_id for _, task_id in pending) == ["f1", "r2"]
    assert max(i for i, t in pending if t == "f1") == 2  # the newest of f1's rows
    store.engine.dispose()
