"""Run control inside the HF Trainer, by the cases every host shares
(``host_control_cases``): random live retimes fire as ``continue_with`` (asked in Python
or by the request file, and kept across a preemption and HF's resume); a SIGTERM or a
cloud notice from a local metadata server saves HF's checkpoint, exits 75, and
``train(resume_from_checkpoint=True)`` fires and trains as the uninterrupted run."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from host_agreement import Shape
from host_control_cases import (
    NoticeCase,
    RetimeCase,
    check_notice,
    check_retime,
    fast_polling,  # noqa: F401 (an autouse fixture)
    notice_cases,
    retime_case,
    retime_cases,
)
from host_control_cases import few as host_settings
from host_control_hf import TRANSFORMERS
from hypothesis import example, given

from schedtrain import Schedule, at, every, on

few = host_settings(4)
OLD = {"a": every("2 steps"), "b": every("1 epoch") | on("train_end")}
NEW = {"a": every("3 batches"), "b": every("1 epoch") | on("train_end")}



@pytest.mark.filterwarnings("ignore")
@few
@given(case=retime_cases("transformers"))
# preempted after the retime, then before it (replayed from retimes.json on resume)
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=True, preempt=5))
@example(case=retime_case(OLD, NEW, Shape(2, 4, 1, 2, 1), 3, by_file=False, preempt=2))
# under accumulation, asked at an epoch's last (partial) step
@example(case=retime_case(OLD, NEW, Shape(2, 3, 2, 2, 1), 2, by_file=True, preempt=None))
def test_a_retimed_train_fires_as_continue_with(case: RetimeCase,
                                                tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    """Asked at a step's end, applied there; preempted before or after it, HF's resume
    with the original schedule goes on as the retimed run (the schedule in HF's
    checkpoint, the retimes after it replayed from retimes.json)."""
    check_retime(case, TRANSFORMERS, tmp_path_factory.mktemp("hf"))


@pytest.mark.filterwarnings("ignore")
@few
@given(case=notice_cases("transformers"))
@example(case=NoticeCase(Schedule({"cue": at("3 steps"), "e": every("1 epoch")}),
                         Shape(2, 3, 2, 2, 1), 3, "aws"))  # an epoch's last step
@example(case=NoticeCase(Schedule({"cue": at("2 steps"), "t": every("5 tokens")}),
                         Shape(1, 4, 1, 2, 1), 2, "gce"))
def test_a_preempted_train_resumes_as_the_uninterrupted_one(
        case: NoticeCase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGTERM, or an AWS or GCE notice: HF's checkpoint, exit 75, and
    ``train(resume_from_checkpoint=True)`` fires and trains as the whole run."""
    check_notice(case, TRANSFORMERS, tmp_path_factory.mktemp("hf"))
