"""What agreement costs on two real processes: the collectives schedtrain calls, counted.

The ranks are forked from the test process, in the environment torchrun gives its
workers (``forked_ranks``): the same collectives, each one, as under a real launch
(measured: every configuration here recorded the same calls both ways, the DCP plans
aside, whose pickles hold the run's folder name). The preemption test runs a real
``torchrun``: there the launcher's part matters (see its docstring).

The rule (docs/distributed.md): no collective on a step where no trigger is due; one
at a step where one is (the counters, the chief's time, the loss and pending signals in
one collective), one at an epoch's end not already agreed at its last step; then one per
firing of a callback that produces metrics, which also carries the stop flags; and a
stop flag after an event only where a callback that may stop alone ran.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs.ddp import collective_count
from torchrun_helpers import forked_module_ranks, forked_ranks, torchrun

from schedtrain.callbacks import Callback
from schedtrain.callbacks.base import stops_alone

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")

EPOCHS, STEPS_PER_EPOCH = 3, 8  # tests/jobs/ddp.py: 256 samples, 16 a rank and step
STEPS = EPOCHS * STEPS_PER_EPOCH

SPEC = """\
[run]
task = "jobs.ddp:make_task"
max_epochs = {epochs}
seed = 1
{run}
[callbacks.tick]
type = "jobs.ddp:Quiet"
trigger = {{ every = "{every} steps" }}
{extra}
[callbacks.count]
type = "jobs.ddp:CountCollectives"
trigger = {{ any = [{{ on = "train_end" }}, {{ on = "preempt" }}] }}
"""


def train(folder: Path, every: int, extra: str = "", run: str = "", *,
          ok: bool = True, launch: bool = False) -> subprocess.CompletedProcess[str]:
    """A 2-rank run of ``SPEC`` in ``folder / "run"``, which must succeed (``ok``): ranks
    forked from this process, or a real ``torchrun`` launch (``launch``)."""
    folder.mkdir(parents=True)
    spec = folder / "cost.toml"
    spec.write_text(SPEC.format(epochs=EPOCHS, every=every, extra=extra, run=run))
    result = (torchrun if launch else forked_ranks)(spec, folder / "run", timeout=180)
    assert result.returncode == 0 or not ok, result.stderr[-3000:]
    return result


def recorded(folder: Path, every: int, extra: str = "", run: str = "", *,
             ok: bool = True, launch: bool = False) -> list[list[list[object]]]:
    """Each rank's records (``CountCollectives``) in a 2-rank run."""
    train(folder, every, extra, run, ok=ok, launch=launch)
    return [json.loads((folder / f"collectives-rank{r}.json").read_text()) for r in (0, 1)]


def calls(records: list[list[object]]) -> list[tuple[str, int]]:
    """The collectives among ``records``, as ``(name, bytes this rank put in)``."""
    return [(str(name), int(size)) for name, size in records  # type: ignore[call-overload]
            if name != "fired" and not str(name).startswith("store:")]


def collectives(folder: Path, every: int, extra: str = "") -> int:
    """The collectives each rank called in a 2-rank run (the same on both)."""
    counts = [collective_count(r) for r in recorded(folder, every, extra)]
    assert counts[0] == counts[1]
    return counts[0]


def agreements(every: int) -> int:
    """One per step where ``every`` is due, plus one per epoch end not due."""
    due = set(range(every, STEPS + 1, every))
    ends = {STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)}
    return len(due) + len(ends - due)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> int:
    """Setup, teardown and the epoch ends: a run whose callback never fires."""
    return collectives(tmp_path_factory.mktemp("cost") / "never", 1000) - agreements(1000)


# What docs/distributed.md's cost table says, on N ranks: an agreement is one all-reduce
# of an N-row float64 matrix (each rank fills its own row), so its bytes grow with N.
N = 2


def agreement_bytes(floats: int) -> int:
    """The matrix of an agreement whose rows have ``floats`` values."""
    return 8 * floats * N


#: An agreement's row: what each rank puts in each float64 column, and how every rank
#: reads the matrix back. Every value is an integer or a loss, exact in a float64.
AGREEMENT_ROW: tuple[tuple[str, str, str], ...] = (
    ("samples", "its samples since the last agreement", "summed: the run's samples"),
    ("tokens", "its tokens since the last agreement", "summed: the run's tokens"),
    ("time_high", "the chief: its training time (ns) >> 32; another rank: 0",
     "with time_low's TIME_LOW bits: every rank's clock takes the chief's time"),
    ("time_low", "the chief: its time's TIME_LOW bits, and run control's bits above "
     "them (RETIME_WAITS when a live retime waits); another rank: 0",
     "run control's bits (RETIME_WAITS: every rank takes the retime)"),
    ("loss", "its mean loss since train/loss was published (0 when it has none)",
     "the mean over the ranks that have one: train/loss"),
    ("has_loss", "1 when it has a loss", "which ranks the loss mean counts"),
    ("preempt", "1 when a signal or notice waits on it (or it saw one posted)",
     "on any rank: every rank preempts at the epoch's end"),
)
#: time_low's bits of the chief's time, and run control's bits above them (no float of
#: their own): ``RETIME`` is bit 32.
TIME_LOW, RETIME_WAITS = 0xFFFFFFFF, 1 << 32

DUE_STEP = ("all_reduce", agreement_bytes(len(AGREEMENT_ROW)))
STOP_FLAG = ("all_reduce", agreement_bytes(1))
SAVE = '[callbacks.save]\ntype = "ModelSaver"\nkeep = 100\ntrigger = { every = "4 steps" }\n'


@pytest.fixture(scope="module")
def every_two(tmp_path_factory: pytest.TempPathFactory) -> list[list[list[object]]]:
    """The records of a run whose callback is due every 2 steps (a plain step trigger)."""
    return recorded(tmp_path_factory.mktemp("cost") / "two", 2)


def added(before: list[list[object]], after: list[list[object]]) -> Counter[tuple[str, int]]:
    """The collectives ``after`` called beyond ``before``'s (none fewer)."""
    more, less = Counter(calls(after)), Counter(calls(before))
    assert not less - more, less - more
    return more - less


@pytest.mark.parametrize("every", [2, 3, 5])
def test_one_collective_per_step_where_a_trigger_is_due_none_elsewhere(
        tmp_path: Path, baseline: int, every: int) -> None:
    assert collectives(tmp_path / "run", every) == baseline + agreements(every)


def test_every_agreement_is_one_all_reduce_of_7_floats_per_rank(
        every_two: list[list[list[object]]]) -> None:
    """A due step's agreement carries 7 float64 per rank: 56 N bytes, on every rank."""
    assert calls(every_two[0]) == calls(every_two[1])
    assert set(calls(every_two[0])) == {DUE_STEP}


def _row(case: dict[str, Any], rank: int) -> dict[str, float]:
    """What ``AGREEMENT_ROW`` says rank ``rank`` puts in for ``case``."""
    chief, loss = rank == 0, case["loss"][rank]
    elapsed = case["elapsed"] if chief else 0
    return {"samples": case["samples"][rank], "tokens": case["tokens"][rank],
            "time_high": elapsed >> 32,
            "time_low": (elapsed & TIME_LOW) | (RETIME_WAITS if chief and case["retime"]
                                                else 0),
            "loss": 0.0 if loss is None else loss, "has_loss": float(loss is not None),
            "preempt": float(case["signal"][rank] is not None)}


def test_an_agreement_row_has_the_layout_and_meaning_of_the_table(tmp_path: Path) -> None:
    """Each rank packs its row as ``AGREEMENT_ROW`` says, and every rank reads the same
    back: the summed counters, the chief's time (its low word without the flag above
    it), whether a live retime waits, the ranks' mean loss, and a preemption of any rank."""
    from jobs.agreement_row import CASES

    from schedtrain.distributed.agreement import MAX_BITS
    from schedtrain.training.control.run_control import RETIME

    # Run control's word rides where the table says, and the bits stay exact in a float64.
    assert RETIME << 32 == RETIME_WAITS and 32 + MAX_BITS <= 53
    # torchrun --standalone --nproc-per-node 2 -m jobs.agreement_row, its ranks forked
    result = forked_module_ranks("jobs.agreement_row", [str(tmp_path)], tmp_path,
                                 timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    names = [name for name, _, _ in AGREEMENT_ROW]
    for i, case in enumerate(CASES):
        assert [dict(zip(names, seen[r][i]["put"], strict=True)) for r in (0, 1)] == [
            _row(case, 0), _row(case, 1)]
        losses = [x for x in case["loss"] if x is not None]
        signal = next((x for x in case["signal"] if x is not None), None)
        read = {"sample": sum(case["samples"]), "token": sum(case["tokens"]),
                "time_ns": case["elapsed"], "retime_asked": case["retime"],
                "loss": [1, sum(losses) / len(losses)], "preempted": signal}
        for rank in (0, 1):
            assert {k: v for k, v in seen[rank][i].items() if k != "put"} == read, rank


def test_a_producing_callback_adds_one_reduction_per_firing_which_carries_the_stop_flag(
        tmp_path: Path, baseline: int, every_two: list[list[list[object]]]) -> None:
    extra = '[callbacks.rank]\ntype = "jobs.ddp:RankMetric"\ntrigger = { every = "4 steps" }\n'
    got = recorded(tmp_path / "run", 2, extra)
    assert collective_count(got[0]) == baseline + agreements(2) + STEPS // 4
    # one metric: its value and whether it was put, and the stop flag: 2 m + 1 floats
    assert added(every_two[0], got[0]) == {("all_reduce", agreement_bytes(3)): STEPS // 4}


def test_a_callback_that_may_stop_alone_adds_one_stop_flag_per_event(
        tmp_path: Path, baseline: int, every_two: list[list[list[object]]]) -> None:
    extra = '[callbacks.maybe]\ntype = "jobs.ddp:MayStop"\ntrigger = { every = "4 steps" }\n'
    got = recorded(tmp_path / "run", 2, extra)
    assert collective_count(got[0]) == baseline + agreements(2) + STEPS // 4
    assert added(every_two[0], got[0]) == {STOP_FLAG: STEPS // 4}


def test_a_one_file_checkpoint_adds_one_gather_of_each_ranks_state(
        tmp_path: Path, every_two: list[list[list[object]]]) -> None:
    """The chief gathers every rank's generators and data position, and writes alone."""
    got = recorded(tmp_path / "run", 2, SAVE)
    for rank in (0, 1):
        more = added(every_two[rank], got[rank])
        assert Counter(name for name, _ in more.elements()) == {"gather_object": STEPS // 4}


def test_a_sharded_checkpoint_costs_nine_collectives(tmp_path: Path) -> None:
    """FSDP2: the gather of the ranks' state, two flags (finite, written) and two
    barriers of schedtrain's, and DCP's planning (two gathers, a scatter and a
    broadcast of the plans) with the torch this was measured on: docs/distributed.md."""
    plain = recorded(tmp_path / "plain", 2, run='strategy = "fsdp"\n')
    got = recorded(tmp_path / "save", 2, SAVE, run='strategy = "fsdp"\n')
    more = added(plain[0], got[0])
    saves = STEPS // 4
    assert Counter(name for name, _ in more.elements()) == {
        "gather_object": 3 * saves, "all_reduce": 2 * saves, "barrier": 2 * saves,
        "scatter_object_list": saves, "broadcast_object_list": saves}
    assert {size for (name, size) in more if name == "all_reduce"} == {STOP_FLAG[1]}


def test_a_preemption_costs_two_store_requests_per_rank_and_one_checkpoint(
        tmp_path: Path) -> None:
    """SIGTERM on rank 1 at step 6: the epoch's end (step 8, due) carries the signal in
    its agreement; each rank reads the store, then proposes the step or reads the
    proposal (no collective); after ``preempt`` come the preemption checkpoint's gather
    and one barrier once run.json is written (no rank exits before the others).

    The file's one real ``torchrun`` launch, the test where the launcher has a part: a
    preempted rank exits (75), which torchrun's agent takes for a failed worker and ends
    the other one on, so only the barrier after run.json keeps both ranks' records whole;
    and the store requests counted go to the elastic agent's store (the path schedtrain
    takes under ``TORCHELASTIC_RESTART_COUNT``), which forked ranks do not take."""
    extra = ('[callbacks.signal]\ntype = "jobs.ddp:SignalOnRank"\nrank = 1\nstep = 6\n'
             'trigger = { every = "2 steps" }\n')
    got = recorded(tmp_path / "run", 2, extra, ok=False, launch=True)  # torchrun exits 1
    store = [[r[0] for r in records if str(r[0]).startswith("store:")] for records in got]
    # a rank finds the step proposed (and reads it) or proposes it: whichever came first
    assert all(s in (["store:check", "store:compare_set"], ["store:check", "store:get"])
               for s in store), store
    assert any("store:compare_set" in s for s in store), store
    for records in got:
        fired = [i for i, r in enumerate(records) if r[0] == "fired"]
        assert [r[1] for r in records if r[0] == "fired"] == [STEPS_PER_EPOCH]
        assert [name for name, _ in calls(records[fired[0]:])] == ["gather_object",
                                                                   "barrier"]
        assert set(calls(records[:fired[0]])) == {DUE_STEP}


def test_stop_training_raised_on_one_rank_stops_both_at_that_step(tmp_path: Path) -> None:
    extra = ('[callbacks.stop]\ntype = "jobs.ddp:RaiseStopOnRank"\nrank = 1\nstep = 6\n'
             'trigger = { every = "3 steps" }\n')
    result = train(tmp_path / "run", 2, extra)
    status = json.loads((tmp_path / "run" / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 6)
    assert "rank 1 raised at step 6 (on rank 1)" in result.stdout


def test_stop_training_raised_by_a_hook_on_one_rank_stops_both_at_the_next_event(
        tmp_path: Path) -> None:
    extra = ('[callbacks.stop]\ntype = "jobs.ddp:RaiseStopInHookOnRank"\nrank = 1\n'
             'step = 5\ntrigger = { on = "train_end" }\n')
    result = train(tmp_path / "run", 2, extra)
    status = json.loads((tmp_path / "run" / "run" / "run.json").read_text())
    assert (status["status"], status["step"]) == ("stopped", 6)  # tick's next firing
    assert "rank 1's hook raised at step 5 (on rank 1)" in result.stdout


@pytest.mark.parametrize(("values", "op", "expected"), [
    ([1.0, 3.0], "mean", 2.0), ([1.0, 3.0], "sum", 4.0), ([1.0, 3.0], "max", 3.0),
    ([1.0, 3.0], "min", 1.0), ([math.inf, -math.inf], "mean", math.nan),
    ([math.inf, 1.0], "sum", math.inf), ([math.nan, 1.0], "max", math.nan),
    ([1.0, math.nan], "min", math.nan), ([1e16, 1.0, -1e16], "sum", 1.0)])
def test_a_reduction_is_exact_and_a_nan_on_any_rank_is_seen(
        values: list[float], op: str, expected: float) -> None:
    from schedtrain.distributed.comm import reduce_column

    got = reduce_column([[v, 1.0] for v in values] + [[123.0, 0.0]], 0, 1, op)
    assert got is not None
    assert got == expected or (math.isnan(got) and math.isnan(expected))


class _Base(Callback):
    pass


class _Declared(Callback):
    may_stop_alone = False

    def _trigger(self) -> None:
        pass


class _Overrides(_Declared):
    def _trigger(self) -> None:  # may stop: it does not restate the promise
        pass


class _Restates(_Declared):
    may_stop_alone = False

    def _after_step(self, step: int, outputs: object) -> None:  # type: ignore[override]
        pass


class _Inherits(_Declared):
    pass


class _Resumes(_Declared):
    def load_state_dict(self, state: dict[str, object]) -> None:  # may stop from it
        pass


class _SetsUp(_Declared):
    def _setup(self) -> None:
        pass


def _instance(alone: bool) -> Callback:
    cb = _Base()
    cb.may_stop_alone = alone  # type: ignore[misc]
    return cb


@pytest.mark.parametrize(("callback", "alone"), [
    (_Base(), True), (_Declared(), False), (_Overrides(), True), (_Restates(), False),
    (_Inherits(), False), (_Resumes(), True), (_SetsUp(), True), (_instance(False), False),
    (object(), True)])
def test_may_stop_alone_is_the_most_derived_class_that_says_it_or_overrides(
        callback: object, alone: bool) -> None:
    assert stops_alone(callback) is alone


def test_built_in_callbacks_that_never_stop_alone_say_so() -> None:
    from schedtrain import callbacks as built_in

    alone = {name for name in built_in.__all__
             if isinstance(cls := getattr(built_in, name), type)
             and issubclass(cls, Callback) and cls is not Callback
             and stops_alone(cls.__new__(cls))}
    # reads its rank's own loss; a human at the chief's shell; user functions
    assert alone <= {"TerminateOnNaN", "InjectShell", "FunctionCallback"}, alone
