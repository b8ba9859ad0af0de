"""What ``celery_outbox`` exports is what ``docs/api.md`` documents, and all of it imports.

Also: every ``celery_outbox.…`` name the docs mention in backticks resolves.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import celery_outbox
from celery_outbox.sweep_task import SWEEP_TASK

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"
#: A name in backticks at the start of a table row of docs/api.md.
ROW = re.compile(r"^\| `celery_outbox\.(\w+)` \|", re.MULTILINE)
#: A dotted ``celery_outbox`` name in backticks anywhere in the docs.
MENTION = re.compile(r"`(celery_outbox(?:\.\w+)+)")
#: Dotted strings the docs mention that are not Python names.
NOT_PYTHON = {SWEEP_TASK}


def documented_names(markdown: str) -> list[str]:
    """The names of the API table."""
    return ROW.findall(markdown)


def resolve(dotted: str) -> Any:
    """The module or attribute ``dotted`` names (raises when there is none)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ModuleNotFoundError(dotted)


def test_the_api_page_documents_exactly_all() -> None:
    names = documented_names(API_MD.read_text())
    assert sorted(names) == sorted(celery_outbox.__all__)
    assert len(names) == len(set(names))


def test_every_exported_name_imports() -> None:
    for name in celery_outbox.__all__:
        assert getattr(celery_outbox, name) is not None, name


def test_plumbing_is_not_exported_but_still_importable() -> None:
    for name in ("store_for", "set_default_store", "load_store"):
        assert name not in celery_outbox.__all__
        assert callable(resolve(f"celery_outbox.registry.{name}"))
    assert "relay_for" not in celery_outbox.__all__
    assert callable(resolve("celery_outbox.relay.relay.relay_for"))
    assert callable(resolve("celery_outbox.state.reset"))


def test_every_celery_outbox_name_the_docs_mention_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    unresolved = []
    for page in pages:
        for dotted in set(MENTION.findall(page.read_text())) - NOT_PYTHON:
            try:
                resolve(dotted)
            except (ImportError, AttributeError):
                unresolved.append(f"{page.name}: {dotted}")
    assert unresolved == []


def test_the_check_sees_a_missing_row() -> None:
    markdown = API_MD.read_text().replace("| `celery_outbox.Relay` |", "| Relay |")
    assert "Relay" not in documented_names(markdown)
