"""What a canvas looks like from one dispatch or one request: pure functions.

Celery hands a canvas to its tasks piece by piece: the first step of a chain carries the
rest in its ``chain`` option, a chord's header steps carry the body in ``chord``, a
group's members share a ``group_id``. From those options this module tells whether a
dispatch or a running request is a step of a workflow, which ``root_id`` keys that
workflow, how many steps a piece of canvas holds (``Workflow.steps_total``), and which
task ids a running step will hand on (its successors, counted already).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

#: Whether a task name is a step that reports its completion (an ``OutboxTask``).
IsStep = Callable[[str], bool]

#: The options of a request or dispatch that make it part of a canvas.
CANVAS_KEYS = ("root_id", "parent_id", "group_id", "group_index", "chord", "chain")
#: Longest ``Workflow.name``.
NAME_LIMIT = 200


def in_canvas(task_id: str, options: Mapping[str, Any]) -> bool:
    """Whether the task ``task_id`` with these options (``root_id``, ``chain``,
    ``group_id``, ``chord``) is a step of a canvas: part of a chain, group or chord, or
    a task whose root is another task.
    """
    root = options.get("root_id")
    return bool(
        (root and root != task_id)
        or options.get("chain")
        or options.get("group_id")
        or options.get("chord")
    )


def workflow_root(task_id: str, options: Mapping[str, Any]) -> str | None:
    """The ``root_id`` of the workflow a task with these options is a step of, or
    ``None`` when it is no canvas step.
    """
    root = options.get("root_id") or task_id
    return str(root) if in_canvas(task_id, {**options, "root_id": root}) else None


def canvas_options(options: Mapping[str, Any], *, headers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options placing a task in its canvas (:data:`CANVAS_KEYS`, its callbacks, and
    the ``headers`` named), as a dead letter keeps them so that a requeue resumes the
    workflow where it stopped; empty outside a canvas.
    """
    kept = {key: options[key] for key in (*CANVAS_KEYS, "link", "link_error") if options.get(key)}
    given = options.get("headers") or {}
    named = {key: given[key] for key in headers if given.get(key) is not None}
    if named:
        kept["headers"] = named
    return kept


def count_steps(sig: Any, is_step: IsStep) -> int:
    """How many steps (tasks ``is_step`` accepts) the signature ``sig`` (a ``Signature``
    or its dict) runs: a task and the chain it carries; every task of a chain, group
    or chord (header and body). ``link`` callbacks are not counted here: they count
    when they are dispatched.
    """
    if not isinstance(sig, Mapping):
        return 0
    kind = sig.get("subtask_type")
    kwargs = sig.get("kwargs") or {}
    options = sig.get("options") or {}
    if kind in ("chain", "group"):
        return sum(count_steps(member, is_step) for member in _members(kwargs.get("tasks")))
    if kind == "chord":
        header = sum(count_steps(member, is_step) for member in _members(kwargs.get("header")))
        return header + count_steps(kwargs.get("body"), is_step)
    own = 1 if is_step(str(sig.get("task") or "")) else 0
    return own + sum(count_steps(step, is_step) for step in options.get("chain") or ())


def dispatch_steps(task_name: str, options: Mapping[str, Any], is_step: IsStep) -> int:
    """The steps a new (not handed-on) dispatch of ``task_name`` adds to its workflow:
    itself, the chain it carries, and, for the first member of a chord's header, the
    chord's body.
    """
    steps = 1 if is_step(task_name) else 0
    steps += sum(count_steps(step, is_step) for step in options.get("chain") or ())
    if options.get("chord") and not options.get("group_index"):
        steps += count_steps(options["chord"], is_step)
    return steps


def dispatch_task_names(task_name: str, options: Mapping[str, Any]) -> list[str]:
    """The name of every task a new dispatch of ``task_name`` will run as its canvas
    goes on: itself, its chain, and its chord's body (every task of nested canvases).
    """
    names = [task_name]
    for piece in (*reversed(list(options.get("chain") or ())), options.get("chord")):
        names.extend(task_names(piece))
    return names


def task_names(sig: Any) -> Iterator[str]:
    """The name of every task a signature (or canvas) runs, in order, with the chain it
    carries; ``link`` callbacks not included.
    """
    if not isinstance(sig, Mapping):
        return
    kind = sig.get("subtask_type")
    kwargs = sig.get("kwargs") or {}
    if kind in ("chain", "group"):
        for member in _members(kwargs.get("tasks")):
            yield from task_names(member)
    elif kind == "chord":
        for member in _members(kwargs.get("header")):
            yield from task_names(member)
        yield from task_names(kwargs.get("body"))
    else:
        yield str(sig.get("task") or "")
        for step in reversed(list((sig.get("options") or {}).get("chain") or ())):
            yield from task_names(step)


def handed_on_ids(request_options: Mapping[str, Any]) -> set[str]:
    """The task ids a running step hands on when it completes: every task of its
    ``chain`` and of its chord's body (already counted in its workflow's steps).
    """
    ids: set[str] = set()
    for piece in (request_options.get("chain"), request_options.get("chord")):
        ids.update(_task_ids(piece))
    return ids


def describe(task_name: str, options: Mapping[str, Any]) -> str:
    """A short name for the workflow a dispatch opens: its task names in order."""
    names = [_short(task_name)]
    if options.get("chord"):
        names = [f"chord({names[0]}…)", *_names(options["chord"])]
    for step in reversed(list(options.get("chain") or ())):
        names.extend(_names(step))
    text = " → ".join(names)
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 1] + "…"


def describe_canvas(pieces: Sequence[Any]) -> str:
    """A short name for a canvas made of ``pieces`` in order (signatures or their dicts)."""
    text = " → ".join(name for piece in pieces for name in _names(piece))
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 1] + "…"


def _names(sig: Any) -> list[str]:
    if not isinstance(sig, Mapping):
        return []
    kind = sig.get("subtask_type")
    kwargs = sig.get("kwargs") or {}
    if kind == "chain":
        return [name for member in _members(kwargs.get("tasks")) for name in _names(member)]
    if kind == "group":
        members = _members(kwargs.get("tasks"))
        first = _names(members[0]) if members else []
        return [f"group({first[0] if first else ''}x{len(members)})"]
    if kind == "chord":
        header = _members(kwargs.get("header"))
        first = _names(header[0]) if header else []
        return [f"chord({first[0] if first else ''}x{len(header)})", *_names(kwargs.get("body"))]
    return [_short(str(sig.get("task") or "?"))]


def _short(task_name: str) -> str:
    return task_name.rsplit(".", 1)[-1]


def _members(tasks: Any) -> list[Any]:
    if isinstance(tasks, Mapping):  # a group given as the header of a chord
        return _members((tasks.get("kwargs") or {}).get("tasks"))
    return list(tasks or ())


def _task_ids(piece: Any) -> Iterator[str]:
    """Every frozen task id inside ``piece`` (signatures, their canvases and chains),
    except those of ``link``/``link_error`` callbacks.
    """
    if isinstance(piece, Mapping):
        options = piece.get("options") or {}
        task_id = options.get("task_id") if isinstance(options, Mapping) else None
        if isinstance(task_id, str) and piece.get("subtask_type") is None:
            yield task_id
        for key, value in piece.items():
            if key in ("link", "link_error"):
                continue
            if key == "options" and isinstance(value, Mapping):
                for option, nested in value.items():
                    if option not in ("link", "link_error", "task_id"):
                        yield from _task_ids(nested)
            elif isinstance(value, (Mapping, list, tuple)):
                yield from _task_ids(value)
    elif isinstance(piece, (list, tuple)):
        for item in piece:
            yield from _task_ids(item)
