"""Real runs for the persisted-state fuzzer: the fixture run directory (a preempted run
with every capability on), its reference resume, and a resume of a mutated copy judged
by the oracle (tests/fuzz_mutations.py mutates; tests/checkpoints/test_state_fuzz.py and
benchmarks/fuzz_state.py drive)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from fork_cli import fork_main, wait
from fuzz_mutations import Mutation, apply
from jobs.fuzz import FIXTURE

from schedtrain.planning.changes import canonical
from schedtrain.planning.requests import Applied, History, write_history
from schedtrain.spec import load_spec

#: The run: the crash job (Adam, dropout, shuffled data), two epochs of 64 steps.
SPEC = """\
[run]
task = "jobs.crash:make_task"
max_epochs = 2
seed = 3
mtbf = "{mtbf}"

[callbacks.ask]
type = "jobs.fuzz:AskRetime"
spec = "new.toml"
trigger = {{ at = "3 steps" }}

[callbacks.preempt]
type = "jobs.fuzz:Preempt"
trigger = {{ at = "{preempt} steps" }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {validate}

[callbacks.checkpoint]
type = "ModelSaver"
keep = {{ any = [{{ latest = 2 }}, {{ every = "16 steps" }}] }}
trigger = {{ any = [{{ every = "auto" }}, {{ on = "train_end" }}] }}
"""
OLD_VALIDATE = '{ every = "1 epoch" }'
NEW_VALIDATE = '{ any = [{ every = "1 epoch" }, { every = "9 steps" }] }'
#: The saver whose firings follow measured wall time (compared loosely).
AUTO_SAVER = "checkpoint"
#: A resume's deadline: past it the case is a hang.
DEADLINE = 60.0
#: A file beside the run that no case may change.
OUTSIDE = "outside.txt"


@attrs.frozen
class Outcome:
    """What one resume did: its exit code (None: killed at the deadline), stderr, and
    the seconds it took."""

    code: int | None
    stderr: str
    seconds: float


def warm_up() -> None:
    """Import what every resume imports, once, so forked children start at once."""
    import schedtrain.callbacks
    import schedtrain.cli.main
    import schedtrain.training  # noqa: F401

    torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), lr=0.1)  # imports torch._dynamo


def run_cli(argv: Sequence[str], cwd: Path, *, deadline: float = DEADLINE,
            env: dict[str, str] | None = None) -> Outcome:
    """``schedtrain ARGV`` in a forked child of this process (torch already imported),
    killed at ``deadline`` seconds (SIGTERM, then SIGKILL 5 s later)."""
    out = cwd / ".stderr"
    start = time.monotonic()
    pid = fork_main(argv, cwd, stderr=out, env=env)
    codes = wait([pid], start + deadline, grace=5)
    seconds = time.monotonic() - start
    text = out.read_text(errors="replace") if out.exists() else ""
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    return Outcome(None if codes is None else codes[0], text, seconds)


def train_argv(case: Path) -> list[str]:
    return ["train", str(case / "old.toml"), "--run-dir", str(case / "run"),
            "--resume", "auto"]


def make_fixture(folder: Path, *, preempt: int = 40, mtbf: str = "2 s") -> Path:
    """A case folder (``old.toml``, ``new.toml``, ``outside.txt``, ``run/``) holding a
    run retimed live at step 3 and preempted (SIGTERM) at step ``preempt``."""
    folder.mkdir(parents=True)
    for name, validate in (("old.toml", OLD_VALIDATE), ("new.toml", NEW_VALIDATE)):
        (folder / name).write_text(SPEC.format(mtbf=mtbf, preempt=preempt,
                                               validate=validate))
    (folder / OUTSIDE).write_text("a user's notes\n")
    # The retime applied at step 3, as the journal a resume replays; the live request
    # (AskRetime) then asks for the schedule the run already has, and is answered so.
    base, new = (canonical(load_spec(folder / n).schedule()) for n in ("old.toml", "new.toml"))
    assert base is not None and new is not None
    (folder / "run").mkdir()
    write_history(folder / "run", History(base, (Applied(3, 0, new),)))
    got = run_cli(train_argv(folder), folder, deadline=300, env={FIXTURE: "1"})
    if got.code != 75:
        raise AssertionError(f"the fixture run was not preempted (exit {got.code}):\n"
                             f"{got.stderr[-3000:]}")
    return folder


def copy_case(fixture: Path, to: Path) -> Path:
    """A fresh copy of the fixture case (symlinks kept as links)."""
    shutil.copytree(fixture, to, symlinks=True)
    return to


def log_lines(case: Path) -> list[str]:
    return (case / "run" / "events.jsonl").read_text().splitlines()


def firings(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The log's lines without wall-clock fields, nor the auto saver's measured ones.

    Where the auto saver fires, ``train/loss`` is put at its firings too, whose steps
    follow the wall clock (a loaded machine saves at other steps): the losses are then
    judged by the final weights, not by the steps they were put at."""
    rows = []
    auto = any(f'"callback": "{AUTO_SAVER}"' in line for line in lines)
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = {"unparsed": line}
        if not isinstance(row, dict):
            row = {"unparsed": line}
        if row.get("callback") == AUTO_SAVER or str(row.get("name", "")).startswith(
                f"{AUTO_SAVER}/") or (auto and row.get("name") == "train/loss"):
            continue
        rows.append({k: v for k, v in row.items()
                     if k not in ("time", "seconds", "duration", "path", "checkpoint")})
    return rows


def auto_saves(case: Path) -> list[int]:
    """The steps at which the auto saver fired (after step_end)."""
    out = []
    for line in log_lines(case):
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if (isinstance(row, dict) and row.get("callback") == AUTO_SAVER
                    and isinstance(row.get("step"), int)):
                out.append(row["step"])
    return out


def final_weights(case: Path) -> str:
    """A digest of the model the train_end checkpoint holds."""
    for path in sorted((case / "run" / "checkpoints").glob("step-*.pt"), reverse=True):
        state = torch.load(path, weights_only=True)
        if state.get("phase") == "train_end":
            h = hashlib.sha256()
            for key, value in sorted(state["model"].items()):
                h.update(key.encode())
                h.update(value.numpy().tobytes())
            return h.hexdigest()
    return "no train_end checkpoint"


def outside_snapshot(case: Path) -> dict[str, bytes]:
    """Every file of the case folder outside the run directory, by its bytes."""
    return {str(p.relative_to(case)): p.read_bytes() for p in sorted(case.rglob("*"))
            if p.is_file() and not p.is_symlink() and "run" not in p.relative_to(case).parts[:1]}


@attrs.frozen
class Reference:
    """The intact resume's result: what every mutated case must reproduce (a case that
    passes over the checkpoint it resumed from: ``earlier(name)``'s)."""

    weights: str
    lines: list[str]
    auto_saves: bool  # whether the auto saver saved between the resume and train_end
    resumed: str  # the file name of the checkpoint it resumed from
    fixture: Path


def _resumed(stderr: str) -> str:
    """The file name of the checkpoint a resume says it resumed from ("" where none)."""
    for line in stderr.splitlines():
        if line.startswith("resumed from "):
            return Path(line.removeprefix("resumed from ").rsplit(" at step ", 1)[0]).name
    return ""


def reference(fixture: Path, to: Path, *, before: str | None = None) -> Reference:
    """Resume an intact copy of ``fixture`` to its end (``before``: with the checkpoints
    from that one on taken away, as a resume passing over them would find them)."""
    case = copy_case(fixture, to)
    if before is not None:
        for path in (case / "run" / "checkpoints").glob("step-*"):
            if path.name >= before:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    got = run_cli(train_argv(case), case)
    assert got.code == 0, got.stderr[-3000:]
    return Reference(final_weights(case), log_lines(case), _saved_between(case),
                     _resumed(got.stderr), fixture)


#: References resumed from an earlier checkpoint, by fixture and checkpoint file name.
_EARLIER: dict[tuple[Path, str], Reference] = {}


def earlier(ref: Reference, name: str) -> Reference:
    """The reference for a case that resumed from checkpoint ``name`` instead of
    ``ref.resumed`` (made once): where the run's shape depends on where it resumed
    (the epoch's rest re-divided among another number of processes), an intact resume
    with the checkpoints after ``name`` taken away."""
    if name in ("", ref.resumed):
        return ref
    key = (ref.fixture, name)
    if key not in _EARLIER:
        names = sorted(p.name for p in (ref.fixture / "run" / "checkpoints").glob("step-*"))
        if not names:  # its checkpoints in a store: one process, the same result
            return ref
        after = next((n for n in names if n > name), "~")
        _EARLIER[key] = reference(ref.fixture, ref.fixture.parent / f"reference-{name}",
                                  before=after)
    return _EARLIER[key]


def _saved_between(case: Path) -> bool:
    state = json.loads((case / "run" / "run.json").read_text())
    last = int(state.get("step", 0))
    return any(last != s > 40 for s in auto_saves(case))


def _same_log(got: list[str], want: list[str], line: tuple[int, str | None] | None
              ) -> bool:
    if firings(got) == firings(want):
        return True
    if line is None:
        return False
    i, text = line
    if text is not None:  # the mutated line kept where it was
        if i >= len(got) or got[i] != text:
            return False
        got = got[:i] + got[i + 1:]
    return firings(got) == firings(want[:i] + want[i + 1:])


#: Outcomes that pass the rule; every other kind is a failure.
PASSES = ("identical", "passed over", "refused")


def judge(case: Path, ref: Reference, outcome: Outcome, *, file: str, key: tuple[Any, ...],
          outside: dict[str, bytes], line: tuple[int, str | None] | None = None
          ) -> tuple[str, str]:
    """The oracle: ``(kind, detail)`` for a resume of a mutated ``case``.

    Passes: exit 0 with the intact resume's final weights and firings (``"passed over"``
    where stderr names the mutated checkpoint), or exit 2 with one line (warnings aside),
    no traceback, naming the file and the key path (``"refused"``). ``line``: the mutated
    events.jsonl line (index, text written; None: deleted), no difference where the
    resume kept it as found (it was not read).
    """
    err = outcome.stderr
    first = (err.strip().splitlines() or [""])[-1][:300]
    if outcome.code is None:
        return "FAIL hang", f"no exit in {DEADLINE:.0f} s"
    if outside_snapshot(case) != outside:
        return "FAIL outside touched", first
    if "Traceback" in err:
        return "FAIL traceback", first
    if outcome.code == 2:
        # warnings and the note of the checkpoint resumed from are not the refusal
        lines = [x for x in err.splitlines() if x.strip()
                 and not x.startswith(("warning", "[warning", "resumed from"))]
        name = Path(file).name
        named = [str(k) for k in key if isinstance(k, str)]
        if len(lines) != 1:
            return "FAIL refusal not one line", " | ".join(lines)[:300]
        # A log's key path is its line: a cut that would fall inside a changed line
        # names the line it falls in; the log mutated as a whole (a FIFO, a folder)
        # has none, as any file's document. Text that is not JSON has no key path: the
        # file is named as a whole.
        keyed = ("line " in lines[0] if name == "events.jsonl" and line is not None else
                 not named or named[-1] in lines[0] or "fuzz" in lines[0]
                 or "is not JSON" in lines[0])
        if name not in lines[0] or not keyed:
            return "FAIL refusal names no file/key", lines[0][:300]
        return "refused", lines[0][:300]
    if outcome.code != 0:
        return f"FAIL exit {outcome.code}", first
    try:
        weights, rows = final_weights(case), log_lines(case)
        saved = _saved_between(case)
    except Exception as exc:  # the run said it ended but left no readable result
        return "FAIL result unreadable", f"{type(exc).__name__}: {exc}"[:300]
    ref = earlier(ref, _resumed(err))  # passed over: the resume from where it went on
    if weights != ref.weights:
        return "FAIL other weights", first
    if not _same_log(rows, ref.lines, line):
        got, want = firings(rows), firings(ref.lines)
        diff = next((f"{a} != {b}" for a, b in zip(got, want, strict=False)
                     if a != b), f"{len(got)} lines, {len(want)} expected")
        return "FAIL other firings", diff[:300]
    if ref.auto_saves and not saved:
        return "FAIL schedule: no auto save", "the auto saver never saved after the resume"
    name = Path(file).name
    used = any(x.startswith("resumed from") and name in x for x in err.splitlines())
    return ("passed over" if name in err and not used and file.endswith(".pt")
            else "identical"), first


def run_case(fixture: Path, ref: Reference, mutation: Mutation, case: Path
             ) -> tuple[str, str, float]:
    """Copy the fixture to ``case``, write ``mutation``, resume: ``(kind, detail,
    seconds)``; kind ``"unwritable"`` where the value has no form in that file."""
    copy_case(fixture, case)
    run = case / "run"
    site = mutation.site
    try:
        apply(mutation, run, case / "elsewhere")
    except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
        return "unwritable", f"{type(exc).__name__}: {exc}"[:200], 0.0
    line: tuple[int, str | None] | None = None
    if site.line is not None:
        lines = log_lines(case)
        line = (site.line, None if mutation.kind == "drop line" else lines[site.line])
    outside = outside_snapshot(case)
    got = run_cli(train_argv(case), case)
    kind, detail = judge(case, ref, got, file=site.file, key=site.key, outside=outside,
                         line=line)
    return kind, detail, got.seconds
