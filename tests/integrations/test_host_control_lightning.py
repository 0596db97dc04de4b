"""Run control inside Lightning (``ScheduleCallback(..., control=HostControl(RUN_DIR))``):
random live retimes fire as ``continue_with`` (asked in Python or by the request file,
and kept across a preemption and Lightning's resume); a SIGTERM or a cloud notice from a
local metadata server saves Lightning's checkpoint, exits 75, and Lightning's resume
from it fires and trains as the uninterrupted fit."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")
from host_agreement import Shape
from host_control_cases import (
    LIGHTNING,
    NoticeCase,
    RetimeCase,
    check_notice,
    check_retime,
    notice_cases,
    retime_case,
    retime_cases,
)
from hypothesis import HealthCheck, example, given, settings

import schedtrain.training.control.retime as live
from schedtrain import Schedule, at, every, on
from schedtrain.training.control.notice import POLL_ENV

few = settings(max_examples=6, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow,
                                      HealthCheck.function_scoped_fixture])
OLD = {"a": every("2 steps"), "b": every("1 epoch") | on("train_end")}
NEW = {"a": every("3 batches"), "b": every("1 epoch") | on("train_end")}


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "POLL_NS", 0)  # a request file is seen at the next look
    monkeypatch.setenv(POLL_ENV, "0.01")


@pytest.mark.filterwarnings("ignore")
@few
@given(case=retime_cases("lightning"))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=True, preempt=5))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=False, preempt=2))
def test_a_retimed_fit_fires_as_continue_with(case: RetimeCase,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """Asked at a step's end, applied there; preempted before or after it, Lightning's
    resume with the original schedule goes on as the retimed fit (the schedule in the
    checkpoint, the retimes after it replayed from retimes.json)."""
    check_retime(case, LIGHTNING, tmp_path_factory.mktemp("pl"))


@pytest.mark.filterwarnings("ignore")
@few
@given(case=notice_cases("lightning"))
@example(case=NoticeCase(Schedule({"cue": at("3 steps"), "e": every("1 epoch")}),
                         Shape(2, 3, 2, 2, 1), 3, "aws"))
def test_a_preempted_fit_resumes_as_the_uninterrupted_one(
        case: NoticeCase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGTERM, or an AWS or GCE notice: Lightning's checkpoint, exit 75, and
    ``fit(ckpt_path=callback.resume_path)`` fires and trains as the whole fit."""
    check_notice(case, LIGHTNING, tmp_path_factory.mktemp("pl"))
