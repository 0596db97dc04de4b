"""Run control inside Ignite (``attach_schedule(..., control=HostControl(RUN_DIR),
to_save=...)``), by the shared cases of ``host_control_cases``: random live retimes fire
as ``continue_with`` (asked in Python or by the request file, and kept across a
preemption and Ignite's resume); a SIGTERM or a cloud notice from a local metadata server
saves Ignite's ``Checkpoint``, exits 75, and ``Checkpoint.load_objects`` then
``engine.run`` fires and trains as the uninterrupted run."""

from __future__ import annotations

import pytest

pytest.importorskip("ignite")
from host_agreement import Shape
from host_control_cases import (
    IGNITE,
    NoticeCase,
    RetimeCase,
    check_notice,
    check_retime,
    fast_polling,  # noqa: F401 (an autouse fixture)
    notice_cases,
    retime_case,
    retime_cases,
    steps,
)
from host_control_cases import few as host_settings
from hypothesis import assume, example, given

from schedtrain import Schedule, at, every, on

few = host_settings(6)
OLD = {"a": every("2 steps"), "b": every("1 epoch") | on("train_end")}
NEW = {"a": every("3 batches"), "b": every("1 epoch") | on("train_end")}



@pytest.mark.filterwarnings("ignore")
@few
@given(case=retime_cases("ignite"))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=True, preempt=5))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 2, 2, 1), 1, by_file=False, preempt=3))
def test_a_retimed_engine_fires_as_continue_with(case: RetimeCase,
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """Asked at a step's end, applied there; preempted before or after it, Ignite's
    resume with the original schedule goes on as the retimed run (the schedule in the
    checkpoint, the retimes after it replayed from retimes.json). A preemption at the
    run's last step lets it complete (``test_ignite_control``): left out here."""
    assume(case.preempt is None or case.preempt < steps(case.shape))
    check_retime(case, IGNITE, tmp_path_factory.mktemp("ig"))


@pytest.mark.filterwarnings("ignore")
@few
@given(case=notice_cases("ignite"))
@example(case=NoticeCase(Schedule({"cue": at("3 steps"), "e": every("1 epoch")}),
                         Shape(2, 3, 1, 2, 1), 3, "aws"))
@example(case=NoticeCase(Schedule({"cue": at("4 steps"), "e": every("1 epoch")}),
                         Shape(2, 4, 2, 2, 1), 4, "SIGTERM"))
def test_a_preempted_engine_resumes_as_the_uninterrupted_one(
        case: NoticeCase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGTERM, or an AWS or GCE notice: Ignite's Checkpoint, exit 75, and the Ignite
    resume fires and trains as the whole run. A notice that lands during a step end's
    actions is the next step end's (its triggers see the deadline), so one at the last
    step lets the run finish, as in the own loop, and so does a SIGTERM at the last step
    (Ignite would run an engine resumed there from its start): such cases are left out."""
    assume(case.step < steps(case.shape))
    check_notice(case, IGNITE, tmp_path_factory.mktemp("ig"))
