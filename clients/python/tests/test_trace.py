"""The traceparent a worker's calls send: the step's trace continued under a span of the worker's own."""

from __future__ import annotations

import pytest

from warden_client._trace import child_traceparent
from warden_client.worker import Task

from .fake_warden import TRACEPARENT, is_child_of, make_task


def test_a_child_keeps_the_trace_id_and_flags_under_a_new_span_id() -> None:
    children = {child_traceparent(TRACEPARENT) for _ in range(50)}
    assert all(is_child_of(child, TRACEPARENT) for child in children)
    assert len(children) == 50, "a fresh random span id each time"
    unsampled = TRACEPARENT[:-2] + "00"
    child = child_traceparent(unsampled)
    assert child is not None and child.endswith("-00")


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "",
        "not a traceparent",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper-case hex
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 has 4 fields
    ],
)
def test_an_invalid_parent_gives_no_traceparent(bad: str | None) -> None:
    assert child_traceparent(bad) is None


def test_a_later_version_with_more_fields_is_continued_as_version_00() -> None:
    child = child_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future")
    assert child is not None and child.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


def test_a_task_names_one_span_of_the_worker_for_all_its_calls() -> None:
    task = Task(make_task(1, traceparent=TRACEPARENT))
    assert task.traceparent == TRACEPARENT
    assert is_child_of(task.worker_traceparent, TRACEPARENT)
    assert task.worker_traceparent == task.worker_traceparent
    assert Task(make_task(2)).worker_traceparent is None
