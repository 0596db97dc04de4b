"""Loop overhead: schedtrain with 0/10/100 callbacks vs bare torch loops, Ignite and Lightning.

Every variant trains the same tiny linear model (16 -> 1, MSE, SGD, batches of 32, CPU,
one thread) for ``--steps`` optimizer steps in epochs of 1000 steps; each callback or
handler fires every 1000 steps and does nothing. Two hand-written baselines:

* **bare** - forward, backward, ``step``, ``zero_grad``; nothing else;
* **bare + mean loss** - the same, plus what schedtrain also does on every step: keep
  the training loss on the device for its mean (``loss_sum += loss.detach()``, the
  hand-written way that never syncs).

Two measures:

* **wall time** (default): ``--repeats`` rounds, each running every variant once in a
  shuffled order, in this process pinned to one CPU; the minimum per variant is the
  least disturbed run (as ``timeit`` advises), the median shows the spread. A second,
  identical bare loop is timed as a control: its ratio to the first is the noise floor.
* **instructions** (``--instructions``): each variant runs under valgrind's callgrind
  at two lengths (``--steps`` and three times that); the difference divided by the
  extra steps is the instructions per step, whatever else the machine is doing. One
  program's count still moves by about 1% with the memory layout (string hashes decide
  dictionary probes), so each count is the mean over ``--seeds`` values of
  ``PYTHONHASHSEED``, with address randomisation off where ``setarch -R`` works; the
  spread over seeds is printed. Needs ``valgrind`` and takes ~15 minutes.

Reproduce (from the repository root; Ignite and Lightning come with the ``bench`` extra
and are skipped when missing)::

    python benchmarks/bench_loop.py --steps 5000 --repeats 15
    python benchmarks/bench_loop.py --steps 1000 --instructions --seeds 3 --no-frameworks
"""

from __future__ import annotations

import argparse
import concurrent.futures
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

import structlog
import torch

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback
from schedtrain.training import Trainer

BATCH, FEATURES, EPOCH = 32, 16, 1000
BARE = "bare torch loop"
CONTROL = "bare torch loop, again"


def _data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EPOCH, BATCH, FEATURES, generator=g)
    y = torch.randn(EPOCH, BATCH, 1, generator=g)
    return [(x[i], y[i]) for i in range(min(steps, EPOCH))]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def bare(steps: int) -> None:
    """A hand-written loop: forward, backward, step, zero_grad."""
    data = _data(steps)
    model, opt = _model()
    loss_fn = torch.nn.functional.mse_loss
    done = 0
    while done < steps:
        for x, y in data:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break


def bare_mean_loss(steps: int) -> None:
    """The bare loop, also summing the loss on the device for a mean reported per epoch."""
    data = _data(steps)
    model, opt = _model()
    loss_fn = torch.nn.functional.mse_loss
    done = 0
    means: list[torch.Tensor] = []
    while done < steps:
        loss_sum, n = torch.zeros(()), 0
        for x, y in data:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
            n += 1
            done += 1
            if done == steps:
                break
        means.append(loss_sum / n)


class _Nothing(Callback):
    pass


def schedtrain_loop(n_callbacks: int) -> Callable[[int], None]:
    """schedtrain's Trainer with ``n_callbacks`` callbacks firing every 1000 steps."""
    def run(steps: int) -> None:
        model, opt = _model()
        names = {f"cb{i}": every("1000 steps") for i in range(n_callbacks)}
        trainer = Trainer(model, opt, _data(steps), torch.nn.functional.mse_loss,
                          schedule=Schedule(names), bindings={n: _Nothing() for n in names},
                          max_steps=steps, device="cpu")
        trainer.fit()
    return run


def ignite_loop(n_callbacks: int) -> Callable[[int], None] | None:
    """Ignite's Engine with ``n_callbacks`` handlers on ITERATION_COMPLETED(every=1000)."""
    try:
        from ignite.engine import Engine, Events
    except ImportError:
        return None

    def run(steps: int) -> None:
        model, opt = _model()
        loss_fn = torch.nn.functional.mse_loss

        def update(_engine: object, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = batch
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        engine = Engine(update)
        for _ in range(n_callbacks):
            engine.add_event_handler(Events.ITERATION_COMPLETED(every=1000), lambda e: None)
        data = _data(steps)
        engine.run(data, max_epochs=-(-steps // len(data)))
    return run


class _Batches:
    """An iterable of batches (Lightning reads a bare list as several data loaders)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def lightning_loop(n_callbacks: int) -> Callable[[int], None] | None:
    """Lightning's Trainer (no logger, checkpointing or bar) with callbacks checking the step."""
    try:
        import lightning as L
    except ImportError:
        return None
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # set on import
        logging.getLogger(name).setLevel(logging.ERROR)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, _ = _model()

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                          _idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Every1000(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
            if trainer.global_step % 1000 == 0:
                pass

    def run(steps: int) -> None:
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[Every1000() for _ in range(n_callbacks)])
        trainer.fit(Module(), train_dataloaders=_Batches(_data(steps)))
    return run


def _variants(frameworks: bool) -> dict[str, Callable[[int], None]]:
    found: dict[str, Callable[[int], None] | None] = {
        BARE: bare,
        "bare + mean loss": bare_mean_loss,
        "schedtrain, 0 callbacks": schedtrain_loop(0),
        "schedtrain, 10 callbacks": schedtrain_loop(10),
        "schedtrain, 100 callbacks": schedtrain_loop(100),
    }
    if frameworks:
        found["ignite, 100 handlers"] = ignite_loop(100)
        found["lightning, 100 callbacks"] = lightning_loop(100)
    return {k: v for k, v in found.items() if v is not None}


def _quiet() -> None:
    torch.set_num_threads(1)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    warnings.filterwarnings("ignore")


def _ratios(per_step: dict[str, float], unit: str) -> None:
    """One row per variant: its cost per step and its ratio to both bare loops."""
    base, same = per_step[BARE], per_step["bare + mean loss"]
    print(f"{'variant':<28}{unit:>12}{'vs bare':>10}{'vs bare+loss':>14}")
    for name, v in per_step.items():
        print(f"{name:<28}{v:>12.1f}{v / base:>9.3f}x{v / same:>13.3f}x")


def wall(args: argparse.Namespace) -> None:
    """Interleaved, shuffled wall-time runs."""
    runs = _variants(not args.no_frameworks)
    runs = {BARE: runs[BARE], CONTROL: bare, **runs}
    if hasattr(os, "sched_setaffinity"):  # one CPU: no migrations between runs
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    for fn in runs.values():  # warm up imports and allocator
        fn(200)
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    rng = random.Random(0)
    for _ in range(args.repeats):
        rng.shuffle(order)  # drift on a shared machine hits every variant alike
        for name in order:
            t0 = time.perf_counter()
            runs[name](args.steps)
            times[name].append(time.perf_counter() - t0)
    print(f"wall time: {args.steps} steps, {args.repeats} shuffled rounds, "
          f"torch {torch.__version__}, 1 thread")
    us = 1e6 / args.steps
    print("minimum (least disturbed run):")
    _ratios({k: min(v) * us for k, v in times.items()}, "us/step")
    print("median:")
    _ratios({k: statistics.median(v) * us for k, v in times.items()}, "us/step")


def _child(name: str, steps: int) -> None:
    """Run one variant under callgrind: warm up, switch instrumentation on, run."""
    # Import Ignite and Lightning only for their own variants.
    fn = _variants(frameworks=name.startswith(("ignite", "lightning")))[name]
    fn(10)
    # The warm-up's garbage would otherwise be collected inside the measured run, by
    # chance in the longer one only, and counted as a cost per step.
    gc.collect()
    subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL)
    fn(steps)


def _no_aslr() -> list[str]:
    """``setarch <arch> -R`` when it works here (containers may forbid it), else nothing."""
    cmd = ["setarch", os.uname().machine, "-R"]
    try:
        ok = subprocess.run([*cmd, "true"], capture_output=True, check=False).returncode == 0
    except OSError:
        ok = False
    return cmd if ok else []


def _count(name: str, steps: int, seed: int, out: str, prefix: list[str]) -> int:
    """Instructions executed by ``steps`` steps of variant ``name`` (after its warm-up)."""
    proc = subprocess.run(
        [*prefix, "valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={out}", sys.executable, __file__, "--child", name, str(steps)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONHASHSEED": str(seed)})
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run of {name!r} failed:\n{proc.stderr[-2000:]}")
    return int(found[1])


def instructions(args: argparse.Namespace) -> None:
    """Instructions per step: (count at 3*steps - count at steps) / (2*steps)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind); install it or measure "
                         "wall time")
    names = list(_variants(not args.no_frameworks))
    if args.variants:
        names = [n for n in names if n in (*args.variants, BARE, "bare + mean loss")]
    seeds = range(args.seeds)
    lengths = (args.steps, 3 * args.steps)
    jobs = [(n, s, seed) for n in names for s in lengths for seed in seeds]
    prefix = _no_aslr()
    with tempfile.TemporaryDirectory() as out_dir, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        futures = {job: pool.submit(_count, *job, str(Path(out_dir) / f"cg.{i}"), prefix)
                   for i, job in enumerate(jobs)}
        counts = {job: f.result() for job, f in futures.items()}
    extra = 2 * args.steps
    by_seed = {n: [(counts[n, lengths[1], seed] - counts[n, lengths[0], seed]) / extra / 1e3
                   for seed in seeds] for n in names}
    print(f"instructions per step (callgrind, steps {lengths[0] + 1}..{lengths[1]}; mean over "
          f"PYTHONHASHSEED 0..{args.seeds - 1}, address randomisation "
          f"{'off' if prefix else 'on'}), torch {torch.__version__}, 1 thread")
    _ratios({n: statistics.fmean(v) for n, v in by_seed.items()}, "k instr")
    print("spread over seeds (k instr per step): " + ", ".join(
        f"{n}: {min(v):.1f}-{max(v):.1f}" for n, v in by_seed.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-frameworks", action="store_true",
                        help="skip Ignite and Lightning (Lightning alone takes ~10 s a run)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under callgrind instead of timing")
    parser.add_argument("--seeds", type=int, default=3,
                        help="with --instructions: PYTHONHASHSEED values to average over")
    parser.add_argument("--variants", nargs="+", metavar="NAME",
                        help="with --instructions: count only these variants (and both bare "
                             "loops), by their names as printed")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    _quiet()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    instructions(args) if args.instructions else wall(args)
    flags = (f" --instructions --seeds {args.seeds}" if args.instructions
             else f" --repeats {args.repeats}")
    flags += " --no-frameworks" if args.no_frameworks else ""
    if args.variants:
        flags += " --variants " + " ".join(f"'{v}'" for v in args.variants)
    print(f"reproduce: python benchmarks/bench_loop.py --steps {args.steps}{flags}")


if __name__ == "__main__":
    main()
