"""What agreement costs on n processes: the collectives schedtrain calls, and their bytes.

Each scenario is one ``torchrun --standalone --nproc-per-node N -m schedtrain train``
job over gloo on the CPU: tests/jobs/ddp.py's small classifier with 128 samples per
rank (8 steps per epoch, 3 epochs, 24 steps, on any N), a do-nothing callback on
``every = "T steps"``, and ``CountCollectives``, which records every collective called
through ``torch.distributed`` (DDP's gradient all-reduce runs in C++ and is not
counted) with the bytes this rank puts in (a tensor's size; an object's pickled size),
and every request to the process group's store. A scenario adds one thing to the run
where the callback is due every 2 steps; its cost is the difference, per firing:

* quiet step - the run where nothing is ever due: what it calls while training, less
  one agreement per epoch end, over its quiet steps;
* due step - a plain step trigger every 2 steps instead of never;
* metric trigger - a callback that produces one metric, every 4 steps;
* stop flag - a callback that may stop alone, every 4 steps; a decided stop (rank 1
  asks at step 6) adds the broadcast of its reason;
* checkpoint - ``ModelSaver`` every 4 steps, one file (``"ddp"``) or sharded
  (``"fsdp"``, against the same run under ``"fsdp"`` without it);
* preemption - SIGTERM to rank 1 at step 6: what runs from the ``preempt`` event on
  (the preemption checkpoint) and the store requests it adds.

Every collective count must be the same on every rank, and equal the formula
(``FORMULA``); the script says where one does not. Reproduce (from the repository
root; 8 processes on 2 cores take a few minutes)::

    python benchmarks/bench_collectives.py --ranks 2 4 8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
EPOCHS, STEPS_PER_EPOCH = 3, 8
STEPS = EPOCHS * STEPS_PER_EPOCH
REPRODUCE = "python benchmarks/bench_collectives.py --ranks {ranks}"

SPEC = """\
[run]
task = "jobs.ddp:make_scaled_task"
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

SAVER = '[callbacks.save]\ntype = "ModelSaver"\nkeep = 100\ntrigger = { every = "4 steps" }\n'
SCENARIOS: dict[str, tuple[int, str, str]] = {  # name -> every, [run] lines, callbacks
    "never": (1000, "", ""),
    "due": (2, "", ""),
    "metric": (2, "", '[callbacks.m]\ntype = "jobs.ddp:RankMetric"\n'
                      'trigger = { every = "4 steps" }\n'),
    "flag": (2, "", '[callbacks.f]\ntype = "jobs.ddp:MayStop"\n'
                    'trigger = { every = "4 steps" }\n'),
    "stop": (2, "", '[callbacks.s]\ntype = "jobs.ddp:StopOnRank"\nrank = 1\nstep = 6\n'
                    'trigger = { every = "3 steps" }\n'),
    "save": (2, "", SAVER),
    "fsdp": (2, 'strategy = "fsdp"\n', ""),
    "fsdp_save": (2, 'strategy = "fsdp"\n', SAVER),
    "preempt": (2, "", '[callbacks.p]\ntype = "jobs.ddp:SignalOnRank"\nrank = 1\nstep = 6\n'
                       'trigger = { every = "2 steps" }\n'),
}
AGREED = 7  # floats per rank in a due step's agreement (agreement.py: _agree_counts)


def agreements(every: int) -> int:
    """Agreements in a run: one per due step, one per epoch end not due."""
    due = set(range(every, STEPS + 1, every))
    ends = {STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)}
    return len(due) + len(ends - due)


def run(n: int, name: str, folder: Path) -> list[list[list[Any]]]:
    """Scenario ``name`` on ``n`` ranks: each rank's records."""
    every, run_lines, extra = SCENARIOS[name]
    here = folder / f"{name}-{n}"
    here.mkdir(parents=True)
    spec = here / "cost.toml"
    spec.write_text(SPEC.format(epochs=EPOCHS, every=every, run=run_lines, extra=extra))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(n), "-m", "schedtrain", "train", str(spec),
           "--run-dir", str(here / "run")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=here, env=env, text=True, capture_output=True,
                          timeout=900, check=False)
    if done.returncode != 0 and name != "preempt":  # a preempted worker exits non-zero
        sys.exit(f"{name} on {n} ranks failed:\n{done.stderr[-3000:]}")
    return [json.loads((here / f"collectives-rank{r}.json").read_text()) for r in range(n)]


def collectives(records: list[list[Any]]) -> list[tuple[str, int]]:
    return [(str(a), int(b)) for a, b in records
            if a != "fired" and not str(a).startswith("store:")]


def store_ops(records: list[list[Any]]) -> int:
    return sum(1 for a, _ in records if str(a).startswith("store:"))


def until_fired(records: list[list[Any]]) -> list[list[Any]]:
    """The records before the callback's first firing (train_end or preempt)."""
    for i, (a, _) in enumerate(records):
        if a == "fired":
            return records[:i]
    return records


def after_fired(records: list[list[Any]]) -> list[list[Any]]:
    for i, (a, _) in enumerate(records):
        if a == "fired":
            return records[i + 1:]
    return []


def summary(calls: list[tuple[str, int]]) -> str:
    """``2 x all_reduce (112 B)`` ..., in order of first call."""
    counts = Counter(name for name, _ in calls)
    sizes: dict[str, set[int]] = {}
    for name, size in calls:
        sizes.setdefault(name, set()).add(size)
    return ", ".join(f"{k} x {name} ({'/'.join(str(s) for s in sorted(sizes[name]))} B)"
                     for name, k in counts.items()) or "none"


def delta(a: list[tuple[str, int]], b: list[tuple[str, int]], per: int
          ) -> tuple[float, float, list[tuple[str, int]]]:
    """Collectives and bytes of ``b`` beyond ``a``, per unit, and what they are."""
    extra = list((Counter(b) - Counter(a)).elements())
    return ((len(b) - len(a)) / per, (sum(s for _, s in b) - sum(s for _, s in a)) / per,
            extra)


def measure(n: int, folder: Path) -> dict[str, Any]:
    """Every scenario on ``n`` ranks; checks the ranks agree on the count."""
    recs = {name: run(n, name, folder) for name in SCENARIOS}
    for name, ranks in recs.items():
        got = {len(collectives(r)) for r in ranks}
        if name not in ("save", "fsdp_save", "preempt", "stop") and len(got) != 1:
            print(f"  ! {name}: ranks called different numbers of collectives: {got}")
    chief = {name: collectives(ranks[0]) for name, ranks in recs.items()}
    train = {name: collectives(until_fired(ranks[0])) for name, ranks in recs.items()}
    out: dict[str, Any] = {}
    # quiet: the never-due run agrees at its 3 epoch ends only
    quiet_steps = STEPS - EPOCHS
    out["quiet step"] = ((len(train["never"]) - EPOCHS) / quiet_steps,
                         (sum(s for _, s in train["never"]) - EPOCHS * AGREED * 8 * n)
                         / quiet_steps, [])
    out["due step (step trigger)"] = delta(chief["never"], chief["due"],
                                           agreements(2) - agreements(1000))
    firings = STEPS // 4
    out["metric trigger firing (1 metric)"] = delta(chief["due"], chief["metric"], firings)
    out["stop flag (may_stop_alone)"] = delta(chief["due"], chief["flag"], firings)
    stop = [c for c in chief["stop"] if c[0] == "broadcast_object_list"]
    out["decided stop (+ reason)"] = (len(stop), sum(s for _, s in stop), stop)
    out["checkpoint, one file (ddp)"] = delta(chief["due"], chief["save"], firings)
    out["checkpoint, sharded (fsdp)"] = delta(chief["fsdp"], chief["fsdp_save"], firings)
    after = collectives(after_fired(recs["preempt"][0]))
    out["preemption (its checkpoint)"] = (len(after), sum(s for _, s in after), after)
    out["store requests: never-due run"] = (store_ops(recs["never"][0]), 0, [])
    out["store requests: preemption, chief / rank 1"] = (
        store_ops(recs["preempt"][0]), store_ops(recs["preempt"][1]), [])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            results[n] = measure(n, Path(tmp))
            print(f"\n{n} ranks: collectives and bytes (this rank's input) per unit, "
                  "on the chief")
            for what, (calls, size, extra) in results[n].items():
                print(f"  {what:44} {calls:6.2f} {size:10.1f}  {summary(extra)}")
    if args.json:
        args.json.write_text(json.dumps(
            {n: {k: v[:2] for k, v in r.items()} for n, r in results.items()}, indent=1))
    print("\nreproduce:", REPRODUCE.format(ranks=" ".join(map(str, args.ranks))))


if __name__ == "__main__":
    main()
