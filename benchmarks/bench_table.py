"""Cost of the compiled trigger table on steps where nothing fires, and of long simulations.

Measures in one run, per non-firing step (nanoseconds):

* an empty Python loop iteration that advances a counter (the baseline);
* the compiled table's ``step_end()`` with 1, 10, 100 and 1000 periodic callbacks;
* the hand-written alternative: one ``if step % k == 0`` per callback;
* Ignite's per-handler event filters (``Events.ITERATION_COMPLETED(every=k)``), when installed;

and the wall time to simulate 10^9 steps with 100 periodic callbacks.

Reproduce: ``python benchmarks/bench_table.py`` (add ``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from collections.abc import Callable

from schedtrain import Schedule, simulate
from schedtrain.clock import LoopClock
from schedtrain.triggers import every

COUNTS = (1, 10, 100, 1000)


def _best_of(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Best wall time per iteration over ``repeats`` runs of ``n`` iterations (ns)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


def _net(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Cost per iteration above the empty loop, measured alternately to cancel machine load."""
    base = min(_best_of(empty_loop, n, 1) for _ in range(repeats))
    return _best_of(fn, n, repeats) - base


def empty_loop(n: int) -> None:
    clock = LoopClock()
    for i in range(n):
        clock.step = i


def table_loop(count: int) -> Callable[[int], None]:
    periods = [10**9 + i for i in range(count)]  # nothing fires inside the measured window
    table = Schedule({f"cb{i}": every(k, "steps") for i, k in enumerate(periods)}).compile()

    def run(n: int) -> None:
        clock = LoopClock()
        table.attach(clock)
        step_end = table.step_end
        for i in range(n):
            clock.step = i
            step_end()

    return run


def inline_loop(count: int) -> Callable[[int], None]:
    """The idiom the training loop uses: compare against ``table.step_due`` inline."""
    periods = [10**9 + i for i in range(count)]
    table = Schedule({f"cb{i}": every(k, "steps") for i, k in enumerate(periods)}).compile()

    def run(n: int) -> None:
        clock = LoopClock()
        table.attach(clock)
        for i in range(n):
            clock.step = i
            if clock.step >= table.step_due:
                table.step_end()

    return run


def modulo_loop(count: int) -> Callable[[int], None]:
    periods = [10**9 + i for i in range(count)]

    def run(n: int) -> None:
        clock = LoopClock()
        for i in range(n):
            clock.step = i
            step = clock.step
            for k in periods:
                if step % k == 0 and step:
                    pass

    return run


def ignite_loop(count: int) -> Callable[[int], None] | None:
    try:
        from ignite.engine import Events
    except ImportError:
        return None
    filters = [Events.ITERATION_COMPLETED(every=10**9 + i).filter for i in range(count)]

    def run(n: int) -> None:
        clock = LoopClock()
        for i in range(n):
            clock.step = i
            for f in filters:
                if f(None, i + 1):  # type: ignore[arg-type]
                    pass

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    n = 200_000 if args.quick else 1_000_000
    repeats = 3 if args.quick else 5

    base = _best_of(empty_loop, n, repeats)
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{n:,} steps per measurement, best of {repeats}")
    print(f"empty loop iteration: {base:7.1f} ns/step\n")
    header = (f"{'callbacks':>9} | {'inline due':>10} | {'step_end()':>10} | {'% k checks':>11}"
              f" | {'ignite filters':>14} | {'vs % k':>7} | {'vs ignite':>9}")
    print(header)
    print("-" * len(header))
    for count in COUNTS:
        # Loops over many callbacks are slow; scale iterations so each run takes similar time.
        m = max(n // max(count // 10, 1), 20_000)
        inline = _net(inline_loop(count), n, repeats)
        table = _net(table_loop(count), n, repeats)
        modulo = _net(modulo_loop(count), m, repeats)
        ig = ignite_loop(count)
        ignite = _net(ig, m, repeats) if ig is not None else float("nan")
        print(f"{count:>9} | {inline:7.1f} ns | {table:7.1f} ns | {modulo:8.1f} ns"
              f" | {ignite:11.1f} ns | {modulo / inline:6.0f}x | {ignite / inline:8.0f}x")

    rng = random.Random(0)
    sched = Schedule({f"cb{i}": every(rng.randrange(10**7, 10**8), "steps") for i in range(100)})
    t0 = time.perf_counter()
    log = simulate(sched, epochs=1000, steps_per_epoch=10**6)
    elapsed = time.perf_counter() - t0
    print(f"\nsimulate 10^9 steps (1000 epochs x 10^6), 100 periodic callbacks "
          f"(periods 10^7..10^8 steps): {elapsed:.3f} s, {len(log):,} firings")
    print(f"\nreproduce: {sys.executable.rsplit('/', 1)[-1]} benchmarks/bench_table.py")


if __name__ == "__main__":
    main()
