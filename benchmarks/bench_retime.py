"""Live retime's delay: from a request (what ``schedtrain retime`` writes) to the change
taking effect in a running job, in seconds and in steps.

A tiny model (16 -> 1, SGD, batches of 32, CPU, one thread) trains in a run directory
with 10 callbacks every 1000 steps; a thread writes a retime request at random moments
(alternating the callbacks between every 1000 and every 999 steps), as the command does
(``planning.retime.write_request``), and waits for the job's answer
(``retime.answer.json``). The step at the request is the number of batches the data has
handed out then; the step of the change is the answer's. The job looks for a request on
its slow path only (a due step, every 256 steps, or the end), at most every
``POLL_NS`` = 0.5 s, so the delay is at most about 0.5 s plus the steps to the next
slow-path step. Also timed: how long the training thread spends applying each request
(``Retimer._apply``: check, compile, adopt, log, journal, answer), the time a step
waits for it: wall time, most of it the fsyncs of three small files, and CPU time.

Reproduce (from the repository root)::

    python benchmarks/bench_retime.py --steps 200000 --trials 8
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from schedtrain import Schedule, every
from schedtrain.callbacks import Callback
from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import read_answer, write_request
from schedtrain.training import Trainer
from schedtrain.training.control.retime import Retimer

BATCH, FEATURES = 32, 16


class _Nothing(Callback):
    pass


class _Counted:
    """Batches handed out so far: the job's step when a request is written. Its length
    is known, as a ``DataLoader``'s is, so the run knows its shape."""

    def __init__(self, steps: int) -> None:
        self.steps, self.given = steps, 0
        self.x = torch.randn(BATCH, FEATURES)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.steps):
            self.given += 1
            yield self.x, self.y


def _schedule(period: int) -> Schedule:
    return Schedule({f"cb{i}": every(f"{period} steps") for i in range(10)})


def _time_applying(spent: list[tuple[float, float]]) -> None:
    """Record the seconds each ``Retimer._apply`` takes on the training thread: wall
    time (with the fsyncs of the journal, ``run.json`` and the answer) and CPU time."""
    apply = Retimer._apply

    def timed(self: Retimer, *args: Any, **kwargs: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            apply(self, *args, **kwargs)
        finally:
            spent.append((time.perf_counter() - t0, time.thread_time() - c0))

    Retimer._apply = timed  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    texts = [canonical(_schedule(999)), canonical(_schedule(1000))]
    data = _Counted(args.steps)
    results: list[tuple[float, int, int]] = []
    applying: list[tuple[float, float]] = []
    _time_applying(applying)
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        model = torch.nn.Linear(FEATURES, 1)
        names = [f"cb{i}" for i in range(10)]
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), data,
                          torch.nn.functional.mse_loss, schedule=_schedule(1000),
                          bindings={n: _Nothing() for n in names}, max_steps=args.steps,
                          device="cpu", run_dir=run_dir, log_events=False)
        done = threading.Event()

        def ask() -> None:
            time.sleep(1.0)
            for trial in range(args.trials):
                time.sleep(rng.uniform(0.2, 1.0))
                text = texts[trial % 2]
                assert text is not None
                asked_step, t0 = data.given, time.perf_counter()
                ident = write_request(run_dir, text)
                while (answer := read_answer(run_dir, ident)) is None:
                    if done.is_set():
                        return
                    time.sleep(0.0005)
                results.append((time.perf_counter() - t0, asked_step, answer.step))
                print(f"retime {trial}: {results[-1][0]:.3f} s, asked at step {asked_step}, "
                      f"applied at step {answer.step}", flush=True)

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        trainer.fit()
        wall = time.perf_counter() - t0
        done.set()
        thread.join()
    rate = args.steps / wall
    print(f"{args.steps} steps in {wall:.1f} s ({rate:,.0f} steps/s), {len(results)} retimes, "
          f"torch {torch.__version__}, 1 thread")
    print(f"{'trial':>5}{'seconds':>10}{'asked at':>10}{'applied at':>12}{'steps':>8}")
    for i, (s, a, b) in enumerate(results):
        print(f"{i:>5}{s:>10.3f}{a:>10}{b:>12}{b - a:>8}")
    if results:
        secs = [r[0] for r in results]
        steps = [r[2] - r[1] for r in results]
        print(f"delay: median {statistics.median(secs):.3f} s (max {max(secs):.3f} s), "
              f"median {statistics.median(steps):.0f} steps (max {max(steps)})")
    if applying:
        took, cpu = ([1000 * s[i] for s in applying] for i in (0, 1))
        print(f"applying on the training thread, over {len(took)} requests: wall median "
              f"{statistics.median(took):.1f} ms (max {max(took):.1f} ms), CPU median "
              f"{statistics.median(cpu):.1f} ms (max {max(cpu):.1f} ms)")


if __name__ == "__main__":
    main()
