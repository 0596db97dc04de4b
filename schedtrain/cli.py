"""The ``schedtrain`` command: ``check``, ``plan`` and ``train`` a TOML schedule.

Exit codes: 0 success, 2 bad input (a spec or the arguments), 1 a failure while
running. A user error prints what is wrong, never a Python traceback. This is
the only module that configures logging (``structlog.configure``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final, NoReturn

import structlog

from schedtrain.errors import Problem, ScheduleError
from schedtrain.simulation import Firing, FiringLog, RunShape, Simulation
from schedtrain.spec import Spec, load_spec
from schedtrain.time import Time, Unit

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_BAD_INPUT: Final = 2

#: Columns of the text timeline; the run is binned into this many, whatever its length.
TIMELINE_WIDTH: Final = 64
#: A plan stops collecting firings here, so a mistaken `every = "1 step"` over 10^9
#: steps reports quickly instead of filling memory.
MAX_FIRINGS: Final = 1_000_000
#: Beyond this many steps, a callback evaluated at every step makes a plan too slow.
MAX_ALWAYS_STEPS: Final = 5_000_000
PNG_MISSING: Final = "the png format needs matplotlib: pip install 'schedtrain[plot]'"


class UsageError(Exception):
    """Bad input found after argument parsing (exit 2, message only)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``main`` returns the exit code."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: error: {message}")


_CHECK_EPILOG = """\
examples:
  schedtrain check specs/resnet_tensorpack.toml
  schedtrain check specs/*.toml --import    # also import "module:Class" types
"""
_PLAN_EPILOG = """\
examples:
  schedtrain plan specs/resnet_tensorpack.toml
  schedtrain plan specs/lm_tokens.toml --format json > firings.json
  schedtrain plan specs/early_stopping.toml --metrics runs/x/events.jsonl
  schedtrain plan specs/resnet_tensorpack.toml --format png --out plan.png
"""
_TRAIN_EPILOG = """\
examples:
  schedtrain train specs/digits.toml
  schedtrain train specs/digits.toml --run-dir runs/try2 --resume auto
"""


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="schedtrain",
        description="Check, plan and run declarative training schedules written in TOML.",
        epilog="run 'schedtrain COMMAND --help' for a command's options",
    )
    parser.add_argument("--traceback", action="store_true",
                        help="print the Python traceback of a failure (for bug reports)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    fmt = argparse.RawDescriptionHelpFormatter

    check = sub.add_parser("check", help="validate spec files", epilog=_CHECK_EPILOG,
                           formatter_class=fmt,
                           description="Validate spec files; exit 0, or 2 listing every problem.")
    check.add_argument("specs", nargs="+", metavar="SPEC", help="TOML spec files")
    check.add_argument("--import", dest="do_import", action="store_true",
                       help="import 'module:Class' callback types and check their arguments")

    plan = sub.add_parser("plan", help="simulate a spec and show when callbacks fire",
                          epilog=_PLAN_EPILOG, formatter_class=fmt,
                          description="Simulate the schedule over the run's shape ([clock] "
                                      "or the options) and show every firing.")
    plan.add_argument("spec", metavar="SPEC", help="a TOML spec file")
    plan.add_argument("--epochs", type=_positive_int, metavar="N", help="override clock.epochs")
    plan.add_argument("--steps-per-epoch", type=_positive_int, metavar="S",
                      help="override clock.steps_per_epoch")
    plan.add_argument("--format", choices=("table", "json", "png"), default="table",
                      help="table (default), json ({\"firings\": [...]}) or png (a timeline)")
    plan.add_argument("--out", metavar="FILE",
                      help="write to FILE instead of stdout (png default: plan.png)")
    plan.add_argument("--metrics", metavar="FILE",
                      help="JSONL metric stream ({\"name\", \"value\", \"step\"|\"epoch\"} per "
                           "line, or a run's events.jsonl) to resolve conditional firings")
    plan.add_argument("--first", type=_positive_int, default=5, metavar="N",
                      help="firings listed per callback in the table (default 5)")

    train = sub.add_parser("train", help="train with a spec's [run] and callbacks",
                           epilog=_TRAIN_EPILOG, formatter_class=fmt,
                           description="Run training as the spec's [run] table describes.")
    train.add_argument("spec", metavar="SPEC", help="a TOML spec file")
    train.add_argument("--run-dir", metavar="DIR", help="override run.run_dir")
    train.add_argument("--resume", metavar="PATH|auto",
                       help="resume from a checkpoint, or 'auto' for the newest in the run dir")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _configure_logging(verbose: bool) -> None:
    level = 10 if verbose else 30  # DEBUG / WARNING
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(
            colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Look sys.stderr up when a logger is made, not now: it may be replaced later.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _report(problems: Sequence[Problem], err: IO[str]) -> None:
    for p in problems:
        print(f"error: {p}", file=err)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# -- check ------------------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.specs:
        try:
            spec = load_spec(path)
            if args.do_import:
                spec.callback_classes()
        except ScheduleError as exc:
            _report(exc.problems, sys.stderr)
            print(f"{path}: {_plural(len(exc.problems), 'problem')}", file=sys.stderr)
            failed = True
            continue
        for note in spec.warnings:
            print(f"warning: {path}: {note}", file=sys.stderr)
        print(f"{path}: ok: {_plural(len(spec.callbacks), 'callback')}, "
              f"{_plural(len(spec.triggers), 'named trigger')}, "
              f"{_plural(len(spec.events), 'custom event')}, "
              f"{_plural(len(spec.warnings), 'warning')}")
    return EXIT_BAD_INPUT if failed else EXIT_OK


# -- plan -------------------------------------------------------------------------------


def read_metrics(path: str) -> list[tuple[Time, str, float]]:
    """Read a JSONL metric stream: ``{"name", "value", "step" | "epoch"}`` per line.

    Lines of a training run's ``events.jsonl`` work too: those with ``"kind"``
    other than ``"scalar"`` are skipped, and extra keys are ignored.

    Raises:
        UsageError: the file cannot be read or a line is malformed (with its line number).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the metrics: {exc.strerror}") from None
    out: list[tuple[Time, str, float]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: invalid JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise UsageError(f"{where}: expected a JSON object, found {type(rec).__name__}")
        if rec.get("kind", "scalar") != "scalar":
            continue
        name, value = rec.get("name"), rec.get("value")
        if not isinstance(name, str):
            raise UsageError(f"{where}: expected \"name\": a metric name, found {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{where}: expected \"value\": a number, found {value!r}")
        if _is_count(rec.get("step")):
            at = Time(rec["step"], Unit.STEP)
        elif _is_count(rec.get("epoch")):
            at = Time(rec["epoch"], Unit.EPOCH)
        else:
            raise UsageError(f"{where}: expected \"step\" or \"epoch\": a whole number >= 0")
        out.append((at, name, float(value)))
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shape(spec: Spec, args: argparse.Namespace) -> RunShape:
    clock = spec.clock
    epochs = args.epochs if args.epochs is not None else clock.epochs
    spe = args.steps_per_epoch if args.steps_per_epoch is not None else clock.steps_per_epoch
    missing = [n for n, v in (("epochs", epochs), ("steps_per_epoch", spe)) if v is None]
    if missing:
        raise UsageError(
            f"{args.spec}: plan needs the run's length: set {' and '.join(missing)} in [clock] "
            f"or pass {' and '.join('--' + m.replace('_', '-') for m in missing)}")
    return RunShape.build(
        epochs=epochs, steps_per_epoch=spe,
        batches_per_step=clock.batches_per_step or 1,
        samples_per_batch=clock.samples_per_batch or 0,
        tokens_per_batch=clock.tokens_per_batch or 0,
        seconds_per_step=clock.seconds_per_step or 0.0)


class Plan:
    """A simulated run of a spec: the firings and what the table reports about them."""

    def __init__(self, spec: Spec, shape: RunShape,
                 metrics: list[tuple[Time, str, float]] | None) -> None:
        self.spec = spec
        self.shape = shape
        sim = Simulation(spec.schedule(), shape, metrics=metrics)
        self.table = sim.table
        self.always = self.table.always_evaluated
        if self.always and shape.total_steps > MAX_ALWAYS_STEPS:
            raise UsageError(
                f"{spec.path}: {', '.join(self.always)} would be evaluated at each of "
                f"{shape.total_steps:,} steps; give each a clock part (e.g. "
                "every = \"1 epoch\") or plan a shorter run with --epochs/--steps-per-epoch")
        firings: list[Firing] = []
        for firing in sim.iter_firings():
            firings.append(firing)
            if len(firings) >= MAX_FIRINGS:
                break
        self.truncated = len(firings) >= MAX_FIRINGS
        self.log = FiringLog(firings)


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
    for e in range(1, shape.epochs + 1):
        ruler[_bin(shape.start(e), total, width)] = "+"
    head = f"timeline: {total:,} steps in {width} columns of ~{max(total / width, 1):,.0f} steps"
    lines = [head, f"{'epochs':>{label}} {''.join(ruler)}"]
    lines += [f"{n:>{label}} {''.join(lanes[n])}" for n in names]
    lines.append(f"{'':>{label}} 0{f'{total:,}':>{width - 1}}")
    lines.append(f"{'':>{label}} '|' fires, '#' several times, '?' conditional, "
                 "'+' epoch end")
    return lines


def _render_table(plan: Plan, first: int) -> str:
    spec, shape = plan.spec, plan.shape
    names = plan.table.names
    lines = [f"plan: {spec.path}: {shape.epochs} epochs x "
             f"{shape.epoch_lengths[0] if shape.epochs else 0:,} steps = "
             f"{shape.total_steps:,} steps"]
    rows = [("callback", "trigger", "fires", "first firings")]
    for name, trig in zip(names, plan.table.triggers, strict=True):
        mine = plan.log.of(name)
        cond = sum(1 for f in mine if f.conditional)
        count = f"{len(mine):,}" + (f" ({cond:,}?)" if cond else "")
        shown = ", ".join(_when(f) for f in mine[:first])
        if len(mine) > first:
            shown += ", ..."
        rows.append((name, repr(trig), count, shown or "never"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True))
                     + "  " + r[3])
    lines.append("")
    lines.append("evaluated at every step: " + (", ".join(plan.always) or "none"))
    if any(f.conditional for f in plan.log):
        lines.append("'?': conditional, fires only if its runtime condition or metric "
                     "allows (--metrics FILE resolves them)")
    if plan.truncated:
        lines.append(f"note: stopped after {MAX_FIRINGS:,} firings")
    lines.append("")
    lines += _timeline(plan) if names and shape.total_steps else []
    return "\n".join(lines) + "\n"


def _render_png(plan: Plan, out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise _PngUnavailable from None
    names = plan.table.names
    total = max(plan.shape.total_steps, 1)
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 1.6))
    for lane, name in enumerate(reversed(names)):
        mine = plan.log.of(name)
        sure = [f.step for f in mine if not f.conditional]
        cond = [f.step for f in mine if f.conditional]
        if sure:
            ax.vlines(sure, lane - 0.35, lane + 0.35, color="tab:blue", linewidth=1.2)
        if cond:
            ax.vlines(cond, lane - 0.35, lane + 0.35, color="tab:orange", linewidth=1.2,
                      linestyles="dotted")
    epochs = plan.shape.epochs
    stride = max(1, math.ceil(epochs / 50))  # at most ~50 boundary lines stay readable
    for e in range(stride, epochs + 1, stride):
        ax.axvline(plan.shape.start(e), color="0.8", linewidth=0.6, zorder=0)
    ax.set_yticks(range(len(names)), list(reversed(names)))
    ax.set_xlim(0, total * 1.01)
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.set_xlabel(f"optimizer steps (grey lines: every {_plural(stride, 'epoch')})")
    title = f"schedtrain plan: {Path(plan.spec.path or 'spec').name}"
    if any(f.conditional for f in plan.log):
        title += "  (dotted orange: conditional)"
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


class _PngUnavailable(Exception):
    """matplotlib is not installed."""


def _cmd_plan(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    shape = _shape(spec, args)
    metrics = read_metrics(args.metrics) if args.metrics else None
    plan = Plan(spec, shape, metrics)
    if plan.truncated:
        print(f"warning: stopped after {MAX_FIRINGS:,} firings", file=sys.stderr)
    if args.format == "png":
        out = args.out or "plan.png"
        try:
            _render_png(plan, out)
        except _PngUnavailable:
            print(f"error: {PNG_MISSING}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"wrote {out}")
        return EXIT_OK
    text = plan.log.to_json() + "\n" if args.format == "json" else _render_table(plan, args.first)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


# -- train ------------------------------------------------------------------------------


def _cmd_train(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    try:
        from schedtrain.training import train_from_spec
    except ImportError as exc:
        print("error: schedtrain train needs schedtrain.training (and torch), which cannot "
              f"be imported: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    trainer = train_from_spec(spec, args.run_dir, args.resume)
    ts = trainer.clock.now()
    shown = [f"{n}={mv.value:.4g}" for n in trainer.metrics.names()
             if n.startswith("val/") and (mv := trainer.metrics.latest(n)) is not None]
    print(f"trained {ts.epoch} epochs, {ts.step} steps in {ts.seconds:.1f} s"
          + (f"; {', '.join(shown)}" if shown else "")
          + (f"; run directory {trainer.run_dir}" if trainer.run_dir else ""))
    return EXIT_OK


_COMMANDS = {"check": _cmd_check, "plan": _cmd_plan, "train": _cmd_train}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``schedtrain`` command line; returns the exit code.

    Args:
        argv: the arguments (without the program name); ``sys.argv[1:]`` by default.
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:  # argparse printed the usage; now the reason, no traceback
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # --help exits 0 through argparse
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    _configure_logging(args.verbose)
    try:
        return _COMMANDS[args.command](args)
    except ScheduleError as exc:  # SpecError included
        _report(exc.problems, sys.stderr)
        return EXIT_BAD_INPUT
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        if not args.traceback:
            print("(run with --traceback for details)", file=sys.stderr)
        return EXIT_FAILURE
