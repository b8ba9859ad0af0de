"""Why a test of Celery's integration suite differs on the outbox (docs/celery-compat.md).

Each entry maps a pattern of test node ids (``fnmatch``) to its reason: an intended
difference of ``OutboxTask`` and the option that restores Celery's behaviour, or a test
that races itself. A difference with no entry here is a bug until explained.
"""

from __future__ import annotations

from fnmatch import fnmatch

#: The subset CI runs on every change (pytest ``-k``): chains, groups, chords (nested ones
#: too), task replacement, retries and apply; without the tests that wait for a failure
#: (an intended difference: an OutboxTask retries for ~15-31 s first) or that take half a
#: minute on plain Celery too (``test_retry``). About 2.5 minutes for both runs.
FAST = (
    "(test_simple_chain or test_complex_chain or test_chain_inside_group_receives_arguments"
    " or test_chain_of_task_a_group_and_a_chord or test_group_lone"
    " or test_nested_group_chord_counting_simple or test_chord_order or test_nested_chord"
    " or test_chord_in_chords_with_chains or test_task_replacement or (test_chain and replace)"
    " or test_apply_tasks or test_task_retried_once or test_basic_task"
    " or (test_chord and test_generator and 3))"
    " and not error and not errback and not _eb_ and not empty_chain"
)

_RETRIES = (
    "intended: a failing OutboxTask retries (autoretry_for=(Exception,), max_retries=5, "
    "about 15-31 s of windows) before it fails, so a test waiting a few seconds for the "
    "failure, its link_error or a chord errback times out; autoretry_for = () restores "
    "Celery's behaviour"
)
_RACE = (
    "races itself: the test arms its check after delay() returned, and the outbox's "
    "dispatch (insert, publish, delete) is slow enough for the worker to receive first"
)

KNOWN: dict[str, str] = {
    "*test_task_replacement::test_replaced_task_nesting_level_0": _RACE,
    "*test_tasks::test_fail": _RETRIES,
    "*test_tasks::test_wrong_arguments": _RETRIES,
    "*test_trace_log_arguments::test_task_failed": _RETRIES,
    "*test_link_error::*": _RETRIES,
    "*test_chord::*errback*": _RETRIES,
    "*test_chord::*error*": _RETRIES,
}


def reason_for(node_id: str, *, autoretry: bool = True) -> str | None:
    """The known reason why ``node_id`` differs on the outbox, or ``None``.

    ``autoretry=False``: the outbox run had ``autoretry_for = ()``, so the retries are no reason.
    """
    return next(
        (
            why
            for pattern, why in KNOWN.items()
            if fnmatch(node_id, pattern) and (autoretry or why is not _RETRIES)
        ),
        None,
    )
