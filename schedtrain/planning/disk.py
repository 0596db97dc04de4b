"""What a plan says about checkpoint files: which exist after each save, the peak, the disk.

The disk is the peak count times one checkpoint's size (``--checkpoint-size 4GB``):
every planned save is taken as written and finite, so it is the most the run holds.
"""

from __future__ import annotations

import re
from typing import Any, Final

from schedtrain.planning.plan import Plan
from schedtrain.retention import spell
from schedtrain.simulation.files import SaveFiles, SaverFiles, best_slots

__all__ = ["describe_saver", "files_json", "files_lines", "format_size", "parse_size", "peak"]

_UNITS: Final = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
                 "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """``"4GB"``, ``"500 MB"``, ``"1.5 GiB"`` or a number of bytes, in bytes.

    Raises:
        ValueError: not a size (the message names what is expected).
    """
    m = _SIZE_RE.fullmatch(text)
    unit = m[2].lower() if m is not None else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"expected a size such as '4GB', '500 MB' or '1.5 GiB', got {text!r}")
    return round(float(m[1]) * _UNITS[unit])


def format_size(n: float) -> str:
    """Bytes as ``"12 GB"`` (decimal units, as disks are sold)."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def describe_saver(saver: SaverFiles) -> str:
    """What a saver writes and keeps, in the spec's words."""
    if saver.kind in ("model", "transformers", "lightning", "host"):
        return f"keep = {spell(saver.keep)}"
    if saver.kind == "best":
        history = "no history" if saver.keep is None else \
            f"its history keep = {spell(saver.keep)}"
        return f"{saver.filename} at each new {saver.mode} of {saver.monitor}, {history}"
    ranked = "no ranked file" if saver.keep is None else f"keep = {spell(saver.keep)}"
    return ranked + (", and last.pt" if saver.save_last else "")


def peak(files: tuple[SaveFiles, ...]) -> tuple[int, int]:
    """The most checkpoint files that exist at once (all savers together), and the step."""
    now: dict[str, int] = {}
    most, at, total = 0, 0, 0
    for f in files:
        # kept as the saves go: a sum over all savers per save is quadratic
        total += len(f.files) - now.get(f.callback, 0)
        now[f.callback] = len(f.files)
        if total > most:
            most, at = total, f.at.step
    return most, at


def _unplaced(plan: Plan) -> int:
    """Files ``Best`` rules may add that a plan without metric values cannot place."""
    if plan.ranked:
        return 0
    return sum(best_slots(p) for p in plan.keep.values()) if plan.files else 0


def files_json(plan: Plan, size: int | None) -> dict[str, Any]:
    """The plan's JSON ``checkpoints`` record."""
    most, at = peak(plan.files)
    return {"after_saves": [f.to_dict() for f in plan.files], "peak_files": most,
            "peak_step": at, "best_slots": _unplaced(plan),
            "checkpoint_bytes": size, "peak_bytes": None if size is None else most * size}


def files_lines(plan: Plan, size: int | None, first: int) -> list[str]:
    """The table's lines on checkpoint files (none when no saver)."""
    if not plan.keep:
        return []
    most, at = peak(plan.files)
    disk = f", {format_size(most * size)} at {format_size(size)} each" if size else \
        " (--checkpoint-size 4GB gives the disk)"
    lines = [f"checkpoint files: at most {most:,} at once (step {at:,}){disk}"]
    for name, saver in plan.keep.items():
        lines.append(f"  {name}: {describe_saver(saver)}")
    for f in plan.files[:first]:
        lines.append(f"  after {f.callback} at step {f.at.step:,}: {', '.join(f.files)}")
    if len(plan.files) > first:
        last = plan.files[-1]
        lines.append(f"  ... after {last.callback} at step {last.at.step:,} (the last): "
                     f"{', '.join(last.files)}")
    extra = _unplaced(plan)
    if extra:
        lines.append(f"  best rules may keep up to {extra} more, chosen by the metric "
                     "(--metrics FILE places them)")
    if not plan.ranked and any(s.kind == "best" for s in plan.keep.values()):
        lines.append("  each MinSaver/MaxSaver firing is taken as a new best "
                     "(--metrics FILE decides them)")
    return lines
