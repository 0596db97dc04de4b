"""Crash trials: kill a real `schedtrain train` run at random moments, resume it with
`--resume auto` until it finishes, and compare with the uninterrupted run.

Used by tests/training/test_crash.py (a few trials) and runnable for many::

    python tests/jobs/trials.py --trials 30 [--signal TERM] [--workers 2]

A trial passes when the interrupted run's ``events.jsonl`` has exactly the firing and
scalar lines of the uninterrupted one (wall-clock fields aside), its final weights are
bit-identical, and no temporary file is left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from jobs.forked import Forked

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent

SPEC = """\
[run]
task = "jobs.crash:make_task"
max_epochs = {epochs}
seed = 3

[callbacks.lr]
type = "ScheduledHyperParamSetter"
param = "lr"
schedule = [[0, 0.001], [2, 0.0005]]
trigger = {{ any = [{{ on = "train_start" }}, {{ every = "1 epoch" }}] }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ any = [{{ every = "1 epoch" }}, {{ every = "23 steps" }}] }}

[callbacks.best]
type = "MinSaver"
trigger = {{ all = [{{ every = "1 epoch" }}, {{ improved = "val/loss" }}] }}

[callbacks.checkpoint]
type = "ModelSaver"
keep = 2
trigger = {{ any = [{{ every = "11 steps" }}, {{ on = "train_end" }}] }}

[callbacks.nan]
type = "TerminateOnNaN"
trigger = {{ every = "10 steps" }}
"""


def write_spec(folder: Path, epochs: int) -> Path:
    """The job's spec in ``folder/specs/crash.toml``."""
    path = folder / "specs" / "crash.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC.format(epochs=epochs))
    return path


def env(workers: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
            "CRASH_JOB_WORKERS": str(workers), "OMP_NUM_THREADS": "1"}


def _log_lines(run_dir: Path) -> int:
    try:
        return (run_dir / "events.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def train(spec: Path, run_dir: Path, *, workers: int = 0, kill_after: float | None = None,
          sig: int = signal.SIGKILL, resume: bool = True, after_start: bool = False,
          kill_at_step: int | None = None, fork: bool = False,
          extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One `schedtrain train` process; sent ``sig`` after ``kill_after`` seconds if alive
    (with ``after_start``: seconds after it logged its first new line, so the signal lands
    while it trains, not while it starts), or once the log has a line of step
    ``kill_at_step`` or later (0: once ``run.json`` says the run is running, as it
    starts). With ``fork``: a child forked from this process (``jobs.forked``) instead of
    a fresh interpreter."""
    cmd = ["train", str(spec), "--run-dir", str(run_dir)]
    if resume:
        cmd += ["--resume", "auto"]
    proc: subprocess.Popen[str] | Forked
    if fork:
        from jobs import forked  # not at the top: this file runs as a script too

        proc = forked.schedtrain(cmd, cwd=spec.parent.parent,
                                 env={**env(workers), **(extra_env or {})})
    else:
        proc = subprocess.Popen([sys.executable, "-m", "schedtrain", *cmd],
                                cwd=spec.parent.parent, env={**env(workers), **(extra_env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_at_step is not None:
        started, step = _now_running(run_dir), StepWatch(run_dir)
        while proc.poll() is None and not (started() if kill_at_step == 0 else
                                           step() >= kill_at_step):
            time.sleep(0.002)
        proc.send_signal(sig)
        kill_after = None
    if after_start and kill_after is not None:
        start = _log_lines(run_dir)
        while proc.poll() is None and _log_lines(run_dir) <= start:
            time.sleep(0.005)
    try:
        out, err = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _now_running(run_dir: Path) -> Callable[[], bool]:
    """Whether ``run.json`` has been written (again) since this call, saying ``running``."""
    path = run_dir / "run.json"
    before = path.stat().st_mtime_ns if path.exists() else None

    def running() -> bool:
        try:
            if path.stat().st_mtime_ns == before:
                return False
            return bool(json.loads(path.read_text()).get("status") == "running")
        except (FileNotFoundError, ValueError):  # not yet, or being replaced
            return False
    return running


class StepWatch:
    """The highest step the lines of ``events.jsonl`` name (-1: none yet), read on as the
    log grows (each call reads only what was appended since the last). A resume cuts the
    log back to its checkpoint's length: a log shorter than what was read, or another
    file, is read again from its start."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.offset, self.step, self.inode = run_dir / "events.jsonl", 0, -1, 0

    def __call__(self) -> int:
        try:
            with self.path.open("rb") as log:
                stat = os.fstat(log.fileno())
                if stat.st_size < self.offset or stat.st_ino != self.inode:
                    self.offset, self.inode = 0, stat.st_ino
                log.seek(self.offset)
                new = log.read()
        except FileNotFoundError:
            return self.step
        whole = new[:new.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(whole)
        for row in whole.splitlines():
            try:
                step = json.loads(row)["step"]
            except (ValueError, KeyError, TypeError):  # no step; or cut and rewritten
                continue                                 # past this offset between reads
            if isinstance(step, int):
                self.step = max(self.step, step)
        return self.step


def lines(run_dir: Path) -> list[dict[str, Any]]:
    """The log without its wall-clock fields."""
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "seconds", "duration")} for r in rows]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model of the checkpoint written at train_end."""
    newest = max((run_dir / "checkpoints").glob("step-*.pt"))
    state = torch.load(newest, weights_only=True)
    assert state["phase"] == "train_end", (newest, state["phase"])
    model: dict[str, torch.Tensor] = state["model"]
    return model


def leftovers(run_dir: Path) -> list[Path]:
    """Temporary files in the run directory."""
    return sorted(run_dir.rglob("*.tmp"))


def run_to_end(spec: Path, run_dir: Path, delays: list[float], *, workers: int = 0,
               sig: int = signal.SIGKILL, after_start: bool = False,
               fork: bool = False) -> list[int]:
    """Start, interrupt after each delay, resume; then run to the end (``fork``: see
    :func:`train`). The exit codes."""
    codes = []
    for delay in delays:
        result = train(spec, run_dir, workers=workers, kill_after=delay, sig=sig,
                       after_start=after_start, fork=fork)
        codes.append(result.returncode)
        if result.returncode == 0:
            return codes
        if result.returncode not in (-sig, 75, -signal.SIGKILL):
            raise AssertionError(f"exit {result.returncode}:\n{result.stderr[-3000:]}")
    result = train(spec, run_dir, workers=workers, fork=fork)
    codes.append(result.returncode)
    if result.returncode == 2 and "nothing left to resume" in result.stderr:
        return codes  # killed after it had finished: the run is whole
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}:\n{result.stderr[-3000:]}")
    return codes


def compare(reference: Path, run_dir: Path) -> list[str]:
    """What differs between a reference run and an interrupted one (empty: nothing).

    The logs line by line; every checkpoint the reference kept (``checkpoints/``,
    ``best/``) must be there with bit-identical weights; no temporary file.
    """
    problems = []
    a, b = lines(reference), lines(run_dir)
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        problems.append(f"events.jsonl differs at line {first + 1} ({len(a)} vs {len(b)} "
                        f"lines): {a[first:first + 1]} vs {b[first:first + 1]}")
    for kept in sorted(reference.rglob("*.pt")):
        other = run_dir / kept.relative_to(reference)
        if not other.exists():
            problems.append(f"{kept.relative_to(reference)} is missing")
            continue
        wa = torch.load(kept, weights_only=True)["model"]
        wb = torch.load(other, weights_only=True)["model"]
        if any(not torch.equal(wa[k], wb[k]) for k in wa):
            problems.append(f"{kept.relative_to(reference)}: weights differ")
    if leftovers(run_dir):
        problems.append(f"left behind: {leftovers(run_dir)}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kills", type=int, default=3, help="interruptions per trial")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--signal", choices=("KILL", "TERM", "INT"), default="KILL")
    parser.add_argument("--folder", default="/tmp/schedtrain-trials")
    parser.add_argument("--spec", help="another spec to train (default: the crash job); "
                                       "e.g. specs/digits.toml, run from the repository root")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--after-start", action="store_true",
                        help="count each delay from the attempt's first new log line, so "
                             "signals land during training (for TERM/INT: preemption)")
    args = parser.parse_args()
    sig = getattr(signal, f"SIG{args.signal}")
    rng = random.Random(args.seed)
    folder = Path(args.folder)
    spec = Path(args.spec).resolve() if args.spec else write_spec(folder, args.epochs)
    reference = folder / "reference"
    if not reference.exists():
        assert train(spec, reference, workers=args.workers, resume=False).returncode == 0
    t0 = time.perf_counter()
    result = train(spec, folder / "timing", workers=args.workers, resume=False)
    whole = time.perf_counter() - t0
    assert result.returncode == 0, result.stderr
    failed = 0
    for trial in range(args.trials):
        run_dir = folder / f"trial-{trial}"
        delays = sorted(rng.uniform(0.5, whole) for _ in range(args.kills))
        delays = [b - a for a, b in zip([0.0, *delays], delays, strict=False)]
        codes = run_to_end(spec, run_dir, [max(d, 0.3) for d in delays], workers=args.workers,
                           sig=sig, after_start=args.after_start)
        problems = compare(reference, run_dir)
        failed += bool(problems)
        print(f"trial {trial}: exits {codes}: {'; '.join(problems) or 'exact'}", flush=True)
    print(f"{args.trials - failed} of {args.trials} trials exact "
          f"(SIG{args.signal}, {args.kills} interruptions each, {args.workers} workers)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
