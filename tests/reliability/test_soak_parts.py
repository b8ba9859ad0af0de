"""The pure parts of the chaos soak (``test_soak.py``): its duration setting, the kinds of
its keys, and what its workflows must record. Seconds, no services."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.atomic_app import ATOMIC_ADD
from tests.reliability.soak_app import ATOMIC_RETRIES, create_soak_app, soak_seconds
from tests.reliability.soak_load import canvas, kind_of, workflow_expected
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
