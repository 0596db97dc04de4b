"""Each host on two real processes (torchrun, gloo on the CPU): every firing identical on
both ranks and equal to ``simulate_ranks()`` on the agreed counters, time and metrics.

The job (tests/jobs/hosts.py) makes the ranks differ where they can: each logs its own
value of the metric, counts its own rows per batch and reads its own wall clock (rank 1's
runs 1.7 times as fast). Agreed, the metric is the ranks' mean (Lightning and Ignite:
reduced by schedtrain; HF: the loss the Trainer itself gathers and averages), samples are
summed and time is rank 0's.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from host_strategies import counters, host_schedules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrun_helpers import forked_script_ranks

from schedtrain import Schedule, ScheduleWarning, Unit, every
from schedtrain.integrations import ScheduleDriver
from schedtrain.integrations.ranks import RankAgreement, reads_time
from schedtrain.testing import simulate_ranks
from tests.jobs.hosts import EPOCHS, RANK1_STEP_NS, ROWS, STEP_NS, STEPS, schedule, value

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available")


#: What each host's job imports, imported once here before its ranks are forked.
WARM = {"lightning": ("lightning.pytorch", "schedtrain.integrations.lightning"),
        "transformers": ("transformers", "transformers.trainer",
                         "schedtrain.integrations.transformers"),
        "ignite": ("ignite.distributed", "ignite.engine", "schedtrain.integrations.ignite")}


def run(host: str, folder: Path, *, launcher: bool = False) -> list[dict[str, Any]]:
    """Both ranks' output of ``torchrun --nproc-per-node 2 tests/jobs/hosts.py HOST``:
    with ``launcher`` that command line itself, else its two ranks forked from this
    process with torchrun's environment (``forked_script_ranks``: the host library is
    imported once here, not once per fresh interpreter)."""
    script = ROOT / "tests" / "jobs" / "hosts.py"
    if launcher:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(script), host, str(folder)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                              check=False)
    else:
        for module in WARM.get(host.removesuffix("-steps"), ()):
            importlib.import_module(module)
        proc = forked_script_ranks(script, [host, str(folder)], folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)]


def expected(metric: str = "m", lag: int = 1, samples: bool = True,
             ranks: tuple[int, ...] = (0, 1), kind: str = "full") -> list[list[object]]:
    """``simulate_ranks`` of the job: the value logged in step ``n`` (from 0) is read at
    step ``n + lag``; ``ranks``: whose values count (one rank alone, for a control)."""
    streams = [{metric: [(n + lag, value(r, n)) for n in range(EPOCHS * STEPS - lag + 1)]}
               for r in ranks]
    log = simulate_ranks(schedule(kind, metric, samples), world_size=len(ranks),
                         rank_metrics=streams, epochs=EPOCHS, steps_per_epoch=STEPS,
                         samples_per_batch=[ROWS[r] for r in ranks] if samples else 0,
                         seconds_per_step=STEP_NS / 1e9)
    return [list(c) for c in counters(log)]


def check(outputs: list[dict[str, Any]], want: list[list[object]]) -> None:
    zero, one = outputs[0]["firings"], outputs[1]["firings"]
    assert zero == one
    assert zero == want
    assert any(f[0] == "cond" for f in want) and any(f[0] == "timed" for f in want)


def test_the_control_would_disagree() -> None:
    """Decided on one rank's metric alone, the condition fires elsewhere than on the
    ranks' mean: the host tests below would see a missing reduction."""
    agreed = [f for f in expected() if f[0] == "cond"]
    assert agreed != [f for f in expected(ranks=(0,)) if f[0] == "cond"]
    assert agreed != [f for f in expected(ranks=(1,)) if f[0] == "cond"]


def test_lightning_ddp(tmp_path: Path) -> None:
    """Lightning's DDP strategy on 2 CPU processes: a metric logged without
    ``sync_dist`` is reduced (mean) before the condition reads it; samples summed; time
    triggers on rank 0's clock."""
    pytest.importorskip("lightning")
    check(run("lightning", tmp_path), expected())


def test_transformers_ddp(tmp_path: Path) -> None:
    """The HF Trainer under torchrun (gloo): the condition reads the ``loss`` the Trainer
    logs (its mean over ranks, taken as it is); time triggers on rank 0's clock."""
    pytest.importorskip("transformers")
    check(run("transformers", tmp_path), expected("loss", lag=2, samples=False))


def test_transformers_agrees_nothing_the_trainer_agreed(tmp_path: Path) -> None:
    """With no time trigger, everything the schedule reads in HF is the Trainer's and
    already the same on every rank (global_step, the gathered loss): no collective runs,
    and both ranks still fire alike, as simulated."""
    pytest.importorskip("transformers")
    outputs = run("transformers-steps", tmp_path)
    assert outputs[0] == outputs[1]
    assert outputs[0]["collectives"] == 0
    want = expected("loss", lag=2, samples=False, kind="steps")
    assert outputs[0]["firings"] == want and any(f[0] == "cond" for f in want)


def test_ignite_idist(tmp_path: Path) -> None:
    """Ignite under ``idist.Parallel(backend="gloo")``: the engine's output, reduced
    (mean); samples summed; time on rank 0's clock."""
    pytest.importorskip("ignite")
    check(run("ignite", tmp_path), expected())


def test_driver_under_torch_distributed(tmp_path: Path) -> None:
    """A hand-written loop's ``ScheduleDriver`` in a gloo process group agrees alike.

    The file's one real ``torchrun`` launch (the others fork its ranks): the driver's
    job imports least, and its ``init_process_group`` reads nothing but the environment
    torchrun's own agent gives its workers, which the forked ranks copy."""
    check(run("driver", tmp_path, launcher=True), expected())


def test_no_collective_on_a_quiet_step(tmp_path: Path) -> None:
    """With a clock-only schedule (and a condition on its step trigger) the ranks agree
    only at the step ends where a trigger is due, the epoch ends and train_end (which a
    trigger listens to): one collective each, none on the other steps."""
    outputs = run("driver-steps", tmp_path)
    assert outputs[0] == outputs[1]
    due = [s for s in range(1, EPOCHS * STEPS + 1) if s % 4 == 0 or s % 3 == 0]
    assert outputs[0]["collectives"] == len(due) + EPOCHS + 1 < EPOCHS * STEPS


def test_an_unknown_reduction_is_refused() -> None:
    """A reduction the ranks do not have is named, with the ones they have."""
    with pytest.raises(ValueError, match=r"reduce\['m'\] must be one of \['mean', 'sum', "
                                         r"'max', 'min', 'host'\], got 'median'"):
        ScheduleDriver(schedule("steps"), reduce={"m": "median"})


def test_one_process_agrees_nothing() -> None:
    """Without a process group of several ranks the driver has no agreement (and so no
    collective anywhere)."""
    driver = ScheduleDriver(schedule("steps"))
    driver.train_start()
    assert driver.ranks is None


class ThreadComm:
    """Two ranks as two threads of this process: ``agree`` is an all-gather through a
    barrier (the arithmetic of ``Comm.agree``: every rank gets every rank's row)."""

    def __init__(self, rank: int, rows: list[list[float]], barrier: threading.Barrier,
                 calls: list[int]) -> None:
        self.rank, self.is_chief = rank, rank == 0
        self._rows, self._barrier, self._calls = rows, barrier, calls

    def agree(self, values: Sequence[float]) -> list[list[float]]:
        self._barrier.wait()  # every rank read the last collective's rows
        self._rows[self.rank] = [float(v) for v in values]
        self._calls[self.rank] += 1
        self._barrier.wait()
        return [list(r) for r in self._rows]


def run_threads(sched: Schedule, shape: tuple[int, int, int], rows: Sequence[int],
                streams: Sequence[Sequence[float]]) -> tuple[list[Any], ...]:
    """The firings of ``sched`` driven by two threaded ranks, each with its rows per batch,
    its metric values (one per step) and its own wall clock (rank 1's 1.7 times faster).

    A rank's clock moves with its steps only, as ``simulate_ranks``'s does: train end
    reads it again (the real time of the end), which a clock moving per reading would
    put a step later, past a window the simulation sees open.
    """
    epochs, steps, accum = shape
    barrier, table = threading.Barrier(2, timeout=20), [[], []]  # type: ignore[var-annotated]
    calls = [0, 0]
    out: list[list[Any]] = [[], []]
    done = [0, 0]  # steps each rank has ended

    def rank(r: int) -> None:
        rate = STEP_NS if r == 0 else RANK1_STEP_NS
        driver = ScheduleDriver(sched, record=True, time_source=lambda: done[r] * rate)
        driver.ranks = RankAgreement(
            ThreadComm(r, table, barrier, calls), driver.metric_names, {},  # type: ignore[arg-type]
            global_counts=False, reads_time=reads_time(driver.table), agreed=(0, 0))
        driver.train_start()
        n = 0
        for _ in range(epochs):
            driver.epoch_start()
            for _ in range(steps):
                for _ in range(accum):
                    driver.batch_end(samples=rows[r])
                driver.put("m", streams[r][n])  # this step's value, read from its end on
                n += 1
                done[r] = n
                driver.step_end()
            driver.epoch_end()
        driver.train_end()
        out[r] = driver.firings

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tuple(out)


@pytest.mark.parametrize("trigger", [
    every("1 step") & every("1 s"), every("1 s") & every("1 step"),
    every("2 steps") & (every("1 s") | every("5 steps"))], ids=repr)
def test_a_time_part_at_any_depth_is_decided_on_the_chiefs_clock(trigger: object) -> None:
    """A part in seconds inside an ``all_of`` (whose bound keeps its step part) is still
    decided on the chief's clock: rank 1's own clock (1.7 times faster) passes 1 s at
    step 6, the chief's never does in these 6 steps, and neither rank fires there."""
    sched = Schedule({"cb0": trigger})
    assert reads_time(ScheduleDriver(sched).table)
    zero, one = run_threads(sched, (2, 3, 1), (0, 0), [[0.0] * 6] * 2)
    assert counters(zero) == counters(one)
    assert not any(f[2] == 6 for f in counters(zero))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sched=host_schedules([Unit.STEP, Unit.BATCH, Unit.EPOCH, Unit.SAMPLE, Unit.SECOND],
                            metric="m"),
       shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 2)),
       rows=st.tuples(st.integers(0, 4), st.integers(0, 4)), data=st.data())
def test_two_ranks_fire_alike_and_as_simulated(sched: Schedule, shape: tuple[int, int, int],
                                              rows: tuple[int, int],
                                              data: st.DataObject) -> None:
    """Random schedules (steps, batches, epochs, samples, seconds, windows, conditions and
    ``improved`` on a metric), rows per batch and metric values that differ per rank: both
    ranks fire the same list, ``simulate_ranks``'s on the summed samples, the chief's time
    and the ranks' mean metric."""
    epochs, steps, accum = shape
    total = epochs * steps
    values = st.lists(st.sampled_from([0.0, 1.0, 2.5, 3.0, 4.0]), min_size=total,
                      max_size=total)
    streams = [data.draw(values, label=f"rank {r}") for r in (0, 1)]
    zero, one = run_threads(sched, shape, rows, streams)
    assert counters(zero) == counters(one)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)
        log = simulate_ranks(sched, world_size=2, epochs=epochs, steps_per_epoch=steps,
                             batches_per_step=accum, samples_per_batch=list(rows),
                             seconds_per_step=STEP_NS / 1e9,
                             rank_metrics=[{"m": [(n + 1, s[n]) for n in range(total)]}
                                           for s in streams])
    assert counters(zero) == counters(log)
