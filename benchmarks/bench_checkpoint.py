"""Checkpoint saves: how long the loop stalls, synchronously and in the background.

For each model size (an MLP of square fp32 layers with Adam, so the state is the
weights plus two moments: 12 bytes a parameter) one run measures side by side:

* **host copy** - the bare copy of the model's and optimizer's tensors: into new memory
  (``clone``), the least a save that allocates its copy can block, and into buffers
  allocated before (``copy_``), the least any consistent save can block;
* **stall sync / async** - how long ``Checkpoints.write`` blocks the loop with
  ``checkpoint_mode = "sync"`` (serialise, checksum, write, fsync, rename) and
  ``"async"`` (a host snapshot; the rest in a background thread): the first save (it
  allocates the staging buffers) and the least of the later ones (with
  ``checkpoint_staging = "reuse"`` they copy into the kept buffers), and how long the
  background write then takes when the loop waits for it at once (unpaced);
* **step slowdown** - the training step's time while a background write overlaps it,
  against quiet steps: ``max(3, repeats)`` cycles of a few steps alone, then steps
  until a background write started after them ends; each cycle's ratio of medians, and
  the median and range over cycles (with the machine's load average: on a shared
  machine other jobs take cores too), and how long those paced writes took;
* **SIGTERM** - a child process training the model gets SIGTERM: the time until its
  preemption checkpoint is committed (renamed into place) and until it exits.

Goals (issue 19): async stall <= 1.2x the host copy; overlapped steps <= 10% slower.

Reproduce (from the repository root)::

    python benchmarks/bench_checkpoint.py                 # 100M and 250M parameters
    python benchmarks/bench_checkpoint.py --sizes 100     # millions of parameters
    python benchmarks/bench_checkpoint.py --quick         # 5M, seconds
    python benchmarks/bench_checkpoint.py --sizes 100 --share 1   # an unpaced writer
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from schedtrain.checkpoints import read_checkpoint
from schedtrain.training import Trainer

WIDTH = 4096  # layer width: a layer holds WIDTH**2 parameters
QUIET_STEPS = 3  # steps timed alone before each overlapped write


def build(millions: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP of about ``millions`` M parameters, with Adam's state filled by one step."""
    layers = max(1, round(millions * 1e6 / WIDTH**2))
    width = WIDTH if millions * 1e6 >= WIDTH**2 else int(math.sqrt(millions * 1e6))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                  for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _step(model, opt)
    return model, opt


def _width(model: torch.nn.Module) -> int:
    first = next(model.parameters())
    return int(first.shape[1])


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(4, _width(model))
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


class _Batches:
    """Endless random batches for the model."""

    def __init__(self, width: int, steps: int) -> None:
        self.width, self.steps = width, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Any:
        for _ in range(self.steps):
            x = torch.randn(4, self.width)
            yield x, torch.zeros(4, self.width)


def _trainer(model: torch.nn.Module, opt: torch.optim.Optimizer, run_dir: Path,
             mode: str, steps: int = 1_000_000, **kw: Any) -> Trainer:
    return Trainer(model, opt, _Batches(_width(model), steps),
                   torch.nn.functional.mse_loss, max_steps=steps, device="cpu",
                   run_dir=run_dir, checkpoint_mode=mode, **kw)


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _copy_into(tensors: list[torch.Tensor], repeats: int) -> float:
    """The least time to copy ``tensors`` into host buffers allocated before."""
    into = [t.clone() for t in tensors]
    return min(_timed(lambda: [d.copy_(t) for d, t in zip(into, tensors, strict=True)])
               for _ in range(repeats))


def measure(millions: float, folder: Path, repeats: int, nice: bool = True,
            **options: Any) -> dict[str, float]:
    """Host copy, stalls, background write and step slowdown of one size (``nice``:
    the writing thread at its default low priority, else at the loop's; ``options``:
    the trainer's ``checkpoint_write_share`` and ``checkpoint_staging``)."""
    # (each stall is followed by ``wait``: the next save never waits for this one)
    model, opt = build(millions)
    params = sum(p.numel() for p in model.parameters())
    out: dict[str, float] = {"params": params}
    tensors = [*model.state_dict().values(),
               *(t for s in opt.state_dict()["state"].values() for t in s.values()
                 if isinstance(t, torch.Tensor))]
    out["state_gb"] = sum(t.nbytes for t in tensors) / 1e9
    out["copy"] = min(_timed(lambda: [t.clone() for t in tensors]) for _ in range(repeats))
    out["copy_into"] = _copy_into(tensors, repeats)
    for mode in ("sync", "async"):
        t = _trainer(model, opt, folder / mode, mode, **options)
        if not nice:
            t.checkpoints.writer.nice = None
        stalls, writes = [], []
        for i in range(repeats):
            path = folder / mode / f"step-{i:08d}.pt"
            stalls.append(_timed(lambda p=path, t=t: t.checkpoints.write(p, "manual")))
            writes.append(_timed(t.checkpoints.wait))
            path.unlink()
        out[f"stall_{mode}"] = min(stalls[1:] or stalls)
        out[f"first_{mode}"] = stalls[0]
        if mode == "async":
            out["background"] = min(w + s for w, s in zip(writes, stalls, strict=True))
    # Steps alone, then steps while a background write runs, interleaved in cycles: on a
    # shared machine the load drifts, so each cycle compares steps seconds apart.
    t = _trainer(model, opt, folder / "overlap", "async", **options)
    writer = t.checkpoints.writer  # a benchmark looks inside
    out["share"] = writer.share
    if not nice:
        writer.nice = None
    ratios, quiet_all, overlapped_all, paced = [], [], [], []
    for i in range(max(3, repeats)):
        quiet = [_timed(lambda: _step(model, opt)) for _ in range(QUIET_STEPS)]
        path = folder / "overlap" / f"step-{i + 1:08d}.pt"
        started = time.perf_counter()
        t.checkpoints.write(path, "manual")
        overlapped = []
        while not writer.done():
            overlapped.append(_timed(lambda: _step(model, opt)))
        paced.append(time.perf_counter() - started)
        t.checkpoints.wait()
        path.unlink()
        quiet_all += quiet
        overlapped_all += overlapped
        if overlapped:
            ratios.append(statistics.median(overlapped) / statistics.median(quiet))
    out["step"] = statistics.median(quiet_all)
    out["step_overlap"] = (statistics.median(overlapped_all) if overlapped_all
                           else float("nan"))
    out["overlapped_steps"] = len(overlapped_all)
    out["paced_write"] = statistics.median(paced)
    out["slowdown"] = statistics.median(ratios) - 1 if ratios else float("nan")
    out["slowdown_min"] = min(ratios, default=float("nan")) - 1
    out["slowdown_max"] = max(ratios, default=float("nan")) - 1
    out["cycles"] = len(ratios)
    return out


def sigterm(millions: float, run_dir: Path, nice: bool = True) -> dict[str, float]:
    """Send SIGTERM to a child training the model; seconds to a committed checkpoint and
    to its exit."""
    ready = run_dir.with_name("ready")
    cmd = [sys.executable, __file__, "--child", str(millions), str(run_dir), str(ready),
           "nice" if nice else "no-nice"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not ready.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the child failed: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.01)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    committed = math.nan
    folder = run_dir / "checkpoints"
    while proc.poll() is None or math.isnan(committed):
        if math.isnan(committed) and folder.is_dir() and any(folder.glob("step-*.pt")):
            committed = time.perf_counter() - t0
        if proc.poll() is not None and math.isnan(committed):
            break
        time.sleep(0.005)
    proc.wait()
    exited = time.perf_counter() - t0
    files = list(folder.glob("step-*.pt"))
    assert files and read_checkpoint(files[0])["phase"] == "preempt", files
    return {"term_commit": committed, "term_exit": exited}


def child(millions: float, run_dir: Path, ready: Path, nice: bool) -> None:
    """Train until SIGTERM (the preemption checkpoint is written on the way out)."""
    from schedtrain.callbacks import Callback
    from schedtrain.errors import Preempted
    from schedtrain.schedule.schedule import Schedule
    from schedtrain.triggers import every

    class Ready(Callback):
        def _trigger(self) -> None:
            ready.touch()

    model, opt = build(millions)
    t = _trainer(model, opt, run_dir, "async", schedule=Schedule({"ready": every("2 steps")}),
                 bindings={"ready": Ready()})
    if not nice:
        t.checkpoints.writer.nice = None
    try:
        t.fit()
    except Preempted:
        sys.exit(75)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[100, 250],
                        help="millions of parameters (default: 100 250)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5M parameters, 2 repeats")
    parser.add_argument("--no-nice", action="store_true",
                        help="write at the loop's priority (before: to compare)")
    parser.add_argument("--share", type=float, default=None,
                        help="checkpoint_write_share (default: the trainer's, by device)")
    parser.add_argument("--staging", choices=("reuse", "fresh"), default="reuse",
                        help="checkpoint_staging (default: reuse)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(float(args.child[0]), Path(args.child[1]), Path(args.child[2]),
              args.child[3] == "nice")
        return
    sizes, repeats = ([5.0], 2) if args.quick else (args.sizes, args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs; fp32 MLP with Adam (12 bytes a parameter); writer "
          f"{'at the loop priority' if args.no_nice else 'niced'}")
    head = ("params", "state", "host copy (new / into)", "stall sync", "stall async (first)",
            "async/copy (new / into)", "bg write", "share", "paced write", "step",
            "step+write", "slowdown", "SIGTERM->commit", "->exit")
    print(" | ".join(head))
    print("load average at the start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for millions in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
            r = measure(millions, Path(tmp), repeats, nice=not args.no_nice,
                        checkpoint_write_share=args.share, checkpoint_staging=args.staging)
            gc.collect()  # the model is freed before the child builds its own
            r.update(sigterm(millions, Path(tmp) / "sigterm", nice=not args.no_nice))
        print(" | ".join([
            f"{r['params'] / 1e6:.0f}M", f"{r['state_gb']:.2f} GB",
            f"{r['copy']:.2f} / {r['copy_into']:.2f} s", f"{r['stall_sync']:.2f} s",
            f"{r['stall_async']:.2f} s ({r['first_async']:.2f} s)",
            f"{r['stall_async'] / r['copy']:.2f}x / {r['stall_async'] / r['copy_into']:.2f}x",
            f"{r['background']:.2f} s", f"{r['share']:g}", f"{r['paced_write']:.1f} s",
            f"{r['step']:.3f} s", f"{r['step_overlap']:.3f} s",
            f"{r['slowdown']:+.0%} ({r['slowdown_min']:+.0%}..{r['slowdown_max']:+.0%}, "
            f"{r['cycles']:.0f} cycles, {r['overlapped_steps']:.0f} steps)",
            f"{r['term_commit']:.2f} s", f"{r['term_exit']:.2f} s"]), flush=True)
    print("load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"reproduce: python benchmarks/bench_checkpoint.py "
          f"{'--quick' if args.quick else '--sizes ' + ' '.join(f'{s:g}' for s in sizes)}"
          f"{' --repeats ' + str(repeats) if not args.quick else ''}"
          f"{' --no-nice' if args.no_nice else ''}"
          f"{f' --share {args.share:g}' if args.share is not None else ''}"
          f"{' --staging fresh' if args.staging == 'fresh' else ''}")


if __name__ == "__main__":
    main()
