"""The header parts of a chord join, as its ``results`` column holds them (every store).

The column is a JSON list with one slot per header step: ``null`` while the step is not
in, ``[result]`` once it is (``result`` a string, or ``null`` for a step that returned
``None``). Wrapping the result keeps "not in yet" apart from "returned ``None``", so a
step counted twice is recognised and changes nothing.
"""

from __future__ import annotations

import json


def empty_parts(size: int) -> str:
    """The ``results`` of a join waiting for ``size`` header steps."""
    return json.dumps([None] * size)


def with_part(parts: str, index: int, result: str | None) -> str | None:
    """``parts`` with header step ``index`` in, holding ``result``; ``None`` when that
    step is in already (nothing to write).

    Raises
    ------
    IndexError
        When ``index`` is outside the header.
    """
    slots = json.loads(parts)
    if not 0 <= index < len(slots):
        raise IndexError(f"Chord header step {index} is outside a header of {len(slots)} steps.")
    if slots[index] is not None:
        return None
    slots[index] = [result]
    return json.dumps(slots)


def part_results(parts: str) -> list[str | None]:
    """The results in header order (``None`` where a step is not in yet)."""
    return [None if slot is None else slot[0] for slot in json.loads(parts)]
