"""CPU cost of planning, simulating and checking as the number of callbacks grows.

For 100, 1,000, 5,000 and 20,000 callbacks, in CPU seconds (``time.process_time``,
best of a few runs; the machine's other jobs do not count):

* ``plan`` as its text table and as ``--format json`` (the command line's own code,
  in process: loading, simulating, rendering), and ``simulate()`` of the same schedule,
  on three workloads of about 60,000 firings each:

  - **spread**: periods of N to 2N steps, so one or two callbacks fire at a step;
  - **crowded**: every callback every 10 steps (each its own trigger: a window that
    ends after the run), so all N fire at the same step;
  - **savers**: ``ModelSaver``s with ``keep`` policies, spread, so the plan predicts
    the files each save leaves;

* ``check`` (loading and validating the spec) of the spread spec.

Each is printed per firing (per callback for ``check``) with its ratio to the figure
at 100 callbacks: with a cost of O(log N) per firing the ratio at 20,000 would be
about 2.2, with a linear one 1.

Reproduce: ``python benchmarks/bench_scale.py`` (``--quick`` for 100 and 1,000 only;
``--sizes 100,20000`` for others).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from schedtrain.cli.main import main as cli
from schedtrain.simulation import simulate
from schedtrain.simulation.simclock import RunShape
from schedtrain.spec import Spec, load_spec

#: Firings each workload plans, whatever the number of callbacks.
FIRINGS = 60_000
WORKLOADS = ("spread", "crowded", "savers")


def write_spec(path: Path, n: int, workload: str) -> None:
    """``n`` callbacks of ``workload`` over a run of about ``FIRINGS`` firings."""
    # crowded: N every 10 steps; else periods N..2N fire about ln 2 of a callback a step
    steps = max(10, 10 * FIRINGS // n) if workload == "crowded" else int(FIRINGS / 0.693)
    lines = ["[clock]", "epochs = 1", f"steps_per_epoch = {steps}", ""]
    keeps = ("3", '{ every = "%d steps" }', '{ any = [{ latest = 2 }, { every = "%d steps" }] }')
    for i in range(n):
        lines.append(f"[callbacks.cb{i}]")
        if workload == "crowded":
            # distinct triggers (a stop past the run's end), so none share an entry
            lines.append(f'trigger = {{ every = "10 steps", stop = "{steps + 1 + i} steps" }}')
            continue
        period = n + i
        lines.append(f'trigger = {{ every = "{period} steps" }}')
        if workload == "savers":
            keep = keeps[i % 3]
            lines += ['type = "ModelSaver"', f"folder = \"ckpt/cb{i}\"",
                      "keep = " + (keep % (4 * period) if "%d" in keep else keep)]
    path.write_text("\n".join(lines) + "\n")


def cpu(fn: Callable[[], object], repeats: int) -> float:
    """Least CPU seconds of ``repeats`` calls."""
    out = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        out = min(out, time.process_time() - t0)
    return out


def run_cli(*argv: str) -> None:
    """The command line in process, its output discarded."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli(list(argv))
    if code != 0:
        raise SystemExit(f"schedtrain {' '.join(argv)} exited {code}")


def measure(tmp: Path, n: int, repeats: int) -> dict[str, tuple[float, int]]:
    """Column -> (CPU seconds, firings or callbacks it divides by)."""
    out: dict[str, tuple[float, int]] = {}
    for workload in WORKLOADS:
        path = tmp / f"{workload}{n}.toml"
        write_spec(path, n, workload)
        spec = load_spec(path)
        shape = spec.clock.shape()
        assert shape is not None
        firings = len(simulate(spec.schedule(), epochs=shape.epochs,
                               steps_per_epoch=shape.total_steps))
        out[f"{workload} table"] = (cpu(partial(run_cli, "plan", str(path)), repeats), firings)
        out[f"{workload} json"] = (cpu(partial(run_cli, "plan", str(path), "--format", "json"),
                                       repeats), firings)
        if workload != "savers":  # the same schedule as spread, without files
            def sim(spec: Spec = spec, shape: RunShape = shape) -> object:
                return simulate(spec.schedule(), epochs=shape.epochs,
                                steps_per_epoch=shape.total_steps)
            out[f"{workload} simulate"] = (cpu(sim, repeats), firings)
        if workload == "spread":
            out["check"] = (cpu(partial(run_cli, "check", str(path)), repeats), n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 callbacks only")
    parser.add_argument("--sizes", help="comma-separated numbers of callbacks")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many (2)")
    args = parser.parse_args()
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes else
             [100, 1000] if args.quick else [100, 1000, 5000, 20_000])
    rows: dict[int, dict[str, tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            rows[n] = measure(Path(tmp), n, args.repeats)
            print(f"measured {n:,} callbacks", flush=True)
    base = rows[sizes[0]]
    print(f"\n{'':<18}" + "".join(f"{n:>22,}" for n in sizes))
    for column in base:
        unit = "us/cb" if column == "check" else "us/firing"
        cells = []
        for n in sizes:
            seconds, per = rows[n][column]
            ratio = (seconds / per) / (base[column][0] / base[column][1])
            cells.append(f"{seconds:7.2f}s {1e6 * seconds / per:6.1f} {ratio:4.1f}x")
        print(f"{column:<18}" + "".join(f"{c:>22}" for c in cells) + f"   ({unit})")
    print("\nfirings per workload: "
          + ", ".join(f"{w} {rows[sizes[-1]][w + ' json'][1]:,}" for w in WORKLOADS)
          + f" at {sizes[-1]:,} callbacks")
    print("cells: CPU seconds, CPU per firing (per callback for check), ratio to "
          f"{sizes[0]:,} callbacks")
    print("reproduce: python benchmarks/bench_scale.py")


if __name__ == "__main__":
    main()
