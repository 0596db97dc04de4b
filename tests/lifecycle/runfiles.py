"""What the lifecycle machine reads from a run directory between operations: a snapshot of
its files, each checkpoint's phase, the newest step a resume could pick, the step a
preemption line names, and ``schedtrain status``'s exit code for the state the machine
believes (docs/checkpoints.md; schedtrain/cli/status.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

#: ``schedtrain status``'s exit code by the machine's state (run.json present).
STATUS_CODES = {"finished": 0, "preempted": 75, "killed": 1}
_PREEMPT = re.compile(r"^preempted by .+ after step (\d+): checkpoint \S*step-(\d+)\.pt;")


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory by its path in it (``.lock`` and interrupted
    writes' temporary files aside: a command may take the lock, or clean those up)."""
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"
            and not p.name.endswith(".tmp")}


def phases(run_dir: Path) -> dict[str, str]:
    """Each checkpoint file's ``phase`` ("unreadable" where it does not load)."""
    out = {}
    for path in sorted((run_dir / "checkpoints").glob("step-*.pt")):
        try:
            out[path.name] = torch.load(path, weights_only=True)["phase"]
        except Exception:
            out[path.name] = "unreadable"
    return out


def newest_step(run_dir: Path) -> int | None:
    """The step of the newest checkpoint that loads (``None``: none does)."""
    good = [int(name[5:13]) for name, phase in phases(run_dir).items() if phase != "unreadable"]
    return max(good) if good else None


def preempted_at(lines: list[str]) -> int | None:
    """The step of the preemption's checkpoint the exit-75 line names."""
    for line in lines:
        got = _PREEMPT.match(line)
        if got is not None:
            return int(got.group(2))
    return None


def run_json(run_dir: Path) -> dict[str, object]:
    try:
        return dict(json.loads((run_dir / "run.json").read_text()))
    except (OSError, ValueError):
        return {}


def answer_text(run_dir: Path) -> str:
    try:
        return (run_dir / "retime.answer.json").read_text()
    except OSError:
        return ""
