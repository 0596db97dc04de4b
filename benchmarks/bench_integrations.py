"""Per-step cost of schedtrain's host integrations against each host's own cadence flags.

In each host the same training runs three ways, in the same process:

* **bare** - no cadence at all (the host's loop alone);
* **flags** - the host's own cadence does the work every ``--every`` steps;
* **schedtrain** - the host's cadence off, a schedtrain schedule asks for the same work
  at the same steps.

Hosts and their flags:

* **Lightning** - a no-op ``on_train_batch_end`` callback testing ``global_step % k``, as
  Lightning's own ``every_n_train_steps`` (ModelCheckpoint) does, vs ``ScheduleCallback``
  with a function bound to ``every(k, "steps")``; a linear model, batches of 32;
* **Hugging Face** - ``logging_strategy="steps", logging_steps=k`` vs
  ``ScheduleCallback({"log": every(k steps)}, {"log": "log"})`` (both log the loss every
  k steps); a one-layer GPT-2 built from a config. The flags are also run with a
  ``TrainerCallback`` that does nothing: what one more callback costs in HF's loop;
* **Ignite** - a no-op handler on ``Events.ITERATION_COMPLETED(every=k)`` vs
  ``attach_schedule`` (a no-op action), vs ``trigger_event(every(k, "steps"))`` and vs
  ``attach_schedule`` running a no-op schedtrain ``Callback``.

Two measures:

* **wall time** (default): ``--repeats`` rounds, each running every variant of a host once
  in a shuffled order (drift on a shared machine hits all alike). Printed per variant: the
  median time per step and its extra over bare; then ``schedtrain / flags`` taken round by
  round (both ran within seconds of each other), as its median and its spread (min-max
  and the middle half), and the same ratio for a second run of the flags (**control**):
  its spread is the machine's noise. The load average before and after is printed too.
* **instructions** (``--instructions``): each variant runs under valgrind's callgrind,
  instrumented only while it trains, once at ``N`` and once at ``3 N`` steps in the same
  process (a dump after each); the difference over ``2 N`` steps is its instructions per
  step, which the machine's load does not change. Setup (building the Trainer, the
  engine, the schedule) is in both runs and cancels out.

Reproduce (from the repository root, with the ``lightning``, ``ignite`` and
``transformers`` extras)::

    python benchmarks/bench_integrations.py --repeats 15
    python benchmarks/bench_integrations.py --instructions
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from schedtrain import Schedule, every

Variant = Callable[[int], None]
"""Trains for the given number of steps."""

#: Per host: steps of a wall-time run, and N of an instruction count (N and 3 N steps).
STEPS = {"lightning": (1000, 60), "transformers": (200, 20), "ignite": (5000, 300)}


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "accelerate",
                 "ignite"):
        logging.getLogger(name).setLevel(logging.ERROR)


# -- Lightning ---------------------------------------------------------------------------
def lightning_parts(k: int) -> tuple[Any, Any]:
    """The benchmark's ``LightningModule`` class, and a callback class testing
    ``global_step % k`` at each batch end (Lightning's own cadence, as a user writes it)."""
    import lightning.pytorch as pl

    _quiet()  # Lightning sets its loggers' levels when imported

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class EveryK(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
            if trainer.global_step % k == 0:
                pass

    return Module, EveryK


def lightning_variants(most: int, k: int) -> dict[str, Variant]:
    import lightning.pytorch as pl

    from schedtrain.integrations.lightning import ScheduleCallback

    Module, EveryK = lightning_parts(k)

    rows = torch.randn(most * 32, 16)

    def fit(callbacks: Callable[[], list[pl.Callback]]) -> Variant:
        def run(steps: int) -> None:
            data = torch.utils.data.DataLoader(rows[:steps * 32], batch_size=32)
            pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False,
                       accelerator="cpu", callbacks=callbacks()).fit(Module(), data)
        return run

    return {
        "bare": fit(list),
        "flags": fit(lambda: [EveryK()]),
        # a new callback per run: a schedule belongs to one run
        "schedtrain": fit(lambda: [ScheduleCallback(
            Schedule({"noop": every(k, "steps")}), {"noop": lambda tr, m: None})]),
    }


# -- Hugging Face --------------------------------------------------------------------------
def hf_variants(most: int, k: int) -> dict[str, Variant]:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from schedtrain.integrations.transformers import ScheduleCallback

    hf_logging.set_verbosity_error()
    rows = [{"input_ids": r, "labels": r} for r in torch.randint(0, 16, (most, 8))]
    out = tempfile.mkdtemp()

    def train(logging_steps: int | None, callbacks: Callable[[], list[Any]]) -> Variant:
        def run(steps: int) -> None:
            model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16,
                                               n_positions=8, bos_token_id=0, eos_token_id=0))
            args = TrainingArguments(
                output_dir=out, use_cpu=True, report_to="none", disable_tqdm=True,
                per_device_train_batch_size=1, num_train_epochs=1, save_strategy="no",
                eval_strategy="no", logging_strategy="steps" if logging_steps else "no",
                logging_steps=logging_steps or 500, log_level="error")
            trainer = Trainer(model=model, args=args, train_dataset=rows[:steps],
                              callbacks=callbacks())
            trainer.remove_callback(PrinterCallback)  # no printing of each log in the timing
            trainer.train()
        return run

    class Empty(TrainerCallback):
        """Does nothing: what the Trainer spends calling each event on one more callback."""

    return {
        "bare": train(None, list),
        "flags": train(k, list),
        "flags + empty callback": train(k, lambda: [Empty()]),
        "schedtrain": train(None, lambda: [ScheduleCallback(
            Schedule({"log": every(k, "steps")}), {"log": "log"})]),
    }


# -- Ignite ----------------------------------------------------------------------------------
def ignite_setups(k: int) -> dict[str, Callable[[Any], object]]:
    """How each Ignite variant sets up an engine: nothing, the flags (``every=k``),
    ``attach_schedule`` and ``trigger_event`` with a no-op handler every ``k`` steps."""
    from ignite.engine import Events

    from schedtrain.integrations.ignite import attach_schedule, trigger_event

    return {
        "bare": lambda e: None,
        "flags": lambda e: e.add_event_handler(
            Events.ITERATION_COMPLETED(every=k), lambda _: None),
        "schedtrain": lambda e: attach_schedule(
            e, Schedule({"noop": every(k, "steps")}), {"noop": lambda _: None}),
        "schedtrain filter": lambda e: e.add_event_handler(
            trigger_event(every(k, "steps")), lambda _: None),
    }


def ignite_variants(most: int, k: int) -> dict[str, Variant]:
    from ignite.engine import Engine

    from schedtrain.callbacks import Callback
    from schedtrain.integrations.ignite import attach_schedule

    class Noop(Callback):
        """A schedtrain callback whose _trigger does nothing (run by CallbackDriver)."""

        def _trigger(self) -> None:
            return None

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randn(32, 16) for _ in range(most)]

    def step(_: Engine, batch: torch.Tensor) -> float:
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return 0.0

    def run_with(setup: Callable[[Engine], object]) -> Variant:
        def run(steps: int) -> None:
            engine = Engine(step)
            setup(engine)
            engine.run(data[:steps], max_epochs=1)
        return run

    setups = {**ignite_setups(k), "schedtrain callback": lambda e: attach_schedule(
        e, Schedule({"noop": every(k, "steps")}), {"noop": Noop()})}
    return {name: run_with(setup) for name, setup in setups.items()}


HOSTS: dict[str, Callable[[int, int], dict[str, Variant]]] = {
    "lightning": lightning_variants, "transformers": hf_variants, "ignite": ignite_variants}


# -- wall time -------------------------------------------------------------------------------
def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{min(values):.3f}-{max(values):.3f} (middle half {q[0]:.3f}-{q[2]:.3f})"


def wall(host: str, steps: int, k: int, repeats: int) -> None:
    """Shuffled rounds of every variant (and the flags again, as a control)."""
    variants = HOSTS[host](steps, k)
    variants["control"] = variants["flags"]
    for run in variants.values():  # warm up imports, caches and the allocator
        run(min(steps, 50))
    times: dict[str, list[float]] = {n: [] for n in variants}
    order, rng = list(variants), random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            gc.collect()
            t0 = time.perf_counter()
            variants[name](steps)
            times[name].append(time.perf_counter() - t0)
    us = 1e6 / steps
    bare = statistics.median(times["bare"]) * us
    print(f"{host}: {steps} steps, every {k}, {repeats} shuffled rounds")
    for name, got in times.items():
        med = statistics.median(got) * us
        print(f"  {name:<18} median {med:9.1f} us/step  (+{med - bare:7.2f} over bare)  "
              f"min {min(got) * us:9.1f}")
    for name in [n for n in variants if n.startswith("schedtrain")] + ["control"]:
        ratios = [a / b for a, b in zip(times[name], times["flags"], strict=True)]
        print(f"  {name + ' / flags':<26} median {statistics.median(ratios):.3f}x, "
              f"spread {_spread(ratios)}")


# -- instructions ----------------------------------------------------------------------------
def _child(host: str, name: str, n: int, k: int) -> None:
    """Under callgrind: warm up, then count N steps and 3 N steps, a dump after each."""
    run = HOSTS[host](3 * n, k)[name]
    run(n)
    gc.collect()
    pid = str(os.getpid())
    for steps in (n, 3 * n):
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True,
                       stdout=subprocess.DEVNULL)
        run(steps)
        subprocess.run(["callgrind_control", "--instr=off", pid], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["callgrind_control", "--dump", pid], check=True,
                       stdout=subprocess.DEVNULL)
        gc.collect()


def _count(host: str, name: str, n: int, k: int, *, seed: int, out: Path) -> float:
    """Instructions per step of one variant: (count at 3 N - count at N) / 2 N."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={out}", sys.executable, __file__, "--child", host, name,
         str(n), "--every", str(k)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": "1"})
    dumps = sorted(out.parent.glob(f"{out.name}.*"), key=lambda p: int(p.suffix[1:]))
    totals = [int(m[1]) for p in dumps
              if (m := re.search(r"^totals: (\d+)", p.read_text(), re.M))]
    if proc.returncode != 0 or len(totals) < 2:
        raise SystemExit(f"callgrind run of {host} {name!r} failed:\n{proc.stderr[-2000:]}")
    return (totals[1] - totals[0]) / (2 * n)


def instructions(hosts: list[str], k: int, seeds: int) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind); install it or measure "
                         "wall time")
    print(f"instructions per step (callgrind; mean over PYTHONHASHSEED 0..{seeds - 1})")
    for host in hosts:
        n = STEPS[host][1]
        names = list(HOSTS[host](1, k))  # every variant of the host
        per: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as folder:
            for i, name in enumerate(names):
                per[name] = [_count(host, name, n, k, seed=seed, out=Path(folder) / f"cg{i}-{seed}")
                             for seed in range(seeds)]
        bare = statistics.fmean(per["bare"])
        flags = statistics.fmean(per["flags"])
        print(f"{host}: steps {n + 1}..{3 * n}, every {k}")
        for name, got in per.items():
            mean = statistics.fmean(got)
            print(f"  {name:<18} {mean / 1e3:10.2f} k instr/step  "
                  f"(+{(mean - bare) / 1e3:6.2f} k over bare, {mean / flags:.4f}x flags)  "
                  f"spread {min(got) / 1e3:.2f}-{max(got) / 1e3:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--every", type=int, default=50, help="cadence k, in steps")
    parser.add_argument("--hosts", default="lightning,transformers,ignite")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under callgrind instead of timing")
    parser.add_argument("--seeds", type=int, default=1,
                        help="with --instructions: PYTHONHASHSEED values to average over")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _quiet()
    torch.set_num_threads(1)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]), args.every)
        return
    hosts = args.hosts.split(",")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread; load average "
          f"{os.getloadavg()[0]:.2f}")
    if args.instructions:
        instructions(hosts, args.every, args.seeds)
    else:
        for host in hosts:
            wall(host, STEPS[host][0], args.every, args.repeats)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
