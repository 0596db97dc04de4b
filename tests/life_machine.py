"""The run's life as a hypothesis state machine: each rule is one real ``schedtrain
train`` (a fault planted in its forked child), and every invariant is checked after each
(life_checks).

Failures are ``LifeFailure``s with a kind. ``TOLERATED`` is empty: every failure fails
the test; benchmarks/run_life.py adds each kind it has found, to go on past it (those
are counted in ``COUNTS``)."""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any, cast

import attrs
import life_oracle as oracle
import life_runfiles as runfiles
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from life_checks import Checks, LifeFailure
from life_faults import (
    NO_FAULT,
    NOTICE_FLAG,
    RETIME_FLAG,
    STEP_FAULTS,
    WRITE_FAULTS,
    Fault,
    Outcome,
    run_cli,
)
from life_specs import Keep, RunOptions, Schedule

__all__ = ["COUNTS", "NOTICE", "TOLERATED", "LifeFailure", "RunLife"]

#: Failure kinds counted instead of raised (set by benchmarks/run_life.py only).
TOLERATED: set[str] = set()
COUNTS: collections.Counter[str] = collections.Counter()
#: A notice server shared by every lifecycle of a process (set by the driver).
NOTICE: dict[str, object] = {}

PERIODS = ("3 steps", "5 steps", "8 steps", "1 epoch", "2 epochs")
schedules = st.builds(Schedule, validate=st.sampled_from(("1 epoch", "2 epochs", "4 steps")),
                      ckpt=st.sampled_from(("auto", *PERIODS)), ckpt_end=st.booleans(),
                      best=st.booleans())
keeps = st.builds(Keep, latest=st.integers(1, 3), every_epochs=st.sampled_from((0, 0, 2)),
                  best=st.sampled_from((0, 0, 1)))
RETIMES = ("retime", "kill_retime")


def live_refused(old: Schedule, new: Schedule) -> bool:
    """Whether a running job refuses ``new`` in place of ``old`` (docs/checkpoints.md,
    "Live retime"): it changes the saver's trigger, and that trigger holds
    ``every = "auto"`` before or after."""
    auto = "auto" in (old.ckpt, new.ckpt)
    return auto and (old.ckpt, old.ckpt_end) != (new.ckpt, new.ckpt_end)


class RunLife(Checks, RuleBasedStateMachine):
    """One run directory through a random life; ``self.history`` the schedules in force
    and where each took over, ``self.policies`` the keep policies by step."""

    def __init__(self) -> None:
        super().__init__()
        self.setup(COUNTS, TOLERATED)
        self.requeues = 0
        self.pending: tuple[list[tuple[oracle.Point, Schedule]], list[tuple[int, Keep]],
                            Schedule, Keep, str] | None = None

    # -- helpers -------------------------------------------------------------------------
    def train(self, spec: str, *extra: str, fault: Fault = NO_FAULT,
              resume: str = "auto") -> Outcome:
        argv = ["train", spec, "--run-dir", "run"]
        if self.status != "fresh":
            argv += ["--resume", resume]
        server, stop = NOTICE.get("server"), threading.Event()
        watchers = []
        if fault.kind == "notice" and server is not None:
            watchers.append(threading.Thread(target=_serve_on_flag, daemon=True, args=(
                server, self.case / NOTICE_FLAG, stop)))
        if fault.command:
            watchers.append(threading.Thread(target=self._retime_on_flag, daemon=True,
                                             args=(fault.retime, stop)))
        for w in watchers:
            w.start()
        got = run_cli([*argv, *extra], self.case, fault=fault, run_dir=self.run_dir,
                      env={"SCHEDTRAIN_PREEMPT_POLL": "0.05"})
        stop.set()
        for w in watchers:
            w.join(120)
        for flag in (NOTICE_FLAG, RETIME_FLAG):
            (self.case / flag).unlink(missing_ok=True)
        if server is not None:
            server.deadline = None  # type: ignore[attr-defined]
        self.log.append(f"{spec} {' '.join(extra)} {resume if self.status != 'fresh' else ''}"
                        f" [{fault}] -> {got.code}")
        COUNTS["operations"] += 1
        what = "start" if self.status == "fresh" else (
            "requeue" if self.status == "finished" else "resume")
        COUNTS[f"op: {what}{' (changed spec)' if extra or spec != self.spec else ''}, "
               f"{fault.kind}{' (command)' if fault.command else ''}"] += 1
        return got

    def local(self, fault: Fault) -> Fault:
        """``fault`` as the run's store takes it: the write faults patch the local
        writer, so in a bucket they are a kill at a step."""
        if self.place.bucket and fault.kind in WRITE_FAULTS:
            return Fault("kill", 5 * fault.at)
        return fault

    def _retime_on_flag(self, spec: str, stop: threading.Event) -> None:
        """Run ``schedtrain retime run SPEC`` once the child asks for it."""
        self.retime_cmd = None
        while not stop.is_set():
            if (self.case / RETIME_FLAG).exists():
                self.retime_cmd = run_cli(["retime", "run", spec], self.case,
                                          log=".retime.stderr", deadline=60.0)
                return
            time.sleep(0.005)

    def settle(self, got: Outcome, fault: Fault) -> None:
        """The new state from the exit code, with its line and run.json checked (d)."""
        lines = got.lines()
        state = runfiles.run_json(self.run_dir).get("status")
        if got.code == 0:
            if not any(x.startswith(("finished: reached", "the run finished")) for x in lines):
                self.fail("exit line", f"exit 0 without its line: {lines[-3:]}")
            self.status = "finished"
        elif got.code == 75:
            if not any(x.startswith("preempted by ") and "resume with:" in x for x in lines):
                self.fail("exit line", f"exit 75 without its line: {lines[-3:]}")
            self.status, self.preempt = "preempted", runfiles.preempted_at(lines)
        elif got.code == -9 and fault.kind not in ("none", "term", "usr1", "notice"):
            self.status = "killed"
            if fault.kind == "kill_commit":  # the newest file committed, nothing after it
                newest = runfiles.newest_step(self.place)
                phase = runfiles.phases(self.place).get(f"step-{newest or 0:08d}.pt")
                if phase == "preempt":  # a preemption's own file, all the same
                    self.preempt = newest
                elif newest is not None:  # its pruning never ran: the resume's does it
                    self.cut_short.append(newest)
            return
        else:
            self.fail(f"exit {got.code}", f"{fault}: {got.stderr[-600:]}")
            return
        if state != self.status:
            self.fail("run.json", f"status {state!r} after exit {got.code}")

    def resumed_at(self, got: Outcome, phases: dict[str, str]) -> oracle.Point | None:
        for line in got.lines():
            if line.startswith("resumed from "):
                path = line.removeprefix("resumed from ").rsplit(" at step ", 1)
                phase = phases.get(Path(path[0]).name, "step_end")
                return int(path[1]), oracle.PHASES.get(phase, 0)
        return None

    def take_retime(self, fault: Fault, schedule: Schedule, answer_before: str) -> None:
        """Record the retime the run applied (its journal says where), if it did, and
        judge a refusal (the command's up front, or the job's answer) by the rule."""
        # Asked for in the step after step ``at``: every change up to there is in force.
        now = [s for p, s in self.history if p[0] <= fault.at][-1]
        refused = live_refused(now, schedule)
        cmd = getattr(self, "retime_cmd", None) if fault.command else None
        if cmd is not None:
            text = cmd.stderr.strip()[-300:]
            if refused and cmd.code != 2:
                self.fail("retime refusal", f"the command handed a refused change: {text}")
            elif not refused and cmd.code != 0 and not _ended(text):
                self.fail("retime command", f"exit {cmd.code}: {text}")
            COUNTS[f"note: retime command exit {cmd.code}"] += 1
        try:
            journal = json.loads((self.run_dir / "retimes.json").read_text())
        except (OSError, ValueError):
            journal = {}
        steps = [a["step"] for a in journal.get("applied", [])
                 if oracle.schedule_of(a["schedule"]) == schedule
                 and a["step"] >= fault.at and a["step"] > self.history[-1][0][0]]
        if steps and refused:
            self.fail("retime refusal", f"a change of an auto trigger applied at {steps[0]}")
        elif steps:
            self.history.append(((steps[0], 0), schedule))
        answer = runfiles.answer_text(self.run_dir)
        if answer and answer != answer_before:
            status = json.loads(answer).get("status")
            if (status == "refused") != refused:
                self.fail("retime answer", f"{status!r} to {now} -> {schedule}: {answer[:300]}")

    # -- rules -----------------------------------------------------------------------------
    @initialize(schedule=schedules, keep=keeps, epochs=st.integers(3, 5),
                seed=st.integers(0, 3), mode=st.sampled_from(("sync", "async")),
                bucket=st.integers(0, 3))
    def draw(self, *, schedule: Schedule, keep: Keep, epochs: int, seed: int, mode: str,
             bucket: int) -> None:
        """The run's spec; its checkpoints in an S3 bucket (one time in four, where the
        driver serves one: ``NOTICE["s3"]``)."""
        port = int(NOTICE["port"]) if "port" in NOTICE else 0  # type: ignore[call-overload]
        self.run = RunOptions(epochs=epochs, seed=seed, mode=mode, notice_port=port)
        if bucket == 0 and "s3" in NOTICE:
            name, endpoint, client = cast("tuple[str, str, Any]", NOTICE["s3"])
            prefix = f"{self.tmp.name}/checkpoints"
            self.place = runfiles.Place(self.run_dir, name, prefix, client)
            self.run = attrs.evolve(self.run, checkpoint_dir=self.place.url("")[:-1],
                                    endpoint=endpoint)
        self.schedule, self.keep = schedule, keep
        self.history: list[tuple[oracle.Point, Schedule]] = [((0, 0), schedule)]
        self.policies: list[tuple[int, Keep]] = [(0, keep)]
        self.resumes: list[tuple[int, Keep]] = []
        self.cut_short: list[int] = []
        self.spec = self.write_spec(schedule, keep)
        self.log.append(f"spec {self.run} {schedule} {keep}")

    faults = st.one_of(
        st.just(Fault()),
        st.builds(Fault, kind=st.sampled_from(STEP_FAULTS), at=st.integers(1, 30)),
        st.builds(Fault, kind=st.sampled_from(WRITE_FAULTS), at=st.integers(1, 5)))

    @precondition(lambda self: self.status != "finished")
    @rule(fault=faults, to=schedules, by_command=st.booleans())
    def go(self, fault: Fault, to: Schedule, by_command: bool) -> None:
        """Start, or ``--resume auto`` as is, with a fault planted (a retime handed by the
        job's own request or by ``schedtrain retime``)."""
        self.take_back()
        fault = self.local(fault)
        if fault.kind in RETIMES:
            if not self.schedule.retimable(to):
                to = attrs.evolve(to, best=self.schedule.best)
            fault = Fault(fault.kind, fault.at, self.write_spec(to, self.keep), by_command)
        before = runfiles.answer_text(self.run_dir)
        phases = runfiles.phases(self.place)
        got = self.train(self.spec, fault=fault)
        at = self.resumed_at(got, phases)
        if at is not None:  # it pruned by its keep as it started training
            self.resumes.append((at[0], self.keep))
        if fault.kind in RETIMES and got.code is not None:
            self.take_retime(fault, to, before)
        self.settle(got, fault)

    @precondition(lambda self: self.status in ("killed", "preempted"))
    @rule(to=schedules, keep=keeps, fault=faults)
    def resume_changed(self, to: Schedule, keep: Keep, fault: Fault) -> None:
        """``--resume auto --schedule-change apply`` with another schedule and keep. The
        new spec is the run's once a checkpoint holds it: a resume killed before its first
        checkpoint leaves the old one the run's."""
        self.take_back()
        fault = self.local(fault)
        if fault.kind in RETIMES:
            fault = Fault()
        spec = self.write_spec(to, keep)
        phases = runfiles.phases(self.place)  # before: the resumed run may rewrite one
        was = (self.history, self.policies, self.schedule, self.keep, self.spec)
        got = self.train(spec, "--schedule-change", "apply", fault=fault)
        at = self.resumed_at(got, phases)
        if at is None and got.code != 2:  # no checkpoint yet: it started over
            self.history, self.policies, self.resumes = [((0, 0), to)], [(0, keep)], []
            self.cut_short = []
            self.schedule, self.keep, self.spec = to, keep, spec
        elif at is not None and got.code != 2:
            self.schedule, self.keep, self.spec = to, keep, spec
            # What came after the checkpoint is not replayed: a retime applied after its
            # step_end included (docs/checkpoints.md, "a resume with another spec
            # applies the resume rules, not the retimes").
            self.history = [h for h in self.history if h[0] < at or h[0] == (0, 0)]
            self.policies = [p for p in self.policies if p[0] < at[0] or p[0] == 0]
            if to != self.history[-1][1]:
                self.history.append((at, to))
            if keep != self.policies[-1][1]:
                self.policies.append((at[0], keep))
            # It pruned by the new keep as it started training: done, whatever follows.
            self.resumes.append((at[0], keep))
        self.settle(got, fault)
        newest = runfiles.newest_step(self.place)
        # A checkpoint at the resume's step but after a later event (its epoch_end, the
        # new schedule's save there) is the new spec's: a point, not a step, is compared.
        phase = runfiles.phases(self.place).get(f"step-{newest or 0:08d}.pt", "step_end")
        if (self.status == "killed" and at is not None and to != was[2]
                and (newest is None or (newest, oracle.PHASES.get(phase, 0)) <= at)):
            # The killed run's log (checked next) is the new spec's; its resume is the
            # old spec's again, from the same checkpoint (taken back by the next rule).
            self.pending = was
            COUNTS["note: changed spec killed before its checkpoint"] += 1

    def take_back(self) -> None:
        """The old spec the run's again (a changed-spec resume killed before its first
        checkpoint): called first by each rule that resumes."""
        if self.pending is not None:
            self.history, self.policies, self.schedule, self.keep, self.spec = self.pending
            self.pending = None

    @precondition(lambda self: self.status in ("killed", "preempted"))
    @rule(to=schedules)
    def resume_refused(self, to: Schedule) -> None:
        """A changed schedule without ``--schedule-change``: exit 2, nothing changed; with
        no checkpoint to resume from there is nothing to refuse: the run starts over
        with the new spec."""
        self.take_back()
        if to in (self.schedule, self.history[-1][1]):
            return
        before = runfiles.snapshot(self.place)
        over = runfiles.newest_step(self.place) is None
        spec = self.write_spec(to, self.keep)
        got = self.train(spec)
        if over:
            if "starting_over" not in got.stderr and (self.run_dir / "run.json").exists():
                self.fail("starting over", f"exit {got.code}: no starting_over line")
            self.history, self.schedule, self.spec = [((0, 0), to)], to, spec
            self.policies, self.resumes, self.cut_short = [(0, self.keep)], [], []
            self.settle(got, NO_FAULT)
            return
        if got.code != 2 or not any(x.startswith("error:") for x in got.lines()):
            self.fail("refusal", f"exit {got.code}: {got.lines()[-2:]}")
        if runfiles.snapshot(self.place) != before:
            self.fail("refusal touched", "the run directory changed")

    @precondition(lambda self: self.status == "finished")
    @rule(by_path=st.booleans())
    def requeue(self, by_path: bool) -> None:
        """``--resume auto`` on a finished run: nothing left to do (exit 0); ``--resume
        PATH`` of its newest checkpoint: exit 2; either way every file as it was."""
        newest = runfiles.newest_step(self.place)
        self.requeues += 1
        if (by_path and newest is None) or self.requeues > 2:
            return  # the rule hypothesis must have (none other applies): cheap after two
        before = runfiles.snapshot(self.place)
        if by_path:
            got = self.train(self.spec, resume=self.place.path(f"step-{newest:08d}.pt"))
            if got.code != 2 or not any(x.startswith("error:") for x in got.lines()):
                self.fail("requeue by path", f"exit {got.code}: {got.lines()[:2]}")
        else:
            got = self.train(self.spec)
            if got.code != 0 or not any("nothing left to do" in x for x in got.lines()):
                self.fail("requeue", f"exit {got.code}: {got.lines()[:2]}")
        after = runfiles.snapshot(self.place)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed:
            self.fail("requeue touched", f"a requeue changed {changed[:4]}")

    @invariant()
    def checks(self) -> None:
        self.check_all()


def _ended(text: str) -> bool:
    """Whether ``schedtrain retime`` found the job ended (it came too late): gone, or
    still holding the lock as it exits, its run.json saying how it ended."""
    return "no job runs there" in text or (
        "still says '" in text and "still says 'running'" not in text)


def _serve_on_flag(server: object, flag: Path, stop: threading.Event) -> None:
    """Serve the notice once the child asks for it (writes ``flag``)."""
    while not stop.is_set():
        if flag.exists():
            server.serve_notice(120.0)  # type: ignore[attr-defined]
            return
        time.sleep(0.005)
