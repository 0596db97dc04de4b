"""What schedtrain's callback itself costs per quiet step inside a host, against the host's flags.

``bench_integrations.py --instructions`` counts a whole training step (a few hundred
thousand to millions of instructions), whose count moves by about 1% with the memory
layout alone: more than what separates the callbacks. This counts only the per-step
part, under callgrind (``N`` and ``3 N`` calls in one process, a dump after each; the
difference over ``2 N`` is the cost of one), so a few hundred instructions show:

* **lightning** - the per-batch hook (``on_train_batch_end``) of a callback testing
  ``global_step % k`` (the flags) and of ``ScheduleCallback`` with ``every(k, "steps")``,
  called on a real ``Trainer`` after a short fit, Lightning's step counter moved by one
  before each call (so every call is a quiet step end); ``bump`` is that move alone;
* **ignite** - a whole ``Engine`` iteration whose process function does nothing (Ignite's
  loop and the handlers only): ``bare``, ``ITERATION_COMPLETED(every=k)`` (the flags),
  ``attach_schedule`` and ``trigger_event``, each with a no-op handler.

Reproduce (from the repository root, valgrind installed)::

    python benchmarks/bench_integration_hooks.py
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_integrations import (  # the same module, flags callback and Ignite setups
    ignite_setups,
    lightning_parts,
)

from schedtrain import Schedule, every

Call = Callable[[int], None]
"""Runs the measured thing the given number of times."""


def lightning_calls(k: int) -> dict[str, Call]:
    import lightning.pytorch as pl
    import torch

    from schedtrain.integrations.lightning import ScheduleCallback

    Module, EveryK = lightning_parts(k)

    seen: dict[str, Any] = {}

    class Keep(pl.Callback):  # the arguments Lightning passes at a batch end
        def on_train_batch_end(self, *args: Any) -> None:
            seen["args"] = args

    sched = ScheduleCallback(Schedule({"noop": every(k, "steps")}), {"noop": lambda t, m: None})
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", callbacks=[Keep(), sched])
    trainer.fit(Module(), torch.utils.data.DataLoader(torch.randn(64, 16), batch_size=32))
    args = seen["args"]
    counter = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step
    total = counter.total
    sched.driver.table.step_due = float("inf")  # every call a quiet step end
    flags = EveryK()

    def calls(hook: Callable[..., None] | None) -> Call:
        def run(n: int) -> None:
            for _ in range(n):
                total.completed += 1
                if hook is not None:
                    hook(*args)
        return run

    return {"bump": calls(None), "flags": calls(flags.on_train_batch_end),
            "schedtrain": calls(sched.on_train_batch_end)}


def ignite_calls(k: int) -> dict[str, Call]:
    from ignite.engine import Engine

    def run_with(setup: Callable[[Engine], object]) -> Call:
        def run(n: int) -> None:
            engine = Engine(lambda e, b: 0.0)
            setup(engine)
            engine.run(range(n), max_epochs=1)
        return run

    return {name: run_with(setup) for name, setup in ignite_setups(k).items()}


HOSTS: dict[str, Callable[[int], dict[str, Call]]] = {
    "lightning": lightning_calls, "ignite": ignite_calls}


def _child(host: str, n: int, k: int) -> None:
    """Under callgrind: each variant warmed up, then N and 3 N calls, a dump after each."""
    pid = str(os.getpid())

    def control(*what: str) -> None:
        subprocess.run(["callgrind_control", *what, pid], check=True,
                       stdout=subprocess.DEVNULL)

    for name, run in HOSTS[host](k).items():
        run(n)
        for calls in (n, 3 * n):
            gc.collect()
            control("--instr=on")
            run(calls)
            control("--instr=off")
            control(f"--dump={name}")


def measure(host: str, n: int, k: int) -> dict[str, float]:
    """Instructions per call of each variant of ``host``."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cg"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--child", host,
             "--n", str(n), "--every", str(k)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})
        dumps = sorted(out.parent.glob("cg.*"), key=lambda p: int(p.suffix[1:]))
        found = [(m[1], int(t[1])) for p in dumps
                 if (m := re.search(r"^desc: Trigger: dump (.+)$", (s := p.read_text()),
                                    re.M)) and (t := re.search(r"^totals: (\d+)", s, re.M))]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"callgrind run of {host} failed:\n{proc.stderr[-2000:]}")
    return {found[i][0]: (found[i + 1][1] - found[i][1]) / (2 * n)
            for i in range(0, len(found) - 1, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--hosts", default="lightning,ignite")
    parser.add_argument("--n", type=int, default=2000, help="calls counted: N and 3 N")
    parser.add_argument("--every", type=int, default=50, help="cadence k, in steps")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.n, args.every)
        return
    print(f"instructions per quiet step (callgrind, PYTHONHASHSEED 0), every {args.every}")
    for host in args.hosts.split(","):
        per = measure(host, args.n, args.every)
        zero = "bump" if "bump" in per else "bare"  # what no callback costs
        flags = per["flags"] - per[zero]
        print(f"{host} ({'per batch-end hook call' if zero == 'bump' else 'per iteration'})")
        for name, got in per.items():
            extra = got - per[zero]
            ratio = f", {extra / flags:.3f}x flags" if name != zero else ""
            print(f"  {name:<18} {got:10.0f}  ({extra:+8.0f} over {zero}{ratio})")


if __name__ == "__main__":
    main()
