"""The persisted-state fuzzer over a host's driver state (issue 41): the schedule's state
that Lightning's ``ScheduleCallback`` keeps inside Lightning's own checkpoint
(``checkpoint["callbacks"][state_key]``: the driver's clock, pending counts, triggers,
metrics, the hosted callbacks' states, the last metric values read and the keep
records), each leaf mutated as tests/fuzz_mutations.py mutates a run's files, then
``Trainer.fit(ckpt_path=...)`` in a forked child with a deadline.

Pass: the intact resume's firings, actions, final weights, saver files and callback
state; or a ``schedtrain.Error`` of one line naming the key path. Fail: a hang, the
child dying, any other exception, a message of several lines or naming no key, a
result other than the reference's, or a file outside the checkpoints' folder changed
(string leaves are also set to ``"../outside.txt"``).
tests/integrations/test_state_fuzz_host.py draws a few cases in CI;
benchmarks/fuzz_state_host.py runs them all."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import shutil
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import lightning.pytorch as pl
import torch
from fuzz_mutations import TABLES, VALUES, Key, _big_stack, _deep_list, _replace, _walk
from torch.utils.data import DataLoader, Dataset

import schedtrain
from schedtrain import Error, Schedule, every, improved, plateau
from schedtrain.callbacks import EarlyStopping
from schedtrain.integrations.host_control import HostControl
from schedtrain.integrations.lightning import ScheduleCallback

for _name in ("lightning", "lightning.pytorch", "lightning.fabric"):
    logging.getLogger(_name).setLevel(logging.ERROR)

EPOCHS, BATCHES = 3, 4  # 4 optimizer steps an epoch (batches of 2, no accumulation)
#: The schedule's saver writes every 3 steps; the fixture fit dies after step CUT
#: (mid-epoch 1), and every case resumes from that saver's file of step CUT.
CUT = 6
CKPT = f"save-epoch=1-step={CUT}.ckpt"
FOLDER = "ckpts"
DEADLINE = 60.0
#: A file beside the checkpoints' folder that no case may change, and a string leaf's
#: mutation that names it (a saved file's name crafted to reach out of the folder).
OUTSIDE = "outside.txt"
PATHS = {"path": "../" + OUTSIDE}
#: The outcomes that pass; every other one is a failure ("unwritable": not run).
PASSES = ("same", "refused")
_SCHEDTRAIN = str(Path(schedtrain.__path__[0]))


class Module(pl.LightningModule):
    """A linear model on fixed data, logging its loss (what the metric triggers read)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = (self.layer(batch[:, :3]) - batch[:, 3:]).pow(2).mean()
        self.log("loss", loss, on_step=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.02)


def data() -> DataLoader[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(BATCHES * 2, 4, generator=g)
    return DataLoader(cast(Dataset[torch.Tensor], rows), batch_size=2)


def _control_folder(folder: Path) -> Path:
    """Run control's folder, beside the saver's (its run.json is not a saver file)."""
    return folder.with_name(f"{folder.name}-control")


class Host:
    """One fit's ``ScheduleCallback``: a periodic probe, two metric-judging triggers
    (``improved``, ``plateau``), schedtrain's ``EarlyStopping`` (a hosted callback with
    its own state) and a ``"checkpoint"`` saver keeping its latest 2 files."""

    def __init__(self, folder: Path) -> None:
        self.seen: list[tuple[str, int]] = []
        self.early = EarlyStopping("loss", patience=10)
        schedule = Schedule({"probe": every("2 steps"), "best": improved("loss"),
                             "calm": plateau("loss", patience=2), "early": every("1 step"),
                             "save": every("3 steps")})
        actions: dict[str, Any] = {n: self._seen(n) for n in ("probe", "best", "calm")}
        actions.update(early=self.early, save="checkpoint")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Run control (its own folder, no handlers): its schedule text rides in the state.
            self.callback = ScheduleCallback(schedule, actions, record=True,
                                             checkpoint_dir=folder, keep={"save": 2},
                                             control=HostControl(_control_folder(folder),
                                                                 handle_signals=False))

    def _seen(self, name: str) -> Callable[[pl.Trainer, pl.LightningModule], None]:
        return lambda trainer, module: self.seen.append((name, trainer.global_step))


def _fit(callbacks: list[Any], module: Module, root: Path, ckpt: Path | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
                   default_root_dir=root, callbacks=callbacks, max_epochs=EPOCHS,
                   deterministic=True).fit(module, data(), ckpt_path=ckpt)


@attrs.frozen
class Result:
    """What a resumed fit did: the firings (callback, event, clock counters), what the
    actions saw, the final weights, the saver's files left and EarlyStopping's state."""

    firings: tuple[tuple[object, ...], ...]
    seen: tuple[tuple[str, int], ...]
    weights: tuple[float, ...]
    files: tuple[str, ...]
    early: str


def resume(case: Path) -> Result:
    """``fit(ckpt_path=case/ckpts/CKPT)`` to the end (this process)."""
    host = Host(case / FOLDER)
    module = Module()
    _fit([host.callback], module, case, case / FOLDER / CKPT)
    t = [(f.callback, f.event, f.timestamp.step, f.timestamp.batch, f.timestamp.epoch,
          f.timestamp.step_in_epoch, f.timestamp.sample) for f in host.callback.firings]
    return Result(tuple(t), tuple(host.seen),
                  tuple(float(x) for p in module.parameters() for x in p.detach().flatten()),
                  tuple(sorted(p.name for p in (case / FOLDER).iterdir())),
                  repr(host.early.state_dict()))


def make_fixture(folder: Path) -> Path:
    """``folder/ckpts``: the saver's files of a fit killed after step ``CUT``."""
    host = Host(folder / FOLDER)

    class Kill(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
            if trainer.global_step == CUT:
                raise KeyError("killed")  # the fit dies, and Lightning saves nothing

    torch.manual_seed(0)
    with contextlib.suppress(KeyError):
        _fit([host.callback, Kill()], Module(), folder, None)
    if not (folder / FOLDER / CKPT).is_file():
        left = sorted(p.name for p in (folder / FOLDER).iterdir())
        raise AssertionError(f"the fixture fit left {left}")
    return folder


def state_key(fixture: Path) -> str:
    """The schedtrain callback's key in the checkpoint's ``callbacks``."""
    keys = [k for k in _load(fixture / FOLDER / CKPT)["callbacks"] if "ScheduleCallback" in k]
    assert len(keys) == 1, keys
    return str(keys[0])


def _load(path: Path) -> dict[str, Any]:
    return dict(torch.load(path, weights_only=False))


@attrs.frozen
class HostMutation:
    """One leaf (or table) of the driver state at ``key`` and what replaces it."""

    key: Key
    kind: str

    def __str__(self) -> str:
        key = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in self.key)
        return f"{CKPT}:callbacks[ScheduleCallback]{key} <- {self.kind}"


def mutations(fixture: Path) -> list[HostMutation]:
    """Every value mutation of every leaf, every missing/extra key of every table."""
    state = _load(fixture / FOLDER / CKPT)["callbacks"][state_key(fixture)]
    out = []
    for key, value in _walk(state, ()):
        if isinstance(value, dict):
            out += [HostMutation(key, k) for k in TABLES if key or k == "extra"]
        else:
            out += [HostMutation(key, k) for k in VALUES]
            if isinstance(value, str):
                out += [HostMutation(key, k) for k in PATHS]
    return out


def apply(mutation: HostMutation, case: Path, key: str) -> None:
    """Write ``mutation`` into the case's checkpoint (raises where it cannot be)."""
    path = case / FOLDER / CKPT
    ckpt = _load(path)
    state = ckpt["callbacks"][key]
    if mutation.kind in PATHS:
        parent = state
        for k in mutation.key[:-1]:
            parent = parent[k]
        parent[mutation.key[-1]] = PATHS[mutation.kind]
    else:
        ckpt["callbacks"][key] = state = _replace(state, mutation.key, mutation.kind)
    if mutation.kind == "deep":
        parent = state
        for k in mutation.key[:-1]:
            parent = parent[k]
        parent[mutation.key[-1]] = _deep_list()
        _big_stack(lambda: torch.save(ckpt, path))
    else:
        torch.save(ckpt, path)


@attrs.frozen
class Outcome:
    """A forked resume: its result, or the exception it raised (type, whether it is a
    ``schedtrain.Error``, message, whether a schedtrain frame raised it, traceback);
    ``None`` for both: killed at the deadline, or died without a word."""

    result: Result | None
    error: tuple[str, bool, str, bool, str] | None
    seconds: float
    hung: bool


def run_forked(case: Path, deadline: float = DEADLINE) -> Outcome:
    """``resume(case)`` in a forked child, killed at ``deadline`` seconds."""
    out = case / ".outcome.pkl"
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            got: Any
            try:
                got = resume(case)
            except BaseException as exc:
                got = (type(exc).__name__, isinstance(exc, Error), str(exc),
                       *_origin(exc))
            out.write_bytes(pickle.dumps(got))
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    hung = _wait(pid, start + deadline)
    seconds = time.monotonic() - start
    if hung or not out.is_file():
        return Outcome(None, None, seconds, hung)
    got = pickle.loads(out.read_bytes())
    out.unlink()
    if isinstance(got, Result):
        return Outcome(got, None, seconds, False)
    return Outcome(None, got, seconds, False)


def _origin(exc: BaseException) -> tuple[bool, str]:
    """Whether a schedtrain frame raised ``exc``, and where: its innermost schedtrain
    frame, else its innermost frame outside Python's own library (the host's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(_SCHEDTRAIN)]
    theirs = [f for f in frames if "site-packages" in f.filename]
    at = (ours or theirs or frames)[-1]
    name = at.filename.split("site-packages/")[-1].split("/schedtrain/")[-1]
    return bool(ours), f"{name}:{at.lineno} {(at.line or '').strip()}"


def _wait(pid: int, until: float) -> bool:
    """Wait for the child; True where it outlived ``until`` (then it is killed)."""
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > until:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.01)
    return False


def warm_up() -> None:
    """Import and run once what each resume runs, so forked children start at once."""
    with contextlib.suppress(Exception):
        Host(Path(os.devnull))


def copy_case(fixture: Path, to: Path) -> Path:
    to.mkdir(parents=True)
    shutil.copytree(fixture / FOLDER, to / FOLDER)
    (to / OUTSIDE).write_text("a user's notes\n")
    return to


def reference(fixture: Path, folder: Path) -> Result:
    """The intact checkpoint's resume: what every case is compared with."""
    got = run_forked(copy_case(fixture, folder))
    if got.result is None:
        raise AssertionError(f"the intact resume failed: {got}")
    return got.result


def _names_key(message: str, mutation: HostMutation) -> bool:
    """Whether ``message`` names the mutated key: a trailing part of its path, from a
    named key on (``clock.now.step``, ``pending[0]``), as a whole word; for the state's
    top table, ``(top)`` or the key added."""
    key = mutation.key
    if not key:
        return "(top)" in message or "fuzz_extra" in message
    for i, k in enumerate(key):
        if isinstance(k, str):
            path = k + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in key[i + 1:])
            if re.search(rf"(^|[\s.(\[']){re.escape(path)}($|[^\w])", message):
                return True
    return False


def judge(mutation: HostMutation, ref: Result, got: Outcome) -> tuple[str, str]:
    """The outcome's kind (``PASSES`` or a failure) and a line of detail."""
    if got.hung:
        return "hang", f"killed after {got.seconds:.1f} s"
    if got.result is not None:
        if got.result == ref:
            return "same", ""
        diff = [f for f in attrs.fields(Result)
                if getattr(got.result, f.name) != getattr(ref, f.name)]
        return "differs", ", ".join(f"{f.name}: {getattr(got.result, f.name)!r:.300}"
                                    for f in diff)
    if got.error is None:
        return "died", "the child ended without a result"
    name, ours, message, in_schedtrain, where = got.error
    if not ours:
        kind = "crash" if in_schedtrain else "host error"
        return kind, f"{name}: {message[:200]!r} at {where[:200]}"
    if "\n" in message or len(message) > 300:
        return "several lines", f"{name}: {message[:300]!r}"
    if not _names_key(message, mutation):
        named = [k for k in mutation.key if isinstance(k, str) and f"{k}:" in message]
        return ("part only" if named else "unnamed key"), f"{name}: {message!r}"
    return "refused", message


def run_case(fixture: Path, ref: Result, key: str, mutation: HostMutation,
             case: Path) -> tuple[str, str, float]:
    """Copy the fixture, mutate, resume, judge: (kind, detail, seconds)."""
    copy_case(fixture, case)
    try:
        apply(mutation, case, key)
    except (TypeError, KeyError, IndexError) as exc:
        return "unwritable", f"{type(exc).__name__}: {exc}", 0.0
    got = run_forked(case)
    kind, detail = judge(mutation, ref, got)
    outside = case / OUTSIDE
    if not outside.is_file() or outside.read_text() != "a user's notes\n":
        kind, detail = "outside touched", f"{OUTSIDE} changed or deleted ({kind}: {detail})"
    with contextlib.suppress(OSError):
        shutil.rmtree(case)
    return kind, detail, got.seconds
