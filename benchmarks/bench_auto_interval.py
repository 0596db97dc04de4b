"""``every("auto")`` against fixed checkpoint intervals, with failures injected at the
declared rate.

A small real job (a linear model whose loss sleeps ``--step-seconds`` a step, and whose
saves are made ``--save-seconds`` slower by a delay this benchmark adds to the write, so
the save's cost is measurable) trains ``--work`` steps in a child process with
``checkpoint_mode = "sync"``. The parent kills it with SIGKILL after an exponential time
of mean ``--mtbf`` seconds (the declared MTBF) and starts it again with ``resume("auto")``
until it finishes; the total wall time counts everything (restarts, redone steps, saves).
Each seed draws the same failure times for every mode. The auto run goes first; the
fixed ones save every 0.25x, 1x and 4x the interval it decided last.

Goal (issue 38): the auto interval's wall time within 5% of the best fixed one.

Reproduce (from the repository root)::

    python benchmarks/bench_auto_interval.py                  # 3 seeds, a few minutes each
    python benchmarks/bench_auto_interval.py --seeds 1 --work 600
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    """One attempt of the job: resume the newest checkpoint, train to the end."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from schedtrain import Schedule, every
    from schedtrain.callbacks import ModelSaver
    from schedtrain.checkpoints.mount import Mount
    from schedtrain.errors import RunEnded
    from schedtrain.training import Trainer
    from schedtrain.triggers import auto_every

    real = Mount.write

    def slow(self: Mount, body: object, path: Path) -> object:  # the save's cost, made known
        time.sleep(args.save_seconds)
        return real(self, body, path)  # type: ignore[arg-type]

    Mount.write = slow  # type: ignore[method-assign]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    x = torch.randn(args.work * 4, 8)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        time.sleep(args.step_seconds)  # the step's work
        return torch.nn.functional.mse_loss(out, y)

    trigger = auto_every(10) if args.every == "auto" else every(int(args.every), "steps")
    t = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4), loss,
                schedule=Schedule({"save": trigger}), bindings={"save": ModelSaver(keep=2)},
                device="cpu", run_dir=args.child, checkpoint_mode="sync",
                mtbf=f"{args.mtbf} s", max_epochs=1, handle_signals=False)
    try:
        t.resume("auto")
    except RunEnded:  # killed after it finished, before it exited: the job is done
        return
    t.fit()


def run(mode: str, args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, object]:
    """The job in ``mode`` (``"auto"`` or a number of steps) until it finishes."""
    run_dir = tmp / f"{mode}-{seed}"
    rng = random.Random(seed)
    cmd = [sys.executable, __file__, "--child", str(run_dir), "--every", mode,
           "--work", str(args.work), "--step-seconds", str(args.step_seconds),
           "--save-seconds", str(args.save_seconds), "--mtbf", str(args.mtbf)]
    start, kills = time.monotonic(), 0
    while True:
        proc = subprocess.Popen(cmd)
        try:
            rc = proc.wait(timeout=rng.expovariate(1 / args.mtbf))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            kills += 1
            continue
        if rc != 0:
            raise SystemExit(f"{mode}: the job failed (exit {rc})")
        break
    wall = time.monotonic() - start
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    decided = [r["value"] for r in rows if r.get("name") == "save/interval"]
    costs = [r["value"] for r in rows if r.get("name") == "save/save_cost"]
    return {"mode": mode, "wall": wall, "kills": kills,
            "interval": int(decided[-1]) if decided else int(mode),
            "cost": statistics.fmean(costs) if costs else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--every", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--work", type=int, default=1000, help="steps the job trains")
    p.add_argument("--step-seconds", type=float, default=0.02)
    p.add_argument("--save-seconds", type=float, default=0.5,
                   help="delay added to each save's write")
    p.add_argument("--mtbf", type=float, default=20.0, help="declared and injected MTBF (s)")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    print(f"work {args.work} steps x {args.step_seconds} s, save +{args.save_seconds} s, "
          f"MTBF {args.mtbf} s (declared and injected), kill -9 + resume auto")
    print(f"{'seed':>4} {'mode':>10} {'interval':>9} {'kills':>6} {'wall s':>8} {'vs best':>8}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            auto = run("auto", args, seed, Path(tmp))
            interval = int(auto["interval"])  # type: ignore[call-overload]
            rows = [auto] + [
                {**run(str(max(1, round(k * interval))), args, seed, Path(tmp)),
                 "mode": f"{k}x"} for k in (0.25, 1, 4)]
            best = min(float(r["wall"]) for r in rows[1:])  # type: ignore[arg-type]
            for r in rows:
                wall = float(r["wall"])  # type: ignore[arg-type]
                print(f"{seed:>4} {r['mode']:>10} {r['interval']:>9} {r['kills']:>6} "
                      f"{wall:>8.1f} {wall / best:>8.3f}")
            ratios.append(float(auto["wall"]) / best)  # type: ignore[arg-type]
            print(f"     auto's measured save cost {auto['cost']:.3f} s")
    print(f"auto / best fixed: mean {statistics.fmean(ratios):.3f}, "
          f"per seed {', '.join(f'{r:.3f}' for r in ratios)}")


if __name__ == "__main__":
    main()
