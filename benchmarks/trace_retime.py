"""Calls between schedtrain's modules from a live retime request to its application.

The job (``schedtrain train``, in this process, on its main thread) trains 60 steps of
a tiny model, ``--step-ms`` each (a sleep in the loss) until the command has its answer,
with a ``ModelSaver`` every 5 steps. A second thread waits until ``run.json`` shows step
5, then runs the real command, ``main(["retime", RUN_DIR, "new.toml"])``, whose schedule
saves every 4 steps. The job takes the request on its slow path, applies it and answers;
its steps after that (outside both windows) are not slowed.

A hop is a call whose caller and callee are both functions of schedtrain and sit in
different modules (``sys.setprofile``, one thread each). The job's window opens when its
training thread reads the request (``read_request``) and closes when the function that
called it returns: the request read, checked, applied, journaled, answered and removed.
The command's window is the whole ``main(["retime", ...])`` call on its thread.

Reproduce (from the repository root; another checkout's code with PYTHONPATH there)::

    PYTHONPATH=. python benchmarks/trace_retime.py
    PYTHONPATH=. python benchmarks/trace_retime.py --step-ms 30 --show 15
    PYTHONPATH=. python benchmarks/trace_retime.py --hops 200
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

TASK = """\
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from schedtrain.training import Task

PAUSE = {pause}


def unpace():  # the retime was answered: the steps left need no pace
    global PAUSE
    PAUSE = 0.0


def make_task():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g)
    y = x.sum(1, keepdim=True)
    model = nn.Linear(4, 1)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.01),
                DataLoader(TensorDataset(x, y), batch_size=1), loss_fn=_loss)


def _loss(out, target):
    time.sleep(PAUSE)
    return nn.functional.mse_loss(out, target)
"""

SPEC = """\
[run]
task = "trace_task:make_task"
max_epochs = 1
seed = 0

[callbacks.save]
type = "ModelSaver"
trigger = {{ every = "{every} steps" }}
"""


def _module(frame: FrameType | None) -> str | None:
    """The schedtrain module ``frame`` runs in (``None``: not schedtrain's)."""
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) and name.startswith("schedtrain") else None


class Hops:
    """Counts calls between schedtrain's modules while ``open``."""

    def __init__(self) -> None:
        self.open = False
        self.calls: Counter[tuple[str, str]] = Counter()
        self.modules: set[str] = set()

    def see(self, frame: FrameType) -> None:
        callee, caller = _module(frame), _module(frame.f_back)
        if callee is not None and caller is not None and callee != caller:
            self.calls[(f"{caller}", f"{callee}:{frame.f_code.co_name}")] += 1
            self.modules.update((caller, callee))

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def busiest(self, n: int) -> list[tuple[str, int]]:
        by: Counter[str] = Counter()
        for (_, callee), k in self.calls.items():
            by[callee.split(":")[0]] += k
        return by.most_common(n)


def _job_profiler(hops: Hops) -> Callable[[FrameType, str, Any], None]:
    """The training thread's profiler: opens the window at ``read_request``, closes it
    when the frame that called it returns."""
    state: dict[str, Any] = {"owner": None, "done": False}

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if state["done"]:
            return
        if event == "call":
            if (state["owner"] is None and frame.f_code.co_name == "read_request"
                    and _module(frame) is not None):
                state["owner"] = frame.f_back
                hops.open = True
            if hops.open:
                hops.see(frame)
        elif event == "return" and frame is state["owner"]:
            hops.open, state["done"] = False, True

    return profile


def _command_profiler(hops: Hops) -> Callable[[FrameType, str, Any], None]:
    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and hops.open:
            hops.see(frame)
    return profile


def _report(package: Path, code: int, said: dict[str, Any], answer: dict[str, Any], *,
            job: Hops, command: Hops, args: argparse.Namespace) -> None:
    print(f"schedtrain from {package}")
    print(f"train exit {code}; retime exit {said.get('code')}; the job's answer: "
          f"{answer['status']} at step {answer['step']} ({answer['reason']})")
    if answer["status"] != "applied" or said.get("code") != 0:
        print(textwrap.indent(said.get("out", "") + said.get("err", ""), "  "))
        raise SystemExit("the retime was not applied: no window to count")
    print(f"job: {job.total:,} calls between modules in {len(job.modules)} modules "
          f"(from read_request to the answer written and the request removed)")
    for module, k in job.busiest(args.show):
        print(f"  {k:6,}  {module}")
    if args.hops:
        print(f"  the {args.hops} most frequent hops (caller -> callee:function):")
        for (caller, callee), k in job.calls.most_common(args.hops):
            print(f"  {k:6,}  {caller} -> {callee}")
    print(f"command: {command.total:,} calls between modules in {len(command.modules)} "
          "modules (main(['retime', ...]) whole)")
    print("reproduce: PYTHONPATH=<checkout> python benchmarks/trace_retime.py "
          f"--step-ms {args.step_ms:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=10.0,
                        help="the job's step time (a sleep in its loss)")
    parser.add_argument("--show", type=int, default=10,
                        help="list the modules called most in the job's window")
    parser.add_argument("--hops", type=int, default=0,
                        help="also list the job's most frequent hops by caller and callee")
    args = parser.parse_args()

    import schedtrain
    from schedtrain.cli.main import main as cli

    folder = Path(tempfile.mkdtemp(prefix="trace-retime-"))
    (folder / "trace_task.py").write_text(TASK.format(pause=args.step_ms / 1000))
    (folder / "spec.toml").write_text(SPEC.format(every=5))
    (folder / "new.toml").write_text(SPEC.format(every=4))
    run_dir = folder / "run"
    job, command = Hops(), Hops()
    said: dict[str, Any] = {}

    def ask() -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                status = json.loads((run_dir / "run.json").read_text())
                if status.get("step", 0) >= 5:
                    break
            time.sleep(0.001)
        out, err = io.StringIO(), io.StringIO()
        sys.setprofile(_command_profiler(command))
        command.open = True
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            said["code"] = cli(["retime", str(run_dir), str(folder / "new.toml")])
        command.open = False
        sys.setprofile(None)
        sys.modules["trace_task"].unpace()
        said["out"], said["err"] = out.getvalue(), err.getvalue()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    sys.setprofile(_job_profiler(job))
    try:
        code = cli(["train", str(folder / "spec.toml"), "--run-dir", str(run_dir)])
    finally:
        sys.setprofile(None)
    thread.join(timeout=60)
    try:
        answer = json.loads((run_dir / "retime.answer.json").read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _report(Path(schedtrain.__file__).parent, code, said, answer, job=job, command=command,
            args=args)

if __name__ == "__main__":
    main()
