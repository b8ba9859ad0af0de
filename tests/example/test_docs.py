"""Every setting is documented with its default, and the docs name no setting the code lacks.

The checks are functions so that a test can show they fail: a setting added to
``celery_outbox.config.DEFAULTS`` without a row in ``docs/settings.md`` is reported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from celery_outbox.config import DEFAULTS, RULES, Rule, Seconds
from django_outbox.settings import PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MD = ROOT / "docs" / "settings.md"
#: Where DESIGN.md may be: the team's shared/ folder beside the checkout (as in CI), in
#: the repository, or named by ``OUTBOX_DESIGN_MD``.
DESIGN_CANDIDATES = [
    ROOT.parent / "shared" / "DESIGN.md",
    ROOT / "DESIGN.md",
    ROOT / "docs" / "design.md",
]

ROW = re.compile(r"^\|\s*`(?P<name>[A-Za-z_]+)`\s*\|(?P<cells>.*)\|\s*$", re.M)


def table_rows(markdown: str) -> dict[str, list[str]]:
    """``{setting name: [cells after the name]}`` of every table row naming a setting."""
    return {m["name"]: [c.strip() for c in m["cells"].split("|")] for m in ROW.finditer(markdown)}


def undocumented(defaults: Mapping[str, Any], markdown: str) -> list[str]:
    """Settings of ``defaults`` without a row in ``markdown`` giving their default.

    The default is the second cell after the name (type, default, unit, meaning) and
    must show the Python value, such as `` `5.0` `` or `` `None` ``.
    """
    rows = table_rows(markdown)
    missing = []
    for name, value in defaults.items():
        cells = rows.get(name)
        if cells is None or len(cells) < 2 or f"`{value!r}`" not in cells[1]:
            missing.append(name)
    return missing


def unknown_in_docs(defaults: Mapping[str, Any], markdown: str) -> list[str]:
    """``outbox_*`` settings the docs list but the code does not have."""
    return sorted(
        name for name in table_rows(markdown) if name.startswith("outbox_") and name not in defaults
    )


#: DESIGN.md settings of open issues, not built yet (the issue that builds one removes it here).
PLANNED_SETTINGS: dict[str, str] = {
    "outbox_all_tasks": "issue 40: every task on the outbox",
    "outbox_exclude_tasks": "issue 40: every task on the outbox",
}


def design_settings(design: str) -> set[str]:
    """The ``outbox_*`` names of DESIGN.md's settings table."""
    section = design.split("## Settings", 1)[1].split("\n## ", 1)[0]
    return {m["name"] for m in ROW.finditer(section) if m["name"].startswith("outbox_")}


def test_every_setting_in_code_is_documented_with_its_default() -> None:
    assert undocumented(DEFAULTS, SETTINGS_MD.read_text()) == []


def without_range(rules: Mapping[str, Rule], markdown: str) -> list[str]:
    """Settings whose row does not give the rule's accepted range (the first cell)."""
    rows = table_rows(markdown)
    return [
        name for name, rule in rules.items() if rule.accepted not in (rows.get(name) or [""])[0]
    ]


def test_every_setting_row_gives_its_accepted_range() -> None:
    markdown = SETTINGS_MD.read_text()
    assert set(RULES) == set(DEFAULTS)
    assert without_range(RULES, markdown) == []
    tighter = {**RULES, "outbox_sweep_interval": Seconds(minimum=1.0, maximum=60.0)}
    assert without_range(tighter, markdown) == ["outbox_sweep_interval"]


def test_no_documented_setting_is_missing_from_the_code() -> None:
    assert unknown_in_docs(DEFAULTS, SETTINGS_MD.read_text()) == []


def test_the_check_fails_for_a_setting_missing_from_the_docs() -> None:
    markdown = SETTINGS_MD.read_text()
    assert undocumented({**DEFAULTS, "outbox_new_knob": 1.5}, markdown) == ["outbox_new_knob"]
    changed = {**DEFAULTS, "outbox_sweep_interval": 7.0}
    assert undocumented(changed, markdown) == ["outbox_sweep_interval"]


def test_django_only_settings_are_documented() -> None:
    markdown = SETTINGS_MD.read_text()
    names = [name for name in vars(Settings) if name.isupper()]
    assert names
    for name in names:
        assert f"`{PREFIX}{name}`" in markdown, name


def test_design_settings_exist_in_the_code() -> None:
    candidates = [*DESIGN_CANDIDATES, *filter(None, [os.environ.get("OUTBOX_DESIGN_MD")])]
    found = [Path(path) for path in candidates if Path(path).is_file()]
    if not found:
        pytest.skip("DESIGN.md is not in this checkout (set OUTBOX_DESIGN_MD to its path)")
    names = design_settings(found[0].read_text())
    assert names, "DESIGN.md has no outbox_* settings table"
    planned = set(PLANNED_SETTINGS)
    assert sorted(names - set(DEFAULTS) - planned) == []
    assert sorted(planned & set(DEFAULTS)) == [], "built: remove it from PLANNED_SETTINGS"
    assert sorted(planned - names) == [], "no longer in DESIGN.md: remove it from PLANNED_SETTINGS"
