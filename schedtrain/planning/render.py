"""Rendering a ``Plan``: the table with a text timeline, JSON, and a PNG timeline."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Final

from schedtrain.errors import Error, one_line
from schedtrain.files import write_atomic
from schedtrain.planning.disk import files_json, files_lines, peak
from schedtrain.planning.plan import Plan
from schedtrain.schedule.firings import Firing
from schedtrain.simulation.files import SaveFiles
from schedtrain.spec.model import CPU_WRITE_SHARE, Spec

__all__ = ["PNG_MISSING", "TIMELINE_WIDTH", "PngUnavailable", "draw_png", "files_over_time",
           "render_json", "render_png", "render_table"]

#: Columns of the text timeline; the run is binned into this many, whatever its length.
TIMELINE_WIDTH: Final = 64
PNG_MISSING: Final = "the png format needs matplotlib: pip install 'schedtrain[plot]'"


def render_json(plan: Plan, checkpoint_size: int | None = None) -> str:
    """``{"firings": [...]}`` as ``schedtrain plan --format json`` prints it, with
    ``"checkpoints"`` (the files after each save, the peak) when a saver saves."""
    if not plan.keep:
        return plan.log.to_json() + "\n"
    out = json.loads(plan.log.to_json())
    out["checkpoints"] = files_json(plan, checkpoint_size)
    return json.dumps(out) + "\n"


def _when(f: Firing) -> str:
    mark = "?" if f.conditional else ""
    if f.event == "epoch_end":
        return f"epoch {f.epoch}{mark}"
    if f.event in ("train_start", "train_end", "epoch_start"):
        return f"{f.event}@{f.step}{mark}"
    return f"step {f.step:,}{mark}"


def _bin(step: int, total: int, width: int) -> int:
    # A firing at the end of step s belongs to the column holding step s.
    if step <= 0 or total <= 0:
        return 0
    return min(width - 1, (step - 1) * width // total)


def _timeline(plan: Plan, width: int = TIMELINE_WIDTH) -> list[str]:
    shape, names = plan.shape, plan.table.names
    total = shape.total_steps
    label = max(len(n) for n in names)
    lanes = {n: [" "] * width for n in names}
    for f in plan.log:
        lane = lanes[f.callback]
        col = _bin(f.step, total, width)
        mark = "?" if f.conditional else "|"
        cur = lane[col]
        if cur == " ":
            lane[col] = mark
        elif cur in "|?" and (cur != mark or mark == "|"):
            lane[col] = "#" if mark == "|" or cur == "|" else "?"
    ruler = ["-"] * width
    for col in range(width):  # a '+' where an epoch ends: per column, not per epoch
        # the steps s this column holds (see _bin) are lo < s <= hi
        lo, hi = -(-col * total // width), -(-(col + 1) * total // width)
        e = shape.first_epoch_starting(lo, after=True)
        if 1 <= e <= shape.epochs and shape.start(e) <= hi:
            ruler[col] = "+"
    head = f"timeline: {total:,} steps in {width} columns of ~{max(total / width, 1):,.0f} steps"
    lines = [head, f"{'epochs':>{label}} {''.join(ruler)}"]
    lines += [f"{n:>{label}} {''.join(lanes[n])}" for n in names]
    lines.append(f"{'':>{label}} 0{f'{total:,}':>{width - 1}}")
    lines.append(f"{'':>{label}} '|' fires, '#' several times, '?' conditional, "
                 "'+' epoch end")
    return lines


def _saves_line(spec: Spec) -> str:
    """How checkpoints are written, and what a save asked for during another does."""
    mode = spec.run.checkpoint_mode if spec.run is not None else "async"
    busy = spec.run.checkpoint_busy if spec.run is not None else "wait"
    share = spec.run.checkpoint_write_share if spec.run is not None else None
    pace = (f"busy at most {share:g} of the time" if share is not None else
            f"busy at most {CPU_WRITE_SHARE:g} of the time on the CPU, flat out on a device")
    how = (f"the loop blocks for a host copy, a background thread writes, {pace}"
           if mode == "async" else "the loop waits for each file")
    rule = ("waits for it" if busy == "wait" else "is skipped")
    return (f"saves: checkpoint_mode = {mode!r} ({how}); a save asked for while one is "
            f"in flight {rule} (checkpoint_busy = {busy!r})")


def render_table(plan: Plan, first: int, checkpoint_size: int | None = None, *,
                 saves: bool = True) -> str:
    """The plan as text; ``saves``: with the line on how checkpoints are written (not for
    a host's schedule without a schedtrain saver: the host writes its own)."""
    spec, shape = plan.spec, plan.shape
    names = plan.table.names
    lengths = sorted({n for n, _ in shape.runs}) or [0]
    each = (f"{lengths[0]:,}" if len(lengths) == 1 else f"{lengths[0]:,}-{lengths[-1]:,}")
    lines = [f"plan: {spec.path}: {shape.epochs:,} epochs x {each} steps = "
             f"{shape.total_steps:,} steps"]
    rows = [("callback", "trigger", "fires", "first firings")]
    # One pass over the log for all rows (a pass per row is callbacks x firings).
    shown_of: dict[str, list[Firing]] = {n: [] for n in names}
    count_of = dict.fromkeys(names, 0)
    cond_of = dict.fromkeys(names, 0)
    for f in plan.log:
        name = f.callback
        count_of[name] += 1
        cond_of[name] += f.conditional
        if len(shown_of[name]) < first:
            shown_of[name].append(f)
    for name, trig in zip(names, plan.table.triggers, strict=True):
        cond = cond_of[name]
        count = f"{count_of[name]:,}" + (f" ({cond:,}?)" if cond else "")
        shown = ", ".join(_when(f) for f in shown_of[name])
        if count_of[name] > first:
            shown += ", ..."
        # a 63-deep trigger is thousands of characters: cut to a readable column
        rows.append((name, one_line(repr(trig), 120), count, shown or "never"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True))
                     + "  " + r[3])
    lines.append("")
    lines.append("evaluated at every step: " + (", ".join(plan.always) or "none"))
    if saves:
        lines.append(_saves_line(spec))
    if any(f.conditional for f in plan.log):
        lines.append("'?': conditional, fires only if its runtime condition or metric "
                     "allows (--metrics FILE resolves them)")
    if plan.stopped:
        lines.append(f"{plan.stopped}; nothing is planned after its train_end")
    if plan.truncated:
        lines.append(f"note: stopped after {len(plan.log):,} firings")
    lines += files_lines(plan, checkpoint_size, first)
    lines.append("")
    lines += _timeline(plan) if names and shape.total_steps else []
    return "\n".join(lines) + "\n"


#: Lifecycle events drawn as markers: at step 0 or at the run's end a tick sits on the
#: plot's frame and would not be seen.
_MARKED: Final = {"train_start": ">", "train_end": "<", "epoch_start": "^"}


def draw_png(plan: Plan) -> Any:
    """The timeline as a matplotlib ``Figure`` (``render_png`` saves it).

    Raises:
        PngUnavailable: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PngUnavailable(PNG_MISSING) from None
    names = plan.table.names
    total = max(plan.shape.total_steps, 1)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 1.6))
    for lane, name in enumerate(reversed(names)):
        for cond, color in ((False, "tab:blue"), (True, "tab:orange")):
            mine = [f for f in plan.log.of(name) if f.conditional == cond]
            ticks = [f.step for f in mine if f.event not in _MARKED]
            if ticks:
                ax.vlines(ticks, lane - 0.35, lane + 0.35, color=color, linewidth=1.2,
                          linestyles="dotted" if cond else "solid")
            for event, marker in _MARKED.items():
                steps = [f.step for f in mine if f.event == event]
                if steps:
                    ax.plot(steps, [lane] * len(steps), linestyle="none", marker=marker,
                            color=color, markersize=7, label=event)
    epochs = plan.shape.ended_epochs
    stride = max(1, math.ceil(epochs / 50))  # at most ~50 boundary lines stay readable
    for e in range(stride, epochs + 1, stride):
        ax.axvline(plan.shape.start(e), color="0.8", linewidth=0.6, zorder=0)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlim(-total * 0.02, total * 1.02)  # room for markers at step 0 and at the end
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.set_xlabel(f"optimizer steps (grey lines: every {stride} epoch{'' if stride == 1 else 's'}"
                  "; > train_start, < train_end, ^ epoch_start)")
    title = f"schedtrain plan: {Path(plan.spec.path or 'spec').name}"
    if any(f.conditional for f in plan.log):
        title += "  (dotted orange: conditional)"
    if plan.files:
        most, at = peak(plan.files)
        title += f"\ncheckpoint files: at most {most:,} at once (step {at:,})"
        steps, counts = files_over_time(plan.files)
        files_ax = ax.twinx()  # the files the savers leave, after each save, on the right
        files_ax.step(steps, counts, where="post", color="tab:green", linewidth=1.0,
                      label="checkpoint files")
        files_ax.set_ylim(0, max(counts) * 1.15 + 1)
        files_ax.set_ylabel("checkpoint files (green)", color="tab:green")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def files_over_time(files: tuple[SaveFiles, ...]) -> tuple[list[int], list[int]]:
    """The step of each save and how many checkpoint files all savers' folders hold
    right after it (the png's green curve)."""
    held: dict[str, int] = {}
    steps: list[int] = []
    counts: list[int] = []
    total = 0  # kept as the saves go: a sum over all savers per save is quadratic
    for save in files:
        total += len(save.files) - held.get(save.callback, 0)
        held[save.callback] = len(save.files)
        steps.append(save.at.step)
        counts.append(total)
    return steps, counts


def render_png(plan: Plan, out: str) -> None:
    """Write the timeline to ``out`` as a PNG (replaced whole: a link there is replaced,
    never written through).

    Raises:
        PngUnavailable: matplotlib is not installed.
    """
    fig = draw_png(plan)  # imports matplotlib, or says how to install it
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(fig)
    write_atomic(Path(out), lambda f: f.write(buffer.getvalue()))


class PngUnavailable(Error):
    """matplotlib is not installed."""
