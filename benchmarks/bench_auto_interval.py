"""``every("auto")`` against fixed checkpoint intervals, with failures injected at the
declared rate.

A small real job (a linear model whose loss sleeps ``--step-seconds`` a step, and whose
saves are made ``--save-seconds`` slower by a delay this benchmark adds to the write, so
the save's cost is known) trains ``--work`` steps in a child process with
``checkpoint_mode = "sync"``. The parent kills it with SIGKILL and starts it again with
``resume("auto")`` until it finishes; the wall time counts everything: restarts, resumes,
redone steps, saves.

Failures arrive while the job runs, at the declared rate: each attempt is killed an
exponential time of mean ``--mtbf`` seconds after it says it trains (its resume done), so
a slow start is paid in wall time but does not move where the kill lands. Each seed draws
one sequence of those times and every mode replays it (common random numbers): the modes
differ by their interval, not by their luck. The auto run goes first; the fixed ones save
every 0.25x, 1x and 4x the interval it decided last (``--factors``).

Goal (issue 38): the auto interval's wall time within 5% of the best fixed one.
Young/Daly's model, for a save cost ``C`` and ``MTBF`` ``M``, puts the time lost per unit
of work at about ``C/T + T/(2M)`` for an interval of ``T`` seconds: at 0.25x or 4x the
optimum it is 2.1 times the optimum's, so the fixed runs bracket it.

Reproduce (from the repository root)::

    python benchmarks/bench_auto_interval.py               # 3 seeds, about 8 min each
    python benchmarks/bench_auto_interval.py --seeds 1 --work 4000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    """One attempt of the job: resume the newest checkpoint, say so, train to the end."""
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
    os.write(args.ready_fd, b"1")  # the failure clock starts now
    os.close(args.ready_fd)
    t.fit()


def attempt(args: argparse.Namespace, mode: str, run_dir: Path,
            uptime: float) -> tuple[bool, float]:
    """Run one attempt; kill it ``uptime`` seconds after it says it trains. Returns
    (whether it finished, the seconds it took to start training)."""
    read, write = os.pipe()
    start = time.monotonic()
    if args.restart == "exec":
        cmd = [sys.executable, __file__, "--child", str(run_dir), "--every", mode,
               "--work", str(args.work), "--step-seconds", str(args.step_seconds),
               "--save-seconds", str(args.save_seconds), "--mtbf", str(args.mtbf),
               "--ready-fd", str(write)]
        proc = subprocess.Popen(cmd, pass_fds=(write,))
        pid = proc.pid
    else:
        pid = os.fork()
        if pid == 0:  # the attempt: a copy of this process, torch already imported
            code = 1
            try:
                os.close(read)
                child(argparse.Namespace(**{**vars(args), "child": str(run_dir),
                                            "every": mode, "ready_fd": write}))
                code = 0
            finally:
                os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as ready:
        said = ready.read(1)  # b"" where it exits without training (already done)
    started = time.monotonic() - start
    deadline = start + started + uptime
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            break
        if said and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False, started
        time.sleep(0.001)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the job failed ({mode}, exit status {status})")
    return True, started


def run(mode: str, args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, object]:
    """The job in ``mode`` (``"auto"`` or a number of steps) until it finishes."""
    run_dir = tmp / f"{mode}-{seed}"
    rng = random.Random(seed)  # the same failure times for every mode
    start, kills, starting = time.monotonic(), 0, 0.0
    while True:
        done, started = attempt(args, mode, run_dir, rng.expovariate(1 / args.mtbf))
        starting += started
        if done:
            break
        kills += 1
    wall = time.monotonic() - start
    rows = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    decided = [r["value"] for r in rows if r.get("name") == "save/interval"]
    costs = [r["value"] for r in rows if r.get("name") == "save/save_cost"]
    return {"mode": mode, "wall": wall, "kills": kills, "starting": starting,
            "interval": int(decided[-1]) if decided else int(mode),
            "cost": statistics.fmean(costs) if costs else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--every", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--work", type=int, default=8000, help="steps the job trains")
    p.add_argument("--step-seconds", type=float, default=0.005)
    p.add_argument("--save-seconds", type=float, default=0.1,
                   help="delay added to each save's write")
    p.add_argument("--mtbf", type=float, default=5.0,
                   help="declared and injected MTBF, in seconds the job runs")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--restart", choices=("fork", "exec"), default="fork",
                   help="start each attempt as a fork of this process (torch imported "
                        "once) or as a fresh interpreter")
    p.add_argument("--factors", type=float, nargs="+", default=[0.25, 1.0, 4.0],
                   help="the fixed intervals, as multiples of auto's")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    if args.restart == "fork":  # what every attempt imports, imported once
        import torch

        import schedtrain.callbacks
        import schedtrain.training  # noqa: F401

        torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo
    print(f"work {args.work} steps x {args.step_seconds} s, save +{args.save_seconds} s, "
          f"MTBF {args.mtbf} s of running (declared and injected), kill -9 + resume auto")
    print(f"{'seed':>4} {'mode':>6} {'interval':>9} {'kills':>6} {'starts s':>9} "
          f"{'wall s':>8} {'vs best':>8}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            auto = run("auto", args, seed, Path(tmp))
            interval = int(auto["interval"])  # type: ignore[call-overload]
            rows = [auto] + [
                {**run(str(max(1, round(k * interval))), args, seed, Path(tmp)),
                 "mode": f"{k:g}x"} for k in args.factors]
            best = min(float(r["wall"]) for r in rows[1:])  # type: ignore[arg-type]
            for r in rows:
                wall = float(r["wall"])  # type: ignore[arg-type]
                print(f"{seed:>4} {r['mode']:>6} {r['interval']:>9} {r['kills']:>6} "
                      f"{float(r['starting']):>9.1f} {wall:>8.1f} "  # type: ignore[arg-type]
                      f"{wall / best:>8.3f}", flush=True)
            ratios.append(float(auto["wall"]) / best)  # type: ignore[arg-type]
            print(f"     auto's measured save cost {auto['cost']:.3f} s", flush=True)
    print(f"auto / best fixed: mean {statistics.fmean(ratios):.3f}, worst {max(ratios):.3f}, "
          f"per seed {', '.join(f'{r:.3f}' for r in ratios)}")
    print("reproduce: python benchmarks/bench_auto_interval.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
