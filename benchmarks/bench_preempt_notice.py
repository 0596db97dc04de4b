"""Time from a cloud preemption notice to the committed checkpoint (``[run] preempt_notice``).

A local server answers as AWS's (or GCE's) metadata server (tests/notice_server.py); a
real ``Trainer`` run (an MLP of ``--params`` parameters with Adam, CPU) polls it every
``--poll`` seconds, the product's 5 s by default. At a random moment a few seconds into
training the server starts serving the notice. Per trial three times are printed:

* **served -> committed**: from the first answer holding the notice to ``Preempted``
  (raised only once the checkpoint is committed): the step in progress, the host copy,
  the write and its commit;
* **notice -> served**: the wait for the next poll (uniform in 0 to ``--poll`` s);
* **notice -> committed**: their sum, what a spot instance's 2 minutes (AWS) or 30 s (GCE)
  must hold.

Reproduce (from the repository root)::

    python benchmarks/bench_preempt_notice.py --trials 5 --params 10000000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

# The notice server is the tests' (one definition of the documented answers).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from notice_server import NoticeServer

from schedtrain import Schedule
from schedtrain.errors import Preempted
from schedtrain.training import Trainer
from schedtrain.training.control.notice import POLL_ENV


def _model(params: int) -> torch.nn.Module:
    width = max(8, int(params ** 0.5))  # one width x width layer holds nearly all
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 1))


def _batches(start: threading.Event) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, generator=g)
    y = x.sum(1, keepdim=True)
    start.set()
    for _ in range(10**9):
        yield x, y


def trial(kind: str, params: int, rng: random.Random) -> tuple[float, float, int]:
    """(notice -> served, served -> committed) in seconds, and the state's bytes."""
    started = threading.Event()
    with NoticeServer() as server, tempfile.TemporaryDirectory() as tmp:
        model = _model(params)
        opt = torch.optim.Adam(model.parameters())
        t = Trainer(model, opt, _batches(started), torch.nn.functional.mse_loss,
                    schedule=Schedule({}), max_epochs=1, run_dir=Path(tmp) / "run",
                    preempt_notice=server.url(kind))
        delay = rng.uniform(2.0, 4.0)

        def serve() -> None:
            started.wait()
            time.sleep(delay)
            server.serve_notice()

        threading.Thread(target=serve, daemon=True).start()
        try:
            t.fit()
        except Preempted as stop:
            committed = time.time()
            size = Path(str(stop.checkpoint)).stat().st_size
        else:
            raise AssertionError("the run was not preempted")
        assert server.noticed_at is not None and server.served_at is not None
        return server.served_at - server.noticed_at, committed - server.served_at, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between polls")
    parser.add_argument("--kind", choices=("aws", "gce"), default="aws")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ[POLL_ENV] = str(args.poll)
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    rows = [trial(args.kind, args.params, rng) for _ in range(args.trials)]
    print(f"{args.kind} notice, poll every {args.poll:g} s, {args.params:,} parameters "
          f"with Adam ({rows[0][2] / 1e6:.0f} MB checkpoint), {args.trials} trials")
    print(f"{'trial':>5} {'notice->served s':>17} {'served->committed s':>20} "
          f"{'notice->committed s':>20}")
    for i, (wait, commit, _) in enumerate(rows, 1):
        print(f"{i:>5} {wait:>17.2f} {commit:>20.2f} {wait + commit:>20.2f}")
    for name, values in (("served->committed", [r[1] for r in rows]),
                         ("notice->committed", [r[0] + r[1] for r in rows])):
        print(f"{name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s")


if __name__ == "__main__":
    main()
