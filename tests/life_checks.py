"""The lifecycle machine's invariants, checked after every operation: ``schedtrain status``
agrees with the state the machine believes, nothing beside the run directory changed, the
logged firings are the oracle's, and a finished run keeps the oracle's checkpoint files
and the final weights of an uninterrupted run validating alike."""

from __future__ import annotations

import collections
import contextlib
import io
import shutil
import tempfile
from pathlib import Path

import attrs
import life_oracle as oracle
import life_runfiles as runfiles
from jobs.lifecycle import DIGEST_FILE
from life_faults import run_cli
from life_specs import Keep, RunOptions, Schedule, render

#: Each failure kind met, with its shortest lifecycle: a failure met while hypothesis
#: shrinks another one is never raised to the driver, so it is kept here.
SEEN: dict[str, str] = {}
#: Final weight digests of uninterrupted runs, by (seed, epochs, validate period).
_REFERENCE: dict[tuple[int, int, str], str] = {}


class LifeFailure(AssertionError):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"[{kind}] {detail}")
        self.kind = kind


class Checks:
    """The state the checks read (set up by ``setup``, changed by the machine's rules)
    and the checks."""

    run: RunOptions
    spec: str
    history: list[tuple[oracle.Point, Schedule]]
    policies: list[tuple[int, Keep]]
    #: each resume with another keep, which prunes by it at once: (step, keep)
    resumes: list[tuple[int, Keep]]
    #: the steps of saves killed right after their commit: their pruning never ran
    cut_short: list[int]

    def setup(self, counts: collections.Counter[str], tolerated: set[str]) -> None:
        self.counts, self.tolerated = counts, tolerated
        self.tmp = Path(tempfile.mkdtemp(prefix="life-"))
        self.case, self.run_dir = self.tmp / "case", self.tmp / "case" / "run"
        self.case.mkdir()
        self.place = runfiles.Place(self.run_dir)
        (self.case / "outside").mkdir()
        (self.case / "outside" / "notes.txt").write_text("a user's notes\n")
        self.status, self.specs = "fresh", 0
        self.log: list[str] = []
        #: The step of the last preemption's own checkpoint (None: never preempted).
        self.preempt: int | None = None
        counts["lifecycles"] += 1

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def fail(self, kind: str, detail: str) -> None:
        self.counts[f"failure: {kind}"] += 1
        text = f"{detail}\n  lifecycle: {'; '.join(self.log)}"
        if kind not in SEEN or len(text) < len(SEEN[kind]):
            SEEN[kind] = text
        if kind not in self.tolerated:
            raise LifeFailure(kind, text)

    def write_spec(self, schedule: Schedule, keep: Keep) -> str:
        self.specs += 1
        name = f"s{self.specs}.toml"
        (self.case / name).write_text(render(self.run, schedule, keep))
        return name

    def check_all(self) -> None:
        if not hasattr(self, "run"):
            return
        self.counts["invariant checks"] += 1
        self.outside()
        self.status_command()
        if self.status == "fresh" or not self.run_dir.exists():
            return
        rows = oracle.read_log(self.run_dir)
        finished = self.status == "finished"
        auto = any(s.ckpt == "auto" for _, s in self.history)
        want = oracle.expected_firings(self.history, self.run.end, oracle.val_losses(rows))
        why = oracle.compare_firings(oracle.logged_firings(rows), want, auto=auto,
                                     finished=finished)
        changes = [r["step"] for r in rows if r.get("kind") == "schedule_change"]
        if why is None and finished and changes != [p[0] for p, _ in self.history[1:]]:
            why = f"schedule changes at {changes}, expected {[p for p, _ in self.history[1:]]}"
        if why is not None:
            self.fail("firings", why)
        if finished:
            self.files(rows)
            self.weights()

    def status_command(self) -> None:
        """``schedtrain status run``'s exit code is the one for the believed state. The
        command only reads run.json: it runs in this process (a fork and a child's exit
        after every operation cost more than the command)."""
        from schedtrain.cli.main import main

        recorded = (self.run_dir / "run.json").exists()
        want = runfiles.STATUS_CODES[self.status] if recorded else 2
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            got = main(["status", str(self.run_dir)])
        if got != want:
            self.fail("status", f"exit {got} for a {self.status} run, expected {want}: "
                                f"{said.getvalue().strip()[-300:]}")

    def outside(self) -> None:
        notes = self.case / "outside" / "notes.txt"
        extra = {p.name for p in self.case.iterdir()} - {"run", "outside"} - {
            f"s{i}.toml" for i in range(1, self.specs + 1)}
        if notes.read_text() != "a user's notes\n" or extra or len(list(
                (self.case / "outside").iterdir())) != 1:
            self.fail("outside touched", f"new beside the run: {sorted(extra)}")

    def files(self, rows: list[dict[str, object]]) -> None:
        """The saver's files as its keep policies leave them; the last preemption's own
        file besides where no save came after it (docs/checkpoints.md, "Preemption")."""
        points = [(int(r["step"]), oracle.RANKS.get(str(r.get("event")), 3))  # type: ignore[call-overload]
                  for r in rows if r.get("kind") == "firing"]
        callbacks = [r.get("callback") for r in rows if r.get("kind") == "firing"]
        saves = [p for p, cb in zip(points, callbacks, strict=True) if cb == "ckpt"]
        validated = [p for p, cb in zip(points, callbacks, strict=True) if cb == "validate"]
        values = oracle.val_losses(rows)
        want = oracle.kept_files(saves, self.policies, validated, values, self.resumes,
                                 cut_short=self.cut_short)
        last = set()
        if self.preempt is not None and not any(s > self.preempt for s, _ in saves):
            last = {f"step-{self.preempt:08d}.pt"}
        got = self.place.names()
        want |= last
        if want - got:
            self.fail("files lost", f"kept {sorted(got)}, expected {sorted(want)}")
        elif got - want:
            self.fail("files extra", f"kept {sorted(got)}, expected {sorted(want)}")

    def weights(self) -> None:
        # Validation draws from torch's global generator (a DataLoader's iterator takes
        # a base seed), so the weights follow where validate fires: compared where its
        # trigger never changed, with an uninterrupted run validating alike.
        periods = {s.validate for _, s in self.history}
        if len(periods) != 1:
            return
        key = (self.run.seed, self.run.epochs, periods.pop())
        if key not in _REFERENCE:
            folder = Path(tempfile.mkdtemp(prefix="life-ref-"))
            alone = attrs.evolve(self.run, notice_port=0, checkpoint_dir="")
            (folder / "r.toml").write_text(render(alone, Schedule(validate=key[2]), Keep()))
            got = run_cli(["train", "r.toml", "--run-dir", "run"], folder)
            assert got.code == 0, got.stderr[-2000:]
            _REFERENCE[key] = (folder / "run" / DIGEST_FILE).read_text()
            shutil.rmtree(folder, ignore_errors=True)
        digest = self.run_dir / DIGEST_FILE
        if not digest.exists() or digest.read_text() != _REFERENCE[key]:
            self.fail("weights", "the final weights differ from the uninterrupted run's")
